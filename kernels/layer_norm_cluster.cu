// LayerNorm and RMSNorm forward for long rows on sm_90 and later: a thread-block cluster of
// CLUSTER blocks holds one row in registers, so x is read once (the split path of
// layer_norm.cu reads it twice and launches three kernels). Each block reduces its slice,
// then reads every block's partial through distributed shared memory and folds them in rank
// order, so all blocks of the cluster hold bit-identical statistics. LayerNorm: each block
// takes its slice's two-pass statistics (x - pivot summed, pivot the row's first element,
// then squared deviations from the slice's own mean) and one cluster exchange merges the
// slices' (sum, M2) pairs by Chan's formula — as stable as the full-row kernel's two passes
// over the row, with one cluster barrier a row instead of two (NOTES v15). RMSNorm: the sum
// of squares alone.
//
// The arguments are norm_fwd's (layer_norm.cu), so the host launches either the same way;
// tile_stats, row_shift and C are unused here.
//
// Cluster operations are PTX (sm_90, common.cuh): cooperative_groups' cluster API needs libcu++ headers
// that NVRTC's wheels do not ship, and CI compiles every kernel without a CUDA install.
#include "row_norm.cuh"

using namespace cunorm;

// One exchange between the blocks of a cluster: this block publishes K values in `slot`
// (its K shared words for this exchange), waits for every block, and lane r < CLUSTER of
// warp 0 gets rank r's values in `theirs` (other lanes and threads: zeros). Exchanges
// alternate two slots, since a block may still be reading the other one of its neighbours.
// Every thread of every block of the cluster calls it.
// cluster_publish then cluster_collect; v90 puts a row's work between the two. (CLUSTER is
// unused here: callers name it as they do for the pushed exchange's publish below.)
template <int CLUSTER = 0, int K>
__device__ __forceinline__ void cluster_publish(const float (&mine)[K], float* slot) {
  if (threadIdx.x == 0) {
#pragma unroll
    for (int k = 0; k < K; ++k) slot[k] = mine[k];
    cluster_fence();
  }
  cluster_arrive();
}

template <int CLUSTER, int K>
__device__ __forceinline__ void cluster_collect(const float* slot, float (&theirs)[K]) {
  cluster_wait();  // every block's slot written (and the previous use of bcast read)
#pragma unroll
  for (int k = 0; k < K; ++k)
    theirs[k] = threadIdx.x < CLUSTER ? load_cluster(slot + k, threadIdx.x) : 0.0f;
}

// (p10) norm_fwd_cluster's exchanges by push (MailSlot below): no fence and no cluster barrier
// a row, the statistics' bits unchanged; which tiles take it: ClusterFwdPush. 1: by its rule;
// 2: every tile (sweeps); 0: none (v48's fenced exchange, cluster_publish above).
#ifndef CUNORM_CLUSTER_FWD_PUSH
#define CUNORM_CLUSTER_FWD_PUSH 1
#endif
// The same exchange by push: thread 0 sends the block's K values into every rank's mail (this
// set's [CLUSTER][2] floats of each block), counted on that rank's mbarrier of the set, and
// the collect waits on its own block's and reads the ranks' values from its own mail: lane
// r < CLUSTER of warp 0 gets rank r's, as cluster_collect's, so the sums after it keep their
// bits. No fence (thread 0's compiles to MEMBAR.ALL.GPU and an L1 invalidation, NOTES "(p7)")
// and no cluster barrier. Two sets alternate: every collect the forward makes is followed by
// a block barrier (the broadcast's) before its next publish, so a rank's push of exchange
// k + 2 (after it has all of k + 1) finds every rank done reading its mail of k. What the
// cluster barrier also ordered inside a block, the broadcast word's reuse, norm_fwd_cluster
// orders itself (its bcast). `parity`: this set's phase, counted by the caller (every thread
// alike).
struct MailSlot {
  float* mail;              // this set's [CLUSTER][2] floats, this block's
  unsigned long long* bar;  // this set's mbarrier, this block's
  unsigned parity;
};
template <int CLUSTER, int K>
__device__ __forceinline__ void cluster_publish(const float (&mine)[K], MailSlot slot) {
  if (threadIdx.x == 0) {
    mbar_arrive_expect(slot.bar, CLUSTER * K * sizeof(float));
#pragma unroll
    for (int r = 0; r < CLUSTER; ++r) push_cluster_values(slot.mail + 2 * cluster_rank(), slot.bar, r, mine);
  }
}
template <int CLUSTER, int K>
__device__ __forceinline__ void cluster_collect(MailSlot slot, float (&theirs)[K]) {
  // every thread waits: warp 0 alone ((p10b), its lanes read the mail) measured level or
  // 0.001-0.008 lower (NOTES "(p10) outcome")
  mbar_wait(slot.bar, slot.parity);
#pragma unroll
  for (int k = 0; k < K; ++k) theirs[k] = threadIdx.x < CLUSTER ? slot.mail[2 * threadIdx.x + k] : 0.0f;
}

template <int CLUSTER, int K, typename Slot>
__device__ __forceinline__ void cluster_gather(const float (&mine)[K], Slot slot, float (&theirs)[K]) {
  cluster_publish<CLUSTER>(mine, slot);
  cluster_collect<CLUSTER>(slot, theirs);
}

// The rank-order sums of the K values each block published in `slot`: the same bits in
// every block. `bcast` is K block-local words; ends with a block barrier, the sums in every
// thread.
template <int CLUSTER, int K, typename Slot>
__device__ __forceinline__ void cluster_collect_sums(float (&v)[K], Slot slot, float* bcast) {
  float theirs[K];
  cluster_collect<CLUSTER>(slot, theirs);
  if (threadIdx.x < kWarp) {
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const float total = group_warp_sum<kWarp>(theirs[k]);
      if (threadIdx.x == 0) bcast[k] = total;
    }
  }
  __syncthreads();
#pragma unroll
  for (int k = 0; k < K; ++k) v[k] = bcast[k];
}

// Sums over the cluster of K values a block, in rank order (cluster_collect_sums).
template <int CLUSTER, int K, typename Slot>
__device__ __forceinline__ void cluster_sums(float (&v)[K], Slot slot, float* bcast) {
  cluster_publish<CLUSTER>(v, slot);
  cluster_collect_sums<CLUSTER>(v, slot, bcast);
}

// The row's mean (relative to the pivot) and M2 from each block's slice sum and slice M2
// (about the slice's own mean), merged in rank order by Chan's formula: the same bits in
// every block. A rank's element count follows from its rank, the row length and the slice.
template <int CLUSTER, typename Slot>
__device__ __forceinline__ void cluster_mean_m2(float sum, float m2, Slot slot, float* bcast, i64 n, i64 slice,
                                                float& mean, float& row_m2) {
  typedef float A;
  const A mine[2] = {sum, m2};
  A theirs[2];
  cluster_gather<CLUSTER>(mine, slot, theirs);
  if (threadIdx.x < kWarp) {
    const i64 c0 = i64(threadIdx.x) * slice;
    const A count = threadIdx.x >= CLUSTER || n <= c0 ? A(0) : A(n - c0 < slice ? n - c0 : slice);
    const A mu = group_warp_sum<kWarp>(theirs[0]) / A(n);
    const A d = count > A(0) ? theirs[0] / count - mu : A(0);
    const A total = group_warp_sum<kWarp>(theirs[1] + count * d * d);
    if (threadIdx.x == 0) {
      bcast[0] = mu;
      bcast[1] = total;
    }
  }
  __syncthreads();
  mean = bcast[0];
  row_m2 = bcast[1];
}

// f(col, v) for each of this thread's packs of a block's slice (TPB threads, pack p of
// thread t at column (p * TPB + t) * VEC) that lies inside the row, widened to A.
// f(p, col, v): the same with the pack's index.
template <typename A, int TPB, typename T, int VEC, int PACKS, typename F>
__device__ __forceinline__ void for_slice_packs_at(const Pack<T, VEC> (&raw)[PACKS], int limit, F&& f) {
#pragma unroll
  for (int p = 0; p < PACKS; ++p) {
    const int col = pack_col<VEC, TPB>(p, threadIdx.x);
    if (col >= limit) continue;
    A v[VEC];
    unpack(raw[p], v);
    f(p, col, v);
  }
}
template <typename A, int TPB, typename T, int VEC, int PACKS, typename F>
__device__ __forceinline__ void for_slice_packs(const Pack<T, VEC> (&raw)[PACKS], int limit, F&& f) {
  for_slice_packs_at<A, TPB>(raw, limit, [&](int, int col, const A(&v)[VEC]) { f(col, v); });
}

// v49: the forward's clusters are persistent (the host starts as many as run at once) and each
// copies the slices of its next rows into shared memory with cp.async while it reduces and
// writes the current one, held in registers as before. Before v49 a cluster loaded its row
// only after the previous one was written, so nothing was in flight through the two
// reductions and the cluster barrier (ncu: long scoreboard and barrier stalls, 1.1 warps
// eligible; NOTES, "Warp stalls of two weak kernels"). Rows staged ahead, measured by
// benchmarks/sweep_cluster_fwd_stage.py (NOTES v49; the host mirrors this in
// _config.cluster_fwd_stage_rows):
//   half precision: one (bf16 RMSNorm N = 65536 / 131072 0.65 / 0.62 -> 0.71 / 0.70 of copy,
//     LayerNorm 0.55 / 0.50 -> 0.58 / 0.56; two rows gained nothing more);
//   float32 LayerNorm of 512-thread blocks (N > 65536): one (0.70 -> 0.74);
//   other float32 tiles: none, v48's grid (RMSNorm lost 0.08-0.12 staged, LayerNorm at
//     256-thread blocks -0.02 to +0.01).
// CUNORM_CLUSTER_FWD_STAGE >= 0 forces that count on every tile (0: the v48 kernel).
#ifndef CUNORM_CLUSTER_FWD_STAGE
#define CUNORM_CLUSTER_FWD_STAGE -1
#endif
// v50: half-precision LayerNorm statistics in one pass where that is safe (row_norm.cuh,
// kOnePassTrust). The shifted sums of d = x - pivot and d^2 (the pivot the row's first
// element) go through one block reduction and one cluster exchange; the two-pass statistics
// take a second pass over the slice and two more reductions. A row the one pass does not
// serve takes the two passes after all, with v48's bits. bf16
// LayerNorm N = 65536 / 131072: 0.58 / 0.56 -> 0.63 / 0.61 of copy (NOTES v50). float32
// rows keep the two passes. CUNORM_CLUSTER_FWD_ONE_PASS=0: always two.
#ifndef CUNORM_CLUSTER_FWD_ONE_PASS
#define CUNORM_CLUSTER_FWD_ONE_PASS 1
#endif
// v112: float32 LayerNorm rows in one pass too (one block reduction and one exchange a row,
// where the two passes take two block reductions), trusted only within two standard
// deviations of zero (row_norm.cuh kOnePassTrustF32); the others take the two passes about
// their first element, as every float32 row did before. Prediction in NOTES "v112".
// CUNORM_CLUSTER_FWD_ONE_PASS_F32=0: float32 rows always in two passes. v112b: only in tiles
// of CUNORM_CLUSTER_FWD_ONE_PASS_F32_MIN_TPB threads or more: v112 on every tile read float32
// LayerNorm 131072 / 262144 (512 / 1024 threads) +0.027 / +0.026 of copy and 32768 / 65536
// (256) -0.011 / -0.029 (H100, NOTES "v112 outcome"). 0: every tile (v112 as measured).
#ifndef CUNORM_CLUSTER_FWD_ONE_PASS_F32
#define CUNORM_CLUSTER_FWD_ONE_PASS_F32 1
#endif
#ifndef CUNORM_CLUSTER_FWD_ONE_PASS_F32_MIN_TPB
#define CUNORM_CLUSTER_FWD_ONE_PASS_F32_MIN_TPB 512
#endif
// v97: the one pass sums x itself, as the fused FP8 forward's (v95), and its y takes the mean
// off inside a multiply-add, fma(x, r, -mean r) * w + b: per element a subtraction fewer in
// the sums and two in y, and no pivot loaded a row. The trust test then reads mean^2 <= 64
// var: rows further than 8 sigma from zero, and constant rows, take the two passes about their
// first element, loaded then, and y as (x - mean) * r. 1: v50's pivot for every row.
#ifndef CUNORM_CLUSTER_FWD_PIVOT
#define CUNORM_CLUSTER_FWD_PIVOT 0
#endif

// v90: the half-precision cluster forward publishes row j + 1's block sums before it waits
// for row j's exchange (cluster_publish / cluster_collect: the cluster barrier's arrive and
// wait split), so a block reduces its next row while the cluster's slowest block catches up.
// ncu (results/stalls-cluster-fwd-h200.txt, bf16 LayerNorm 65536 / RMSNorm 131072): the
// barrier's wait (UCGABAR_WAIT) held 17.6% / 23.1% of the warps' samples, barrier stalls
// 26% / 34%. Rows stay in shared memory until their y is written (each read twice: sums,
// then y), so the ring holds the row being written, the row being summed and the staged
// rows: ClusterFwdStage::rows + 2 buffers (_config.cluster_fwd_stage_bytes mirrors it).
// 0: the exchange waits where it publishes (v50's loop).
#ifndef CUNORM_CLUSTER_FWD_PIPE
#define CUNORM_CLUSTER_FWD_PIPE 1
#endif

// v105: RMSNorm's weight staged once a block in shared memory after its rows (OwnSlot: half
// precision in its own packs, float32 as floats), for y to read there instead of loading it
// from global memory every row: a row's parameters are as many bytes as the row, more than
// the L1 keeps (NOTES "Probe: the long-row forwards re-read their parameters every row").
// The slots cost resident blocks where they join staged rows, and that decides (H200, two
// rounds, benchmarks/sweep_cluster_fwd_param_slots.py, results/sweep-cluster-fwd-param-
// slots-v105-h200.txt, forward of copy):
//   float32 RMSNorm (rows not staged, no block lost): 32768 / 65536 / 131072 0.849 / 0.822 /
//     0.759 -> 0.857 / 0.855 / 0.805;
//   half-precision RMSNorm, 256-thread blocks with a weight in x's type (4 -> 3 blocks an
//     SM): bf16 65536 0.775 -> 0.817; with a float32 weight (4 -> 2) 0.776 -> 0.750; 512-
//     thread blocks (2 -> 1) 0.761 -> 0.715;
//   LayerNorm (weight and bias), every tile lost but bf16 rows with float32 parameters
//     (65536: 0.647 -> 0.683, 131072: 0.637 -> 0.606): bf16 0.717 / 0.700 -> 0.675 / 0.614
//     at 65536 / 131072, float32 32768 0.820 -> 0.794.
// So the slots serve those two RMSNorm kinds of tile, where rows and slots fit what a block
// may opt in to. v107 adds float32 RMSNorm's 1024-thread tile (rows of 131073-262144, which
// stage no rows: its 128 KiB of slots cost no resident block): 0.645 -> 0.732 of copy at
// 262144 (without a weight, slots of ones, 0.755 -> 0.724). The host mirrors it
// (_config.cluster_fwd_param_bytes). 0: loaded every row.
#ifndef CUNORM_CLUSTER_FWD_PARAM_SLOTS
#define CUNORM_CLUSTER_FWD_PARAM_SLOTS 1
#endif
#ifndef CUNORM_CLUSTER_FWD_PARAM_SLOTS_ALL  // 1: every tile where they fit (the sweep's first build)
#define CUNORM_CLUSTER_FWD_PARAM_SLOTS_ALL 0
#endif
// v106: half-precision LayerNorm rows with float32 weight and bias in 256-thread tiles keep
// both in slots too, for the rows from 16385 the host sends here with such parameters
// (_config.FWD_CLUSTER_WIDE_PARAMS_FROM). Its sweep, bf16 LayerNorm with float32 w + b:
// 32768 0.661 -> 0.701 of copy, 65536 0.647 -> 0.685 (against the same route without them).
// 0: v105's tiles.
#ifndef CUNORM_CLUSTER_FWD_WIDE_PARAM_SLOTS
#define CUNORM_CLUSTER_FWD_WIDE_PARAM_SLOTS 1
#endif
// v121: LayerNorm's portable clusters of eight keep w + b in slots for float32 rows (32769-
// 131072: 256- and 512-thread blocks; the 1024-thread tile has no room) and for half-precision
// rows with float32 w + b in 512-thread blocks (65537-131072). H100, the every-tile build of
// benchmarks/sweep_cluster_fwd_param_slots.py against v105's tiles (results/parked-57c),
// forward of copy: float32 LayerNorm 65536 / 131072 0.878 / 0.859 -> 0.905 / 0.914 (clusters
// of four, 32768: 0.914 / 0.910, left out), bf16 LayerNorm with float32 w + b 131072 0.810 ->
// 0.830; bf16 w + b lost there (0.864 -> 0.818 at 65536), as in v105's sweep. 0: v120's tiles.
#ifndef CUNORM_CLUSTER_FWD_EIGHT_PARAM_SLOTS
#define CUNORM_CLUSTER_FWD_EIGHT_PARAM_SLOTS 1
#endif

// v107: float32 RMSNorm blocks of at least this many threads store whole 16-byte packs, as
// every other cluster forward does. The plain store compiles to four 4-byte STG.E a pack (32
// a thread a row at 1024 threads); without a weight's loads between them, ncu found the
// 1024-thread tile stalled on the LG queue (43 of 99 cycles an issue) at 0.373 of copy
// against 0.654 with a weight. Whole stores on every tile (sweep_cluster_fwd_f32_rms_store.py,
// float32 RMSNorm with a weight, forward of copy): 24576-131072 +0.03-0.04 (32768 0.857 ->
// 0.885, 131072 0.804 -> 0.842), 262144 without a weight 0.376 -> 0.755, with one 0.656 ->
// 0.645 (then 0.732 with v107's slots). v47's loss with them predates the staged rows and
// slots. 2048: the plain store throughout.
#ifndef CUNORM_CLUSTER_FWD_F32_RMS_STORE16_FROM
#define CUNORM_CLUSTER_FWD_F32_RMS_STORE16_FROM 0
#endif

// v120: float32 RMSNorm in non-portable clusters (past eight blocks) stages its next row as
// float32 LayerNorm does, beside its weight's slots (64 KiB of row, 64 KiB of slots a block).
// 0: no row staged there, as on the portable tiles.
#ifndef CUNORM_CLUSTER_FWD_F32_RMS_NONPORTABLE_STAGE
#define CUNORM_CLUSTER_FWD_F32_RMS_NONPORTABLE_STAGE 1
#endif
template <typename T, int TPB, bool RMS, int CLUSTER>
struct ClusterFwdStage {
  static constexpr int rows = CUNORM_CLUSTER_FWD_STAGE >= 0 ? CUNORM_CLUSTER_FWD_STAGE
                              : sizeof(T) == 2 ? 1
                              : (!RMS && TPB >= 512) || (CUNORM_CLUSTER_FWD_F32_RMS_NONPORTABLE_STAGE && CLUSTER > 8) ? 1
                              : 0;
  // v90's rows (half precision, rows staged; LayerNorm with its one-pass statistics)
  static constexpr bool pipe = CUNORM_CLUSTER_FWD_PIPE && sizeof(T) == 2 && rows > 0 &&
                               (RMS || CUNORM_CLUSTER_FWD_ONE_PASS);
  static constexpr int buffers = pipe ? rows + 2 : rows;
};
// v119: float32 LayerNorm rows of 131073-262144 in non-portable clusters of sixteen 512-thread
// blocks (the host's _config.CLUSTER_FWD_NONPORTABLE) keep w and b in slots after their staged
// row (64 KiB of row, 128 KiB of slots), where the portable tile of eight 1024-thread blocks
// stages 128 KiB of row and has no room for them: it loads w + b from the L2 every row.
// Measured in benchmarks/NOTES.md, "v119". 0: the non-portable tile loads them as the
// portable one does.
#ifndef CUNORM_CLUSTER_FWD_F32_NONPORTABLE_SLOTS
#define CUNORM_CLUSTER_FWD_F32_NONPORTABLE_SLOTS 1
#endif
// v120: half-precision rows there too (host: _config.CLUSTER_FWD_NONPORTABLE_HALF), whose
// portable tile's three staged rows (v90, 192 KiB) leave no room for slots; in sixteen blocks
// the rows take 96 KiB and w (+ b) fit after them (H100, forward of copy at 262144: bf16
// LayerNorm 0.82 -> 0.90, with float32 w + b 0.77 -> 0.88; benchmarks/NOTES.md, "v120
// outcome"). 0: these blocks load their parameters every row.
#ifndef CUNORM_CLUSTER_FWD_HALF_NONPORTABLE_SLOTS
#define CUNORM_CLUSTER_FWD_HALF_NONPORTABLE_SLOTS 1
#endif
template <typename T, typename W, int VEC, int PACKS, int TPB, bool RMS, int CLUSTER>
struct ClusterFwdParamSlots {
  typedef typename OwnSlot<W, VEC>::type Slot;
  static constexpr int kSlice = TPB * PACKS * VEC;
  static constexpr int kRowBytes = ClusterFwdStage<T, TPB, RMS, CLUSTER>::buffers * kSlice * int(sizeof(T));
  static constexpr int kParamBytes = kSlice * OwnSlot<W, VEC>::kValueBytes;  // one parameter's
  static constexpr bool kServes =
      CUNORM_CLUSTER_FWD_PARAM_SLOTS_ALL ||
      (CUNORM_CLUSTER_FWD_WIDE_PARAM_SLOTS && !RMS && sizeof(T) == 2 && sizeof(W) == 4 && TPB == 256) ||
      (RMS && (sizeof(T) == 4 || (TPB == 256 && sizeof(W) == 2))) ||
      (CUNORM_CLUSTER_FWD_F32_NONPORTABLE_SLOTS && !RMS && sizeof(T) == 4 && CLUSTER > 8) ||  // v119
      (CUNORM_CLUSTER_FWD_HALF_NONPORTABLE_SLOTS && sizeof(T) == 2 && CLUSTER > 8) ||  // v120
      (CUNORM_CLUSTER_FWD_EIGHT_PARAM_SLOTS && !RMS && CLUSTER == 8 &&
       (sizeof(T) == 4 || (sizeof(W) == 4 && TPB == 512)));  // v121
  static constexpr bool value = CUNORM_CLUSTER_FWD_PARAM_SLOTS && kServes &&
                                WeightSlotsFit<kRowBytes, (RMS ? 1 : 2) * kParamBytes>::value;
};

// Whether a cluster forward tile exchanges by push (p10). H200, forward of copy (NOTES "(p10)
// outcome", two sweeps): +0.015-0.146 at 65536-262144 (bf16, fp16, float32, float32
// parameters), level at 32768, but -0.02-0.03 in RMSNorm's half-precision clusters of eight
// 256-thread blocks with the weight in shared memory (65536: bf16 0.822 -> 0.794, fp16 0.826
// -> 0.806), which keep the fence.
template <typename T, typename W, int VEC, int PACKS, int TPB, int CLUSTER, bool RMS>
struct ClusterFwdPush {
  static constexpr bool kLost =
      RMS && sizeof(T) == 2 && CLUSTER == 8 && ClusterFwdParamSlots<T, W, VEC, PACKS, TPB, RMS, CLUSTER>::value;
  static constexpr bool value = CUNORM_CLUSTER_FWD_PUSH == 2 || (CUNORM_CLUSTER_FWD_PUSH == 1 && !kLost);
};

template <typename T, typename W, int VEC, int PACKS, int TPB, int CLUSTER, bool RMS>
__global__ void __cluster_dims__(CLUSTER, 1, 1) __launch_bounds__(TPB, 1024 / TPB)
norm_fwd_cluster(const T* __restrict__ x, CUNORM_ROWMAP_PARAMS(xm), T* __restrict__ y,
                 const W* __restrict__ weight, const W* __restrict__ bias,
                 typename AccOf<T>::type* __restrict__ mean, typename AccOf<T>::type* __restrict__ rstd,
                 typename AccOf<T>::type* __restrict__ tile_stats, typename AccOf<T>::type* __restrict__ row_shift,
                 i64 M, i64 N, i64 C, typename AccOf<T>::type eps) {
  typedef typename AccOf<T>::type A;
  constexpr i64 kSlice = i64(TPB) * PACKS * VEC;  // columns a block holds
  __shared__ A smem[2 * kWarp];
  __shared__ A slots[2][2];  // [exchange][sum, M2]
  // [exchange parity][K]: a pushed exchange (p10) has no barrier before thread 0 writes its
  // sums, and v90's pipeline none between one row's collect and the next where no block
  // sums come between (a cluster's last row): alternating two sets, exchange n's write
  // follows exchange n - 1's barrier, which every thread passes after reading n - 2's
  // (racecheck found the single set's write-after-read in the first check of p10)
  __shared__ A bcast[2][2];
  static_assert(sizeof(A) == 4, "clusters serve float accumulation (float64 takes the split path)");
  const unsigned rank = cluster_rank();
  const i64 c0 = i64(rank) * kSlice;
  const int limit = N <= c0 ? 0 : int(N - c0 < kSlice ? N - c0 : kSlice);
  const RowMap xmap = CUNORM_ROWMAP(xm);
  const i64 clusters = gridDim.x / CLUSTER, first = blockIdx.x / CLUSTER;
  // exchanges collected so far: the two sets of slots (and of mail, and of bcast) alternate,
  // so the next exchange's set is exchange & 1 and its mbarrier's phase parity
  // (exchange >> 1) & 1
  unsigned exchange = 0;
  constexpr bool kPush = ClusterFwdPush<T, W, VEC, PACKS, TPB, CLUSTER, RMS>::value;
  __shared__ float mail[2][kPush ? CLUSTER : 1][2];  // [set][rank][K]: the ranks' pushed values (p10)
  __shared__ unsigned long long mail_bars[2];
  if constexpr (kPush) {
    if (threadIdx.x == 0) {
      mbar_init(mail_bars, 1);  // thread 0's arrival a phase; the pushes' bytes complete it
      mbar_init(mail_bars + 1, 1);
    }
    cluster_barrier();  // every rank's barriers initialised before any push reaches them
  }
  auto xslot = [&] {  // the next exchange's slot (MailSlot) or slots (fenced)
    const unsigned e = exchange & 1;
    if constexpr (kPush) return MailSlot{&mail[e][0][0], mail_bars + e, (exchange >> 1) & 1};
    else return &slots[e][0];
  };
  auto xbcast = [&] { return bcast[exchange & 1]; };  // the next exchange's broadcast words
  static_assert(sizeof(Pack<T, VEC>) == 16, "cluster tiles are 16-byte packs (scalar packs take the split path)");
  constexpr int kStage = ClusterFwdStage<T, TPB, RMS, CLUSTER>::rows, kSet = PACKS * TPB;
  constexpr bool kOnePass = !RMS && CUNORM_CLUSTER_FWD_ONE_PASS &&
                            (sizeof(T) == 2 ||
                             (CUNORM_CLUSTER_FWD_ONE_PASS_F32 && TPB >= CUNORM_CLUSTER_FWD_ONE_PASS_F32_MIN_TPB));
  constexpr int kTrust = sizeof(T) == 2 ? kOnePassTrust : kOnePassTrustF32;
  constexpr bool kPipe = ClusterFwdStage<T, TPB, RMS, CLUSTER>::pipe;
  constexpr bool kPivot = !RMS && (!kOnePass || CUNORM_CLUSTER_FWD_PIVOT);  // else pivots stay 0
  // [ClusterFwdStage::buffers][this block's slice] packs
  extern __shared__ __align__(16) unsigned char stage_smem[];
  Pack<T, VEC>* const staged = reinterpret_cast<Pack<T, VEC>*>(stage_smem);
  typedef ClusterFwdParamSlots<T, W, VEC, PACKS, TPB, RMS, CLUSTER> ParamSlots;
  typedef typename ParamSlots::Slot Slot;
  Slot* const wslots = reinterpret_cast<Slot*>(stage_smem + ParamSlots::kRowBytes);
  Slot* const bslots = reinterpret_cast<Slot*>(stage_smem + ParamSlots::kRowBytes + ParamSlots::kParamBytes);
  if constexpr (ParamSlots::value) {  // a thread reads back only the slots it wrote: no barrier
    stage_weight<VEC, PACKS, TPB, TPB>(wslots, weight, c0, N, threadIdx.x);
    if constexpr (!RMS) stage_weight<VEC, PACKS, TPB, TPB>(bslots, bias, c0, N, threadIdx.x, 0.0f, 0.0f);
  }
  // The pivots of the staged rows ride in registers (plain loads, used kStage rows later).
  A pivots[kStage > 0 ? kStage : 1] = {};
  // row r's slice into buffer buf and (LayerNorm) its first element into `pivot`; rows past
  // M copy nothing, their slot is never read
  auto stage_row = [&](i64 r, int buf, A& pivot) {
    if constexpr (kStage > 0) {
      if (r >= M) return;
      const T* xr = x + xmap.offset(r);
      stage_tile<VEC, PACKS, TPB, TPB>(staged + buf * kSet, xr + c0, limit, threadIdx.x);
      if constexpr (kPivot) pivot = cvt<A>(xr[0]);
    }
  };
  if constexpr (kStage > 0 && !kPipe) {  // v90 stages its own rows (below)
#pragma unroll
    for (int s = 0; s < kStage; ++s) {
#pragma unroll
      for (int k = 0; k + 1 < kStage; ++k) pivots[k] = pivots[k + 1];
      stage_row(first + s * clusters, s, pivots[kStage - 1]);
      copies_commit();  // a group a row, empty past M
    }
  }
  int buf = 0;
  // y of one row from its slice and statistics (the mean as pivot + mu; both 0 for RMSNorm),
  // and the row's mean and rstd from one thread of the cluster; `in_fma` (v97: one-pass
  // rows, pivot 0): the mean taken off inside a multiply-add
  auto write_y = [&](i64 row, A pivot, A mu, A r, const Pack<T, VEC>(&raw)[PACKS], auto in_fma) {
    const A centre_r = -mu * r;
    if (threadIdx.x == 0 && rank == 0 && rstd) {  // inference callers may skip them
      if (!RMS) mean[row] = pivot + mu;
      rstd[row] = r;
    }
    T* yrow = y + row * N + c0;
    for_slice_packs_at<A, TPB>(raw, limit, [&](int p, int col, const A(&v)[VEC]) {
      A wv[VEC], bv[VEC], out[VEC];
      if constexpr (ParamSlots::value) {
        read_weight_slot<VEC, TPB>(wslots, p, wv);
        if constexpr (!RMS) read_weight_slot<VEC, TPB>(bslots, p, bv);
        else
#pragma unroll
          for (int k = 0; k < VEC; ++k) bv[k] = A(0);  // RMSNorm has no bias
      } else {
        load_param<VEC>(weight, c0 + col, A(1), wv);
        load_param<VEC>(bias, c0 + col, A(0), bv);
      }
#pragma unroll
      for (int k = 0; k < VEC; ++k)
        out[k] = (decltype(in_fma)::value ? fmaf(v[k], r, centre_r) : (v[k] - pivot - mu) * r) * wv[k] + bv[k];
      // whole 16-byte stores: bf16 +0.01-0.03, float32 LayerNorm +0.02-0.05 of copy (NOTES
      // v47); float32 RMSNorm from CUNORM_CLUSTER_FWD_F32_RMS_STORE16_FROM threads (v107)
      if constexpr (RMS && sizeof(T) == 4 && TPB < CUNORM_CLUSTER_FWD_F32_RMS_STORE16_FROM)
        store_pack<T>(yrow + col, out);
      else store_pack_whole<T>(yrow + col, out);
    });
  };

  // The row's statistics from its slice by two passes (v48's bits): mu, the mean less the
  // pivot (0 for RMSNorm), and var; one cluster exchange.
  auto two_pass = [&](const Pack<T, VEC>(&raw)[PACKS], A pivot, A& mu, A& var) {
    A slice_sum = A(0), slice_mu = A(0), q = A(0);
    if constexpr (!RMS) {
      A s = A(0);
      for_slice_packs<A, TPB>(raw, limit, [&](int, const A(&v)[VEC]) {
#pragma unroll
        for (int k = 0; k < VEC; ++k) s += v[k] - pivot;
      });
      slice_sum = group_sum<TPB>(s, smem);
      slice_mu = limit > 0 ? slice_sum / A(limit) : A(0);
    }
    for_slice_packs<A, TPB>(raw, limit, [&](int, const A(&v)[VEC]) {
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        const A d = v[k] - pivot - slice_mu;
        q += d * d;
      }
    });
    mu = A(0);
    if constexpr (RMS) {
      A sum_sq[1] = {q};
      sum_sq[0] = group_sum<TPB>(sum_sq[0], smem);
      cluster_sums<CLUSTER>(sum_sq, xslot(), xbcast());
      var = sum_sq[0] / A(N);
    } else {
      q = group_sum<TPB>(q, smem);
      A m2;
      cluster_mean_m2<CLUSTER>(slice_sum, q, xslot(), xbcast(), N, kSlice, mu, m2);
      var = m2 / A(N);
    }
    ++exchange;
  };
  // two_pass, then (v113, common.cuh pivot_far) again about pivot + mu for a row whose
  // pivot lies far from its mean: its slice is still held, one more exchange. Uniform over
  // the cluster (the same bits in every block; the vote shows the compiler the branch
  // uniform over the warp, as v90's and v112's).
  auto row_stats = [&](const Pack<T, VEC>(&raw)[PACKS], A& pivot, A& mu, A& var) {
    two_pass(raw, pivot, mu, var);
    if constexpr (!RMS) {
      if (warp_any(pivot_far(mu, var))) {
        pivot += mu;
        two_pass(raw, pivot, mu, var);
      }
    }
  };
  auto read_row = [&](int b, Pack<T, VEC>(&raw)[PACKS]) {  // this thread's slots of buffer b
#pragma unroll
    for (int p = 0; p < PACKS; ++p) raw[p] = read_slot(staged + b * kSet + p * TPB + threadIdx.x);
  };

  if constexpr (kPipe) {
    // Row j + 1's block sums are published (cluster_arrive) before row j's exchange is
    // collected (cluster_wait), and row j's y is written after; a thread's arrive and wait
    // alternate. A slot is rewritten two exchanges after it was published, once every block
    // has passed the wait of the exchange between, which each block reaches only after its
    // own reads of the slot. Rows past M are neither staged nor published.
    constexpr int kBufs = ClusterFwdStage<T, TPB, RMS, CLUSTER>::buffers, K = RMS ? 1 : 2;
    A pv[kBufs] = {};  // the pivots of rows j .. j + kBufs - 1 (LayerNorm; plain loads)
    // this block's sums of the row in buffer b: RMSNorm's sum of squares; LayerNorm's sums of
    // d = x - pivot and d^2 (the one-pass statistics), every thread holding the totals
    auto block_sums = [&](int b, A pivot, A (&v)[K]) {
      Pack<T, VEC> raw[PACKS];
      read_row(b, raw);
      A s0 = A(0), s1 = A(0);
      for_slice_packs<A, TPB>(raw, limit, [&](int, const A(&u)[VEC]) {
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          const A d = u[k] - pivot;
          s0 += RMS ? u[k] * u[k] : d;
          if constexpr (!RMS) s1 += d * d;
        }
      });
      if constexpr (RMS) {
        v[0] = group_sum<TPB>(s0, smem);
      } else {
        group_sum2<TPB>(s0, s1, smem);
        v[0] = s0;
        v[K - 1] = s1;
      }
    };
#pragma unroll
    for (int s = 0; s < kBufs - 1; ++s) {
      stage_row(first + s * clusters, s, pv[s]);
      copies_commit();  // a group a row, empty past M
    }
    A next[K];
    if (first < M) {
      copies_wait<kBufs - 2>();  // row j = 0's copies (this thread's; it reads only its own)
      block_sums(0, pv[0], next);
      cluster_publish<CLUSTER>(next, xslot());
    }
    int buf = 0;
    for (i64 row = first; row < M; row += clusters) {  // uniform over the cluster
      const int after = buf + 1 == kBufs ? 0 : buf + 1, before = buf == 0 ? kBufs - 1 : buf - 1;
      stage_row(row + (kBufs - 1) * clusters, before, pv[kBufs - 1]);  // the buffer of row j - 1, written
      copies_commit();
      const bool more = row + clusters < M;
      if (more) {
        copies_wait<kBufs - 2>();
        block_sums(after, pv[1], next);
      }
      A tot[K];
      cluster_collect_sums<CLUSTER>(tot, xslot(), xbcast());
      ++exchange;
      Pack<T, VEC> raw[PACKS];
      read_row(buf, raw);
      A mu = A(0), var;
      bool one_pass = true;
      if constexpr (RMS) {
        var = tot[0] / A(N);
      } else {
        mu = tot[0] / A(N);
        var = tot[K - 1] / A(N) - mu * mu;
        // as v50's loop below: rows whose pivot lies far from their mean take two passes
        // (uniform over the cluster; the vote lets the compiler see it uniform over the warp,
        // as group_sum2_any's: 8 bytes spilled without it)
        one_pass = !warp_any(!one_pass_trusted(mu, var));
        if (!one_pass) {
          // v97: the row's first element as the pivot after all (a constant row's y exactly its
          // bias), loaded by the rare rows that take two passes
          if constexpr (!kPivot) pv[0] = cvt<A>(x[xmap.offset(row)]);
          row_stats(raw, pv[0], mu, var);
        }
      }
      if (more) cluster_publish<CLUSTER>(next, xslot());
      if (one_pass) write_y(row, pv[0], mu, rsqrt_acc(var + eps), raw, Flag<!RMS && !kPivot>());
      else write_y(row, pv[0], mu, rsqrt_acc(var + eps), raw, Flag<false>());
#pragma unroll
      for (int k = 0; k + 1 < kBufs; ++k) pv[k] = pv[k + 1];
      buf = after;
    }
    copies_wait<0>();  // no copy outlives the block's shared memory
    cluster_barrier();  // no block leaves while another may still read its slots
    return;
  }

  for (i64 row = first; row < M; row += clusters) {  // uniform over the cluster
    Pack<T, VEC> raw[PACKS];  // the slice stays in its own width: half the registers for bf16
    A pivot = A(0);
    if constexpr (kStage > 0) {
      copies_wait<kStage - 1>();  // this thread's copies of this row; it reads only its own
      read_row(buf, raw);
      if constexpr (!RMS) pivot = pivots[0];
#pragma unroll
      for (int k = 0; k + 1 < kStage; ++k) pivots[k] = pivots[k + 1];
      stage_row(row + kStage * clusters, buf, pivots[kStage - 1]);  // into the slot just read
      copies_commit();
      buf = buf + 1 == kStage ? 0 : buf + 1;
    } else {
      const T* xrow = x + xmap.offset(row);
#pragma unroll
      for (int p = 0; p < PACKS; ++p) {
        const int col = pack_col<VEC, TPB>(p, threadIdx.x);
        if (col < limit) raw[p] = load_raw<VEC>(xrow + c0 + col);
      }
      if constexpr (kPivot) pivot = cvt<A>(xrow[0]);
    }
    if constexpr (kOnePass) {
      A sums[2] = {A(0), A(0)};  // of d = x - pivot and d^2
      for_slice_packs<A, TPB>(raw, limit, [&](int, const A(&v)[VEC]) {
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          const A d = v[k] - pivot;
          sums[0] += d;
          sums[1] += d * d;
        }
      });
      group_sum2<TPB>(sums[0], sums[1], smem);
      cluster_sums<CLUSTER>(sums, xslot(), xbcast());
      ++exchange;
      const A mu = sums[0] / A(N), var = sums[1] / A(N) - mu * mu;
      // uniform over the cluster (every block holds the same bits): rows whose pivot lies
      // far from their mean, and constant rows, take the two passes below (nothing of this
      // pass is kept for them)
      // (the vote shows the compiler the test uniform over the warp, as in v90's loop: without
      // it float32's tiles spilled 8-44 bytes, v112)
      if (!warp_any(!one_pass_trusted<A, kTrust>(mu, var))) {
        write_y(row, pivot, mu, rsqrt_acc(var + eps), raw, Flag<!kPivot>());
        continue;
      }
    }
    A mu = A(0), var;  // mu: the row's mean less the pivot
    if constexpr (kOnePass && !kPivot) pivot = cvt<A>(x[xmap.offset(row)]);  // as in v90's loop above
    row_stats(raw, pivot, mu, var);
    write_y(row, pivot, mu, rsqrt_acc(var + eps), raw, Flag<false>());
  }
  if constexpr (kStage > 0) copies_wait<0>();  // no copy outlives the block's shared memory
  cluster_barrier();  // no block leaves while another may still read its slots
}

// Backward for the same rows: the cluster holds a row's x and dy (BWD-sized tiles, 16 values
// a thread), each block sums w*dy and w*dy*xhat over its slice, one cluster exchange gives
// the row's sums, and each block writes dx for its slice — x and dy read once, where the
// split path reads them twice and launches four kernels. Clusters are persistent (the host
// starts as many as fit): cluster g handles rows g, g + G, ... and keeps its columns' dW / dB
// in registers, writing partial row g for norm_reduce_partials. The arguments are norm_bwd's;
// row_sums and C are unused.
template <typename T, typename W, int VEC, int PACKS, int TPB, int CLUSTER, bool RMS>
__global__ void __cluster_dims__(CLUSTER, 1, 1) __launch_bounds__(TPB, 512 / TPB)
norm_bwd_cluster(const T* __restrict__ dy, CUNORM_ROWMAP_PARAMS(dym), const T* __restrict__ x,
                 CUNORM_ROWMAP_PARAMS(xm), const W* __restrict__ weight,
                 const typename AccOf<T>::type* __restrict__ mean, const typename AccOf<T>::type* __restrict__ rstd,
                 const typename AccOf<T>::type* __restrict__ row_sums, T* __restrict__ dx,
                 typename AccOf<T>::type* __restrict__ dw_part, typename AccOf<T>::type* __restrict__ db_part,
                 i64 M, i64 N, i64 C) {
  typedef typename AccOf<T>::type A;
  static_assert(sizeof(A) == 4, "clusters serve float accumulation (float64 takes the split path)");
  constexpr i64 kSlice = i64(TPB) * PACKS * VEC;
  __shared__ A smem[2 * kWarp];
  __shared__ A slots[2][2];  // [exchange][sum w*dy, sum w*dy*xhat]
  __shared__ A bcast[2];
  const RowMap dymap = CUNORM_ROWMAP(dym), xmap = CUNORM_ROWMAP(xm);
  const int lane = threadIdx.x;
  const i64 c0 = i64(cluster_rank()) * kSlice;
  const int limit = tile_limit(N, c0, kSlice, N > c0);
  const i64 group = blockIdx.x / CLUSTER, groups = gridDim.x / CLUSTER;
  A dw_acc[PACKS][VEC], db_acc[PACKS][VEC];
  zero_tile(dw_acc);
  zero_tile(db_acc);
  int exchange = 0;

  // Each row's loads wait for the previous row's exchange; loading the next row during it
  // (a build measured in NOTES v17) was slower still, at 126-128 registers.
  for (i64 row = group; row < M; row += groups) {  // uniform over the cluster
    A xv[PACKS][VEC], g[PACKS][VEC];
    load_row<VEC, PACKS, TPB>(dy, dymap, x, xmap, row, M, N, c0, lane, xv, g);
    const A r = rstd[row];
    A sums[2];
    // Not v61 (row_norm.cuh, WdyInPlace): w * dy kept in place lost 0.06-0.08 of copy here
    // (bf16 N = 16384 and 65536, H200, NOTES v61)
    xhat_and_sums<VEC, PACKS, TPB>(xv, g, weight, c0, limit, lane, RMS ? A(0) : mean[row], r, sums[0], sums[1]);
    group_sum2<TPB>(sums[0], sums[1], smem);
    cluster_sums<CLUSTER>(sums, slots[exchange], bcast);
    exchange ^= 1;
    const A inv_n = A(1) / A(N);
    dx_tile<T, VEC, PACKS, TPB, true>(xv, g, weight, r, RMS ? A(0) : sums[0] * inv_n, sums[1] * inv_n, dx + row * N + c0,
                                      c0, limit, lane, dw_acc, db_acc);
  }
  store_partials<VEC, PACKS, TPB>(dw_acc, db_acc, dw_part, db_part, group, N, c0, lane);
  cluster_barrier();  // no block leaves while another may still read its slots
}


// Backward of half-precision rows of 8193 to CLUSTER * 8192 elements (v46): a cluster of
// CLUSTER 1024-thread blocks a row, each block the full-row backward's one-pack tile of 8192
// columns (norm_bwd's StagePolicy for 1024-thread rows: three rows in the buffers, each row's
// mean and rstd staged with it), the two row sums exchanged once through distributed shared
// memory. norm_bwd_cluster above holds its slice in registers and keeps nothing in flight
// through the exchange (NOTES v16, v17); here the next two rows' copies are in flight through
// it. Clusters are persistent and write one dW / dB partial row each, as norm_bwd_cluster's.
// The arguments are norm_bwd's; row_sums and C are unused.
template <typename T, typename W, int CLUSTER, bool RMS>
__global__ void __cluster_dims__(CLUSTER, 1, 1) __launch_bounds__(1024, 1)
norm_bwd_cluster_staged(const T* __restrict__ dy, CUNORM_ROWMAP_PARAMS(dym), const T* __restrict__ x,
                        CUNORM_ROWMAP_PARAMS(xm), const W* __restrict__ weight, const float* __restrict__ mean,
                        const float* __restrict__ rstd, const float* __restrict__ row_sums, T* __restrict__ dx,
                        float* __restrict__ dw_part, float* __restrict__ db_part, i64 M, i64 N, i64 C) {
  typedef float A;
  constexpr int VEC = 8, PACKS = 1, TPB = 1024;
  static_assert(Staged<T, VEC>::value, "half-precision rows of 16-byte packs");
  constexpr i64 kSlice = i64(TPB) * PACKS * VEC;
  constexpr int kSet = PACKS * TPB, kDepth = StagePolicy<TPB, RMS>::depth;
  __shared__ A smem[2 * kWarp];
  __shared__ A slots[2][2];  // [exchange][sum w*dy, sum w*dy*xhat]
  __shared__ A bcast[2];
  __shared__ A stats[kDepth * 2 * StatsSlots<TPB, TPB>::value];
  extern __shared__ __align__(16) unsigned char stage_smem[];  // [kDepth][x, dy][block] packs
  Pack<T, VEC>* const tiles = reinterpret_cast<Pack<T, VEC>*>(stage_smem);
  const RowMap dymap = CUNORM_ROWMAP(dym), xmap = CUNORM_ROWMAP(xm);
  const int lane = threadIdx.x;
  const i64 c0 = i64(cluster_rank()) * kSlice;
  const i64 group = blockIdx.x / CLUSTER, groups = gridDim.x / CLUSTER;
  A dw_acc[PACKS][VEC], db_acc[PACKS][VEC];
  zero_tile(dw_acc);
  zero_tile(db_acc);
  auto stage_row = [&](i64 r, int buf) {  // rows past M stage zeros, never read
    const i64 safe = r < M ? r : 0;
    const int limit = tile_limit(N, c0, kSlice, r < M && N > c0);
    stage_tile<VEC, PACKS, TPB, TPB>(tiles + 2 * buf * kSet, x + xmap.offset(safe) + c0, limit, lane);
    stage_tile<VEC, PACKS, TPB, TPB>(tiles + (2 * buf + 1) * kSet, dy + dymap.offset(safe) + c0, limit, lane);
    stage_stats<RMS, TPB, TPB>(stats, buf, mean, rstd, r, M);
    copies_commit();
  };
  StageRing<kDepth> ring;
  ring.fill([&](int ahead, int b) { stage_row(group + ahead * groups, b); });
  int exchange = 0;
  for (i64 row = group; row < M; row += groups) {  // uniform over the cluster
    ring.refill_and_wait([&](int ahead, int b) { stage_row(row + ahead * groups, b); });
    const int buf = ring.buf;
    A xv[PACKS][VEC], g[PACKS][VEC];
    unstage_tile<VEC, PACKS, TPB>(tiles + 2 * buf * kSet, xv);
    unstage_tile<VEC, PACKS, TPB>(tiles + (2 * buf + 1) * kSet, g);
    const RowStats<A> st = staged_stats<RMS, TPB, TPB>(stats, buf, mean, rstd, row, M);
    const int limit = tile_limit(N, c0, kSlice, N > c0);
    A sums[2];
    // Not v61, as in norm_bwd_cluster: it lost 0.06-0.08 of copy here too
    xhat_and_sums<VEC, PACKS, TPB>(xv, g, weight, c0, limit, lane, st.mean, st.rstd, sums[0], sums[1]);
    group_sum2<TPB>(sums[0], sums[1], smem);
    cluster_sums<CLUSTER>(sums, slots[exchange], bcast);
    exchange ^= 1;
    const A inv_n = A(1) / A(N);
    dx_tile<T, VEC, PACKS, TPB, true>(xv, g, weight, st.rstd, RMS ? A(0) : sums[0] * inv_n, sums[1] * inv_n,
                                      dx + row * N + c0, c0, limit, lane, dw_acc, db_acc);
    ring.advance();
  }
  copies_wait<0>();  // the last stages (rows past M) land before the block's shared memory goes
  store_partials<VEC, PACKS, TPB>(dw_acc, db_acc, dw_part, db_part, group, N, c0, lane);
  cluster_barrier();  // no block leaves while another may still read its slots
}

// Backward of rows of 16385 to CLUSTER * COLS elements (v68): a cluster of CLUSTER wide
// blocks a row (norm_bwd_wide's 1024-thread block, layer_norm.cu), each COLS columns of it
// staged as that kernel stages them, the two row sums exchanged once through distributed
// shared memory. One SM cannot hold a LayerNorm row of 32768 columns' dW and dB (65536
// floats, its whole register file), so these rows need two SMs or more; the staged cluster
// above spreads them over blocks of 8192 columns, which pay one cluster barrier a row for
// half the work. Clusters are persistent and write one dW / dB partial row each. The
// arguments are norm_bwd's; row_sums and C are unused.
// v78, lost: each row meets four barriers here (the block sums' two, the exchange's cluster
// barrier, cluster_sums' closing block barrier); the block sums' closing one only guards their
// partials' reuse by the next row, which the cluster barrier already orders, so 1 drops it
// (wide_bwd_rows OPEN_SUMS; racecheck clean, benchmarks/sanitize_wide_cluster.py). The barrier
// is this kernel's largest stall in ncu (3.28 cycles an issue at bf16 LayerNorm 65536), but
// one H200 sweep read the same with three (benchmarks/sweep_wide_cluster_barriers.py, results/
// sweep-wide-cluster-barriers-v78-h200.txt: all eight rows within 0.002 of copy). 0: four.
#ifndef CUNORM_WIDE_CLUSTER_OPEN_SUMS
#define CUNORM_WIDE_CLUSTER_OPEN_SUMS 0
#endif
// A wide row's two sums over its cluster (rank order, the same bits in every block), whole
// (operator(): v68) or as publish then collect (v91, wide_bwd_rows), alternating two slots.
template <int CLUSTER>
struct ClusterRowSums {
  float* slots;  // [2 exchanges][2 sums], this block's shared memory
  float* bcast;  // 2 block-local words
  int exchange = 0;
  __device__ __forceinline__ void publish(float c1, float c2) {
    const float mine[2] = {c1, c2};
    cluster_publish(mine, slots + 2 * exchange);
  }
  __device__ __forceinline__ void collect(float& c1, float& c2) {
    float sums[2];
    cluster_collect_sums<CLUSTER>(sums, slots + 2 * exchange, bcast);
    exchange ^= 1;
    c1 = sums[0];
    c2 = sums[1];
  }
  __device__ __forceinline__ void operator()(float& c1, float& c2) {
    publish(c1, c2);
    collect(c1, c2);
  }
};

// The wide clusters' row sums pushed, not fenced (NOTES "(p8), (p9)" and their outcome). The
// fenced exchange (ClusterRowSums: thread 0's fence, MEMBAR.ALL.GPU and an L1 invalidation a
// row, NOTES "(p7)", then the cluster barrier) becomes st.async pushes into every rank's
// slots, counted against that rank's mbarrier for the exchange; the sums are taken in rank
// order, the same bits in every block.
// ClusterPushSums ((p8)): block_sums stops at each warp's two sums, which lane 0 pushes (thread
// 0 arms its own mbarrier with the kWarps x CLUSTER x 8 bytes it expects); every warp waits on
// its block's mbarrier and sums the slots, lane w warp w's over the ranks, then the butterfly:
// no fence, no cluster barrier and no block barrier a row. Two slot sets alternate; a rank
// pushes exchange k + 2 only once it has all of k + 1, which each warp of every rank pushed
// after reading its slots of k, so none is overwritten unread.
template <int CLUSTER, int TPB>
struct ClusterPushSums {
  static constexpr int kWarps = TPB / kWarp, kSets = 2, kSlots = kSets * CLUSTER * kWarps;
  static constexpr unsigned kBytes = CLUSTER * kWarps * sizeof(float2);  // an exchange's pushes into a block
  float2* slots;             // [kSets][CLUSTER ranks][kWarps] this block's
  unsigned long long* bars;  // [kSets] this block's
  unsigned exchange = 0;     // exchanges so far: set exchange & 1, phase parity (exchange >> 1) & 1
  __device__ __forceinline__ void publish(float c1, float c2) {  // this warp's sums, every lane
    const unsigned set = exchange & 1;
    if (threadIdx.x == 0) mbar_arrive_expect(bars + set, kBytes);
    if (threadIdx.x % kWarp == 0) {
      float2* slot = slots + (set * CLUSTER + cluster_rank()) * kWarps + threadIdx.x / kWarp;
#pragma unroll
      for (int r = 0; r < CLUSTER; ++r) push_cluster_values(&slot->x, bars + set, r, {c1, c2});
    }
  }
  __device__ __forceinline__ void collect(float& c1, float& c2) {
    const unsigned set = exchange & 1;
    mbar_wait(bars + set, (exchange >> 1) & 1);
    ++exchange;
    const float2* mine = slots + set * CLUSTER * kWarps;
    const int lane = threadIdx.x % kWarp;
    float s1 = 0.0f, s2 = 0.0f;
    if (lane < kWarps) {  // blocks of fewer than 32 warps: the other lanes add nothing
#pragma unroll
      for (int r = 0; r < CLUSTER; ++r) {
        const float2 v = mine[r * kWarps + lane];
        s1 += v.x;
        s2 += v.y;
      }
    }
    c1 = group_warp_sum<kWarp>(s1);
    c2 = group_warp_sum<kWarp>(s2);
  }
  __device__ __forceinline__ void operator()(float& c1, float& c2) {
    publish(c1, c2);
    collect(c1, c2);
  }
};
// ClusterPushRowSums ((p9)): the block sums as before (with their closing barrier), thread 0
// pushing the block's two into every rank's slots; every thread waits on its block's mbarrier
// and sums the ranks' in rank order: no fence, no cluster barrier, no broadcast barrier a row.
// Three sets: a rank pushes exchange k + 3 once it has all of k + 2, which each rank's thread 0
// pushed after the block barrier of its block sums of k + 2, which every thread of it reached
// after reading its slots of k (v91's pipeline publishes k + 1 right after collecting k, with
// no barrier between, so two sets would not do).
// v116: clusters past eight blocks collect their ranks' row sums four at a time. Unrolled
// whole, the loop's sixteen loads went up together, and at the 64-register bound of a
// 1024-thread block the wide backward spilled in 30 of its 160 non-portable instantiations
// (NVRTC 13, sm_90: bf16 LayerNorm with three rows in the ring 8-44 bytes at 11-16 blocks,
// half precision with float32 parameters 4-8 bytes), none at four; the same ranks in the same
// order, so the same bits. H100, backward of copy, best of two rounds (results/sweep-v116-
// v117-54-h100.json): bf16 LayerNorm 196608 / 262144 0.607 / 0.610 -> 0.702 / 0.732, the
// other half-precision and float32 cases within 0.01 but 147456 LayerNorm 0.651 -> 0.634.
// Clusters of eight or fewer keep the whole unroll (their PTX unchanged). 16: whole.
#ifndef CUNORM_PUSH_COLLECT_UNROLL
#define CUNORM_PUSH_COLLECT_UNROLL 4
#endif
template <int CLUSTER>
struct ClusterPushRowSums {
  static constexpr int kSets = 3, kSlots = kSets * CLUSTER;
  static constexpr int kCollectUnroll = CLUSTER > 8 ? CUNORM_PUSH_COLLECT_UNROLL : CLUSTER;
  float2* slots;             // [kSets][CLUSTER ranks] this block's
  unsigned long long* bars;  // [kSets] this block's
  unsigned exchange = 0;     // exchanges so far: set exchange % kSets, parity (exchange / kSets) & 1
  __device__ __forceinline__ void publish(float c1, float c2) {  // the block's sums, every thread
    const unsigned set = exchange % kSets;
    if (threadIdx.x == 0) {
      mbar_arrive_expect(bars + set, CLUSTER * sizeof(float2));
#pragma unroll
      for (int r = 0; r < CLUSTER; ++r)
        push_cluster_values(&slots[set * CLUSTER + cluster_rank()].x, bars + set, r, {c1, c2});
    }
  }
  __device__ __forceinline__ void collect(float& c1, float& c2) {
    const unsigned set = exchange % kSets;
    mbar_wait(bars + set, (exchange / kSets) & 1);
    ++exchange;
    float s1 = 0.0f, s2 = 0.0f;
#pragma unroll(kCollectUnroll)
    for (int r = 0; r < CLUSTER; ++r) {
      const float2 v = slots[set * CLUSTER + r];
      s1 += v.x;
      s2 += v.y;
    }
    c1 = s1;
    c2 = s2;
  }
  __device__ __forceinline__ void operator()(float& c1, float& c2) {
    publish(c1, c2);
    collect(c1, c2);
  }
};

namespace cunorm {
template <int CLUSTER, int TPB>
struct ExchangeTakesWarpSums<ClusterPushSums<CLUSTER, TPB>> {
  static constexpr bool value = true;
};
}  // namespace cunorm

// The exchange a wide cluster takes: 0 the fenced ClusterRowSums, 1 ClusterPushSums, 2
// ClusterPushRowSums. Measured on the H200 with 1024-thread blocks (NOTES "(p8), (p9), (p10)
// outcome"), backward of copy: half precision in clusters of two with parameters in x's
// dtype, (p9) -0.006 to -0.065, (p8) -0.012 to +0.084; with float32 parameters, (p9) +0.02
// to +0.055 (LayerNorm bf16 32768 0.576 -> 0.630), (p8) +0.06-0.09; in clusters of three to
// eight, (p9) +0.054-0.085 (but -0.008 at six), (p8) at most +0.027; float32 in clusters of
// three to five, (p9) -0.03 to +0.002, (p8) -0.06-0.07; of eight to sixteen, (p9) +0.03-0.08.
// (p8) is left out: racecheck warns of it (the staged statistics' reuse is ordered only
// through its mbarrier, since it drops the block barriers a row), so clusters of two with
// parameters in x's dtype keep the fence until that is settled. CUNORM_WIDE_PUSH_SUMS (0-2)
// forces one (sweeps); -1 the rule.
#ifndef CUNORM_WIDE_PUSH_SUMS
#define CUNORM_WIDE_PUSH_SUMS -1
#endif
template <typename T, typename W, int CLUSTER, int TPB>
struct WideClusterExchange {
  static constexpr int kByRule =
      sizeof(T) == 2 ? (CLUSTER > 2 || sizeof(W) == 4 ? 2 : 0) : (CLUSTER >= 8 ? 2 : 0);
  // (p8)'s slots past 1 KiB (more than 2048 threads a cluster) leave too little of the host's
  // static reserve (four blocks: 240 bytes by ptxas' count, and the H200 refused the launch's
  // shared memory): a forced (p8) takes the rule there
  static constexpr bool kP8Fits = CLUSTER * TPB <= 2048;
  static constexpr int value =
      CUNORM_WIDE_PUSH_SUMS >= 0 && (CUNORM_WIDE_PUSH_SUMS != 1 || kP8Fits) ? CUNORM_WIDE_PUSH_SUMS : kByRule;
};

// v109 (TPB 512, half precision): blocks of half the threads and columns, two an SM, so one
// block's barriers and exchange waits leave the SM the other's work (one 1024-thread block an
// SM at 64 registers stalls whole at each: ncu, bf16 LayerNorm 65536, barrier 19% and the
// cluster barrier's wait 3% of samples, issue active ~60%). The host sizes each block's ring
// and slots to half the SM (WideBlockSmem, _config.wide_block_smem_budget).
template <typename T, typename W, bool RMS, int DEPTH, int COLS, int CLUSTER, int TPB>
__global__ void __cluster_dims__(CLUSTER, 1, 1) __launch_bounds__(TPB, 1024 / TPB)
norm_bwd_wide_cluster(const T* __restrict__ dy, CUNORM_ROWMAP_PARAMS(dym), const T* __restrict__ x,
                      CUNORM_ROWMAP_PARAMS(xm), const W* __restrict__ weight, const float* __restrict__ mean,
                      const float* __restrict__ rstd, const float* __restrict__ row_sums, T* __restrict__ dx,
                      float* __restrict__ dw_part, float* __restrict__ db_part, i64 M, i64 N, i64 C) {
  const i64 group = blockIdx.x / CLUSTER, groups = gridDim.x / CLUSTER;
  constexpr int kExchange = WideClusterExchange<T, W, CLUSTER, TPB>::value;
  auto rows = [&](auto open_sums, auto&& exchange) {
    wide_bwd_rows<T, W, RMS, DEPTH, COLS, decltype(open_sums)::value, true, TPB>(
        dy, CUNORM_ROWMAP(dym), x, CUNORM_ROWMAP(xm), weight, mean, rstd, dx, dw_part, db_part, M, N,
        i64(cluster_rank()) * COLS, group, groups, group, exchange);
  };
  if constexpr (kExchange == 0) {
    __shared__ float slots[2][2];  // [exchange][sum w*dy, sum w*dy*xhat]
    __shared__ float bcast[2];
    rows(Flag<bool(CUNORM_WIDE_CLUSTER_OPEN_SUMS)>(), ClusterRowSums<CLUSTER>{&slots[0][0], bcast});
  } else {
    typedef typename Select<kExchange == 1, ClusterPushSums<CLUSTER, TPB>, ClusterPushRowSums<CLUSTER>>::type Push;
    // at most 1 KiB of slots ((p8) in clusters of two 1024-thread blocks) within the host's
    // reserve for static buffers (_config.WIDE_BWD_STATIC_SMEM) beside the ring and weight slots
    static_assert(Push::kSlots * sizeof(float2) <= 1024, "the push slots fit the static reserve");
    __shared__ float2 push_slots[Push::kSlots];
    __shared__ unsigned long long push_bars[Push::kSets];
    if (threadIdx.x == 0)
      for (int set = 0; set < Push::kSets; ++set) mbar_init(push_bars + set, 1);  // thread 0's arrival a phase
    cluster_barrier();  // every rank's barriers initialised before any push reaches them
    rows(Flag<false>(), Push{push_slots, push_bars});
  }
  cluster_barrier();  // no block leaves while another may still read its slots
}
