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

#ifndef CUNORM_FUSED_LEAN_Y
#define CUNORM_FUSED_LEAN_Y 1  // 0: one output loop for every call, as before v28 (sweep_fused_variant.py)
#endif

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
template <typename O> struct IsFp8 { static constexpr bool value = false; };
template <> struct IsFp8<__nv_fp8_e4m3> {
  static constexpr bool value = true;
  static constexpr __nv_fp8_interpretation_t kind = __NV_E4M3;
};
template <> struct IsFp8<__nv_fp8_e5m2> {
  static constexpr bool value = true;
  static constexpr __nv_fp8_interpretation_t kind = __NV_E5M2;
};

}  // namespace cunorm

using namespace cunorm;

// FP8 packs of 4 or 8 values assembled as 32-bit words (v48) instead of byte by byte into the
// pack: the byte stores into the pack compiled to PRMT / LOP3 shuffles. 0: byte by byte.
#ifndef CUNORM_FP8_WORDS
#define CUNORM_FP8_WORDS 1
#endif

// v58: see write_y in norm_fwd_fused. 0: FP8 y scaled element by element after |y| is taken.
#ifndef CUNORM_FP8_FOLD_SCALE
#define CUNORM_FP8_FOLD_SCALE 1
#endif

// One pack of y: FP8 two values a conversion (sm_89+ converts a pair in one instruction, the
// same rounding as one at a time), other dtypes as store_pack.
template <typename O, int VEC>
__device__ __forceinline__ void store_y(O* p, const float (&v)[VEC]) {
  if constexpr (IsFp8<O>::value && VEC % 4 == 0 && CUNORM_FP8_WORDS) {
    // two pairs a 32-bit word, the first value in the low byte (little-endian memory order)
    unsigned words[VEC / 4];
#pragma unroll
    for (int k = 0; k < VEC; k += 4) {
      const unsigned lo = __nv_cvt_float2_to_fp8x2(make_float2(v[k], v[k + 1]), __NV_SATFINITE, IsFp8<O>::kind);
      const unsigned hi = __nv_cvt_float2_to_fp8x2(make_float2(v[k + 2], v[k + 3]), __NV_SATFINITE, IsFp8<O>::kind);
      words[k / 4] = lo | (hi << 16);
    }
    if constexpr (VEC == 8) {
      *reinterpret_cast<uint2*>(p) = make_uint2(words[0], words[1]);
    } else {
#pragma unroll
      for (int c = 0; c < VEC / 4; ++c) reinterpret_cast<unsigned*>(p)[c] = words[c];
    }
  } else if constexpr (IsFp8<O>::value && VEC % 2 == 0) {
    Pack<O, VEC> pk;
#pragma unroll
    for (int k = 0; k < VEC; k += 2) {
      const __nv_fp8x2_storage_t two = __nv_cvt_float2_to_fp8x2(make_float2(v[k], v[k + 1]), __NV_SATFINITE,
                                                                IsFp8<O>::kind);
      pk.v[k].__x = static_cast<__nv_fp8_storage_t>(two & 0xFFu);  // the first value in the low byte
      pk.v[k + 1].__x = static_cast<__nv_fp8_storage_t>(two >> 8);
    }
    *reinterpret_cast<Pack<O, VEC>*>(p) = pk;
  } else {
    store_pack<O>(p, v);
  }
}

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

// v60: half-precision LayerNorm rows with FP8 out take their statistics in one pass where that
// is safe (row_norm.cuh one_pass_tile): one block reduction a row instead of two, and a
// subtraction an element fewer (the output loop takes the mean off, inside a multiply-add
// where a bias is added). FP8 LayerNorm N = 2048-8192 +0.005-0.007 of copy on an H100; the
// residual forward, which is memory-bound, lost 0.006-0.011 with it, so it keeps two passes
// (NOTES v60). 0: two passes always; 1: FP8 outputs; 2: every output.
#ifndef CUNORM_FUSED_ONE_PASS
#define CUNORM_FUSED_ONE_PASS 1
#endif
// v95: the one pass sums x itself, not x - pivot: a subtraction an element and the row's
// dependent load of its first element fewer, in a kernel short of issue slots. The trust
// test (row_norm.cuh kOnePassTrust) then reads mean^2 <= 64 var, so rows further than 8
// sigma from zero take the two passes, as rows far from their pivot did. 1: the first
// element as the pivot (v60).
#ifndef CUNORM_FUSED_ONE_PASS_PIVOT
#define CUNORM_FUSED_ONE_PASS_PIVOT 0
#endif

// v76: bf16 packs widened a 32-bit word at a time (common.cuh unpack_words): one instruction
// a value instead of ~1.5. The FP8 LayerNorm forward is short of issue slots (NOTES v60).
// Bit 2: the weight and the bias; bit 1: x and the residual (which spilled 32 bytes in the
// FP8 LayerNorm tile, NVRTC 13, sm_90). H200, two rounds within 0.003 (benchmarks/
// sweep_fused_variant.py, results/sweep-fused-fwd-words-v76-h200.txt), bf16 N = 2048 / 4096 /
// 8192: with 2, FP8 LayerNorm 0.737 / 0.740 / 0.705 -> 0.762 / 0.765 / 0.731 of copy, FP8
// RMSNorm +0.001-0.006, the residual forwards within 0.002; with 3, FP8 LayerNorm +0.01 only
// and the residual LayerNorm forward -0.01. 0: element by element.
#ifndef CUNORM_FUSED_FWD_WORDS
#define CUNORM_FUSED_FWD_WORDS 2
#endif

// Launch bounds of 1024 threads an SM (v45): NVRTC 13.0 (sm_90) gave the forward 56 registers
// and 16-28 bytes of spills left alone, 64 and none with the bound; bf16 LayerNorm residual
// forward 0.84-0.89 -> 0.87-0.90 of copy at N = 2048-8192 in two rounds, RMSNorm and FP8 out
// unchanged (NOTES v45). 0: the block size alone.
#ifndef CUNORM_FUSED_FWD_THREADS
#define CUNORM_FUSED_FWD_THREADS 1024
#endif
template <int TPR>
struct FusedFwdOccupancy {
  static constexpr int min_blocks = CUNORM_FUSED_FWD_THREADS / GroupShape<TPR>::kBlock;
};

template <typename T, typename R, typename H, typename O, typename W, int VEC, int PACKS, int TPR, bool RMS>
__global__ void __launch_bounds__(GroupShape<TPR>::kBlock, FusedFwdOccupancy<TPR>::min_blocks)
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
  constexpr bool kOnePass = !RMS && sizeof(T) == 2 && CUNORM_FUSED_ONE_PASS >= (IsFp8<O>::value ? 1 : 2);

  // Block-uniform loop: every thread runs every iteration, so the barriers in group_sum hold.
  for (i64 base = i64(blockIdx.x) * kRows; base < M; base += i64(gridDim.x) * kRows) {
    const i64 row = base + ty;
    const bool row_ok = row < M;
    const i64 safe_row = row_ok ? row : 0;
    const int limit = tile_limit(N, 0, kTile, row_ok);
    const T* xrow = x + xmap.offset(safe_row);
    const R* rrow = residual ? residual + rmap.offset(safe_row) : nullptr;
    A v[PACKS][VEC];
    constexpr bool kTileWords = CUNORM_FUSED_FWD_WORDS & 1, kParamWords = CUNORM_FUSED_FWD_WORDS & 2;
    auto load_h = [&]() {  // v = x (+ the residual), in float32
      load_tile<VEC, PACKS, TPR, kTileWords>(xrow, limit, lane, v);
      if (rrow) {
        A rv[PACKS][VEC];
        load_tile<VEC, PACKS, TPR, kTileWords>(rrow, limit, lane, rv);
#pragma unroll
        for (int p = 0; p < PACKS; ++p)
#pragma unroll
          for (int k = 0; k < VEC; ++k) v[p][k] += rv[p][k];
      }
    };
    load_h();
    if (rrow && h) {  // h is normalized as summed in float32, and written rounded to H
#pragma unroll
      for (int p = 0; p < PACKS; ++p)
        if (pack_col<VEC, TPR>(p, lane) < limit) store_pack<H>(h + safe_row * N + pack_col<VEC, TPR>(p, lane), v[p]);
    }
    A pivot = A(0), mu, var;
    A centre = A(0);  // what v still holds of its mean (one pass: the output loop takes it off)
    if constexpr (!RMS && (!kOnePass || CUNORM_FUSED_ONE_PASS_PIVOT))
      pivot = cvt<A>(xrow[0]) + (rrow ? cvt<A>(rrow[0]) : A(0));
    if (kOnePass && one_pass_tile<VEC, PACKS, TPR>(v, limit, lane, pivot, smem, mu, var)) {
      centre = mu;
    } else {  // (after a one pass it does not trust, v holds x - pivot)
      var = centre_tile<VEC, PACKS, TPR, RMS>(v, limit, lane, kOnePass ? A(0) : pivot, smem, mu) / A(N);
      // v113 (common.cuh pivot_far): a row far from its pivot, reloaded and centred again
      // about pivot + mu, with every group it shares barriers with
      if constexpr (!RMS) {
        if (groups_any<TPR>(row_ok && pivot_far(mu, var))) {
          load_h();
          pivot += mu;
          var = centre_tile<VEC, PACKS, TPR, RMS>(v, limit, lane, pivot, smem, mu) / A(N);
        }
      }
    }
    const A r = rsqrt_acc(var + eps);
    if (lane == 0 && row_ok && rstd) {  // inference callers may skip the statistics
      if (!RMS && mean) mean[row] = pivot + mu;
      rstd[row] = r;
    }
    const A centre_r = -centre * r;
    O* yrow = y + safe_row * N;
    // The output loop in a variant for what the call asks (uniform over the grid): a weight
    // offset to add, an amax to track, an FP8 scale; each one absent is an instruction an
    // element less, and this kernel is short of issue slots rather than bytes (NOTES v28).
    // FP8 without a bias, half-precision x (v58): y * scale = (x̂ * w) * (r * scale), the scale
    // folded into the row's rstd, and the row's amax r * max|x̂ * w| (r > 0; within an ulp or
    // two of max|y|): an instruction an element fewer. Otherwise y, |y| and y * scale element by
    // element.
    auto write_y = [&](auto add_offset, auto track_amax, auto fold) {
      constexpr bool kFold = decltype(fold)::value;
      const A rs = kFold ? r * out_scale : r;
      A row_top = A(0);
#pragma unroll
      for (int p = 0; p < PACKS; ++p) {
        const int col = pack_col<VEC, TPR>(p, lane);
        if (col >= limit) continue;
        A wv[VEC], bv[VEC], out[VEC];
        load_param<VEC, kParamWords>(weight, col, A(1), wv);  // 1 where there is no weight, offset or not
        if constexpr (!kFold) load_param<VEC, kParamWords>(bias, col, A(0), bv);
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          const A wk = decltype(add_offset)::value ? wv[k] + weight_offset : wv[k];
          if constexpr (kFold) {
            const A t = (kOnePass ? v[p][k] - centre : v[p][k]) * wk;
            if constexpr (decltype(track_amax)::value) row_top = fmaxf(row_top, fabsf(t));
            out[k] = t * rs;
          } else {
            out[k] = (kOnePass ? fmaf(v[p][k], r, centre_r) : v[p][k] * r) * wk + bv[k];
            if constexpr (decltype(track_amax)::value) top = fmaxf(top, fabsf(out[k]));
            if constexpr (IsFp8<O>::value || !CUNORM_FUSED_LEAN_Y) out[k] *= out_scale;  // 1 unless FP8
          }
        }
        if constexpr (CUNORM_FUSED_LEAN_Y) store_y<O>(yrow + col, out);
        else store_pack<O>(yrow + col, out);
      }
      if constexpr (kFold && decltype(track_amax)::value) top = fmaxf(top, row_top * r);
    };
    auto write = [&](auto add_offset, auto track_amax) {
      if constexpr (IsFp8<O>::value && CUNORM_FP8_FOLD_SCALE && sizeof(T) == 2) {  // float32 x: 54 -> 64 registers, spills
        if (!bias) return write_y(add_offset, track_amax, Flag<true>());
      }
      write_y(add_offset, track_amax, Flag<false>());
    };
    if (!CUNORM_FUSED_LEAN_Y) {
      write_y(Flag<true>(), Flag<true>(), Flag<false>());
    } else if (weight && weight_offset != A(0)) {
      if (amax) write(Flag<true>(), Flag<true>());
      else write(Flag<true>(), Flag<false>());
    } else {
      if (amax) write(Flag<false>(), Flag<true>());
      else write(Flag<false>(), Flag<false>());
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

// One pack of weight + offset in float32 (1 + offset where there is no weight: callers pass
// a null weight for packs past the row, where dy is zero).
template <int VEC, typename W>
__device__ __forceinline__ void load_weight(const W* weight, i64 col, float offset, float (&wv)[VEC]) {
  load_param<VEC>(weight, col, 1.0f, wv);
#pragma unroll
  for (int k = 0; k < VEC; ++k) wv[k] += offset;
}

// v73: the backward's weight slots (norm_bwd_fused below). 0: the weight loaded each row step.
#ifndef CUNORM_FUSED_BWD_WEIGHT_SMEM
#define CUNORM_FUSED_BWD_WEIGHT_SMEM 1
#endif

// Backward of the fused forward for rows one register tile holds, one pass over h, dy and dh:
//   dx = dh + rstd * (w'dy - mean(w'dy) - xhat * mean(w'dy * xhat)),  w' = w + offset,
// written in X and, where dres is given, again in H as the residual's gradient (h = x + r
// passes dh and the norm's gradient to both). The mean(w'dy) term is absent for RMSNorm. dh
// and dres are contiguous and may be null. Row groups are persistent and write their dW =
// sum(dy * xhat), dB = sum(dy) partial rows as norm_bwd does (norm_reduce_partials folds them).
// Occupancy as the plain backward's by h's width (h is dy's dtype or wider: float32 h with
// half dy held to 64 registers spilled 8-16 bytes).
template <typename T, typename H, typename X, typename W, int VEC, int PACKS, int TPR, bool RMS>
__global__ void __launch_bounds__(GroupShape<TPR>::kBlock, (BwdOccupancy<H, VEC, PACKS, TPR>::min_blocks))
norm_bwd_fused(const T* __restrict__ dy, CUNORM_ROWMAP_PARAMS(dym), const H* __restrict__ h,
               CUNORM_ROWMAP_PARAMS(hm), const H* __restrict__ dh, const W* __restrict__ weight,
               const float* __restrict__ mean, const float* __restrict__ rstd, X* __restrict__ dx,
               H* __restrict__ dres, float* __restrict__ dw_part, float* __restrict__ db_part, i64 M, i64 N,
               float weight_offset) {
  typedef float A;
  constexpr int kRows = GroupShape<TPR>::kRows;
  constexpr i64 kTile = i64(TPR) * PACKS * VEC;
  __shared__ A smem[2 * kWarp];
  const RowMap dymap = CUNORM_ROWMAP(dym), hmap = CUNORM_ROWMAP(hm);
  const int lane = threadIdx.x % TPR, ty = threadIdx.x / TPR;
  A dw_acc[PACKS][VEC], db_acc[PACKS][VEC];
  zero_tile(dw_acc);
  zero_tile(db_acc);

  // Rows staged through shared memory as norm_bwd's (row_norm.cuh): dynamic shared memory
  // [depth buffers][h packs in H, dy packs in T][PACKS][block] (_fused.stage_bytes); the rows'
  // mean and rstd in `stats` where StagePolicy stages them.
  constexpr bool kStaged = Staged<T, VEC>::value;
  constexpr int kBlock = GroupShape<TPR>::kBlock, kSet = PACKS * kBlock, kDepth = StagePolicy<TPR, RMS>::depth;
  constexpr int kBuffer = kSet * int(sizeof(Pack<H, VEC>) + sizeof(Pack<T, VEC>));
  extern __shared__ __align__(16) unsigned char stage_smem[];
  // a slot a warp (stage_stats) or, v85, a row group (SharedStatsRing); unreferenced unless staged
  constexpr bool kSharedStats = kStaged && SharedStats<TPR, RMS>::value;
  __shared__ A stats[kSharedStats ? (kDepth + 1) * 2 : kDepth * 2 * StatsSlots<TPR, kBlock>::value];
  SharedStatsRing<RMS, kDepth> shared_stats;
  auto h_slots = [&](int buf) { return reinterpret_cast<Pack<H, VEC>*>(stage_smem + buf * kBuffer); };
  auto dy_slots = [&](int buf) {
    return reinterpret_cast<Pack<T, VEC>*>(stage_smem + buf * kBuffer + kSet * int(sizeof(Pack<H, VEC>)));
  };
  const i64 step = i64(gridDim.x) * kRows;
  // rows past M stage zeros, never read; `refill`: also the statistics a step further (v85)
  auto stage_row = [&](i64 base, int buf, bool refill) {
    const i64 r = base + ty;
    const i64 safe = r < M ? r : 0;
    const int limit = tile_limit(N, 0, kTile, r < M);
    stage_tile<VEC, PACKS, TPR, kBlock>(h_slots(buf), h + hmap.offset(safe), limit, lane);
    stage_tile<VEC, PACKS, TPR, kBlock>(dy_slots(buf), dy + dymap.offset(safe), limit, lane);
    if constexpr (!kSharedStats) stage_stats<RMS, TPR, kBlock>(stats, buf, mean, rstd, r, M);
    else if (refill) shared_stats.refill(stats, mean, rstd, r + step, M);
    copies_commit();
  };
  // v73: the weight (+ offset) widened once into shared memory (row_norm.cuh stage_weight, v71
  // for norm_bwd), read back in both passes. H200, two rounds (results/sweep-bwd-overhead-v73-
  // stats-h200.txt), bf16 N = 2048 / 4096 / 8192: LayerNorm 0.82 / 0.81 / 0.79 -> 0.86 / 0.85 /
  // 0.84, RMSNorm 0.84 / 0.84 / 0.85 -> 0.88 / 0.88 / 0.89 of copy.
  constexpr bool kWeightSlots =
      CUNORM_FUSED_BWD_WEIGHT_SMEM && kStaged && VEC % 4 == 0 &&
      WeightSlotsFit<kDepth * kSet * int(sizeof(Pack<H, VEC>) + sizeof(Pack<T, VEC>)), PACKS * VEC * 4 * kBlock>::value;
  __shared__ __align__(16) float4 wslots[kWeightSlots ? PACKS * VEC / 4 * kBlock : 1];
  if constexpr (kWeightSlots) stage_weight<VEC, PACKS, TPR, kBlock>(wslots, weight, 0, N, lane, weight_offset);
  StageRing<kDepth> ring;
  if constexpr (kSharedStats) shared_stats.fill(stats, mean, rstd, i64(blockIdx.x) * kRows + ty, step, M);
  if constexpr (kStaged) ring.fill([&](int ahead, int b) { stage_row(i64(blockIdx.x) * kRows + ahead * step, b, false); });
  if constexpr (kSharedStats) shared_stats.arrived();

  for (i64 base = i64(blockIdx.x) * kRows; base < M; base += step) {  // block-uniform
    const i64 row = base + ty;
    const bool row_ok = row < M;
    const i64 safe_row = row_ok ? row : 0;
    const int limit = tile_limit(N, 0, kTile, row_ok);
    A xv[PACKS][VEC], g[PACKS][VEC];
    RowStats<A> st;
    if constexpr (kStaged) {
      ring.refill_and_wait([&](int ahead, int b) { stage_row(base + ahead * step, b, true); });
      unstage_tile<VEC, PACKS, kBlock>(h_slots(ring.buf), xv);
      unstage_tile<VEC, PACKS, kBlock>(dy_slots(ring.buf), g);
      if constexpr (kSharedStats) {
        st = shared_stats.current(stats);
        shared_stats.advance();
      } else {
        st = staged_stats<RMS, TPR, kBlock>(stats, ring.buf, mean, rstd, row, M);
      }
      ring.advance();
    } else {
      load_tile<VEC, PACKS, TPR>(h + hmap.offset(safe_row), limit, lane, xv);
      load_tile<VEC, PACKS, TPR>(dy + dymap.offset(safe_row), limit, lane, g);
      st = row_stats<RMS>(mean, rstd, row, M);
    }
    // v61 (row_norm.cuh, WdyInPlace): the first pass accumulates dW / dB and leaves
    // (w + offset) * dy in g, so the dx pass loads no weight; a row past M then takes 0 for
    // its statistics (row 0's need not be finite) and adds zeros. LayerNorm only: two-round
    // H200 sweep, bf16 N = 2048-8192, LayerNorm +0.005-0.010 of copy, RMSNorm -0.002-0.007
    constexpr bool kInPlace = WdyInPlace<T>::value && !RMS;
    const A mu = kInPlace && !row_ok ? A(0) : st.mean, r = kInPlace && !row_ok ? A(0) : st.rstd;
    auto weight_at = [&](int p, int col, bool inside, A (&wv)[VEC]) {
      if constexpr (kWeightSlots) read_weight_slot<VEC, kBlock>(wslots, p, wv);
      else load_weight<VEC>(inside ? weight : nullptr, col, weight_offset, wv);
    };
    A c1, c2;
    if constexpr (kInPlace) {
      xhat_sums_wdy_with<VEC, PACKS, TPR, true>(xv, g, weight_at, limit, lane, mu, r, c1, c2, dw_acc, db_acc);
    } else {
      xhat_and_sums_with<VEC, PACKS, TPR>(xv, g, weight_at, limit, lane, mu, r, c1, c2);
    }
    if constexpr (RMS) c2 = group_sum<TPR>(c2, smem);
    else group_sum2<TPR, kPairedRowSums<TPR>>(c1, c2, smem);
    const A m1 = RMS ? A(0) : c1 / A(N), m2 = c2 / A(N);
    const A a = -r * m1, b = -r * m2;
#pragma unroll
    for (int p = 0; p < PACKS; ++p) {
      const int col = pack_col<VEC, TPR>(p, lane);
      if (col >= limit) continue;
      const i64 at = safe_row * N + col;
      A wv[VEC], dhv[VEC], out[VEC];
      if constexpr (!kInPlace) weight_at(p, col, true, wv);
      load_param<VEC>(dh ? dh + at : nullptr, 0, A(0), dhv);
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        if constexpr (kInPlace) {
          out[k] = dhv[k] + (r * g[p][k] + (xv[p][k] * b + a));
        } else {
          out[k] = dhv[k] + r * (wv[k] * g[p][k] - m1 - xv[p][k] * m2);
          dw_acc[p][k] += g[p][k] * xv[p][k];
          db_acc[p][k] += g[p][k];
        }
      }
      store_pack<X>(dx + at, out);
      if (dres) store_pack<H>(dres + at, out);
    }
  }
  if constexpr (kStaged) copies_wait<0>();  // the copies past the last row land before the block's shared memory goes
  store_partials<VEC, PACKS, TPR>(dw_acc, db_acc, dw_part, db_part, i64(blockIdx.x) * kRows + ty, N, 0, lane);
}
