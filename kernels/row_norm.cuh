// Per-thread pieces of the row kernels (layer_norm.cu) that the cluster kernels
// (layer_norm_cluster.cu) share: a tile's pack layout, its loads, and the backward's two row
// sums and dx for one tile. Backward: dx = rstd * (w*dy - mean(w*dy) - xhat * mean(w*dy*xhat)),
// without the mean(w*dy) term for RMSNorm.
#pragma once
#include "common.cuh"

namespace cunorm {

// Where the paired sums pay (benchmarks/sweep_paired_sums.py, H200, two rounds within 0.002,
// bf16 LayerNorm backward of copy, two butterflies -> paired): norm_bwd's 1024-thread rows
// (N = 8192) 0.799 -> 0.859, 512 (4096) 0.860 -> 0.868, the fused residual backward
// +0.004-0.012; but rows of 64-256 threads -0.005-0.007, the wide block (16384) 0.713 ->
// 0.691 and the FP8 LayerNorm forward's one-pass sums -0.013-0.019. So the row backwards
// pair their sums from 512 threads a row and every other caller keeps two butterflies.
template <int TPR>
constexpr bool kPairedRowSums = CUNORM_PAIRED_SUM2 && TPR >= 512;

// A row group of TPR threads; groups smaller than 128 threads share a 128-thread block.
template <int TPR>
struct GroupShape {
  static constexpr int kBlock = TPR < 128 ? 128 : TPR;  // threads per block
  static constexpr int kRows = kBlock / TPR;            // row groups per block
};

// Columns of this thread's pack p, relative to the tile start. A pack is either wholly in
// the row or wholly out (VEC > 1 only when N % VEC == 0), so validity is one 32-bit compare
// per pack against `limit`, the tile's valid length (0 for a row past the end).
template <int VEC, int TPR>
__device__ __forceinline__ int pack_col(int p, int lane) { return (p * TPR + lane) * VEC; }

__device__ __forceinline__ int tile_limit(i64 N, i64 c0, i64 tile, bool row_ok) {
  return row_ok ? int(N - c0 < tile ? N - c0 : tile) : 0;
}

// Loads this thread's part of a tile into registers, zeros outside the row (WORDS: bf16
// packs widened a 32-bit word at a time, common.cuh widen; STREAM: loaded with .cs, v118).
template <int VEC, int PACKS, int TPR, bool WORDS = false, bool STREAM = false, typename A, typename T>
__device__ __forceinline__ void load_tile(const T* tile, int limit, int lane, A (&v)[PACKS][VEC]) {
#pragma unroll
  for (int p = 0; p < PACKS; ++p) {
    if (pack_col<VEC, TPR>(p, lane) < limit) {
      widen<WORDS>(load_raw<VEC, STREAM>(tile + pack_col<VEC, TPR>(p, lane)), v[p]);
    } else {
#pragma unroll
      for (int k = 0; k < VEC; ++k) v[p][k] = A(0);
    }
  }
}

// A row's saved statistics for the backward (mean 0 for RMSNorm; row 0's for rows past M,
// whose results are never stored).
template <typename A>
struct RowStats {
  A mean, rstd;
};

template <bool RMS, typename A>
__device__ __forceinline__ RowStats<A> row_stats(const A* __restrict__ mean, const A* __restrict__ rstd, i64 row,
                                                 i64 M) {
  const i64 safe = row < M ? row : 0;
  return RowStats<A>{RMS ? A(0) : mean[safe], rstd[safe]};
}

// Optional affine parameter of one pack: `fill` where absent (WORDS as load_tile's).
template <int VEC, bool WORDS = false, typename A, typename W>
__device__ __forceinline__ void load_param(const W* p, i64 col, A fill, A (&out)[VEC]) {
  if (p) {
    load_pack<A, W, VEC, WORDS>(p + col, out);
  } else {
#pragma unroll
    for (int k = 0; k < VEC; ++k) out[k] = fill;
  }
}

// Backward's per-thread part of the two row sums: turns x into xhat in place and adds up
// w*dy and w*dy*xhat, w from weight_at(p, col, inside the row, w pack) for the thread's pack
// p. Packs outside the row hold x = dy = 0 and add nothing. IN_PLACE (v61, xhat_sums_wdy_with): each element's dy and
// xhat go to `accumulate(p, k, dy, xhat)` first, and g is left holding w*dy.
template <int VEC, int PACKS, int TPR, bool IN_PLACE, typename A, typename G, typename WeightAt, typename Accumulate>
__device__ __forceinline__ void xhat_sums_pass(A (&xv)[PACKS][VEC], G (&g)[PACKS][VEC], WeightAt&& weight_at,
                                               int limit, int lane, A mu, A r, A& c1, A& c2, Accumulate&& accumulate) {
  c1 = A(0);
  c2 = A(0);
#pragma unroll
  for (int p = 0; p < PACKS; ++p) {
    const int col = pack_col<VEC, TPR>(p, lane);
    A wv[VEC];
    weight_at(p, col, col < limit, wv);
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      xv[p][k] = (xv[p][k] - mu) * r;
      if constexpr (IN_PLACE) accumulate(p, k, g[p][k], xv[p][k]);
      const A wdy = wv[k] * g[p][k];
      c1 += wdy;
      c2 += wdy * xv[p][k];
      if constexpr (IN_PLACE) g[p][k] = wdy;
    }
  }
}

template <int VEC, int PACKS, int TPR, typename A, typename WeightAt>
__device__ __forceinline__ void xhat_and_sums_with(A (&xv)[PACKS][VEC], const A (&g)[PACKS][VEC],
                                                   WeightAt&& weight_at, int limit, int lane, A mu, A r, A& c1,
                                                   A& c2) {
  xhat_sums_pass<VEC, PACKS, TPR, false>(xv, g, weight_at, limit, lane, mu, r, c1, c2, [](int, int, A, A) {});
}

// The same with the weight itself (1 where absent) for the tile at c0.
template <int VEC, int PACKS, int TPR, typename A, typename W>
__device__ __forceinline__ void xhat_and_sums(A (&xv)[PACKS][VEC], const A (&g)[PACKS][VEC], const W* weight,
                                              i64 c0, int limit, int lane, A mu, A r, A& c1, A& c2) {
  xhat_and_sums_with<VEC, PACKS, TPR>(
      xv, g, [&](int, int col, bool inside, A (&wv)[VEC]) { load_param<VEC>(inside ? weight : nullptr, c0 + col, A(1), wv); },
      limit, lane, mu, r, c1, c2);
}

// Row r's x and dy tiles at c0, widened to the accumulation type (zeros outside the row;
// r past M has none).
template <int VEC, int PACKS, int TPR, typename A, typename T>
__device__ __forceinline__ void load_row(const T* dy, const RowMap& dymap, const T* x, const RowMap& xmap, i64 r,
                                         i64 M, i64 N, i64 c0, int lane, A (&xv)[PACKS][VEC], A (&g)[PACKS][VEC]) {
  const bool ok = r < M;
  const i64 safe = ok ? r : 0;
  const int limit = tile_limit(N, c0, i64(TPR) * PACKS * VEC, ok);
  load_tile<VEC, PACKS, TPR>(x + xmap.offset(safe) + c0, limit, lane, xv);
  load_tile<VEC, PACKS, TPR>(dy + dymap.offset(safe) + c0, limit, lane, g);
}

// dx for this thread's packs of one row's tile from xhat (xv), dy (g) and the row's two
// means m1 = mean(w*dy) (0 for RMSNorm) and m2 = mean(w*dy*xhat); with ACC, adds dy*xhat
// and dy into the dW / dB accumulators of the tile's columns.
template <typename T, int VEC, int PACKS, int TPR, bool ACC, typename A, typename W>
__device__ __forceinline__ void dx_tile(const A (&xv)[PACKS][VEC], const A (&g)[PACKS][VEC], const W* weight,
                                        A r, A m1, A m2, T* dxtile, i64 c0, int limit, int lane,
                                        A (&dw_acc)[PACKS][VEC], A (&db_acc)[PACKS][VEC]) {
#pragma unroll
  for (int p = 0; p < PACKS; ++p) {
    const int col = pack_col<VEC, TPR>(p, lane);
    if (col >= limit) continue;
    A wv[VEC], out[VEC];
    load_param<VEC>(weight, c0 + col, A(1), wv);
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      out[k] = r * (wv[k] * g[p][k] - m1 - xv[p][k] * m2);
      if constexpr (ACC) {
        dw_acc[p][k] += g[p][k] * xv[p][k];
        db_acc[p][k] += g[p][k];
      }
    }
    store_pack_whole<T>(dxtile + col, out);
  }
}

// v61 (sixteenth session): the backward's first pass over a row's tile also adds dy * xhat and
// dy into the dW / dB accumulators and leaves w * dy in g, and the dx pass takes
// r * (w*dy - m1 - xhat*m2) as two multiply-adds with the row's -r*m1 and -r*m2: no weight
// loaded or widened again, and two instructions an element fewer in all. The half-precision
// backward at N = 1024-8192 is short of issue slots as much as of bytes (ncu, NOTES "Next").
// The sums and the accumulators keep their bits; dx moves by the multiply-adds' rounding.
// Two-round H200 sweep (NOTES v61): bf16 norm_bwd N = 1024-8192 +0.025-0.035 of copy; the
// fused LayerNorm backward +0.005-0.010. The cluster backwards (-0.06-0.08) and the fused
// RMSNorm backward (-0.002-0.007) lost, so they keep dx_tile. 0: dx_tile everywhere.
#ifndef CUNORM_BWD_WDY_IN_PLACE
#define CUNORM_BWD_WDY_IN_PLACE 1
#endif
// Half-precision rows only: the float32 tile of 16 values (norm_bwd<float, float, 4, 4, 256>)
// went from 122 registers to 157, one block an SM instead of two (NVRTC 13, sm_90).
template <typename T>
struct WdyInPlace {
  static constexpr bool value = CUNORM_BWD_WDY_IN_PLACE && sizeof(T) == 2;
};

// With ACC every pack adds into the accumulators, the row's valid ones and the rest: callers
// pass zeros for x and dy outside the row (load_tile, stage_tile) and a finite mean and rstd
// (0 for a row past M), so the rest add zeros, and only into columns past N, which are never
// stored. A test per pack held the bf16 tile to 64 registers with spills.
// `weight_at(p, col, inside, wv)` gives the weight of pack p, at tile column col, as in
// xhat_and_sums_with.
template <int VEC, int PACKS, int TPR, bool ACC, typename A, typename WeightAt>
__device__ __forceinline__ void xhat_sums_wdy_with(A (&xv)[PACKS][VEC], A (&g)[PACKS][VEC], WeightAt&& weight_at,
                                                   int limit, int lane, A mu, A r, A& c1, A& c2,
                                                   A (&dw_acc)[PACKS][VEC], A (&db_acc)[PACKS][VEC]) {
  xhat_sums_pass<VEC, PACKS, TPR, true>(xv, g, weight_at, limit, lane, mu, r, c1, c2, [&](int p, int k, A dy, A xh) {
    if constexpr (ACC) {  // every pack: see the contract above
      dw_acc[p][k] += dy * xh;
      db_acc[p][k] += dy;
    }
  });
}

template <int VEC, int PACKS, int TPR, bool ACC, typename A, typename W>
__device__ __forceinline__ void xhat_sums_wdy(A (&xv)[PACKS][VEC], A (&g)[PACKS][VEC], const W* weight, i64 c0,
                                              int limit, int lane, A mu, A r, A& c1, A& c2,
                                              A (&dw_acc)[PACKS][VEC], A (&db_acc)[PACKS][VEC]) {
  xhat_sums_wdy_with<VEC, PACKS, TPR, ACC>(
      xv, g, [&](int, int col, bool inside, A (&wv)[VEC]) { load_param<VEC>(inside ? weight : nullptr, c0 + col, A(1), wv); },
      limit, lane, mu, r, c1, c2, dw_acc, db_acc);
}

// dx for this thread's packs from xhat (xv) and w * dy (wdy), xhat_sums_wdy's outputs.
template <typename T, int VEC, int PACKS, int TPR, typename A>
__device__ __forceinline__ void dx_from_wdy(const A (&xv)[PACKS][VEC], const A (&wdy)[PACKS][VEC], A r, A m1, A m2,
                                            T* dxtile, int limit, int lane) {
  const A a = -r * m1, b = -r * m2;
#pragma unroll
  for (int p = 0; p < PACKS; ++p) {
    const int col = pack_col<VEC, TPR>(p, lane);
    if (col >= limit) continue;
    A out[VEC];
#pragma unroll
    for (int k = 0; k < VEC; ++k) out[k] = r * wdy[p][k] + (xv[p][k] * b + a);
    store_pack_whole<T>(dxtile + col, out);
  }
}

// The backward's two passes over a row's tile, as IN_PLACE (WdyInPlace<T>) picks: the first
// turns xv into xhat and gives the row sums c1 = sum(w*dy), c2 = sum(w*dy*xhat) (and, v61,
// accumulates and leaves w*dy in g); the second writes dx (and, before v61, accumulates).
template <int VEC, int PACKS, int TPR, bool ACC, bool IN_PLACE, typename A, typename W>
__device__ __forceinline__ void bwd_first_pass(A (&xv)[PACKS][VEC], A (&g)[PACKS][VEC], const W* weight, i64 c0,
                                               int limit, int lane, A mu, A r, A& c1, A& c2,
                                               A (&dw_acc)[PACKS][VEC], A (&db_acc)[PACKS][VEC]) {
  if constexpr (IN_PLACE) {
    xhat_sums_wdy<VEC, PACKS, TPR, ACC>(xv, g, weight, c0, limit, lane, mu, r, c1, c2, dw_acc, db_acc);
  } else {
    xhat_and_sums<VEC, PACKS, TPR>(xv, g, weight, c0, limit, lane, mu, r, c1, c2);
  }
}

template <typename T, int VEC, int PACKS, int TPR, bool ACC, bool IN_PLACE, typename A, typename W>
__device__ __forceinline__ void bwd_dx_pass(const A (&xv)[PACKS][VEC], const A (&g)[PACKS][VEC], const W* weight,
                                            A r, A m1, A m2, T* dxtile, i64 c0, int limit, int lane,
                                            A (&dw_acc)[PACKS][VEC], A (&db_acc)[PACKS][VEC]) {
  if constexpr (IN_PLACE) {
    dx_from_wdy<T, VEC, PACKS, TPR>(xv, g, r, m1, m2, dxtile, limit, lane);
  } else {
    dx_tile<T, VEC, PACKS, TPR, ACC>(xv, g, weight, r, m1, m2, dxtile, c0, limit, lane, dw_acc, db_acc);
  }
}

// Two-pass statistics of one tile held in registers: v becomes v - pivot - mu (the centred
// values) and the group's sum of their squares is returned; mu is the tile mean of v - pivot
// (LayerNorm; RMSNorm leaves pivot and mu at 0 and sums plain squares). The pivot (the
// row's first element) keeps a large common offset's digits (1e4 + noise in fp32), which a
// plain fp32 sum of the raw values would lose. Every thread of the block calls it together.
template <int VEC, int PACKS, int TPR, bool RMS, typename A>
__device__ __forceinline__ A centre_tile(A (&v)[PACKS][VEC], int limit, int lane, A pivot, A* smem, A& mu) {
  mu = A(0);
  if constexpr (!RMS) {
    A s = A(0);
#pragma unroll
    for (int p = 0; p < PACKS; ++p) {
      if (pack_col<VEC, TPR>(p, lane) >= limit) continue;
#pragma unroll
      for (int k = 0; k < VEC; ++k) { v[p][k] -= pivot; s += v[p][k]; }
    }
    mu = group_sum<TPR>(s, smem) / A(limit > 0 ? limit : 1);
  }
  A q = A(0);  // second pass over the registers: squared deviations from the exact tile mean
#pragma unroll
  for (int p = 0; p < PACKS; ++p) {
    if (pack_col<VEC, TPR>(p, lane) >= limit) continue;
#pragma unroll
    for (int k = 0; k < VEC; ++k) { v[p][k] -= mu; q += v[p][k] * v[p][k]; }
  }
  return group_sum<TPR>(q, smem);
}

// LayerNorm statistics in one pass where that is safe (half-precision rows: the cluster
// forward's v50, the fused forward's v60). The shifted sums of d = v - pivot and d^2 go
// through one reduction, var = E[d^2] - E[d]^2. The cancellation costs a relative error of
// about eps * (1 + (mean - pivot)^2 / var) in var, so a row whose (mean - pivot)^2 exceeds
// kOnePassTrust * var (its first element an outlier, or a constant row) takes the two passes
// after all. Below that one pass loses at most ~6 bits of var against two (1e-4 relative at
// worst), against bf16's 4e-3 spacing.
constexpr int kOnePassTrust = 64;

// Float32 rows (v112, the cluster forward) are held to float32's tolerance, 2e-5 against the
// float64 reference, not bf16's: mean^2 <= 4 var (within two standard deviations of zero).
// An emulation of the kernel's float32 sums (32 values a thread in order, then a tree) over
// rows of 262144 normal values put y's error at 1.6e-6 at most at a mean of 2 sigma (rstd
// 3e-7), against 3e-5 at 8 sigma (the half-precision trust's edge); rows further out than 2
// sigma take the two passes.
constexpr int kOnePassTrustF32 = 4;

// Whether one pass's statistics serve a row of this mean (of d) and var (false for NaN and
// inf rows too); TRUST: kOnePassTrust, or kOnePassTrustF32 for float32 rows.
template <typename A, int TRUST = kOnePassTrust>
__device__ __forceinline__ bool one_pass_trusted(A mu, A var) {
  return mu * mu <= A(TRUST) * var;
}

// Whether `flag` holds in any row group that shares barriers with this one (group_sum2_any's
// answer without the sums): a branch on it is uniform wherever the reductions inside need
// every thread.
template <int TPR>
__device__ __forceinline__ bool groups_any(bool flag) {
  if constexpr (TPR <= kWarp) {
    return warp_any(flag);
  } else {
    const bool any = __syncthreads_or(flag);
    return CUNORM_UNIFORM_ANY ? warp_any(any) : any;
  }
}

// A one pass's sums s of d and ss of d^2 over `count` values, summed over the row group in
// place (group_sum2_any): true where this group or one it shares barriers with does not
// trust them.
template <int TPR, typename A>
__device__ __forceinline__ bool one_pass_distrusted(A& s, A& ss, A count, A* smem) {
  return group_sum2_any<TPR>(s, ss, smem, [count](A a, A b) {
    const A m = a / count;
    return !one_pass_trusted(m, b / count - m * m);
  });
}

// This thread's sums of d = v - pivot and of d^2 over its packs inside the row; v becomes d.
template <int VEC, int PACKS, int TPR, typename A>
__device__ __forceinline__ void shifted_sums(A (&v)[PACKS][VEC], int limit, int lane, A pivot, A& s, A& ss) {
  s = A(0);
  ss = A(0);
#pragma unroll
  for (int p = 0; p < PACKS; ++p) {
    if (pack_col<VEC, TPR>(p, lane) >= limit) continue;
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      v[p][k] -= pivot;
      s += v[p][k];
      ss += v[p][k] * v[p][k];
    }
  }
}

// One pass over a tile (centre_tile's arguments): v becomes d = v - pivot, mu the tile mean
// of d and var the tile variance. False where this group or one it shares barriers with
// (group_sum2_any) does not trust the one pass: its caller then runs centre_tile on v with a
// pivot of 0 (v already holds d), every thread of the block together.
template <int VEC, int PACKS, int TPR, typename A>
__device__ __forceinline__ bool one_pass_tile(A (&v)[PACKS][VEC], int limit, int lane, A pivot, A* smem, A& mu,
                                              A& var) {
  A s, ss;
  shifted_sums<VEC, PACKS, TPR>(v, limit, lane, pivot, s, ss);
  const A count = A(limit > 0 ? limit : 1);
  const bool distrusted = one_pass_distrusted<TPR>(s, ss, count, smem);
  mu = s / count;
  var = ss / count - mu * mu;
  return !distrusted;
}

template <int VEC, int PACKS, typename A>
__device__ __forceinline__ void zero_tile(A (&v)[PACKS][VEC]) {
#pragma unroll
  for (int p = 0; p < PACKS; ++p)
#pragma unroll
    for (int k = 0; k < VEC; ++k) v[p][k] = A(0);
}

// A persistent row group's dW / dB accumulators for its tile's columns, as partial row
// `group` of dw_part / db_part [G, N] (either may be null); norm_reduce_partials folds them.
template <int VEC, int PACKS, int TPR, typename A>
__device__ __forceinline__ void store_partials(const A (&dw_acc)[PACKS][VEC], const A (&db_acc)[PACKS][VEC],
                                               A* dw_part, A* db_part, i64 group, i64 N, i64 c0, int lane) {
#pragma unroll
  for (int p = 0; p < PACKS; ++p) {
    const i64 col = c0 + pack_col<VEC, TPR>(p, lane);
    if (col >= N) continue;
    if (dw_part) store_pack_whole<A>(dw_part + group * N + col, dw_acc[p]);
    if (db_part) store_pack_whole<A>(db_part + group * N + col, db_acc[p]);
  }
}

// The full-row backwards' occupancy: one-pack tiles (16 bytes of x a thread) are held to 64
// registers a thread, so two 512-thread blocks share an SM: left alone, NVRTC gave the bf16
// 512-thread tile 72 (one block an SM).
template <typename T, int VEC, int PACKS, int TPR>
struct BwdOccupancy {
  static constexpr int min_blocks = PACKS * VEC * sizeof(T) <= 16 ? 1024 / GroupShape<TPR>::kBlock : 1;
};

// ---- row tiles staged through shared memory (backward, v19) ------------------------------
// A persistent row group copies its next row's tiles global -> shared with cp.async while it
// reduces the current row, so loads stay in flight through the barriers without holding
// registers (a register prefetch spilled at the one-pack tiles' 64 registers, NOTES v7).
// Each thread copies and later reads only its own 16-byte chunks, so waiting on its own
// copies (no barrier) makes them visible to it. Tiles of 16-byte packs only.
#ifndef CUNORM_BWD_STAGE
#define CUNORM_BWD_STAGE 1  // 0: the backward loads rows straight into registers
#endif

template <typename T, int VEC>
struct Staged {  // whether the backward stages rows of T in VEC-packs (the host mirrors this)
  static constexpr bool value = CUNORM_BWD_STAGE && sizeof(T) == 2 && VEC * sizeof(T) == 16;
};

// How a staged backward tile of TPR threads a row stages (v44; the host mirrors the depth in
// cunorm/_config.py bwd_stage_depth, whose comment holds the measurements of both):
//   depth: rows in its buffers, the current one and depth - 1 in flight;
//   stats: each row's mean and rstd staged with its tiles (stage_stats below).
// CUNORM_BWD_STAGE_DEPTH (2-4) / CUNORM_BWD_STAGE_STATS (0, 1) force one choice for every
// tile (benchmarks/sweep_bwd_stage.py, with the host's _row_norm.STAGE_DEPTH).
#ifndef CUNORM_BWD_STAGE_DEPTH
#define CUNORM_BWD_STAGE_DEPTH 0
#endif
#ifndef CUNORM_BWD_STAGE_STATS
#define CUNORM_BWD_STAGE_STATS -1
#endif
template <int TPR, bool RMS>
struct StagePolicy {
  static constexpr bool kWarpRows = TPR <= 32, kSmRows = TPR >= 1024;  // a warp a row / a block an SM
  // v74: rows of 128 threads or more stage their statistics. With v70-v72 in, two rounds on the
  // H200 (benchmarks/sweep_bwd_overhead.py, results/sweep-bwd-overhead-v73-stats-h200.txt), bf16
  // backward of copy: LayerNorm N = 1024 / 2048 / 4096 0.77 / 0.74 / 0.71 -> 0.85 / 0.88 /
  // 0.86, RMSNorm 0.82 / 0.79 / 0.76 -> 0.83 / 0.85 / 0.78; at N = 512 (warp rows of two
  // packs) they lost 0.01 / 0.04, so rows under 128 threads load them late still (64-thread
  // rows were not measured). Before v71 (NOTES v44) rows under 1024 threads lost with them.
  static constexpr int kStatsFrom = 128;
  static constexpr int depth = CUNORM_BWD_STAGE_DEPTH > 0 ? CUNORM_BWD_STAGE_DEPTH
                               : kWarpRows ? 3 : kSmRows ? (RMS ? 2 : 3) : 2;  // v75: 2 for RMSNorm too
  static constexpr bool stats = CUNORM_BWD_STAGE_STATS >= 0 ? bool(CUNORM_BWD_STAGE_STATS) : TPR >= kStatsFrom;
  static_assert(depth >= 2, "a staged backward keeps at least the next row in flight");
};

// The buffer ring of a staged backward loop: DEPTH buffers, the current row's in `buf` and
// the next DEPTH - 1 rows' copies in flight behind it. `stage(ahead, b)` copies the row
// `ahead` row steps past the loop's current one into buffer b and commits them.
template <int DEPTH>
struct StageRing {
  int buf = 0;
  // Before the loop: the first DEPTH - 1 rows (steps 0 .. DEPTH - 2 from the first row).
  template <typename F>
  __device__ __forceinline__ void fill(F&& stage) {
#pragma unroll
    for (int d = 0; d < DEPTH - 1; ++d) stage(d, d);
  }
  // At the top of a row step: the row DEPTH - 1 steps ahead into the buffer the previous step
  // read (the caller then waits for this step's row its own way: v86's mbarriers).
  template <typename F>
  __device__ __forceinline__ void refill(F&& stage) {
    stage(DEPTH - 1, buf == 0 ? DEPTH - 1 : buf - 1);
  }
  // refill, then wait until this step's row has arrived (cp.async groups).
  template <typename F>
  __device__ __forceinline__ void refill_and_wait(F&& stage) {
    refill(stage);
    copies_wait<DEPTH - 1>();
  }
  __device__ __forceinline__ void advance() { buf = buf == DEPTH - 1 ? 0 : buf + 1; }
};

// One 16-byte slot of shared memory, read anew at every call: a plain load would let the
// compiler keep the values of one pass in registers for the next (the registers the
// shared-memory forward exists to free).
template <typename T, int VEC>
__device__ __forceinline__ Pack<T, VEC> read_slot(const Pack<T, VEC>* slot) {
  static_assert(sizeof(Pack<T, VEC>) == 16, "slots are 16-byte chunks");
  Pack<T, VEC> pk;
#if defined(CUNORM_HIP)
  const volatile unsigned* word = reinterpret_cast<const volatile unsigned*>(slot);
  const uint4 u = make_uint4(word[0], word[1], word[2], word[3]);
#else
  uint4 u;
  const unsigned a = shared_address(slot);
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w) : "r"(a));
#endif
  *reinterpret_cast<uint4*>(&pk) = u;
  return pk;
}

// ---- rows held in shared memory (the full-row forward, v22) ------------------------------
// The full-row forward of 16-byte packs copies its row into shared memory with cp.async
// instead of registers, each thread its own slots, and reads it back once per pass (mean,
// squared deviations, output): no value is live in registers through the reductions, so more
// blocks fit an SM and more loads are in flight (benchmarks/NOTES.md, v22). Up to 64 KiB a
// block (v29: bf16 N = 32768). Half precision and float32 (v31); the host picks the tiles
// (_config.smem_fwd_config).
template <typename T, typename W, int VEC, int PACKS, int TPR>
struct FwdInSmem {  // the host mirrors this (_row_norm.smem_row_config) and picks norm_fwd_smem
  static constexpr bool value = sizeof(T) <= 4 && VEC * sizeof(T) == 16 && GroupShape<TPR>::kBlock * PACKS * 16 <= 65536;
  // Threads an SM the launch bounds ask for (NVRTC -Xptxas -v, sm_90): 2048 at 32 registers;
  // float32 parameters (twice a pack's weight and bias bytes) spilled 8 bytes there, so 1536
  // at 40. Left alone NVRTC gave 32-40 (no bound) or more.
  static constexpr int min_blocks = (sizeof(W) > sizeof(T) ? 1536 : 2048) / GroupShape<TPR>::kBlock;
};

// This thread's packs of one row tile (zeros past `limit`) into its slots: slot p of thread t
// at slots[p * BLOCK + t], so a warp's chunks are consecutive (no bank conflicts).
template <int VEC, int PACKS, int TPR, int BLOCK, typename T>
__device__ __forceinline__ void stage_tile(Pack<T, VEC>* slots, const T* tile, int limit, int lane) {
  static_assert(sizeof(Pack<T, VEC>) % 16 == 0, "staged packs are whole 16-byte chunks");
#pragma unroll
  for (int p = 0; p < PACKS; ++p) {
    const int col = pack_col<VEC, TPR>(p, lane);
    const bool inside = col < limit;
    const char* src = reinterpret_cast<const char*>(tile + (inside ? col : 0));
    char* dst = reinterpret_cast<char*>(slots + p * BLOCK + threadIdx.x);
#pragma unroll
    for (int c = 0; c < int(sizeof(Pack<T, VEC>)) / 16; ++c) copy16_async(dst + 16 * c, src + 16 * c, inside);
  }
}

// Where StagePolicy says so, a staged backward copies each row's statistics with its tiles
// (v44): loaded after the copies had arrived, their latency stands between a row's tiles and
// its first arithmetic; held in registers across the wait they spilled (one-pack tiles at
// 64 registers). One thread of each warp (of each row group, for groups narrower than a warp)
// copies them into its slots: every thread copying the same word measured slower than
// loading it late (NOTES v44). `stats` holds [depth buffers][mean, rstd][StatsSlots slots].

template <int TPR, int BLOCK>
struct StatsSlots {
  static constexpr int kGroup = TPR < kWarp ? TPR : kWarp;  // threads sharing one slot (one row)
  static constexpr int value = BLOCK / kGroup;
};

// A row's mean (LayerNorm only) and rstd into two shared-memory words, a 4-byte cp.async
// each, uncommitted: the staged backwards' one way of copying statistics (stage_stats,
// SharedStatsRing, v86's bulk rows), so the three cannot drift apart.
template <bool RMS>
__device__ __forceinline__ void copy_row_stats(float* mean_to, float* rstd_to, const float* mean, const float* rstd,
                                               i64 row) {
  if (!RMS) copy4_async(mean_to, mean + row);
  copy4_async(rstd_to, rstd + row);
}

template <bool RMS, int TPR, int BLOCK>
__device__ __forceinline__ void stage_stats(float* stats, int buf, const float* mean, const float* rstd, i64 row,
                                            i64 M) {
  constexpr int kGroup = StatsSlots<TPR, BLOCK>::kGroup, kSlots = StatsSlots<TPR, BLOCK>::value;
  if (!StagePolicy<TPR, RMS>::stats || threadIdx.x % kGroup) return;
  const int slot = threadIdx.x / kGroup;
  copy_row_stats<RMS>(stats + (2 * buf) * kSlots + slot, stats + (2 * buf + 1) * kSlots + slot, mean, rstd,
                      row < M ? row : 0);
}

// v85: the fused residual backward's rows of 128-512 threads (every row step passes a block
// barrier, its sums') stage their statistics in one slot a row group, copied by the group's
// first thread alone, DEPTH row steps ahead: one step further than the tiles, so each copy
// has arrived (that thread's wait, a step early) and crossed a barrier (that step's sums)
// before any thread reads it. stage_stats has each warp copy its own slot (no barrier
// needed), which ncu's source counters (bf16 LayerNorm backward, N = 8192: 24 of a row's 283
// instructions a warp) put at 8% of the kernel's issue slots. The ring holds DEPTH + 1
// slots: the step's row, DEPTH rows ahead. H200, two rounds (benchmarks/sweep_row_copies.py,
// results/sweep-row-copies-v85-v86-h200.txt), bf16 backward of copy, stage_stats -> v85:
// fused residual LayerNorm N = 2048 / 4096 / 8192 0.892 / 0.870 / 0.847 -> 0.899 / 0.879 /
// 0.847, RMSNorm 0.911 / 0.897 / 0.879 -> 0.911 / 0.904 / 0.884; norm_bwd's 1024-thread rows
// (N = 8192) lost 0.02 (LayerNorm 0.859 -> 0.839, RMSNorm 0.895 -> 0.873), so blocks of a
// whole SM keep stage_stats, and norm_bwd's rows under 1024 threads take v86 instead (on
// sm_80, which v86 does not reach, stage_stats: v85 was not measured there). 0: stage_stats.
#ifndef CUNORM_BWD_SHARED_STATS
#define CUNORM_BWD_SHARED_STATS 1
#endif

template <int TPR, bool RMS>
struct SharedStats {
  static constexpr bool value =
      CUNORM_BWD_SHARED_STATS && StagePolicy<TPR, RMS>::stats && GroupShape<TPR>::kRows == 1 &&
      !StagePolicy<TPR, RMS>::kSmRows;
};

// A row a block (SharedStats), so a slot holds one row's pair and thread 0 copies it.
template <bool RMS, int DEPTH>
struct SharedStatsRing {
  static constexpr int kSlots = DEPTH + 1;  // `stats`: [kSlots][mean, rstd]
  int read = 0;                             // the slot of the current step's row
  // Row `row`'s statistics into `slot`, by the block's first thread (uncommitted).
  static __device__ __forceinline__ void copy(float* stats, int slot, const float* mean, const float* rstd, i64 row,
                                              i64 M) {
    if (threadIdx.x) return;
    copy_row_stats<RMS>(stats + 2 * slot, stats + 2 * slot + 1, mean, rstd, row < M ? row : 0);
  }
  // Before the tiles' ring.fill: the first DEPTH steps' rows (row0 + d * step), a group of
  // their own, the oldest, so that the wait in `arrived` (after the fill's DEPTH - 1 groups)
  // covers them and its barrier shows them to the block.
  static __device__ __forceinline__ void fill(float* stats, const float* mean, const float* rstd, i64 row0, i64 step,
                                              i64 M) {
#pragma unroll
    for (int d = 0; d < DEPTH; ++d) copy(stats, d, mean, rstd, row0 + d * step, M);
    copies_commit();
  }
  static __device__ __forceinline__ void arrived() {
    copies_wait<DEPTH - 1>();
    __syncthreads();
  }
  // At a step's refill (uncommitted: the tiles' commit takes it): the row DEPTH steps
  // ahead, into the slot the previous step read (every thread has passed that step's barriers).
  __device__ __forceinline__ void refill(float* stats, const float* mean, const float* rstd, i64 row, i64 M) const {
    copy(stats, read == 0 ? DEPTH : read - 1, mean, rstd, row, M);
  }
  __device__ __forceinline__ RowStats<float> current(const float* stats) const {
    return RowStats<float>{RMS ? 0.0f : stats[2 * read], stats[2 * read + 1]};
  }
  __device__ __forceinline__ void advance() { read = read == DEPTH ? 0 : read + 1; }
};

// v86: on sm_90, norm_bwd's staged rows of 128-512 threads (a row a block) have the block's
// first thread copy the row's x and dy with one bulk copy each (cp.async.bulk) and its
// statistics with two 4-byte cp.async, all completing on the buffer's mbarrier, instead of
// one 16-byte cp.async a thread a stream and v74's statistics slots. Every other thread only
// waits on the mbarrier: ncu's source counters (bf16 LayerNorm, N = 8192) put ~75 of a row
// step's 283 instructions a warp in the per-thread copies (row offsets, LDGSTS, the three
// predicated-off LDS that ptxas pairs with each) and the statistics. A row's bytes in shared
// memory are its packs in order (one row a block: slot p * BLOCK + t holds column
// (p * TPR + t) * VEC), so one contiguous copy fills them; the packs past the row are zeroed
// once a buffer, since no copy writes them. Needs rows on 16-byte boundaries, which the
// host's 16-byte packs already imply (_launch.pick_vec). H200, two rounds
// (benchmarks/sweep_row_copies.py, results/sweep-row-copies-v85-v86-h200.txt), bf16 backward
// of copy, per-thread copies -> bulk: LayerNorm N = 1024 / 2048 / 4096 0.850 / 0.881 / 0.869
// -> 0.885 / 0.887 / 0.866, RMSNorm 0.874 / 0.843 / 0.846 -> 0.898 / 0.912 / 0.905; but
// 1024-thread rows (N = 8192) fell, LayerNorm 0.859 -> 0.712 and RMSNorm 0.895 -> 0.861, so
// blocks of a whole SM keep cp.async. RMSNorm's 128-thread rows (N = 513-1024) read 0.898
// in that sweep but 0.819-0.844 in the next three processes (the GPU check,
// results/bulk-rms-1024-h200.txt; same SASS), against 0.867 with cp.async, so they keep
// cp.async too (kBulkRmsFromTpr). A deeper ring (3) lost 0.08-0.15 on every bulk row. 0: never;
// 2: every one-row tile, those two included (for profiling why they lose,
// benchmarks/profile_stalls.py --define CUNORM_BWD_BULK=2).
#ifndef CUNORM_BWD_BULK
#define CUNORM_BWD_BULK 1
#endif
constexpr int kBulkRmsFromTpr = 256;

template <typename T, int VEC, int TPR, bool RMS>
struct BulkRows {
  static constexpr bool kGated = !StagePolicy<TPR, RMS>::kSmRows && (!RMS || TPR >= kBulkRmsFromTpr);
  static constexpr bool value = kBulkCopies && CUNORM_BWD_BULK && GroupShape<TPR>::kRows == 1 &&
                                (kGated || CUNORM_BWD_BULK >= 2) &&
                                sizeof(Pack<T, VEC>) == 16;
};

// The statistics of the row staged in `buf`, after this thread's wait for its copies: the
// warp barrier makes the copying lane's arrived words visible to the others. Without
// staged statistics, loaded now.
template <bool RMS, int TPR, int BLOCK>
__device__ __forceinline__ RowStats<float> staged_stats(const float* stats, int buf, const float* mean,
                                                        const float* rstd, i64 row, i64 M) {
  if (!StagePolicy<TPR, RMS>::stats) return row_stats<RMS>(mean, rstd, row, M);
  constexpr int kGroup = StatsSlots<TPR, BLOCK>::kGroup, kSlots = StatsSlots<TPR, BLOCK>::value;
  sync_warp();
  const int slot = threadIdx.x / kGroup;
  return RowStats<float>{RMS ? 0.0f : stats[(2 * buf) * kSlots + slot], stats[(2 * buf + 1) * kSlots + slot]};
}

// v70: the staged row tiles widened a 32-bit word at a time (common.cuh unpack_words), as v69
// did in the wide backward. H200, two rounds within 0.003 (benchmarks/sweep_bwd_overhead.py,
// results/sweep-bwd-overhead-v70-v72-h200.txt): bf16 norm_bwd N = 512-8192 +0.000-0.005 of
// copy, the fused residual backward +0.004-0.010 at N = 8192. 0: element by element.
#ifndef CUNORM_BWD_STAGED_WORDS
#define CUNORM_BWD_STAGED_WORDS 1
#endif

template <int VEC, int PACKS, int BLOCK, typename A, typename T>
__device__ __forceinline__ void unstage_tile(const Pack<T, VEC>* slots, A (&v)[PACKS][VEC]) {
#pragma unroll
  for (int p = 0; p < PACKS; ++p) {
    const Pack<T, VEC> pk = slots[p * BLOCK + threadIdx.x];  // one wide load (see load_pack)
    widen<bool(CUNORM_BWD_STAGED_WORDS)>(pk, v[p]);
  }
}

// v71: a persistent backward group's columns never change, so each thread widens its packs
// of the weight once, into shared memory as float (its own slots: [PACKS * VEC / 4][BLOCK]
// float4, a warp's reads consecutive), and each row step reads them back with VEC / 4 wide
// loads instead of a global load (with the statistics' loads, the long-scoreboard waits ncu
// put first among the stalls at N = 4096), its address and predicate, and the widening. Columns past the row hold 1 (+ offset; their
// x and dy are zero). Same sweep: bf16 norm_bwd N = 8192 (one block an SM) LayerNorm 0.70 ->
// 0.79, RMSNorm 0.81 -> 0.89; N = 512 +0.01-0.02; RMSNorm 1024-4096 +0.005-0.01; LayerNorm
// 1024-4096 -0.004-0.013 alone, even with v72. 0: the weight loaded each row step.
#ifndef CUNORM_BWD_WEIGHT_SMEM
#define CUNORM_BWD_WEIGHT_SMEM 1
#endif

// v77: the weight slots are static shared memory beside the ring's dynamic bytes, and a block
// must fit both in what the GPU lets it opt in to: 227 KiB on sm_90, 163 KiB on sm_80, 99 KiB
// on sm_86 / sm_89. The host compiles each kernel with its device's opt-in
// (_compile.function_ptr: CUNORM_SMEM_OPTIN); a tile whose ring and slots would not fit keeps
// loading its weight each row step (on sm_86, 1024-thread LayerNorm rows; on sm_80, the fused
// backward's 1024-thread LayerNorm rows with float32 h). Without the define (NVRTC checks in
// CI), the sm_90 figure.
#ifndef CUNORM_SMEM_OPTIN
#define CUNORM_SMEM_OPTIN 232448
#endif
template <int RING_BYTES, int SLOT_BYTES, i64 BUDGET = CUNORM_SMEM_OPTIN>
struct WeightSlotsFit {
  // 2 KiB for the kernels' other static buffers (block sums, staged statistics: under 1.1 KiB)
  static constexpr bool value = i64(RING_BYTES) + SLOT_BYTES + 2048 <= BUDGET;
};
// v109: a wide block of fewer than 1024 threads shares its SM with a second one, so each may
// take half of the SM's shared memory (the opt-in plus the 1 KiB the GPU reserves a block),
// less its own reserved KiB (_config.wide_block_smem_budget mirrors this)
template <int TPB>
struct WideBlockSmem {
  static constexpr i64 value = TPB >= 1024 ? i64(CUNORM_SMEM_OPTIN) : (i64(CUNORM_SMEM_OPTIN) + 1024) / 2 - 1024;
};

// A thread's pack p of the staged weight: float4 slots of the widened values (v71), or the
// weight's own half-precision pack (v101's half slots: exact, the values came from W).
template <int VEC, int BLOCK>
__device__ __forceinline__ void put_weight_slot(float4* slots, int p, const float (&wv)[VEC]) {
  static_assert(VEC % 4 == 0, "whole float4 slots");
#pragma unroll
  for (int q = 0; q < VEC / 4; ++q)
    slots[(p * (VEC / 4) + q) * BLOCK + threadIdx.x] = make_float4(wv[4 * q], wv[4 * q + 1], wv[4 * q + 2], wv[4 * q + 3]);
}
template <int VEC, int BLOCK, typename W>
__device__ __forceinline__ void put_weight_slot(Pack<W, VEC>* slots, int p, const float (&wv)[VEC]) {
  slots[p * BLOCK + threadIdx.x] = convert_pack<W>(wv);
}

// The weight's columns this thread reads (1 past the row), in slots of Slot (put_weight_slot);
// `fill` where the weight is null (a bias: 0). An offset is only exact in float slots.
template <int VEC, int PACKS, int TPR, int BLOCK, typename W, typename Slot>
__device__ __forceinline__ void stage_weight(Slot* slots, const W* weight, i64 c0, i64 N, int lane,
                                             float offset = 0.0f, float fill = 1.0f) {
#pragma unroll
  for (int p = 0; p < PACKS; ++p) {
    const i64 col = c0 + pack_col<VEC, TPR>(p, lane);
    float wv[VEC];
    load_param<VEC>(col < N ? weight : nullptr, col, fill, wv);
#pragma unroll
    for (int k = 0; k < VEC; ++k) wv[k] += offset;  // the fused backward's w + offset, as load_weight
    put_weight_slot<VEC, BLOCK>(slots, p, wv);
  }
}

// A parameter staged in its own type (v105): half precision in its own packs (exact), wider
// types as float4 slots of the widened values (what load_param gives the kernels anyway).
template <typename W, int VEC, bool HALF = sizeof(W) == 2>
struct OwnSlot {
  typedef Pack<W, VEC> type;
  static constexpr int kValueBytes = 2;  // shared memory a parameter value takes
};
template <typename W, int VEC>
struct OwnSlot<W, VEC, false> {
  typedef float4 type;
  static constexpr int kValueBytes = 4;
};
template <int VEC, int BLOCK, typename W>
__device__ __forceinline__ void read_weight_slot(const Pack<W, VEC>* slots, int p, float (&wv)[VEC]) {
  unpack(read_slot(slots + p * BLOCK + threadIdx.x), wv);
}
template <int VEC, int BLOCK>
__device__ __forceinline__ void read_weight_slot(const float4* slots, int p, float (&wv)[VEC]) {
#pragma unroll
  for (int q = 0; q < VEC / 4; ++q) {
    const float4 f = slots[(p * (VEC / 4) + q) * BLOCK + threadIdx.x];
    wv[4 * q] = f.x;
    wv[4 * q + 1] = f.y;
    wv[4 * q + 2] = f.z;
    wv[4 * q + 3] = f.w;
  }
}

// ---- the wide backward (v63, v65, v66; the cluster form v68) ---------------------------------
// v67 (dy's loads through the L2 only, so the L1 would keep the weight) lost 0.01-0.03 of
// copy on the RMSNorm tiles (NOTES v67; benchmarks/experiments/v67-wide-dy-past-l1.patch).
// v69: bf16 packs widened a 32-bit word at a time (common.cuh unpack_words) in both passes:
// x, dy and the weight, one instruction a value instead of ~1.5 (static SASS of the bf16
// RMSNorm 32768 tile: SHF 122 + PRMT 96 of 1285 a row step). H200, two rounds within 0.003
// (benchmarks/sweep_wide_bwd_words.py, results/sweep-wide-bwd-words-v69-h200.txt), bf16
// backward of copy: LayerNorm N = 9216 / 12288 / 16384 0.54 / 0.61 / 0.66 -> 0.57 / 0.67 /
// 0.71, 32768 / 65536 (clusters) +0.01; RMSNorm 9216 / 16384 / 24576 / 32768 +0.01-0.03,
// 65536 +0.01. 0: element by element.
#ifndef CUNORM_WIDE_BF16_WORDS
#define CUNORM_WIDE_BF16_WORDS 1
#endif
// v81 (NOTES lever (e)): the wide block's weight widened once into float slots of dynamic
// shared memory after the ring (COLS * 4 bytes), where the ring and the slots fit what the
// block may opt in to, in place of a 16-byte weight load from L1 / L2 in both passes of every
// row (ncu: the float32 wide backward at 16384 waits on global loads, long scoreboard 16-19
// cycles an issue). On the H200: the half-precision 16384-column tile at depth 2 and the
// float32 one (192 KiB with the ring); not the depth-3 RMSNorm rings. The host sizes the
// slots alike (_config.wide_bwd_weight_bytes). 0: loaded each pass.
// v83: not half-precision LayerNorm's single block (CLUSTER false), which lost 0.04 of copy
// with the slots at 12288-16384 against main before v81 (NOTES v83).
#ifndef CUNORM_WIDE_WEIGHT_SMEM
#define CUNORM_WIDE_WEIGHT_SMEM 1
#endif
// v101: in the clusters, a half-precision weight of half-precision rows keeps its own type
// in the slots (COLS * 2 bytes, widened a word at a time as x and dy are), so a ring of three
// 64 KiB rows fits beside them (192 + 32 KiB) where the float slots (64 KiB) do not: the
// half-precision clusters' rings of three (v91's loop; LayerNorm's too, _config) keep their
// weight on chip. The single wide block keeps float slots or none: half-precision RMSNorm's
// ring of three lost 0.03 with half slots at 16384 (results/sweep-wide-half-slots-v101-
// h200.txt). The host sizes the slots alike (_config.wide_bwd_slot_bytes). 0: float slots.
#ifndef CUNORM_WIDE_HALF_SLOTS
#define CUNORM_WIDE_HALF_SLOTS 1
#endif
// v103: the LayerNorm wide backward's first pass sums wdy * (x - mean) and multiplies the
// thread's sum by the row's rstd once, one FMUL an element fewer (these kernels are
// issue-bound, NOTES "Stall reasons": ~35 thread instructions an element; NVRTC 13 sm_90 bf16
// single block 1592 -> 1576 SASS instructions, a cluster block of four 2504 -> 2472). H200,
// two rounds (results/sweep-wide-fold-v103-h200.txt), backward of copy, bf16 clusters at
// 32768 / 65536 / 131072 0.654 / 0.557 / 0.564 -> 0.665 / 0.572 / 0.578, the single block and
// float32 level; RMSNorm's (x * rstd then, 2152 -> 2120) lost 0.015-0.02 at bf16 12288, so it
// keeps its loop. dx's rstd * (wdy - m1 - xhat * m2) stays: the compiler already contracts it
// to FFMA, FFMA, FMUL, as many as any regrouping. xhat keeps (x - mean) * rstd: an FFMA
// x * rstd - mean * rstd would round mean * rstd at the row's offset (v31's rows). 0: the
// loop before v103.
#ifndef CUNORM_WIDE_FOLD_RSTD
#define CUNORM_WIDE_FOLD_RSTD 1
#endif
template <typename T, typename W, bool CLUSTER>
struct WideHalfSlots {
  static constexpr bool value = CUNORM_WIDE_HALF_SLOTS && CLUSTER && sizeof(T) == 2 && sizeof(W) == 2;
};
template <typename T, typename W, bool RMS, int DEPTH, int COLS, bool CLUSTER, int TPB = 1024>
struct WideWeightSlots {
  static constexpr int kRingBytes = DEPTH * (COLS * int(sizeof(T)) <= 32768 ? 2 : 1) * COLS * int(sizeof(T));
  static constexpr int kSlotBytes = COLS * (WideHalfSlots<T, W, CLUSTER>::value ? 2 : 4);
  static constexpr bool kServes = sizeof(T) == 4 || RMS || CLUSTER;
  static constexpr bool value = CUNORM_WIDE_WEIGHT_SMEM && kServes &&
                                WeightSlotsFit<kRingBytes, kSlotBytes, WideBlockSmem<TPB>::value>::value;
};

// Whether wide_bwd_rows' exchange E takes each warp's two sums, not the block's (below).
template <typename E>
struct ExchangeTakesWarpSums {
  static constexpr bool value = false;
};

// The rows of norm_bwd_wide (layer_norm.cu, where its design is told): a TPB-thread block's
// COLS columns from c0 of rows first, first + step, ... (uniform over the block, and over the
// cluster in norm_bwd_wide_cluster). `exchange(c1, c2)` turns the block's two row sums into
// the row's (nothing to do where one block holds the row); dW / dB go to partial row
// `partial`. Every block holds part of the row (c0 < N: the host sizes clusters so), which
// keeps norm_bwd_wide's code as it was before this function took c0 (a test of c0 against N
// cost it 8 instructions). Every thread of the block calls it.
// An exchange whose ExchangeTakesWarpSums is true ((p8): norm_bwd_wide_cluster's
// ClusterPushSums) takes each warp's sums and sums them over the cluster itself: the block
// sums then stop at the warps'.
// OPEN_SUMS (v78): the block sums leave out their closing barrier, for an exchange whose own
// barriers (the cluster barrier of norm_bwd_wide_cluster: every thread arrives after reading
// the partials) order the next row's writes of them.
// v91: clusters whose ring holds three rows or more (half-precision RMSNorm's) take row
// j + 1's first pass and publish its sums before they collect row j's exchange, then write
// row j's dx, as v90 does in the cluster forward: ncu put the cluster barrier's wait at 15.8%
// of the wide cluster's samples (bf16 LayerNorm 32768, results/stalls-cluster-fwd-h200.txt).
// Row j + 1 must have landed a step earlier, so one row fewer is in flight behind it: a ring
// of two would leave none, and keeps v68's loop. The exchange then also has publish(c1, c2)
// and collect(c1, c2) (norm_bwd_wide_cluster's ClusterRowSums). 0: v68's loop everywhere.
#ifndef CUNORM_WIDE_CLUSTER_PIPE
#define CUNORM_WIDE_CLUSTER_PIPE 1
#endif
// v94: clusters whose rings hold two rows (half-precision LayerNorm's) add a row's dW / dB in
// a pass of their own between the row's publish and its collect, where the warps otherwise
// wait at the cluster barrier (13.6-17.2% of samples at bf16 LayerNorm 65536 / 131072,
// results/source-counters-wide-cluster-h200-v93.txt), and leave them out of the dx pass: x
// and dy read from shared memory once more a row, same sums in the same order. Float32
// clusters, whose dy is not staged, lost 0.06-0.10 with it (dy loaded a third time, 4-20
// bytes spilled; results/sweep-wide-cluster-window2-v94-h200.txt). 0: v68's loop.
#ifndef CUNORM_WIDE_CLUSTER_WINDOW
#define CUNORM_WIDE_CLUSTER_WINDOW 1
#endif
// v108: half-precision RMSNorm's dx pass where dW is added apart (v94's window) takes dx as
// rstd * w * dy + x * a (write_dx below). Sweep (results/sweep-wide-dx-affine-v108-h200.txt,
// backward of copy, bf16 rows, float32 weight): 24576 / 65536 0.613 / 0.627 -> 0.622 / 0.641;
// LayerNorm's window in the same form (x * a + b) measured -0.001 at 16384-131072 and with its
// dW / dB passes too -0.004, so LayerNorm keeps dx through xhat. 0: dx through xhat throughout.
#ifndef CUNORM_WIDE_DX_AFFINE
#define CUNORM_WIDE_DX_AFFINE 1
#endif
template <typename T, typename W, bool RMS, int DEPTH, int COLS, bool OPEN_SUMS = false, bool CLUSTER = false,
          int TPB = 1024, typename Exchange>
__device__ __forceinline__ void wide_bwd_rows(const T* __restrict__ dy, const RowMap& dymap, const T* __restrict__ x,
                                              const RowMap& xmap, const W* __restrict__ weight,
                                              const float* __restrict__ mean, const float* __restrict__ rstd,
                                              T* __restrict__ dx, float* __restrict__ dw_part,
                                              float* __restrict__ db_part, i64 M, i64 N, i64 c0, i64 first, i64 step,
                                              i64 partial, Exchange&& exchange) {
  typedef float A;
  constexpr int VEC = 16 / sizeof(T), PACKS = COLS / (TPB * VEC), kSet = PACKS * TPB;
  // dy staged too where a row's x takes at most 32 KiB (the host mirrors this:
  // _config.wide_bwd_row_bytes)
  constexpr bool kStageDy = COLS * sizeof(T) <= 32768;
  constexpr int kSets = kStageDy ? 2 : 1;  // staged tiles a row: x (and dy)
  static_assert(sizeof(T) == 2 || sizeof(T) == 4, "half precision or float32");
  static_assert(COLS % (TPB * VEC) == 0 && PACKS >= 1, "whole packs a thread");
  static_assert(RMS || PACKS * VEC <= 16, "LayerNorm's dW and dB: 32 accumulators a thread at most");
  static_assert(DEPTH >= 2, "the next row in flight behind the current one");
  __shared__ A smem[2 * kWarp];
  __shared__ A stats[DEPTH * 2 * StatsSlots<TPB, TPB>::value];
  extern __shared__ __align__(16) unsigned char stage_smem[];  // [DEPTH][x, dy][PACKS][block] packs
  Pack<T, VEC>* const tiles = reinterpret_cast<Pack<T, VEC>*>(stage_smem);
  constexpr bool kWeightSlots = WideWeightSlots<T, W, RMS, DEPTH, COLS, CLUSTER, TPB>::value;
  constexpr bool kHalfSlots = WideHalfSlots<T, W, CLUSTER>::value;
  float4* const wslots = reinterpret_cast<float4*>(tiles + DEPTH * kSets * kSet);  // after the ring
  Pack<W, VEC>* const hslots = reinterpret_cast<Pack<W, VEC>*>(wslots);  // v101: the same place
  const int lane = threadIdx.x;
  const int limit = tile_limit(N, c0, i64(kSet) * VEC, true);  // c0 < N: see above
  const A inv_n = A(1) / A(N);
  A dw_acc[PACKS][VEC], db_acc[PACKS][VEC];
  zero_tile(dw_acc);
  zero_tile(db_acc);
  // a thread reads back only the slots it wrote: no barrier
  if constexpr (kWeightSlots && kHalfSlots) stage_weight<VEC, PACKS, TPB, TPB>(hslots, weight, c0, N, lane);
  else if constexpr (kWeightSlots) stage_weight<VEC, PACKS, TPB, TPB>(wslots, weight, c0, N, lane);
  auto stage_row = [&](i64 r, int buf) {  // rows past M stage zeros, never read
    const i64 safe = r < M ? r : 0;
    const int lim = r < M ? limit : 0;
    stage_tile<VEC, PACKS, TPB, TPB>(tiles + kSets * buf * kSet, x + xmap.offset(safe) + c0, lim, lane);
    if constexpr (kStageDy)
      stage_tile<VEC, PACKS, TPB, TPB>(tiles + (kSets * buf + 1) * kSet, dy + dymap.offset(safe) + c0, lim, lane);
    stage_stats<RMS, TPB, TPB>(stats, buf, mean, rstd, r, M);
    copies_commit();
  };
  constexpr bool kWords = CUNORM_WIDE_BF16_WORDS;
  // This thread's pack p of the row in buf: x and dy (read_x_dy), and the weight (read_pack),
  // widened (zeros past N).
  auto read_x_dy = [&](int buf, const T* dyrow, int p, A (&xv)[VEC], A (&g)[VEC]) {
    const int col = pack_col<VEC, TPB>(p, lane);
    widen<kWords>(read_slot(tiles + kSets * buf * kSet + p * TPB + threadIdx.x), xv);
    if constexpr (kStageDy) widen<kWords>(read_slot(tiles + (kSets * buf + 1) * kSet + p * TPB + threadIdx.x), g);
    else load_param<VEC, kWords>(col < limit ? dyrow : nullptr, col, A(0), g);
  };
  auto read_pack = [&](int buf, const T* dyrow, int p, A (&xv)[VEC], A (&g)[VEC], A (&wv)[VEC]) {
    const int col = pack_col<VEC, TPB>(p, lane);
    read_x_dy(buf, dyrow, p, xv, g);
    if constexpr (kWeightSlots && kHalfSlots) widen<kWords>(read_slot(hslots + p * TPB + threadIdx.x), wv);
    else if constexpr (kWeightSlots) read_weight_slot<VEC, TPB>(wslots, p, wv);
    else load_param<VEC, kWords>(col < limit ? weight : nullptr, c0 + col, A(1), wv);
  };
  // the block's sums of the row in buf, in xhat_sums_pass's order (packs outside the row
  // hold zeros and add nothing)
  auto block_sums = [&](int buf, const T* dyrow, const RowStats<A>& st, A& c1, A& c2) {
    constexpr bool kFoldRstd = CUNORM_WIDE_FOLD_RSTD && !RMS;
    c1 = A(0);
    c2 = A(0);
#pragma unroll
    for (int p = 0; p < PACKS; ++p) {
      A xv[VEC], g[VEC], wv[VEC];
      read_pack(buf, dyrow, p, xv, g, wv);
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        const A wdy = wv[k] * g[k];
        c1 += wdy;
        if constexpr (kFoldRstd) c2 += wdy * (xv[k] - st.mean);  // v103: times rstd below
        else c2 += wdy * ((xv[k] - st.mean) * st.rstd);
      }
    }
    if constexpr (kFoldRstd) c2 *= st.rstd;
    if constexpr (ExchangeTakesWarpSums<typename RemoveRef<Exchange>::type>::value) {  // the exchange sums the warps' sums
      if constexpr (!RMS) c1 = group_warp_sum<kWarp>(c1);
      c2 = group_warp_sum<kWarp>(c2);
    } else if constexpr (OPEN_SUMS) {
      if constexpr (RMS) c2 = group_sum_open<TPB>(c2, smem);
      else group_sum2_open<TPB>(c1, c2, smem);
    } else {
      if constexpr (RMS) c2 = group_sum<TPB>(c2, smem);
      else group_sum2<TPB>(c1, c2, smem);
    }
  };
  // dx of the row in buf from the row's sums, and its dW / dB unless they were added
  // already (Flag<false>: v94's window)
  auto write_dx = [&](int buf, const T* dyrow, const RowStats<A>& st, i64 row, A c1, A c2, auto add_dw) {
    const A m1 = RMS ? A(0) : c1 * inv_n, m2 = c2 * inv_n;
    // v108 (RMSNorm, dx alone, half precision): dx = rstd * w * dy + x * a, a = -rstd^2 m2,
    // xhat not taken (m1 = 0 and no mean: the same terms in another order)
    constexpr bool kAffineDx = RMS && sizeof(T) == 2 && !decltype(add_dw)::value && CUNORM_WIDE_DX_AFFINE != 0;
    const A dx_a = -(st.rstd * st.rstd) * m2;
#pragma unroll
    for (int p = 0; p < PACKS; ++p) {  // dx as dx_tile computes it
      const int col = pack_col<VEC, TPB>(p, lane);
      if (col >= limit) continue;
      A xv[VEC], g[VEC], wv[VEC], out[VEC];
      read_pack(buf, dyrow, p, xv, g, wv);
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        const A xhat = (xv[k] - st.mean) * st.rstd;  // (unused, so not computed, by v108's dx alone)
        if constexpr (kAffineDx) out[k] = fmaf(wv[k] * g[k], st.rstd, xv[k] * dx_a);
        else out[k] = st.rstd * (wv[k] * g[k] - m1 - xhat * m2);
        if constexpr (decltype(add_dw)::value) {
          dw_acc[p][k] += g[k] * xhat;
          if constexpr (!RMS) db_acc[p][k] += g[k];
        }
      }
      store_pack_whole<T>(dx + row * N + c0 + col, out);
    }
  };
  // dW / dB of the row in buf alone (v94: between the row's publish and its collect)
  auto add_dw_db = [&](int buf, const RowStats<A>& st) {
#pragma unroll
    for (int p = 0; p < PACKS; ++p) {
      const int col = pack_col<VEC, TPB>(p, lane);
      if (col >= limit) continue;
      A xv[VEC], g[VEC];
      read_x_dy(buf, nullptr, p, xv, g);  // dy staged: v94's window serves staged rows only
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        const A xhat = (xv[k] - st.mean) * st.rstd;
        dw_acc[p][k] += g[k] * xhat;
        if constexpr (!RMS) db_acc[p][k] += g[k];
      }
    }
  };
  auto dy_row = [&](i64 row) { return kStageDy ? nullptr : dy + dymap.offset(row) + c0; };
  StageRing<DEPTH> ring;
  ring.fill([&](int ahead, int b) { stage_row(first + ahead * step, b); });
  if constexpr (CLUSTER && DEPTH >= 3 && CUNORM_WIDE_CLUSTER_PIPE && !OPEN_SUMS) {  // v91
    // a thread's publish and collect alternate: the first row's publish here, then each
    // step collects its row's sums and publishes the next row's, if any
    A next1 = A(0), next2 = A(0);
    RowStats<A> next_st{};
    if (first < M) {
      copies_wait<DEPTH - 2>();  // the first row (the ring's oldest group)
      next_st = staged_stats<RMS, TPB, TPB>(stats, 0, mean, rstd, first, M);
      block_sums(0, dy_row(first), next_st, next1, next2);
      exchange.publish(next1, next2);
    }
    for (i64 row = first; row < M; row += step) {  // cluster-uniform
      ring.refill([&](int ahead, int b) { stage_row(row + ahead * step, b); });
      const int buf = ring.buf, after = buf == DEPTH - 1 ? 0 : buf + 1;
      const RowStats<A> st = next_st;
      const bool more = row + step < M;
      if (more) {
        copies_wait<DEPTH - 2>();  // row j + 1; row j + 2 .. stay in flight
        next_st = staged_stats<RMS, TPB, TPB>(stats, after, mean, rstd, row + step, M);
        block_sums(after, dy_row(row + step), next_st, next1, next2);
      }
      A c1, c2;
      exchange.collect(c1, c2);
      if (more) exchange.publish(next1, next2);
      write_dx(buf, dy_row(row), st, row, c1, c2, Flag<true>{});
      ring.advance();
    }
  } else if constexpr (CLUSTER && kStageDy && CUNORM_WIDE_CLUSTER_WINDOW && !OPEN_SUMS) {  // v94
    for (i64 row = first; row < M; row += step) {  // cluster-uniform
      ring.refill_and_wait([&](int ahead, int b) { stage_row(row + ahead * step, b); });
      const int buf = ring.buf;
      const RowStats<A> st = staged_stats<RMS, TPB, TPB>(stats, buf, mean, rstd, row, M);
      A c1, c2;
      block_sums(buf, nullptr, st, c1, c2);
      exchange.publish(c1, c2);
      add_dw_db(buf, st);  // while the cluster's other blocks reach the exchange
      exchange.collect(c1, c2);
      write_dx(buf, nullptr, st, row, c1, c2, Flag<false>{});
      ring.advance();
    }
  } else {
    for (i64 row = first; row < M; row += step) {  // block-uniform (cluster-uniform)
      ring.refill_and_wait([&](int ahead, int b) { stage_row(row + ahead * step, b); });
      const int buf = ring.buf;
      const RowStats<A> st = staged_stats<RMS, TPB, TPB>(stats, buf, mean, rstd, row, M);
      const T* const dyrow = dy_row(row);
      A c1, c2;
      block_sums(buf, dyrow, st, c1, c2);
      exchange(c1, c2);
      write_dx(buf, dyrow, st, row, c1, c2, Flag<true>{});
      ring.advance();
    }
  }
  copies_wait<0>();  // the last stages (rows past M) land before the block's shared memory goes
  store_partials<VEC, PACKS, TPB>(dw_acc, db_acc, dw_part, RMS ? nullptr : db_part, partial, N, c0, lane);
}

}  // namespace cunorm
