// LayerNorm and RMSNorm, forward and backward, for rows longer than a cluster holds (v79): the
// whole grid works on R rows at a time, so x (and dy) are read from memory once, where the
// split path of layer_norm.cu reads them twice. Block b of G owns the same packs of every
// row (a slice of about N / G columns, one 16-byte pack a thread), so:
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
// The backward's dW / dB columns are this block's alone over every row, so each block sums
// them in registers and writes one partial row (the host's usual fold, with one row, turns it
// into the gradient's dtype): no partial rows to reduce across blocks.
// LayerNorm's partials are (sum, M2) of two passes over the staged slice, merged by Chan's
// formula (common.cuh Welford), as the cluster forward merges its blocks' slices.
// A thread reads back only the packs it copied itself, so the staged rows need no block
// barrier of their own.
//
// CUDA only (sm_80: cp.async, acquire loads); the host does not dispatch here on HIP.
#include "row_norm.cuh"

namespace cunorm {

#if !defined(CUNORM_HIP)
__device__ __forceinline__ unsigned load_acquire_gpu(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// This block's arrival at a step's barrier (thread 0, after it wrote the step's partials: the
// fence publishes them first).
__device__ __forceinline__ void grid_arrive(unsigned* counter) {
  __threadfence();
  atomicAdd(counter, 1u);
}

// Waits until `counter` holds `target` arrivals; every thread of the block calls it.
__device__ __forceinline__ void grid_wait(const unsigned* counter, unsigned target) {
  if (threadIdx.x == 0) {
    while (load_acquire_gpu(counter) < target) {
    }
  }
  __syncthreads();
}
#endif

// Block b's slice of the row's `packs` packs: [first, first + count), sizes within one.
struct GridSlice {
  i64 first;
  int count;
};

__device__ __forceinline__ GridSlice grid_slice(i64 packs, i64 b) {
  const i64 G = gridDim.x, first = b * packs / G;
  return GridSlice{first, int((b + 1) * packs / G - first)};
}

// The most blocks a grid-row grid may have (the host holds it: _config.GRID_MAX_BLOCKS):
// each lane of a folding warp loads kGridPerLane blocks' partials of a row at once.
constexpr int kGridMaxBlocks = 160;
constexpr int kGridPerLane = (kGridMaxBlocks + kWarp - 1) / kWarp;

// Row r's partial pairs from `slot` ([R][G][2]) for the rows warp, warp + kWarps, ... of the
// block (kRows of them): lane l gets blocks l, l + kWarp, ... (zeros past G or R). Every load
// issues before any is used: the fold waits one L2 round trip, not one a block (v79's first
// form, a loop of dependent adds over the blocks, held each step for microseconds).
template <int R, int TPB, int kRows = (R + TPB / kWarp - 1) / (TPB / kWarp)>
__device__ __forceinline__ void load_row_partials(const float* slot, i64 G, float (&a)[kRows][kGridPerLane],
                                                  float (&b)[kRows][kGridPerLane]) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
#pragma unroll
  for (int k = 0; k < kRows; ++k) {
    const int r = warp + k * (TPB / kWarp);
#pragma unroll
    for (int u = 0; u < kGridPerLane; ++u) {
      const i64 blk = lane + u * kWarp;
      const bool ok = r < R && blk < G;
      a[k][u] = ok ? __ldcg(slot + (r * G + blk) * 2) : 0.0f;
      b[k][u] = ok ? __ldcg(slot + (r * G + blk) * 2 + 1) : 0.0f;
    }
  }
}

// Each of K values summed over the block (TPB threads, whole warps); every thread gets the K
// totals, in a fixed order. smem: K * TPB / kWarp values.
template <int TPB, int K, typename A>
__device__ __forceinline__ void block_sums(A (&v)[K], A* smem) {
  constexpr int kWarps = TPB / kWarp;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
#pragma unroll
  for (int k = 0; k < K; ++k) v[k] = group_warp_sum<kWarp>(v[k]);
  if (lane == 0) {
#pragma unroll
    for (int k = 0; k < K; ++k) smem[k * kWarps + warp] = v[k];
  }
  __syncthreads();
#pragma unroll
  for (int k = 0; k < K; ++k) v[k] = second_level_sum<kWarps>(smem + k * kWarps, lane);
  __syncthreads();  // smem free again
}

// Copies this thread's pack of rows s*R .. s*R + R - 1 of each of the SETS sources into ring
// buffer `buf` ([DEPTH][R][SETS][TPB] packs; zeros for rows past M or a thread past its slice)
// and commits them as one group.
template <int R, int SETS, int TPB, typename T, int VEC>
__device__ __forceinline__ void stage_grid_rows(Pack<T, VEC>* ring, int buf, const T* const (&src)[SETS],
                                                const RowMap (&map)[SETS], i64 s, i64 M, i64 col, bool mine) {
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const i64 row = s * R + r;
    const bool in = mine && row < M;
#pragma unroll
    for (int k = 0; k < SETS; ++k)
      copy16_async(ring + ((buf * R + r) * SETS + k) * TPB + threadIdx.x, src[k] + (in ? map[k].offset(row) + col : 0),
                   in);
  }
  copies_commit();
}

// The steps of a grid-row kernel over rows 0 .. M - 1, R a step: `reduce(step, rows, slot)`
// sums this block's slice of the step's staged rows (`rows`: this thread's first pack of
// them, [R][SETS] strided by TPB) and has thread 0 write them into `slot`; `finish(step, rows,
// slot)` folds the step's slot once every block has written it and writes the outputs. The
// ring holds DEPTH steps: LAG between a step's sums and its finish, the rest in flight.
// Scratch: `counters` (LAG + 1 words, zeroed; step s arrives at counter s mod (LAG + 1), whose
// arrivals count on over the launch) and `partials` (2 * LAG + 2 slots of R * G * 2 floats:
// a block rewrites a slot only after every block has folded it). A block ahead by a counter's
// period has waited for the barrier LAG + 1 steps before its own, so no step's arrivals mix
// with a later step's.
template <int R, int SETS, int TPB, int DEPTH, int LAG, typename T, int VEC, typename Reduce, typename Finish>
__device__ __forceinline__ void grid_row_steps(Pack<T, VEC>* ring, const T* const (&src)[SETS],
                                               const RowMap (&map)[SETS], i64 M, i64 col, bool mine,
                                               float* partials, unsigned* counters, Reduce&& reduce,
                                               Finish&& finish) {
  constexpr int kAhead = DEPTH - LAG - 1, kCounters = LAG + 1, kSlots = 2 * LAG + 2;
  static_assert(kAhead >= 1, "a step in flight");
  const i64 G = gridDim.x, steps = (M + R - 1) / R, slot_floats = i64(R) * G * 2;
  auto rows_of = [&](i64 s) { return ring + int(s % DEPTH) * (R * SETS * TPB) + threadIdx.x; };
#pragma unroll
  for (int d = 0; d < kAhead; ++d) {
    if (d < steps) stage_grid_rows<R, SETS, TPB>(ring, d, src, map, d, M, col, mine);
    else copies_commit();
  }
  for (i64 i = 0; i < steps + LAG; ++i) {
    if (i < steps) {
      const i64 ahead = i + kAhead;  // into the buffer of step i - LAG - 1, finished (by this thread) last step
      if (ahead < steps) stage_grid_rows<R, SETS, TPB>(ring, int(ahead % DEPTH), src, map, ahead, M, col, mine);
      else copies_commit();
      copies_wait<kAhead>();
      reduce(i, rows_of(i), partials + (i % kSlots) * slot_floats);
      if (threadIdx.x == 0) grid_arrive(counters + i % kCounters);
    }
    const i64 j = i - LAG;
    if (j >= 0) {
      grid_wait(counters + j % kCounters, unsigned((j / kCounters + 1) * G));
      finish(j, rows_of(j), partials + (j % kSlots) * slot_floats);
    }
  }
  copies_wait<0>();
}

}  // namespace cunorm

using namespace cunorm;

#if !defined(CUNORM_HIP)
// The forward: y, and mean (LayerNorm) / rstd where non-null. Scratch as grid_row_steps says.
// 16-byte packs only (VEC = 16 / sizeof(T)).
template <typename T, typename W, bool RMS, int TPB, int R, int DEPTH, int LAG>
__global__ void __launch_bounds__(TPB) norm_fwd_grid(const T* __restrict__ x, CUNORM_ROWMAP_PARAMS(xm),
                                                     T* __restrict__ y, const W* __restrict__ weight,
                                                     const W* __restrict__ bias, float* __restrict__ mean,
                                                     float* __restrict__ rstd, float* __restrict__ partials,
                                                     unsigned* __restrict__ counters, i64 M, i64 N, float eps) {
  typedef float A;
  constexpr int VEC = 16 / sizeof(T);
  extern __shared__ __align__(16) unsigned char stage_smem[];
  __shared__ A red[R * (TPB / kWarp)];
  __shared__ A stats[R][2];
  const i64 G = gridDim.x, P = N / VEC;
  const GridSlice sl = grid_slice(P, blockIdx.x);
  const int t = threadIdx.x, lane = t % kWarp, warp = t / kWarp;
  const bool mine = t < sl.count;
  const i64 col = (sl.first + t) * VEC;
  const A count = A(sl.count) * VEC;
  A wv[VEC], bv[VEC];
  load_param<VEC>(mine ? weight : nullptr, col, A(1), wv);
  load_param<VEC>(mine ? bias : nullptr, col, A(0), bv);
  const T* const src[1] = {x};
  const RowMap map[1] = {CUNORM_ROWMAP(xm)};
  auto reduce = [&](i64, const Pack<T, VEC>* rows, A* slot) {
    A part[R], m2[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      A xv[VEC];
      widen<true>(rows[r * TPB], xv);
      part[r] = A(0);
#pragma unroll
      for (int k = 0; k < VEC; ++k) part[r] += RMS ? xv[k] * xv[k] : xv[k];
    }
    block_sums<TPB>(part, red);
    if constexpr (!RMS) {  // the slice's squared deviations from its own mean
#pragma unroll
      for (int r = 0; r < R; ++r) {
        A xv[VEC];
        widen<true>(rows[r * TPB], xv);
        const A mu = part[r] / count;
        m2[r] = A(0);
        if (mine) {
#pragma unroll
          for (int k = 0; k < VEC; ++k) m2[r] += (xv[k] - mu) * (xv[k] - mu);
        }
      }
      block_sums<TPB>(m2, red);
    }
    if (t == 0) {  // (every thread holds the totals; one writes them, by constant index)
#pragma unroll
      for (int r = 0; r < R; ++r) {
        slot[(r * G + blockIdx.x) * 2] = part[r];
        slot[(r * G + blockIdx.x) * 2 + 1] = RMS ? A(0) : m2[r];
      }
    }
  };
  auto finish = [&](i64 s, const Pack<T, VEC>* rows, const A* slot) {
    constexpr int kRows = (R + TPB / kWarp - 1) / (TPB / kWarp);
    A pa[kRows][kGridPerLane], pb[kRows][kGridPerLane];
    load_row_partials<R, TPB>(slot, G, pa, pb);
#pragma unroll
    for (int k = 0; k < kRows; ++k) {  // row r: the G partials folded in block order
      const int r = warp + k * (TPB / kWarp);
      if (r >= R) break;
      if constexpr (RMS) {
        A sum = A(0);
#pragma unroll
        for (int u = 0; u < kGridPerLane; ++u) sum += pa[k][u];
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
          w.merge(Welford<A>{n_b, pa[k][u] / n_b, pb[k][u]});
        }
#pragma unroll
        for (int o = kWarp / 2; o > 0; o /= 2) w.merge(Welford<A>{shfl_xor(w.count, o), shfl_xor(w.mean, o),
                                                                     shfl_xor(w.m2, o)});
        if (lane == 0) {
          stats[r][0] = w.mean;
          stats[r][1] = rsqrt_acc(w.m2 / A(N) + eps);
        }
      }
      const i64 row = s * R + r;
      if (lane == 0 && blockIdx.x == 0 && row < M) {
        if (mean && !RMS) mean[row] = stats[r][0];
        if (rstd) rstd[row] = stats[r][1];
      }
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const i64 row = s * R + r;
      if (!mine || row >= M) continue;
      A xv[VEC], out[VEC];
      widen<true>(rows[r * TPB], xv);
      const A mu = stats[r][0], rs = stats[r][1];
#pragma unroll
      for (int k = 0; k < VEC; ++k) out[k] = (xv[k] - mu) * rs * wv[k] + bv[k];
      store_pack_whole<T>(y + row * N + col, out);
    }
  };
  grid_row_steps<R, 1, TPB, DEPTH, LAG>(reinterpret_cast<Pack<T, VEC>*>(stage_smem), src, map, M, col, mine,
                                        partials, counters, reduce, finish);
}

// The backward: dx, and one row of dW / dB partials (this block's columns over every row,
// where non-null; the host folds the one row into the gradients). Scratch as grid_row_steps
// says.
template <typename T, typename W, bool RMS, int TPB, int R, int DEPTH, int LAG>
__global__ void __launch_bounds__(TPB) norm_bwd_grid(const T* __restrict__ dy, CUNORM_ROWMAP_PARAMS(dym),
                                                     const T* __restrict__ x, CUNORM_ROWMAP_PARAMS(xm),
                                                     const W* __restrict__ weight, const float* __restrict__ mean,
                                                     const float* __restrict__ rstd, T* __restrict__ dx,
                                                     float* __restrict__ dw_part, float* __restrict__ db_part,
                                                     float* __restrict__ partials, unsigned* __restrict__ counters,
                                                     i64 M, i64 N) {
  typedef float A;
  constexpr int VEC = 16 / sizeof(T), K = RMS ? R : 2 * R;  // sums a step: w*dy*xhat (and w*dy)
  extern __shared__ __align__(16) unsigned char stage_smem[];  // [DEPTH][R][x, dy][TPB] packs
  __shared__ A red[K * (TPB / kWarp)];
  __shared__ A sums[R][2];
  const i64 G = gridDim.x;
  const GridSlice sl = grid_slice(N / VEC, blockIdx.x);
  const int t = threadIdx.x, lane = t % kWarp, warp = t / kWarp;
  const bool mine = t < sl.count;
  const i64 col = (sl.first + t) * VEC;
  const A inv_n = A(1) / A(N);
  A wv[VEC], dw_acc[VEC], db_acc[VEC];
  load_param<VEC>(mine ? weight : nullptr, col, A(1), wv);
#pragma unroll
  for (int k = 0; k < VEC; ++k) dw_acc[k] = db_acc[k] = A(0);
  const T* const src[2] = {x, dy};
  const RowMap map[2] = {CUNORM_ROWMAP(xm), CUNORM_ROWMAP(dym)};
  auto reduce = [&](i64 s, const Pack<T, VEC>* rows, A* slot) {
    A part[K];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const RowStats<A> st = row_stats<RMS>(mean, rstd, s * R + r, M);
      A xv[VEC], g[VEC];
      widen<true>(rows[(2 * r) * TPB], xv);
      widen<true>(rows[(2 * r + 1) * TPB], g);
      A c1 = A(0), c2 = A(0);
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        const A xhat = (xv[k] - st.mean) * st.rstd, wdy = wv[k] * g[k];
        c1 += wdy;
        c2 += wdy * xhat;
      }
      part[r] = c2;
      if constexpr (!RMS) part[R + r] = c1;
    }
    block_sums<TPB>(part, red);
    if (t == 0) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        slot[(r * G + blockIdx.x) * 2] = part[r];
        slot[(r * G + blockIdx.x) * 2 + 1] = RMS ? A(0) : part[R + r];
      }
    }
  };
  auto finish = [&](i64 s, const Pack<T, VEC>* rows, const A* slot) {
    constexpr int kRows = (R + TPB / kWarp - 1) / (TPB / kWarp);
    A p2[kRows][kGridPerLane], p1[kRows][kGridPerLane];
    load_row_partials<R, TPB>(slot, G, p2, p1);
#pragma unroll
    for (int k = 0; k < kRows; ++k) {  // row r: the G partials summed in block order
      const int r = warp + k * (TPB / kWarp);
      if (r >= R) break;
      A c2 = A(0), c1 = A(0);
#pragma unroll
      for (int u = 0; u < kGridPerLane; ++u) {
        c2 += p2[k][u];
        c1 += p1[k][u];
      }
      c2 = group_warp_sum<kWarp>(c2);
      if constexpr (!RMS) c1 = group_warp_sum<kWarp>(c1);
      if (lane == 0) {
        sums[r][0] = c1 * inv_n;
        sums[r][1] = c2 * inv_n;
      }
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const i64 row = s * R + r;
      if (!mine || row >= M) continue;
      const RowStats<A> st = row_stats<RMS>(mean, rstd, row, M);
      A xv[VEC], g[VEC], out[VEC];
      widen<true>(rows[(2 * r) * TPB], xv);
      widen<true>(rows[(2 * r + 1) * TPB], g);
      const A m1 = RMS ? A(0) : sums[r][0], m2 = sums[r][1];
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        const A xhat = (xv[k] - st.mean) * st.rstd;
        out[k] = st.rstd * (wv[k] * g[k] - m1 - xhat * m2);
        dw_acc[k] += g[k] * xhat;
        if constexpr (!RMS) db_acc[k] += g[k];
      }
      store_pack_whole<T>(dx + row * N + col, out);
    }
  };
  grid_row_steps<R, 2, TPB, DEPTH, LAG>(reinterpret_cast<Pack<T, VEC>*>(stage_smem), src, map, M, col, mine,
                                        partials, counters, reduce, finish);
  if (mine) {
    if (dw_part) store_pack_whole<A>(dw_part + col, dw_acc);
    if (db_part && !RMS) store_pack_whole<A>(db_part + col, db_acc);
  }
}
#endif
