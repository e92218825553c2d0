// BatchNorm over the channels of x, forward and backward, with an optional residual added and
// an activation applied in the same pass. First version: three passes each way (partial
// sums per channel and chunk, a per-channel finalize, an elementwise apply), x read twice.
//
// x is addressed as (outer O, channel C, inner I): element (o, c, i) at o * so + c * sc + i.
//   nc kernels : channel-major (NCHW and friends): each block owns one channel and a chunk of
//                its O * I elements; I % VEC == 0, so a pack never straddles two runs of I.
//   cl kernels : channels last (sc = 1, I = 1): each block owns 32 * VEC channels (one pack a
//                lane) and a chunk of the O positions, kBnRows warps stepping down them.
// y, dy, dx, the residual and its gradient share x's strides (the host sees to it).
// Sums are per thread in order, then fixed trees: deterministic, no atomics.
#include "common.cuh"
#include "activations.cuh"

using namespace cunorm;

constexpr int kBnBlock = 256;
constexpr int kBnRows = kBnBlock / kWarp;  // cl kernels: warps stepping down positions

// e / I for e < 2^32 by a multiply and a shift (imul, ishift from the host, which passes
// imul = 0 when a channel holds 2^32 elements or more: then a 64-bit division). A 64-bit
// division per pack cost more instructions than the pack's arithmetic.
__device__ __forceinline__ i64 div_inner(i64 e, i64 I, unsigned imul, int ishift) {
  if (imul == 0u) return e / I;
  const unsigned n = unsigned(e);
  return i64((static_cast<unsigned long long>(__umulhi(n, imul)) + n) >> ishift);
}

// Channel-major traversal: calls f(offset of a pack from the channel's base) for this
// thread's packs of elements [q0, q1) of the channel, q = o * I + i.
template <int VEC, typename F>
__device__ __forceinline__ void for_nc(i64 q0, i64 q1, i64 I, unsigned imul, int ishift, i64 so, F&& f) {
  for (i64 e = q0 + i64(threadIdx.x) * VEC; e < q1; e += i64(kBnBlock) * VEC) {
    const i64 o = div_inner(e, I, imul, ishift);
    f(o * so + (e - o * I));
  }
}

// Channels-last traversal: calls f(offset of this lane's pack) for positions [p0, p1).
template <typename F>
__device__ __forceinline__ void for_cl(i64 p0, i64 p1, i64 so, i64 c, F&& f) {
  for (i64 p = p0 + threadIdx.x / kWarp; p < p1; p += kBnRows) f(p * so + c);
}

// Sums `v` (VEC values a lane) over the kBnRows warps of a cl block into row 0, in order.
template <int VEC, typename A>
__device__ __forceinline__ void sum_rows(A (&v)[VEC], A* red) {
  const int lane = threadIdx.x % kWarp, row = threadIdx.x / kWarp;
#pragma unroll
  for (int k = 0; k < VEC; ++k) red[(row * kWarp + lane) * VEC + k] = v[k];
  __syncthreads();
  if (row == 0) {
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      A s = A(0);
      for (int r = 0; r < kBnRows; ++r) s += red[(r * kWarp + lane) * VEC + k];
      v[k] = s;
    }
  }
  __syncthreads();
}

// The pre-activation z = (x - mean) * rstd * w + b (+ residual), and xhat.
template <typename A>
struct Affine {
  A mean, rstd, w, b;
  __device__ __forceinline__ A xhat(A x) const { return (x - mean) * rstd; }
  __device__ __forceinline__ A z(A x, A r) const { return xhat(x) * w + b + r; }
};

template <typename A, typename W>
__device__ __forceinline__ Affine<A> affine_of(i64 c, const A* mean, const A* rstd, const W* w, const W* b) {
  return Affine<A>{mean[c], rstd[c], w ? cvt<A>(w[c]) : A(1), b ? cvt<A>(b[c]) : A(0)};
}

// ---- forward statistics -------------------------------------------------------------------
// Partial (count, sum(x - K), sum((x - K)^2)) per channel and chunk -> part [C, chunks, 3], K
// the channel's first element: all partials of a channel share it, so they simply add up,
// and the shift keeps the digits a large common offset would cost.
template <typename T, int VEC>
__global__ void __launch_bounds__(kBnBlock)
bn_stats_nc(const T* __restrict__ x, i64 so, i64 sc, i64 O, i64 I, unsigned imul, int ishift, i64 per_chunk,
            typename AccOf<T>::type* __restrict__ part) {
  typedef typename AccOf<T>::type A;
  __shared__ A smem[2 * kWarp];
  const i64 c = blockIdx.y;
  const T* xc = x + c * sc;
  const A K = cvt<A>(xc[0]);
  const i64 q0 = i64(blockIdx.x) * per_chunk, q1 = min(O * I, q0 + per_chunk);
  A n = A(0), s = A(0), q = A(0);
  for_nc<VEC>(q0, q1, I, imul, ishift, so, [&](i64 off) {
    A v[VEC];
    load_pack<A, T, VEC>(xc + off, v);
#pragma unroll
    for (int k = 0; k < VEC; ++k) { const A d = v[k] - K; s += d; q += d * d; }
    n += A(VEC);
  });
  group_sum2<kBnBlock>(s, q, smem);
  n = group_sum<kBnBlock>(n, smem);
  if (threadIdx.x == 0) {
    A* out = part + (c * gridDim.x + blockIdx.x) * 3;
    out[0] = n; out[1] = s; out[2] = q;
  }
}

template <typename T, int VEC>
__global__ void __launch_bounds__(kBnBlock)
bn_stats_cl(const T* __restrict__ x, i64 so, i64 C, i64 O, i64 per_chunk, typename AccOf<T>::type* __restrict__ part) {
  typedef typename AccOf<T>::type A;
  __shared__ A red[kBnBlock * VEC];
  const int lane = threadIdx.x % kWarp;
  const i64 c = (i64(blockIdx.y) * kWarp + lane) * VEC;
  const bool ok = c < C;  // VEC > 1 only when C % VEC == 0
  const i64 p0 = i64(blockIdx.x) * per_chunk, p1 = min(O, p0 + per_chunk);
  A K[VEC], s[VEC], q[VEC], n[1] = {A(0)};
#pragma unroll
  for (int k = 0; k < VEC; ++k) { K[k] = A(0); s[k] = A(0); q[k] = A(0); }
  if (ok) {
    load_pack<A, T, VEC>(x + c, K);
    for_cl(p0, p1, so, c, [&](i64 off) {
      A v[VEC];
      load_pack<A, T, VEC>(x + off, v);
#pragma unroll
      for (int k = 0; k < VEC; ++k) { const A d = v[k] - K[k]; s[k] += d; q[k] += d * d; }
      n[0] += A(1);
    });
  }
  sum_rows<VEC>(s, red);
  sum_rows<VEC>(q, red);
  // every lane of a row counted the same positions: the count is row-independent of lanes
  A cnt[1] = {n[0]};
  sum_rows<1>(cnt, red);
  if (threadIdx.x < kWarp && ok) {
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      A* out = part + ((c + k) * gridDim.x + blockIdx.x) * 3;
      out[0] = cnt[0]; out[1] = s[k]; out[2] = q[k];
    }
  }
}

// Per channel (one warp each): mean and rstd from the partials, and the running statistics
// updated in place (unbiased variance; factor = momentum, or 1 / batches for the cumulative
// average). Sums in double, lanes over chunks in order, then a fixed tree.
template <typename T, typename R>
__global__ void __launch_bounds__(128)
bn_finalize(const T* __restrict__ x, i64 pivot_stride, const typename AccOf<T>::type* __restrict__ part,
            i64 chunks, i64 C, double eps, double factor, R* __restrict__ running_mean,
            R* __restrict__ running_var, typename AccOf<T>::type* __restrict__ mean,
            typename AccOf<T>::type* __restrict__ rstd) {
  typedef typename AccOf<T>::type A;
  const int lane = threadIdx.x % kWarp;
  const i64 c = i64(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  if (c >= C) return;
  double n = 0, s = 0, q = 0;
  for (i64 k = lane; k < chunks; k += kWarp) {
    const A* p = part + (c * chunks + k) * 3;
    n += double(p[0]); s += double(p[1]); q += double(p[2]);
  }
  n = group_warp_sum<kWarp>(n);
  s = group_warp_sum<kWarp>(s);
  q = group_warp_sum<kWarp>(q);
  if (lane != 0) return;
  const double shift = s / n;
  const double var = fmax(q / n - shift * shift, 0.0);
  const double m = double(cvt<A>(x[c * pivot_stride])) + shift;
  mean[c] = A(m);
  rstd[c] = A(1.0 / sqrt(var + eps));
  if (running_mean) running_mean[c] = cvt<R>((1.0 - factor) * double(cvt<A>(running_mean[c])) + factor * m);
  if (running_var) {
    const double unbiased = n > 1 ? var * n / (n - 1) : nan("");
    running_var[c] = cvt<R>((1.0 - factor) * double(cvt<A>(running_var[c])) + factor * unbiased);
  }
}

// Eval: mean and rstd from the running statistics.
template <typename A, typename R>
__global__ void __launch_bounds__(128)
bn_running_stats(const R* __restrict__ running_mean, const R* __restrict__ running_var, i64 C, double eps,
                 A* __restrict__ mean, A* __restrict__ rstd) {
  const i64 c = i64(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  mean[c] = cvt<A>(running_mean[c]);
  rstd[c] = A(1.0 / sqrt(double(cvt<A>(running_var[c])) + eps));
}

// ---- forward apply ------------------------------------------------------------------------
template <typename T, typename W, int VEC>
__global__ void __launch_bounds__(kBnBlock)
bn_apply_nc(const T* __restrict__ x, const T* __restrict__ res, T* __restrict__ y, i64 so, i64 sc, i64 O, i64 I,
            unsigned imul, int ishift,            i64 per_chunk, const typename AccOf<T>::type* __restrict__ mean,
            const typename AccOf<T>::type* __restrict__ rstd, const W* __restrict__ w, const W* __restrict__ b,
            int act, typename AccOf<T>::type param) {
  typedef typename AccOf<T>::type A;
  const i64 c = blockIdx.y;
  const Affine<A> aff = affine_of(c, mean, rstd, w, b);
  const i64 base = c * sc, q0 = i64(blockIdx.x) * per_chunk, q1 = min(O * I, q0 + per_chunk);
  for_nc<VEC>(q0, q1, I, imul, ishift, so, [&](i64 off) {
    A v[VEC], r[VEC], out[VEC];
    load_pack<A, T, VEC>(x + base + off, v);
    if (res) load_pack<A, T, VEC>(res + base + off, r);
#pragma unroll
    for (int k = 0; k < VEC; ++k) out[k] = act_forward(act, aff.z(v[k], res ? r[k] : A(0)), param);
    store_pack<T>(y + base + off, out);
  });
}

template <typename T, typename W, int VEC>
__global__ void __launch_bounds__(kBnBlock)
bn_apply_cl(const T* __restrict__ x, const T* __restrict__ res, T* __restrict__ y, i64 so, i64 C, i64 O,
            i64 per_chunk, const typename AccOf<T>::type* __restrict__ mean,
            const typename AccOf<T>::type* __restrict__ rstd, const W* __restrict__ w, const W* __restrict__ b,
            int act, typename AccOf<T>::type param) {
  typedef typename AccOf<T>::type A;
  const i64 c = (i64(blockIdx.y) * kWarp + threadIdx.x % kWarp) * VEC;
  if (c >= C) return;  // no barriers below
  Affine<A> aff[VEC];
#pragma unroll
  for (int k = 0; k < VEC; ++k) aff[k] = affine_of(c + k, mean, rstd, w, b);
  const i64 p0 = i64(blockIdx.x) * per_chunk, p1 = min(O, p0 + per_chunk);
  for_cl(p0, p1, so, c, [&](i64 off) {
    A v[VEC], r[VEC], out[VEC];
    load_pack<A, T, VEC>(x + off, v);
    if (res) load_pack<A, T, VEC>(res + off, r);
#pragma unroll
    for (int k = 0; k < VEC; ++k) out[k] = act_forward(act, aff[k].z(v[k], res ? r[k] : A(0)), param);
    store_pack<T>(y + off, out);
  });
}

// ---- backward -----------------------------------------------------------------------------
// dz = dy * act'(z), z recomputed from x (never stored: fewer bytes than writing and reading
// it back). Partial (sum dz, sum dz * xhat) per channel and chunk -> part [C, chunks, 2].
template <typename T, typename W, int VEC>
__global__ void __launch_bounds__(kBnBlock)
bn_bwd_sums_nc(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ res, i64 so, i64 sc, i64 O,
               i64 I, unsigned imul, int ishift, i64 per_chunk, const typename AccOf<T>::type* __restrict__ mean,
               const typename AccOf<T>::type* __restrict__ rstd, const W* __restrict__ w, const W* __restrict__ b,
               int act, typename AccOf<T>::type param, typename AccOf<T>::type* __restrict__ part) {
  typedef typename AccOf<T>::type A;
  __shared__ A smem[2 * kWarp];
  const i64 c = blockIdx.y;
  const Affine<A> aff = affine_of(c, mean, rstd, w, b);
  const i64 base = c * sc, q0 = i64(blockIdx.x) * per_chunk, q1 = min(O * I, q0 + per_chunk);
  A s1 = A(0), s2 = A(0);
  for_nc<VEC>(q0, q1, I, imul, ishift, so, [&](i64 off) {
    A v[VEC], g[VEC], r[VEC];
    load_pack<A, T, VEC>(x + base + off, v);
    load_pack<A, T, VEC>(dy + base + off, g);
    if (res) load_pack<A, T, VEC>(res + base + off, r);
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      const A dz = g[k] * act_derivative(act, aff.z(v[k], res ? r[k] : A(0)), param);
      s1 += dz;
      s2 += dz * aff.xhat(v[k]);
    }
  });
  group_sum2<kBnBlock>(s1, s2, smem);
  if (threadIdx.x == 0) {
    A* out = part + (c * gridDim.x + blockIdx.x) * 2;
    out[0] = s1; out[1] = s2;
  }
}

template <typename T, typename W, int VEC>
__global__ void __launch_bounds__(kBnBlock)
bn_bwd_sums_cl(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ res, i64 so, i64 C, i64 O,
               i64 per_chunk, const typename AccOf<T>::type* __restrict__ mean,
               const typename AccOf<T>::type* __restrict__ rstd, const W* __restrict__ w, const W* __restrict__ b,
               int act, typename AccOf<T>::type param, typename AccOf<T>::type* __restrict__ part) {
  typedef typename AccOf<T>::type A;
  __shared__ A red[kBnBlock * VEC];
  const i64 c = (i64(blockIdx.y) * kWarp + threadIdx.x % kWarp) * VEC;
  const bool ok = c < C;
  A s1[VEC], s2[VEC];
#pragma unroll
  for (int k = 0; k < VEC; ++k) { s1[k] = A(0); s2[k] = A(0); }
  if (ok) {
    Affine<A> aff[VEC];
#pragma unroll
    for (int k = 0; k < VEC; ++k) aff[k] = affine_of(c + k, mean, rstd, w, b);
    const i64 p0 = i64(blockIdx.x) * per_chunk, p1 = min(O, p0 + per_chunk);
    for_cl(p0, p1, so, c, [&](i64 off) {
      A v[VEC], g[VEC], r[VEC];
      load_pack<A, T, VEC>(x + off, v);
      load_pack<A, T, VEC>(dy + off, g);
      if (res) load_pack<A, T, VEC>(res + off, r);
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        const A dz = g[k] * act_derivative(act, aff[k].z(v[k], res ? r[k] : A(0)), param);
        s1[k] += dz;
        s2[k] += dz * aff[k].xhat(v[k]);
      }
    });
  }
  sum_rows<VEC>(s1, red);
  sum_rows<VEC>(s2, red);
  if (threadIdx.x < kWarp && ok) {
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      A* out = part + ((c + k) * gridDim.x + blockIdx.x) * 2;
      out[0] = s1[k]; out[1] = s2[k];
    }
  }
}

// Per channel: dbias = sum dz, dweight = sum dz * xhat (in W, where asked for), and the two
// means the dx pass subtracts (zero in eval, where the statistics are constants) -> coef [C, 2].
template <typename A, typename W>
__global__ void __launch_bounds__(128)
bn_bwd_finalize(const A* __restrict__ part, i64 chunks, i64 C, double count, int training, W* __restrict__ dw,
                W* __restrict__ db, A* __restrict__ coef) {
  const int lane = threadIdx.x % kWarp;
  const i64 c = i64(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  if (c >= C) return;
  double s1 = 0, s2 = 0;
  for (i64 k = lane; k < chunks; k += kWarp) {
    s1 += double(part[(c * chunks + k) * 2]);
    s2 += double(part[(c * chunks + k) * 2 + 1]);
  }
  s1 = group_warp_sum<kWarp>(s1);
  s2 = group_warp_sum<kWarp>(s2);
  if (lane != 0) return;
  if (db) db[c] = cvt<W>(s1);
  if (dw) dw[c] = cvt<W>(s2);
  coef[c * 2] = training ? A(s1 / count) : A(0);
  coef[c * 2 + 1] = training ? A(s2 / count) : A(0);
}

// dx = w * rstd * (dz - mean(dz) - xhat * mean(dz * xhat)); dres = dz where asked for.
template <typename T, typename W, int VEC>
__global__ void __launch_bounds__(kBnBlock)
bn_bwd_apply_nc(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ res, T* __restrict__ dx,
                T* __restrict__ dres, i64 so, i64 sc, i64 O, i64 I, unsigned imul, int ishift, i64 per_chunk,
                const typename AccOf<T>::type* __restrict__ mean, const typename AccOf<T>::type* __restrict__ rstd,
                const W* __restrict__ w, const W* __restrict__ b, int act, typename AccOf<T>::type param,
                const typename AccOf<T>::type* __restrict__ coef) {
  typedef typename AccOf<T>::type A;
  const i64 c = blockIdx.y;
  const Affine<A> aff = affine_of(c, mean, rstd, w, b);
  const A m1 = coef[c * 2], m2 = coef[c * 2 + 1], scale = aff.w * aff.rstd;
  const i64 base = c * sc, q0 = i64(blockIdx.x) * per_chunk, q1 = min(O * I, q0 + per_chunk);
  for_nc<VEC>(q0, q1, I, imul, ishift, so, [&](i64 off) {
    A v[VEC], g[VEC], r[VEC], out[VEC], dz[VEC];
    load_pack<A, T, VEC>(x + base + off, v);
    load_pack<A, T, VEC>(dy + base + off, g);
    if (res) load_pack<A, T, VEC>(res + base + off, r);
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      dz[k] = g[k] * act_derivative(act, aff.z(v[k], res ? r[k] : A(0)), param);
      out[k] = scale * (dz[k] - m1 - aff.xhat(v[k]) * m2);
    }
    store_pack<T>(dx + base + off, out);
    if (dres) store_pack<T>(dres + base + off, dz);
  });
}

template <typename T, typename W, int VEC>
__global__ void __launch_bounds__(kBnBlock)
bn_bwd_apply_cl(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ res, T* __restrict__ dx,
                T* __restrict__ dres, i64 so, i64 C, i64 O, i64 per_chunk,
                const typename AccOf<T>::type* __restrict__ mean, const typename AccOf<T>::type* __restrict__ rstd,
                const W* __restrict__ w, const W* __restrict__ b, int act, typename AccOf<T>::type param,
                const typename AccOf<T>::type* __restrict__ coef) {
  typedef typename AccOf<T>::type A;
  const i64 c = (i64(blockIdx.y) * kWarp + threadIdx.x % kWarp) * VEC;
  if (c >= C) return;  // no barriers below
  Affine<A> aff[VEC];
  A m1[VEC], m2[VEC];
#pragma unroll
  for (int k = 0; k < VEC; ++k) {
    aff[k] = affine_of(c + k, mean, rstd, w, b);
    m1[k] = coef[(c + k) * 2];
    m2[k] = coef[(c + k) * 2 + 1];
  }
  const i64 p0 = i64(blockIdx.x) * per_chunk, p1 = min(O, p0 + per_chunk);
  for_cl(p0, p1, so, c, [&](i64 off) {
    A v[VEC], g[VEC], r[VEC], out[VEC], dz[VEC];
    load_pack<A, T, VEC>(x + off, v);
    load_pack<A, T, VEC>(dy + off, g);
    if (res) load_pack<A, T, VEC>(res + off, r);
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      dz[k] = g[k] * act_derivative(act, aff[k].z(v[k], res ? r[k] : A(0)), param);
      out[k] = aff[k].w * aff[k].rstd * (dz[k] - m1[k] - aff[k].xhat(v[k]) * m2[k]);
    }
    store_pack<T>(dx + off, out);
    if (dres) store_pack<T>(dres + off, dz);
  });
}
