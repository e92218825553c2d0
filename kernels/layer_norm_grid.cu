// LayerNorm and RMSNorm, forward and backward, for rows longer than a cluster holds (v79): the
// whole grid works on R rows at a time, so x (and dy) are read from memory once, where the
// split path of layer_norm.cu reads them twice. Block b of G owns the same packs of every
// row (a slice of about N / G columns, one 16-byte pack a thread of a row group), so:
//   - each step, every block copies its slice of R rows into shared memory with cp.async
//     (several steps ahead), reduces its slice of each row, and publishes the partials in
//     global memory, then arrives at the step's grid barrier (an arrival counter);
//   - LAG steps later it waits for the step's barrier, folds the G partials of each row in
//     block order (the same bits in every block, run after run) and writes y (dx) from the
//     staged slice: nothing is read twice.
// A step's barrier and fold take microseconds that hold no memory traffic of their own: with
// the wait right after the arrival (LAG 0), each step's latency chain bounded the kernel
// (0.20-0.44 of copy backward, NOTES v79). LAG steps between arrival and wait let later steps'
// loads and sums run meanwhile. The grid is launched cooperatively, so every block is
// resident; the host zeroes the counters.
// A block is kGridThreads threads in row groups of QPAD (the slice's packs rounded up to a
// power of two from 128): each group takes RG rows of a step, so a thread's serial work a
// step is RG packs whatever the slice's width (v79's first form put every thread of a
// narrow block on all R rows: 128 threads an SM, 16 rows each, 6-7 us a step).
// The backward's dW / dB columns are this block's alone over every row, so each block sums
// them in registers and writes one partial row (the host's usual fold, with one row, turns it
// into the gradient's dtype): no partial rows to reduce across blocks.
// LayerNorm's partials are (sum, M2) of two passes over the staged slice about the row's first
// element (the pivot), merged by Chan's formula (common.cuh Welford), as the cluster forward
// merges its blocks' slices: rows far from zero keep their digits (x - mean in float32 lost
// them at a mean of 300).
// A thread reads back only the packs it copied itself, so the staged rows need no block
// barrier of their own.
//
// CUDA only (sm_80: cp.async, acquire loads); the host does not dispatch here on HIP.
#include "row_norm.cuh"

namespace cunorm {

// (grid_arrive / grid_wait: common.cuh)

// Block b's slice of the row's `packs` packs: [first, first + count), sizes within one.
struct GridSlice {
  i64 first;
  int count;
};

__device__ __forceinline__ GridSlice grid_slice(i64 packs, i64 b) {
  const i64 G = gridDim.x, first = b * packs / G;
  return GridSlice{first, int((b + 1) * packs / G - first)};
}

// A grid-row block's threads, and the most blocks a grid may have (the host holds it:
// _config.GRID_MAX_BLOCKS): each lane of a folding warp loads kGridPerLane blocks' partials.
constexpr int kGridThreads = 1024;
constexpr int kGridMaxBlocks = 160;
constexpr int kGridPerLane = (kGridMaxBlocks + kWarp - 1) / kWarp;

// The rows of a step that warp w folds: w, w + 32, ... (kRows of them).
template <int R>
struct FoldRows {
  static constexpr int kWarps = kGridThreads / kWarp, kRows = (R + kWarps - 1) / kWarps;
};

// The partial pairs of the rows this warp folds, from `slot` ([R][G][2]): lane l gets blocks
// l, l + kWarp, ... (zeros past G or R). Every load issues before any is used: the fold
// waits one L2 round trip, not one a block.
template <int R, int kRows = FoldRows<R>::kRows>
__device__ __forceinline__ void load_row_partials(const float* slot, i64 G, float (&a)[kRows][kGridPerLane],
                                                  float (&b)[kRows][kGridPerLane]) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
#pragma unroll
  for (int k = 0; k < kRows; ++k) {
    const int r = warp + k * FoldRows<R>::kWarps;
#pragma unroll
    for (int u = 0; u < kGridPerLane; ++u) {
      const i64 blk = lane + u * kWarp;
      const bool ok = r < R && blk < G;
      a[k][u] = ok ? __ldcg(slot + (r * G + blk) * 2) : 0.0f;
      b[k][u] = ok ? __ldcg(slot + (r * G + blk) * 2 + 1) : 0.0f;
    }
  }
}

// Calls fold(r, a, b) for each row r of the step that this warp folds, with the row's
// partial pairs loaded as load_row_partials gives them (all loads before any fold).
template <int R, typename Fold>
__device__ __forceinline__ void fold_rows(const float* slot, i64 G, Fold&& fold) {
  constexpr int kRows = FoldRows<R>::kRows;
  float a[kRows][kGridPerLane], b[kRows][kGridPerLane];
  load_row_partials<R>(slot, G, a, b);
  const int warp = threadIdx.x / kWarp;
#pragma unroll
  for (int k = 0; k < kRows; ++k) {
    const int r = warp + k * FoldRows<R>::kWarps;
    if (r < R) fold(r, a[k], b[k]);
  }
}

// Each of K values summed over its row group of QPAD threads (whole warps; every group of the
// block at once); every thread gets its group's K totals, in a fixed order. smem: K *
// kGridThreads / kWarp values.
template <int QPAD, int K, typename A>
__device__ __forceinline__ void group_sums(A (&v)[K], A* smem) {
  constexpr int kWarps = kGridThreads / kWarp, kGroupWarps = QPAD / kWarp;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, first = warp / kGroupWarps * kGroupWarps;
#pragma unroll
  for (int k = 0; k < K; ++k) v[k] = group_warp_sum<kWarp>(v[k]);
  if (lane == 0) {
#pragma unroll
    for (int k = 0; k < K; ++k) smem[k * kWarps + warp] = v[k];
  }
  __syncthreads();
#pragma unroll
  for (int k = 0; k < K; ++k) v[k] = second_level_sum<kGroupWarps>(smem + k * kWarps + first, lane);
  __syncthreads();  // smem free again
}

// A grid-row block's layout: row group `grp` of QPAD threads takes local rows grp * RG ..
// grp * RG + RG - 1 of each step's R; thread q of a group holds pack q of the block's slice.
template <int QPAD, int RG, int SETS>
struct GridLayout {
  static constexpr int kGroups = kGridThreads / QPAD, R = kGroups * RG;
  int grp, q;
  __device__ __forceinline__ GridLayout() : grp(threadIdx.x / QPAD), q(threadIdx.x % QPAD) {}
  // This thread's pack of local row k (< RG) of set `set` in ring buffer `buf`.
  template <typename P>
  __device__ __forceinline__ P* at(P* ring, int buf, int k, int set) const {
    return ring + ((buf * R + grp * RG + k) * SETS + set) * QPAD + q;
  }
};

// v79d: each warp's lane 0 also copies the few words a row's sums need besides its slice
// (the backward's saved mean and rstd, the forward's pivot) with the step's packs, so neither
// pass loads them from L2 on its step's latency chain (two round trips a step in the
// backward, three in the forward). H200 (benchmarks/results/sweep-grid-rows-v79d-h200.txt):
// backward +0.01-0.07 of copy (bf16 0.44-0.52, float32 0.50-0.55), LayerNorm forward +0.09
// at 262144 (still under the split path). 0: loaded when used.
#ifndef CUNORM_GRID_STAGE_SIDE
#define CUNORM_GRID_STAGE_SIDE 1
#endif

// Copies this thread's packs of its RG rows of step s, each of the SETS sources, into ring
// buffer `buf` (zeros for rows past M or a thread past its slice), and where
// CUNORM_GRID_STAGE_SIDE, lane 0 of each warp calls side(buf, k, row) for them (row past M
// too: it must fill those with finite values); committed as one group.
template <int QPAD, int RG, int SETS, typename T, int VEC, typename Side>
__device__ __forceinline__ void stage_grid_rows(Pack<T, VEC>* ring, int buf, const T* const (&src)[SETS],
                                                const RowMap (&map)[SETS], i64 s, i64 M, i64 col, bool mine,
                                                Side&& side) {
  const GridLayout<QPAD, RG, SETS> lay;
#pragma unroll
  for (int k = 0; k < RG; ++k) {
    const i64 row = s * lay.R + lay.grp * RG + k;
    const bool in = mine && row < M;
#pragma unroll
    for (int set = 0; set < SETS; ++set)
      copy16_async(lay.at(ring, buf, k, set), src[set] + (in ? map[set].offset(row) + col : 0), in);
    if (CUNORM_GRID_STAGE_SIDE && threadIdx.x % kWarp == 0) side(buf, k, row);
  }
  copies_commit();
}

// The first element of type T of a 32-bit word copied from a row's start.
template <typename T>
__device__ __forceinline__ float first_of_word(float word) {
  T v;
  memcpy(&v, &word, sizeof(T));
  return cvt<float>(v);
}

// The steps of a grid-row kernel over rows 0 .. M - 1, R a step (`side` as stage_grid_rows
// says; its words are the warp's once reduce runs and the block's once finish does):
// `reduce(step, slot)` sums
// this block's slice of the step's staged rows and writes them into `slot` (before the block
// barrier that precedes the arrival); `finish(step, slot)` folds the step's slot once every
// block has written it and writes the outputs. The ring holds DEPTH steps: LAG between a
// step's sums and its finish, the rest in flight.
// Scratch: `counters` (LAG + 1 words, zeroed; step s arrives at counter s mod (LAG + 1), whose
// arrivals count on over the launch) and `partials` (2 * LAG + 2 slots of R * G * 2 floats:
// a block rewrites a slot only after every block has folded it). A block ahead by a counter's
// period has waited for the barrier LAG + 1 steps before its own, so no step's arrivals mix
// with a later step's.
template <int QPAD, int RG, int SETS, int DEPTH, int LAG, typename T, int VEC, typename Side, typename Reduce,
          typename Finish>
__device__ __forceinline__ void grid_row_steps(Pack<T, VEC>* ring, const T* const (&src)[SETS],
                                               const RowMap (&map)[SETS], i64 M, i64 col, bool mine,
                                               float* partials, unsigned* counters, Side&& side, Reduce&& reduce,
                                               Finish&& finish) {
  constexpr int R = GridLayout<QPAD, RG, SETS>::R, kAhead = DEPTH - LAG - 1, kCounters = LAG + 1,
                kSlots = 2 * LAG + 2;
  static_assert(kAhead >= 1, "a step in flight");
  const i64 G = gridDim.x, steps = (M + R - 1) / R, slot_floats = i64(R) * G * 2;
#pragma unroll
  for (int d = 0; d < kAhead; ++d) {
    if (d < steps) stage_grid_rows<QPAD, RG, SETS>(ring, d, src, map, d, M, col, mine, side);
    else copies_commit();
  }
  for (i64 i = 0; i < steps + LAG; ++i) {
    if (i < steps) {
      const i64 ahead = i + kAhead;  // into the buffer of step i - LAG - 1, finished (by this thread) last step
      // lane 0 rewrites that buffer's side words, which its warp's lanes read in last step's
      // finish past a divergent `continue`: reconvergence at the loop's end is not promised
      if (CUNORM_GRID_STAGE_SIDE) __syncwarp();
      if (ahead < steps) stage_grid_rows<QPAD, RG, SETS>(ring, int(ahead % DEPTH), src, map, ahead, M, col, mine, side);
      else copies_commit();
      copies_wait<kAhead>();
      if (CUNORM_GRID_STAGE_SIDE) __syncwarp();  // lane 0's side words to its warp
      reduce(i, partials + (i % kSlots) * slot_floats);
      __syncthreads();  // every group's partials written
      if (threadIdx.x == 0) grid_arrive(counters + i % kCounters);
    }
    const i64 j = i - LAG;
    if (j >= 0) {
      grid_wait(counters + j % kCounters, unsigned((j / kCounters + 1) * G));
      finish(j, partials + (j % kSlots) * slot_floats);
    }
  }
  copies_wait<0>();
}

}  // namespace cunorm

using namespace cunorm;

#if !defined(CUNORM_HIP)
// The forward: y, and mean (LayerNorm) / rstd where non-null. Scratch as grid_row_steps says.
// 16-byte packs only (VEC = 16 / sizeof(T)).
template <typename T, typename W, bool RMS, int QPAD, int RG, int DEPTH, int LAG>
__global__ void __launch_bounds__(kGridThreads) norm_fwd_grid(const T* __restrict__ x, CUNORM_ROWMAP_PARAMS(xm),
                                                              T* __restrict__ y, const W* __restrict__ weight,
                                                              const W* __restrict__ bias, float* __restrict__ mean,
                                                              float* __restrict__ rstd, float* __restrict__ partials,
                                                              unsigned* __restrict__ counters, i64 M, i64 N,
                                                              float eps) {
  typedef float A;
  typedef GridLayout<QPAD, RG, 1> Layout;
  constexpr int VEC = 16 / sizeof(T), R = Layout::R;
  extern __shared__ __align__(16) unsigned char stage_smem[];
  Pack<T, VEC>* const ring = reinterpret_cast<Pack<T, VEC>*>(stage_smem);
  __shared__ A red[RG * (kGridThreads / kWarp)];
  __shared__ A stats[R][2];
  __shared__ A side_words[DEPTH][kGridThreads / kWarp][RG];  // CUNORM_GRID_STAGE_SIDE: pivots
  const Layout lay;
  const i64 G = gridDim.x, P = N / VEC;
  const GridSlice sl = grid_slice(P, blockIdx.x);
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const bool mine = lay.q < sl.count;
  const i64 col = (sl.first + lay.q) * VEC;
  const A count = A(sl.count) * VEC;
  const RowMap xmap = CUNORM_ROWMAP(xm);
  A wv[VEC], bv[VEC];
  load_param<VEC>(mine ? weight : nullptr, col, A(1), wv);
  load_param<VEC>(mine ? bias : nullptr, col, A(0), bv);
  const T* const src[1] = {x};
  const RowMap map[1] = {xmap};
  auto row_of = [&](i64 s, int k) { return s * R + lay.grp * RG + k; };
  // LayerNorm's pivot: the row's first element (0 past M, and for RMSNorm)
  auto pivot = [&](i64 row) { return !RMS && row < M ? cvt<A>(x[xmap.offset(row)]) : A(0); };
  auto side = [&](int buf, int k, i64 row) {  // the word holding the pivot, beside the packs
    A* const word = &side_words[buf][threadIdx.x / kWarp][k];
    if (!RMS && row < M) copy4_async(word, x + xmap.offset(row));
    else *word = A(0);
  };
  // local row k of this thread's group in step s (its own warp's word), and local row r of
  // any group once a block barrier has passed since the step's copies landed
  auto own_pivot = [&](i64 s, int k) {
    return CUNORM_GRID_STAGE_SIDE ? (RMS ? A(0) : first_of_word<T>(side_words[int(s % DEPTH)][warp][k]))
                                  : pivot(row_of(s, k));
  };
  auto row_pivot = [&](i64 s, int r) {
    return CUNORM_GRID_STAGE_SIDE
               ? (RMS ? A(0) : first_of_word<T>(side_words[int(s % DEPTH)][r / RG * (QPAD / kWarp)][r % RG]))
               : pivot(s * R + r);
  };
  auto reduce = [&](i64 s, A* slot) {
    A part[RG], m2[RG];
#pragma unroll
    for (int k = 0; k < RG; ++k) {
      A xv[VEC];
      widen<true>(*lay.at(ring, int(s % DEPTH), k, 0), xv);
      const A p = own_pivot(s, k);
      part[k] = A(0);
      if (mine) {
#pragma unroll
        for (int e = 0; e < VEC; ++e) part[k] += RMS ? xv[e] * xv[e] : xv[e] - p;
      }
    }
    group_sums<QPAD>(part, red);
    if constexpr (!RMS) {  // the slice's squared deviations from its own mean
#pragma unroll
      for (int k = 0; k < RG; ++k) {
        A xv[VEC];
        widen<true>(*lay.at(ring, int(s % DEPTH), k, 0), xv);
        const A p = own_pivot(s, k), mc = part[k] / count;
        m2[k] = A(0);
        if (mine) {
#pragma unroll
          for (int e = 0; e < VEC; ++e) m2[k] += ((xv[e] - p) - mc) * ((xv[e] - p) - mc);
        }
      }
      group_sums<QPAD>(m2, red);
    }
    if (lay.q == 0) {  // (every thread holds its group's totals; one writes them, by constant index)
#pragma unroll
      for (int k = 0; k < RG; ++k) {
        const int r = lay.grp * RG + k;
        slot[(r * G + blockIdx.x) * 2] = part[k];
        slot[(r * G + blockIdx.x) * 2 + 1] = RMS ? A(0) : m2[k];
      }
    }
  };
  auto finish = [&](i64 s, const A* slot) {
    // row r: the G partials folded in block order
    fold_rows<R>(slot, G, [&](int r, const A (&pa)[kGridPerLane], const A (&pb)[kGridPerLane]) {
      if constexpr (RMS) {
        A sum = A(0);
#pragma unroll
        for (int u = 0; u < kGridPerLane; ++u) sum += pa[u];
        sum = group_warp_sum<kWarp>(sum);
        if (lane == 0) {
          stats[r][0] = A(0);
          stats[r][1] = rsqrt_acc(sum / A(N) + eps);
        }
      } else {
        Welford<A> w{A(0), A(0), A(0)};
#pragma unroll
        for (int u = 0; u < kGridPerLane; ++u) {
          const i64 blk = lane + u * kWarp;
          if (blk >= G) break;
          const A n_b = A(grid_slice(P, blk).count) * VEC;
          w.merge(Welford<A>{n_b, pa[u] / n_b, pb[u]});
        }
#pragma unroll
        for (int o = kWarp / 2; o > 0; o /= 2) w.merge(Welford<A>{shfl_xor(w.count, o), shfl_xor(w.mean, o),
                                                                     shfl_xor(w.m2, o)});
        if (lane == 0) {
          stats[r][0] = w.mean;  // about the pivot
          stats[r][1] = rsqrt_acc(w.m2 / A(N) + eps);
        }
      }
      const i64 row = s * R + r;
      if (lane == 0 && blockIdx.x == 0 && row < M) {
        if (mean && !RMS) mean[row] = row_pivot(s, r) + stats[r][0];
        if (rstd) rstd[row] = stats[r][1];
      }
    });
    __syncthreads();
#pragma unroll
    for (int k = 0; k < RG; ++k) {
      const i64 row = row_of(s, k);
      if (!mine || row >= M) continue;
      A xv[VEC], out[VEC];
      widen<true>(*lay.at(ring, int(s % DEPTH), k, 0), xv);
      const int r = lay.grp * RG + k;
      const A p = own_pivot(s, k), mu = stats[r][0], rs = stats[r][1];
#pragma unroll
      for (int e = 0; e < VEC; ++e) out[e] = ((xv[e] - p) - mu) * rs * wv[e] + bv[e];
      store_pack_whole<T>(y + row * N + col, out);
    }
  };
  grid_row_steps<QPAD, RG, 1, DEPTH, LAG>(ring, src, map, M, col, mine, partials, counters, side, reduce, finish);
}

// The backward: dx, and one row of dW / dB partials (this block's columns over every row,
// where non-null; the host folds the one row into the gradients). Scratch as grid_row_steps
// says.
template <typename T, typename W, bool RMS, int QPAD, int RG, int DEPTH, int LAG>
__global__ void __launch_bounds__(kGridThreads) norm_bwd_grid(const T* __restrict__ dy, CUNORM_ROWMAP_PARAMS(dym),
                                                              const T* __restrict__ x, CUNORM_ROWMAP_PARAMS(xm),
                                                              const W* __restrict__ weight,
                                                              const float* __restrict__ mean,
                                                              const float* __restrict__ rstd, T* __restrict__ dx,
                                                              float* __restrict__ dw_part, float* __restrict__ db_part,
                                                              float* __restrict__ partials,
                                                              unsigned* __restrict__ counters, i64 M, i64 N) {
  typedef float A;
  typedef GridLayout<QPAD, RG, 2> Layout;
  constexpr int VEC = 16 / sizeof(T), R = Layout::R, K = RMS ? RG : 2 * RG;  // w*dy*xhat (and w*dy) a row
  extern __shared__ __align__(16) unsigned char stage_smem[];  // [DEPTH][R][x, dy][QPAD] packs
  Pack<T, VEC>* const ring = reinterpret_cast<Pack<T, VEC>*>(stage_smem);
  __shared__ A red[K * (kGridThreads / kWarp)];
  __shared__ A sums[R][2];
  __shared__ A side_words[DEPTH][kGridThreads / kWarp][RG][2];  // CUNORM_GRID_STAGE_SIDE: mean, rstd
  const Layout lay;
  const i64 G = gridDim.x;
  const GridSlice sl = grid_slice(N / VEC, blockIdx.x);
  const int lane = threadIdx.x % kWarp;
  const bool mine = lay.q < sl.count;
  const i64 col = (sl.first + lay.q) * VEC;
  const A inv_n = A(1) / A(N);
  A wv[VEC], dw_acc[VEC], db_acc[VEC];
  load_param<VEC>(mine ? weight : nullptr, col, A(1), wv);
#pragma unroll
  for (int e = 0; e < VEC; ++e) dw_acc[e] = db_acc[e] = A(0);
  const T* const src[2] = {x, dy};
  const RowMap map[2] = {CUNORM_ROWMAP(xm), CUNORM_ROWMAP(dym)};
  auto row_of = [&](i64 s, int k) { return s * R + lay.grp * RG + k; };
  auto side = [&](int buf, int k, i64 row) {  // the row's saved statistics, beside the packs
    A* const words = side_words[buf][threadIdx.x / kWarp][k];
    if (row < M) {
      if (!RMS) copy4_async(words, mean + row);
      copy4_async(words + 1, rstd + row);
    }
    if (RMS || row >= M) words[0] = A(0);
    if (row >= M) words[1] = A(0);
  };
  // local row k of this thread's group in step s (its own warp's words)
  auto stats_of = [&](i64 s, int k) {
    if constexpr (CUNORM_GRID_STAGE_SIDE) {
      const A* const words = side_words[int(s % DEPTH)][threadIdx.x / kWarp][k];
      return RowStats<A>{words[0], words[1]};
    } else {
      return row_stats<RMS>(mean, rstd, row_of(s, k), M);
    }
  };
  auto reduce = [&](i64 s, A* slot) {
    A part[K];
#pragma unroll
    for (int k = 0; k < RG; ++k) {
      const RowStats<A> st = stats_of(s, k);
      A xv[VEC], g[VEC];
      widen<true>(*lay.at(ring, int(s % DEPTH), k, 0), xv);
      widen<true>(*lay.at(ring, int(s % DEPTH), k, 1), g);
      A c1 = A(0), c2 = A(0);
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const A xhat = (xv[e] - st.mean) * st.rstd, wdy = wv[e] * g[e];
        c1 += wdy;
        c2 += wdy * xhat;
      }
      part[k] = c2;
      if constexpr (!RMS) part[RG + k] = c1;
    }
    group_sums<QPAD>(part, red);
    if (lay.q == 0) {
#pragma unroll
      for (int k = 0; k < RG; ++k) {
        const int r = lay.grp * RG + k;
        slot[(r * G + blockIdx.x) * 2] = part[k];
        slot[(r * G + blockIdx.x) * 2 + 1] = RMS ? A(0) : part[RG + k];
      }
    }
  };
  auto finish = [&](i64 s, const A* slot) {
    // row r: the G partials summed in block order
    fold_rows<R>(slot, G, [&](int r, const A (&p2)[kGridPerLane], const A (&p1)[kGridPerLane]) {
      A c2 = A(0), c1 = A(0);
#pragma unroll
      for (int u = 0; u < kGridPerLane; ++u) {
        c2 += p2[u];
        c1 += p1[u];
      }
      c2 = group_warp_sum<kWarp>(c2);
      if constexpr (!RMS) c1 = group_warp_sum<kWarp>(c1);
      if (lane == 0) {
        sums[r][0] = c1 * inv_n;
        sums[r][1] = c2 * inv_n;
      }
    });
    __syncthreads();
#pragma unroll
    for (int k = 0; k < RG; ++k) {
      const i64 row = row_of(s, k);
      if (!mine || row >= M) continue;
      const RowStats<A> st = stats_of(s, k);
      A xv[VEC], g[VEC], out[VEC];
      widen<true>(*lay.at(ring, int(s % DEPTH), k, 0), xv);
      widen<true>(*lay.at(ring, int(s % DEPTH), k, 1), g);
      const int r = lay.grp * RG + k;
      const A m1 = RMS ? A(0) : sums[r][0], m2 = sums[r][1];
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const A xhat = (xv[e] - st.mean) * st.rstd;
        out[e] = st.rstd * (wv[e] * g[e] - m1 - xhat * m2);
        dw_acc[e] += g[e] * xhat;
        if constexpr (!RMS) db_acc[e] += g[e];
      }
      store_pack_whole<T>(dx + row * N + col, out);
    }
  };
  grid_row_steps<QPAD, RG, 2, DEPTH, LAG>(ring, src, map, M, col, mine, partials, counters, side, reduce, finish);
  // The groups hold the same columns' sums over different rows: folded in group order
  // through the ring's memory (every copy has landed and been read).
  __syncthreads();
  A* const fold = reinterpret_cast<A*>(stage_smem);  // [sums][group][QPAD][VEC]
  constexpr int kGroups = Layout::kGroups, kSums = RMS ? 1 : 2;
#pragma unroll
  for (int e = 0; e < VEC; ++e) {
    fold[((0 * kGroups + lay.grp) * QPAD + lay.q) * VEC + e] = dw_acc[e];
    if constexpr (!RMS) fold[((1 * kGroups + lay.grp) * QPAD + lay.q) * VEC + e] = db_acc[e];
  }
  __syncthreads();
  if (lay.grp == 0 && mine) {
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
#pragma unroll
      for (int g = 1; g < kGroups; ++g) {
        dw_acc[e] += fold[((0 * kGroups + g) * QPAD + lay.q) * VEC + e];
        if constexpr (!RMS) db_acc[e] += fold[((1 * kGroups + g) * QPAD + lay.q) * VEC + e];
      }
    }
    if (dw_part) store_pack_whole<A>(dw_part + col, dw_acc);
    if (db_part && !RMS) store_pack_whole<A>(db_part + col, db_acc);
  }
  static_assert(kSums * kGridThreads * VEC * sizeof(A) <= DEPTH * R * 2 * QPAD * 16, "the fold fits the ring");
}
#endif
