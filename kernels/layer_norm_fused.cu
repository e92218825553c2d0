// LayerNorm and RMSNorm forward with the work transformers fuse around the norm (issue 7),
// for rows one register tile holds (layer_norm.cu's full-row path; the host composes longer
// rows from the plain kernels):
//   - a residual added first: h = x + r is normalized and written, in its own dtype H
//     (pre-norm blocks keep their residual stream, often in float32);
//   - a weight offset added to the weight in float32 (Gemma's zero-centred weights: casting
//     1 + w to bf16 first would move outputs by up to ~3e-2);
//   - y written in another dtype O than x, FP8 included: y * out_scale cast with
//     saturation (e4m3 at ±448, e5m2 at ±57344), and the per-tensor amax of y before the
//     scale, for delayed-scaling recipes (the host zeroes it; blocks fold theirs in with an
//     atomic max, order-independent).
// residual, h, mean, rstd and amax may each be null. Statistics in float32, two passes over
// the registers as the plain kernel.
#include "row_norm.cuh"

#include <cuda_fp8.h>

namespace cunorm {
template <> struct Cvt<__nv_fp8_e4m3> {
  static __device__ __forceinline__ __nv_fp8_e4m3 from(float v) {
    __nv_fp8_e4m3 out;
    out.__x = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
    return out;
  }
};
template <> struct Cvt<__nv_fp8_e5m2> {
  static __device__ __forceinline__ __nv_fp8_e5m2 from(float v) {
    __nv_fp8_e5m2 out;
    out.__x = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E5M2);
    return out;
  }
};
}  // namespace cunorm

using namespace cunorm;

// Maximum over the block of one non-negative value a thread, folded into *amax as float
// bits (non-negative floats order as their bit patterns). Every thread calls it together.
__device__ __forceinline__ void block_amax(float v, float* smem, unsigned* amax) {
#pragma unroll
  for (int o = kWarp / 2; o > 0; o /= 2) v = fmaxf(v, shfl_xor(v, o));
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  __syncthreads();  // smem may still hold the statistics' partials
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    float m = 0.0f;
    for (int w = 0; w < int(blockDim.x) / kWarp; ++w) m = fmaxf(m, smem[w]);
    atomicMax(amax, __float_as_uint(m));
  }
}

template <typename T, typename R, typename H, typename O, typename W, int VEC, int PACKS, int TPR, bool RMS>
__global__ void __launch_bounds__(GroupShape<TPR>::kBlock)
norm_fwd_fused(const T* __restrict__ x, CUNORM_ROWMAP_PARAMS(xm), const R* __restrict__ residual,
               CUNORM_ROWMAP_PARAMS(rm), H* __restrict__ h, O* __restrict__ y, const W* __restrict__ weight,
               const W* __restrict__ bias, float* __restrict__ mean, float* __restrict__ rstd,
               unsigned* __restrict__ amax, i64 M, i64 N, float eps, float weight_offset, float out_scale) {
  typedef float A;
  static_assert(sizeof(typename AccOf<T>::type) == 4, "fused variants serve half and float inputs");
  constexpr int kRows = GroupShape<TPR>::kRows;
  constexpr i64 kTile = i64(TPR) * PACKS * VEC;
  __shared__ A smem[2 * kWarp];
  const RowMap xmap = CUNORM_ROWMAP(xm), rmap = CUNORM_ROWMAP(rm);
  const int lane = threadIdx.x % TPR, ty = threadIdx.x / TPR;
  A top = A(0);  // this thread's max |y| over its rows

  // Block-uniform loop: every thread runs every iteration, so the barriers in group_sum hold.
  for (i64 base = i64(blockIdx.x) * kRows; base < M; base += i64(gridDim.x) * kRows) {
    const i64 row = base + ty;
    const bool row_ok = row < M;
    const i64 safe_row = row_ok ? row : 0;
    const int limit = tile_limit(N, 0, kTile, row_ok);
    const T* xrow = x + xmap.offset(safe_row);
    const R* rrow = residual ? residual + rmap.offset(safe_row) : nullptr;
    A v[PACKS][VEC];
    load_tile<VEC, PACKS, TPR>(xrow, limit, lane, v);
    if (rrow) {
      A rv[PACKS][VEC];
      load_tile<VEC, PACKS, TPR>(rrow, limit, lane, rv);
#pragma unroll
      for (int p = 0; p < PACKS; ++p)
#pragma unroll
        for (int k = 0; k < VEC; ++k) v[p][k] += rv[p][k];
      if (h) {  // h is normalized as summed in float32, and written rounded to H
#pragma unroll
        for (int p = 0; p < PACKS; ++p)
          if (pack_col<VEC, TPR>(p, lane) < limit) store_pack<H>(h + safe_row * N + pack_col<VEC, TPR>(p, lane), v[p]);
      }
    }
    A pivot = A(0), mu;
    if constexpr (!RMS) pivot = cvt<A>(xrow[0]) + (rrow ? cvt<A>(rrow[0]) : A(0));
    const A q = centre_tile<VEC, PACKS, TPR, RMS>(v, limit, lane, pivot, smem, mu);
    const A r = rsqrt_acc(q / A(N) + eps);
    if (lane == 0 && row_ok && rstd) {  // inference callers may skip the statistics
      if (!RMS && mean) mean[row] = pivot + mu;
      rstd[row] = r;
    }
    O* yrow = y + safe_row * N;
#pragma unroll
    for (int p = 0; p < PACKS; ++p) {
      const int col = pack_col<VEC, TPR>(p, lane);
      if (col >= limit) continue;
      A wv[VEC], bv[VEC], out[VEC];
      load_param<VEC>(weight, col, A(1), wv);
      load_param<VEC>(bias, col, A(0), bv);
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        out[k] = v[p][k] * r * (weight ? wv[k] + weight_offset : A(1)) + bv[k];
        top = fmaxf(top, fabsf(out[k]));
        out[k] *= out_scale;
      }
      store_pack<O>(yrow + col, out);
    }
  }
  if (amax) block_amax(top, smem, amax);
}

// y * out_scale cast with saturation to FP8, for the calls the fused kernel does not serve
// (the host composes them from the plain kernels in float32; CuPy has no FP8 dtype to cast
// with). Contiguous, grid-stride.
template <typename O>
__global__ void cast_scaled(const float* __restrict__ y, O* __restrict__ out, i64 n, float out_scale) {
  for (i64 i = i64(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += i64(gridDim.x) * blockDim.x)
    out[i] = Cvt<O>::from(y[i] * out_scale);
}
