// BatchNorm over the channels of x, forward and backward, with an optional residual added and
// an activation applied in the same pass. Three passes each way: partial sums per channel and
// chunk, a per-channel finalize, an elementwise apply; x is read twice.
//
// x is addressed as (outer O, channel C, inner I): element (o, c, i) at o * so + c * sc + i.
//   nc kernels : channel-major (NCHW and friends): each block owns one channel and a chunk of
//                its packs (VEC elements; I % VEC == 0, so a pack never straddles two runs).
//   cl kernels : channels last (sc = 1, I = 1): a block is CPB channel packs (lanes) by
//                kBnBlock / CPB rows of positions; it owns CPB * VEC channels and a chunk of
//                the O positions. Few channels take narrow, tall blocks: no idle lanes.
//   flat kernels: dense channel-major x: blocks own a piece of an image (apply passes) or
//                of every image (bn_stats_flat), whole packs across channel boundaries; the
//                apply passes may sum the partials themselves (no finalize launch).
// y, dy, dx, the residual and its gradient share x's strides (the host sees to it).
// Sums are per thread in order, then fixed trees: deterministic, no atomics.
//
// Speed (NOTES, BatchNorm v2): each thread keeps U packs of loads in flight, walks its packs
// with adds (no division a pack), holds few per-channel constants (folded once), and the apply
// passes walk the tensor in the opposite order of the sums pass before them, so they start on
// what that pass left in L2. The activation is a template class (none, ReLU, any).
#include "common.cuh"
#include "activations.cuh"

using namespace cunorm;

#ifndef CUNORM_BN_BLOCK_LOG2
#define CUNORM_BN_BLOCK_LOG2 8  // the host's BLOCK must match (sweep_bn_variants.py sets both)
#endif
constexpr int kBnBlockLog2 = CUNORM_BN_BLOCK_LOG2;
constexpr int kBnBlock = 1 << kBnBlockLog2;

// Packs a thread keeps in flight: about kInflightBytes a stream (fewer leaves the loads
// latency-bound; more costs registers and so resident threads), 1 to 8 packs.
#ifndef CUNORM_BN_INFLIGHT_BYTES
#define CUNORM_BN_INFLIGHT_BYTES 32  // benchmarks/sweep_bn_config.py compares others
#endif
constexpr int kInflightBytes = CUNORM_BN_INFLIGHT_BYTES;
template <typename T, int VEC, int BYTES = kInflightBytes>
__host__ __device__ constexpr int unroll_of() {
  return BYTES / int(VEC * sizeof(T)) < 1 ? 1 : (BYTES / int(VEC * sizeof(T)) > 8 ? 8 : BYTES / int(VEC * sizeof(T)));
}

// The statistics pass reads one stream and holds few registers: its own budget.
#ifndef CUNORM_BN_STATS_INFLIGHT_BYTES
#define CUNORM_BN_STATS_INFLIGHT_BYTES CUNORM_BN_INFLIGHT_BYTES
#endif
constexpr int kStatsInflightBytes = CUNORM_BN_STATS_INFLIGHT_BYTES;

// The backward-sums passes read two or three streams and write none: their own budget too.
#ifndef CUNORM_BN_SUMS_INFLIGHT_BYTES
#define CUNORM_BN_SUMS_INFLIGHT_BYTES CUNORM_BN_INFLIGHT_BYTES
#endif
constexpr int kSumsInflightBytes = CUNORM_BN_SUMS_INFLIGHT_BYTES;
// The channels-last sums pass's own (bn_bwd_sums_cl): 64 against the shared 32 lifted bf16
// NHWC backward +0.012-0.027 of copy, float32 NHWC -0.003-+0.008, with each pass on its own
// grid (results/sweep-bn-cl-grid-v82-h200.txt); set for both layouts it cost bf16 NCHW 0.01
// (NOTES "BatchNorm in-flight bytes"). sweep_bn_variants.py sums_cl_inflight_32 is the old.
#ifndef CUNORM_BN_SUMS_CL_INFLIGHT_BYTES
#define CUNORM_BN_SUMS_CL_INFLIGHT_BYTES 64
#endif
constexpr int kSumsClInflightBytes = CUNORM_BN_SUMS_CL_INFLIGHT_BYTES;
// v19: the half-precision channels-last backward apply without an activation takes
// dx = a * dy - d * x - (a * m1 - d * mean): three constants a channel live instead of four,
// two FMAs an element instead of four operations (94 -> 78 registers; H200, bf16 NHWC
// backward +0.00-0.03 of copy, results/sweep-bn-v19-fold-mean-h200.txt). x's mean folded
// into a constant cancels against d * x where |mean| >> std: float32 keeps x - mean, and
// half precision's output rounding is 2^-8 against float32's 2^-24 times that ratio.
#ifndef CUNORM_BN_BWD_FOLD_MEAN
#define CUNORM_BN_BWD_FOLD_MEAN 1
#endif

// The residual's pack, or zeros where there is none (no residual).
template <typename A, typename T, int VEC>
__device__ __forceinline__ void unpack_or_zero(bool given, const Pack<T, VEC>& pk, A (&out)[VEC]) {
  if (given) {
    unpack(pk, out);
  } else {
#pragma unroll
    for (int k = 0; k < VEC; ++k) out[k] = A(0);
  }
}

// The packs of x and (where given) the residual at element base + each live slot's offset,
// every load issued before any is used; the backwards' x, dy and residual likewise.
template <int U, int VEC, typename T, typename S>
__device__ __forceinline__ void load_x_res(const T* x, const T* res, i64 base, const S (&sl)[U],
                                           Pack<T, VEC> (&v)[U], Pack<T, VEC> (&r)[U]) {
#pragma unroll
  for (int u = 0; u < U; ++u)
    if (sl[u].any()) {
      v[u] = load_raw<VEC>(x + base + sl[u].off);
      if (res) r[u] = load_raw<VEC>(res + base + sl[u].off);
    }
}

template <int U, int VEC, typename T, typename S>
__device__ __forceinline__ void load_x_dy_res(const T* x, const T* dy, const T* res, bool with_res, i64 base,
                                              const S (&sl)[U], Pack<T, VEC> (&v)[U], Pack<T, VEC> (&g)[U],
                                              Pack<T, VEC> (&r)[U]) {
#pragma unroll
  for (int u = 0; u < U; ++u)
    if (sl[u].any()) {
      v[u] = load_raw<VEC>(x + base + sl[u].off);
      g[u] = load_raw<VEC>(dy + base + sl[u].off);
      if (with_res) r[u] = load_raw<VEC>(res + base + sl[u].off);
    }
}

// ---- walks ---------------------------------------------------------------------------------
// A pack a thread visits: its element offset and the elements [lo, hi) of it that belong to
// the tensor (a channel-major run need not start on a pack boundary). Empty when lo == hi.
struct Slot {
  i64 off;
  int lo, hi;
  __device__ __forceinline__ bool any() const { return lo < hi; }
  __device__ __forceinline__ bool has(int k) const { return k >= lo && k < hi; }
};

// Channel-major: a channel is O runs of I contiguous elements, run o at o * so. Packs are
// VEC-aligned in memory and IP of them cover a run: I / VEC when every run starts aligned,
// else enough for any start, the elements outside the run masked off (so odd spatial sizes
// such as 7 x 7 still move 16-byte packs). A pack is loaded only when it holds an element
// of the run, so it lies in the 16-byte block of one: inside the allocation. Thread t
// visits packs p = p0 + t, p0 + t + kBnBlock, ... < p1 of the channel (p = o * IP + i); its
// cursor moves kBnBlock packs with adds (the run offset, the pack, the run's misalignment
// `mis` against pack boundaries), the division once.
template <int VEC>
struct NcWalk {
  i64 so, dso;   // a run's stride; the step's run offset
  int I, IP, dr;  // run length, packs a run, the step's pack remainder (the host keeps I < 2^31)
  int dmis, wmis;
  __device__ __forceinline__ NcWalk(i64 so_, i64 I_, i64 IP_) : so(so_), I(int(I_)), IP(int(IP_)) {
    const int dq = kBnBlock / IP;
    dr = kBnBlock - dq * IP;
    dso = dq * so;
    dmis = int(dso & (VEC - 1));
    wmis = int(so & (VEC - 1));
  }
};

template <int VEC>
struct NcCursor {
  i64 run;   // the run's offset from the channel's base
  int i;     // pack within the run
  int mis;   // the run's first element's place within its pack
  __device__ __forceinline__ NcCursor(const NcWalk<VEC>& w, i64 p, i64 base_mis) {
    const i64 o = p / w.IP;
    i = int(p - o * w.IP);
    run = o * w.so;
    mis = int((base_mis + run) & (VEC - 1));
  }
  __device__ __forceinline__ void next(const NcWalk<VEC>& w) {
    i += w.dr; run += w.dso; mis += w.dmis;
    if (i >= w.IP) { i -= w.IP; run += w.so; mis += w.wmis; }
    mis &= VEC - 1;
  }
  __device__ __forceinline__ void prev(const NcWalk<VEC>& w) {
    i -= w.dr; run -= w.dso; mis -= w.dmis;
    if (i < 0) { i += w.IP; run -= w.so; mis -= w.wmis; }
    mis &= VEC - 1;
  }
  __device__ __forceinline__ Slot slot(const NcWalk<VEC>& w) const {
    const int start = i * VEC - mis;  // the pack's first element, from the run's start
    const int lo = start < 0 ? -start : 0;
    const int hi = w.I - start < VEC ? w.I - start : VEC;
    return Slot{run + start, lo, hi > lo ? hi : lo};
  }
};

// Calls f(slot[U]) for this thread's packs of [p0, p1) of the channel at xc, U at a time (f
// issues all U loads before it uses any), last pack first when REVERSE. Every thread returns
// normally, so block barriers may follow. (Counts a thread's packs in 32 bits: a chunk holds
// fewer than 2^31 * kBnBlock packs.)
template <int U, int VEC, bool REVERSE, typename T, typename F>
__device__ __forceinline__ void walk_nc(const T* xc, i64 p0, i64 p1, i64 so, i64 I, i64 IP, F&& f) {
  const i64 first = p0 + threadIdx.x;
  const int K = first < p1 ? int((p1 - 1 - first) / kBnBlock) + 1 : 0;
  if (K == 0) return;
  const NcWalk<VEC> w(so, I, IP);
  const i64 base_mis = i64(reinterpret_cast<unsigned long long>(xc) / sizeof(T));
  NcCursor<VEC> cur(w, REVERSE ? first + i64(K - 1) * kBnBlock : first, base_mis);
  for (int k = 0; k < K; k += U) {
    Slot sl[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      sl[u] = k + u < K ? cur.slot(w) : Slot{0, 0, 0};
      if (REVERSE) cur.prev(w); else cur.next(w);
    }
    f(sl);
  }
}

// Channels last: this thread's row ty of R visits positions p0 + ty, p0 + ty + R, ... < p1 at
// offsets p * so + c (R a power of two, rshift its log2); every pack is whole.
template <int U, int VEC, bool REVERSE, typename F>
__device__ __forceinline__ void walk_cl(i64 p0, i64 p1, int ty, int rshift, i64 so, i64 c, F&& f) {
  const i64 first = p0 + ty, R = i64(1) << rshift;
  const int K = first < p1 ? int((p1 - 1 - first) >> rshift) + 1 : 0;
  i64 at = (REVERSE ? first + (K - 1) * R : first) * so + c;
  const i64 step = REVERSE ? -R * so : R * so;
  for (int k = 0; k < K; k += U) {
    Slot sl[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      sl[u] = Slot{at, 0, k + u < K ? VEC : 0};
      at += step;
    }
    f(sl);
  }
}

// v23: the sums passes (bn_stats_cl / _nc, bn_bwd_sums_cl / _nc) load through a ring of RING
// shared-memory slots a thread and stream (cp.async, 16-byte packs): RING - 1 packs of every
// stream in flight a thread without holding them in registers (bf16 bn_bwd_sums_cl: 123 ->
// 56, with ReLU 201 -> 80), where the walks' U packs in registers left the channels-last
// statistics pass reading at 2.0-2.3 TB/s (ncu: long scoreboard 11-13 at 41% active warps,
// NOTES "Stall reasons"; bn_pass_times: bf16 (32, 256, 56, 56) NHWC 22.1 us for 51 MB).
// CUNORM_BN_CL_RING: the statistics passes' slots (the backward sums', reading two or three
// streams, half as many); 0: the register walks, as before.
#ifndef CUNORM_BN_CL_RING
#define CUNORM_BN_CL_RING 8
#endif
constexpr int kClRing = CUNORM_BN_CL_RING;
// The backward sums' ring: measured on the H200 (thirty-sixth session, one round, NOTES
// "BatchNorm v21-v23 outcome"), its backward read 0.006-0.015 of copy lower than the register
// walk at bf16 56 x 56 NHWC and 112 x 112 NCHW (level elsewhere) while the statistics' ring
// gained 0.008-0.020: 0 keeps the backward sums on the register walk. 1: the ring.
#ifndef CUNORM_BN_BWD_SUMS_RING
#define CUNORM_BN_BWD_SUMS_RING 0
#endif

// A thread's slots: slot[r][s][t] is thread t's slot r of stream s (consecutive threads'
// slots consecutive: no bank conflicts).
template <int RING, int NS, typename T, int VEC>
struct ClRing {
  Pack<T, VEC> slot[RING][NS][kBnBlock];
};

// The ring's slots for a pass of 16-byte packs (RING of them, NS streams), or none.
template <typename T, int VEC>
constexpr bool ring_packs() { return kClRing > 0 && sizeof(Pack<T, VEC>) == 16; }

// A walk's cursor for walk_ring: channels last, every pack whole, ``step`` apart.
template <int VEC>
struct ClCursor {
  i64 at, step;
  __device__ __forceinline__ Slot slot() const { return Slot{at, 0, VEC}; }
  __device__ __forceinline__ void next() { at += step; }
};

// Channel-major: walk_nc's cursor (its packs may be masked at the runs' ends); BACK: walking
// back, its next() the walk's previous pack (bn_fwd_two_phase_nc's apply).
template <int VEC, bool BACK = false>
struct NcRingCursor {
  const NcWalk<VEC>& w;
  NcCursor<VEC> c;
  __device__ __forceinline__ Slot slot() const { return c.slot(w); }
  __device__ __forceinline__ void next() {
    if (BACK) c.prev(w);
    else c.next(w);
  }
};

// K packs of a thread's walk in order (cursor ``cur`` at the first), of NS streams (src[s] +
// the slot's offset; a null stream is not read): f(v, slot) with the packs by value, each
// copied RING - 1 packs ahead into this thread's own slots (no other thread reads them, so
// no block barrier; a slot is refilled one pack after the pack that read it). A pack with no
// element of the tensor is not copied (its slot is stale: f masks by the slot).
template <int RING, int NS, int VEC, typename T, typename Cur, typename F>
__device__ __forceinline__ void walk_ring(int K, Cur cur, const T* const* src, ClRing<RING, NS, T, VEC>& ring,
                                          F&& f) {
  static_assert(RING >= 2 && (RING & (RING - 1)) == 0 && sizeof(Pack<T, VEC>) == 16, "ring of 16-byte packs");
  const int t = threadIdx.x;
  Cur ahead = cur;  // the next pack to copy
  const auto issue = [&](int k) {
    if (k < K) {
      const Slot sl = ahead.slot();
      if (sl.any()) {
#pragma unroll
        for (int s = 0; s < NS; ++s)
          if (src[s]) copy16_async(&ring.slot[k & (RING - 1)][s][t], src[s] + sl.off, true);
      }
      ahead.next();
    }
    copies_commit();  // empty past the walk's end: every thread's group count stays the same
  };
#pragma unroll
  for (int d = 0; d < RING - 1; ++d) issue(d);
  for (int k = 0; k < K; ++k) {
    copies_wait<RING - 2>();  // pack k's group has landed
    Pack<T, VEC> v[NS];
#pragma unroll
    for (int s = 0; s < NS; ++s) v[s] = ring.slot[k & (RING - 1)][s][t];
    issue(k + RING - 1);  // into the slot pack k - 1 read
    const Slot sl = cur.slot();
    cur.next();
    if (sl.any()) f(v, sl);
  }
  copies_wait<0>();  // the empty groups: nothing lands after the walk
}

// walk_cl's positions through the ring (a thread's row ty of 1 << rshift, so apart), last
// first when REVERSE.
template <int RING, int NS, int VEC, bool REVERSE = false, typename T, typename F>
__device__ __forceinline__ void walk_cl_ring(i64 p0, i64 p1, int ty, int rshift, i64 so, i64 c, const T* const* src,
                                             ClRing<RING, NS, T, VEC>& ring, F&& f) {
  const i64 first = p0 + ty, R = i64(1) << rshift;
  const int K = first < p1 ? int((p1 - 1 - first) >> rshift) + 1 : 0;
  const i64 start = REVERSE ? first + i64(K > 0 ? K - 1 : 0) * R : first;
  walk_ring(K, ClCursor<VEC>{start * so + c, (REVERSE ? -R : R) * so}, src, ring, f);
}

// walk_nc's packs (not reversed) through the ring; src[s] point at the channel's base.
template <int RING, int NS, int VEC, typename T, typename F>
__device__ __forceinline__ void walk_nc_ring(const T* xc, i64 p0, i64 p1, i64 so, i64 I, i64 IP, const T* const* src,
                                             ClRing<RING, NS, T, VEC>& ring, F&& f) {
  const i64 first = p0 + threadIdx.x;
  const int K = first < p1 ? int((p1 - 1 - first) / kBnBlock) + 1 : 0;
  const NcWalk<VEC> w(so, I, IP);
  const i64 base_mis = i64(reinterpret_cast<unsigned long long>(xc) / sizeof(T));
  walk_ring(K, NcRingCursor<VEC>{w, NcCursor<VEC>(w, first, base_mis)}, src, ring, f);
}

// Calls g(k) for the elements k of a pack that belong to the tensor; a masked pack's store.
template <int VEC, typename G>
__device__ __forceinline__ void each(const Slot& s, G&& g) {
  if (s.lo == 0 && s.hi == VEC) {
#pragma unroll
    for (int k = 0; k < VEC; ++k) g(k);
  } else {
#pragma unroll
    for (int k = 0; k < VEC; ++k)
      if (s.has(k)) g(k);
  }
}

template <typename T, typename A, int VEC>
__device__ __forceinline__ void store_slot(T* p, const Slot& s, const A (&v)[VEC]) {
  if (s.lo == 0 && s.hi == VEC) {
    store_pack<T>(p, v);
  } else {
#pragma unroll
    for (int k = 0; k < VEC; ++k)
      if (s.has(k)) p[k] = cvt<T>(v[k]);
  }
}

// The cl block's shape: CPB = 1 << cshift channel packs (lanes) by kBnBlock >> cshift rows,
// at most 32 lanes (the host's CL_MAX_LANES).
struct ClTile {
  int tx, ty, rshift;
  i64 c;  // this lane's first channel
  __device__ __forceinline__ ClTile(int cshift, int vec) {
    tx = threadIdx.x & ((1 << cshift) - 1);
    ty = threadIdx.x >> cshift;
    rshift = kBnBlockLog2 - cshift;
    c = lane_channel(tx, vec);
  }
  // the first channel of lane ``lane`` of this block
  __device__ __forceinline__ i64 lane_channel(int lane, int vec) const {
    return (i64(blockIdx.y) << (kBnBlockLog2 - rshift) | lane) * vec;
  }
};

// Sums value(k, j) (value j of NV for channel k of a thread's VEC) over the rows of a cl block,
// in row order, and hands each total to put(lane, k, j, total) (lane: the channel pack, 0 ..
// width - 1; ClTile::lane_channel). The totals are spread over the block's threads, one a
// thread (v55): row 0's threads summing all VEC * NV of theirs in turn made a chain of
// VEC * NV * rows dependent adds (bf16 NHWC 8 lanes: 512 double adds, a tenth of a 390 KB
// chunk's time), now rows. The same order of adds: the same bits. CUNORM_BN_ROWS_SPREAD=0: row
// 0's threads sum their own lanes' totals (as before v55, for sweeps).
#ifndef CUNORM_BN_ROWS_SPREAD
#define CUNORM_BN_ROWS_SPREAD 1
#endif
template <int VEC, int NV, typename A, typename V, typename P>
__device__ __forceinline__ void sum_rows_put(A* red, const ClTile& t, V&& value, P&& put) {
#pragma unroll
  for (int k = 0; k < VEC; ++k)
#pragma unroll
    for (int j = 0; j < NV; ++j) red[(threadIdx.x * VEC + k) * NV + j] = value(k, j);
  __syncthreads();
  const int rows = 1 << t.rshift, per_row = (kBnBlock >> t.rshift) * VEC * NV;
  const auto total = [&](int i) {  // i = (lane * VEC + k) * NV + j
    A s = A(0);
    for (int r = 0; r < rows; ++r) s += red[r * per_row + i];
    put(i / (VEC * NV), i / NV % VEC, i % NV, s);
  };
  if (CUNORM_BN_ROWS_SPREAD) {
    for (int i = threadIdx.x; i < per_row; i += kBnBlock) total(i);
  } else if (t.ty == 0) {  // (before v55: row 0's threads, each its own lane's totals)
    for (int i = t.tx * VEC * NV; i < (t.tx + 1) * VEC * NV; ++i) total(i);
  }
  __syncthreads();
}

// Per-channel constants, folded once a thread so a cl thread (VEC channels) holds few:
// z = (x - mean) * scale + shift (+ residual), scale = rstd * w, shift = b. (x - mean) is kept
// rather than folding the mean into the shift: with |mean| >> std that fold cancels digits.
template <typename A>
struct Channel {
  A mean, scale, shift;
  __device__ __forceinline__ A z(A x, A r) const { return (x - mean) * scale + shift + r; }
  // without a residual: no + 0 (which would not fold away: -0 + 0 is +0)
  __device__ __forceinline__ A z(A x) const { return (x - mean) * scale + shift; }
};

template <typename A, typename W>
__device__ __forceinline__ Channel<A> channel_from(i64 c, A mean, A rstd, const W* w, const W* b) {
  return Channel<A>{mean, w ? rstd * cvt<A>(w[c]) : rstd, b ? cvt<A>(b[c]) : A(0)};
}

template <typename A, typename W>
__device__ __forceinline__ Channel<A> channel_of(i64 c, const A* mean, const A* rstd, const W* w, const W* b) {
  return channel_from(c, mean[c], rstd[c], w, b);
}

// ACT: 0 identity, 1 ReLU (each its own instantiation, the switch folded away), 2 any (the
// id a kernel argument, one switch per element). The host picks; registers stay those of the
// plain kernel when there is no activation.
template <int ACT> struct ActOf { typedef ActAny type; };
template <> struct ActOf<0> { typedef ActFixed<kIdentity> type; };
template <> struct ActOf<1> { typedef ActFixed<kRelu> type; };

template <int ACT>
__device__ __forceinline__ typename ActOf<ACT>::type act_tag(int id) {
  if constexpr (ACT == 2) return ActAny{id};
  else return typename ActOf<ACT>::type{};
}

// ---- forward statistics -------------------------------------------------------------------
// v53: the passes' and the two-phase forward's statistics summed in double (StatSum), from
// each element to the partials (part [C, chunks, 2] is double for every x dtype): x - pivot
// widened and its square and running sums keep ~53 bits, so var = q / n - shift^2 cancels
// no digits that matter. In float they lost about eps * R * k of var (R = shift^2 / var, at
// most n since the pivot is one of the channel's elements; k values a thread): a channel
// whose first element alone carries its variance (x[0] = 600 among N(0, 1) values; a dead
// ReLU channel with one live value) came out up to 520x float32's tolerance (NOTES
// "BatchNorm's pivots"). The staged kernels keep float sums and re-pivot a far channel on
// chip instead (stage_far): double sums cost them up to 0.066 of copy (NOTES "BatchNorm v53").
// CUNORM_BN_WIDE_SUMS=0: the float sums (sweeps; the host still allocates double partials).
#ifndef CUNORM_BN_WIDE_SUMS
#define CUNORM_BN_WIDE_SUMS 1
#endif
template <typename A>
using StatSum = typename Select<CUNORM_BN_WIDE_SUMS != 0, double, A>::type;

// x - pivot in A, then widened to the sums' S: exact for half precision x (at most 11
// significant bits each), one rounding for float32 (relative to the difference itself: var
// then errs by about 3 eps sqrt(n) at worst, R = n); the pivots stay in A (fewer registers).
template <typename S, typename A>
__device__ __forceinline__ S centred(A v, A pivot) { return S(v - pivot); }

// Partial (sum(x - K), sum((x - K)^2)) per channel and chunk -> part [C, chunks, 2], K the
// channel's first element: all partials of a channel share it, so they simply add up, and the
// shift keeps the digits a large common offset would cost. The counts are the host's.
template <typename T, int VEC>
__global__ void __launch_bounds__(kBnBlock)
bn_stats_nc(const T* __restrict__ x, i64 so, i64 sc, i64 I, i64 IP, i64 packs, i64 per_chunk,
            double* __restrict__ part) {
  typedef typename AccOf<T>::type A;
  typedef StatSum<A> S;
  constexpr int U = unroll_of<T, VEC, kStatsInflightBytes>();
  __shared__ S smem[2 * kWarp];
  const i64 c = blockIdx.y;
  const T* xc = x + c * sc;
  const A K = cvt<A>(xc[0]);
  const i64 p0 = i64(blockIdx.x) * per_chunk, p1 = min(packs, p0 + per_chunk);
  S s = S(0), q = S(0);
  const auto add = [&](const Pack<T, VEC>& v, const Slot& sl) {
    A xv[VEC];
    unpack(v, xv);
    each<VEC>(sl, [&](int k) { const S d = centred<S>(xv[k], K); s += d; q += d * d; });
  };
  if constexpr (ring_packs<T, VEC>()) {
    __shared__ ClRing<(kClRing > 1 ? kClRing : 2), 1, T, VEC> ring;
    const T* const src[1] = {xc};
    walk_nc_ring(xc, p0, p1, so, I, IP, src, ring, [&](const Pack<T, VEC> (&v)[1], const Slot& sl) { add(v[0], sl); });
  } else {
    walk_nc<U, VEC, false>(xc, p0, p1, so, I, IP, [&](const Slot (&sl)[U]) {
      Pack<T, VEC> v[U];
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (sl[u].any()) v[u] = load_raw<VEC>(xc + sl[u].off);
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (sl[u].any()) add(v[u], sl[u]);
    });
  }
  group_sum2<kBnBlock>(s, q, smem);
  if (threadIdx.x == 0) {
    double* out = part + (c * gridDim.x + blockIdx.x) * 2;
    out[0] = double(s); out[1] = double(q);
  }
}

// bn_stats_cl's sums a thread (v53: x - K in double from the first row on); v55 moved them
// into a struct read per channel after the walk (sum_rows_put makes each total's double as
// it stores it). A Welford state in float (running mean and M2 of x - K, 2 VEC registers)
// was measured against them and lost (bf16 NHWC 112 x 112 forward 0.577 against 0.582, NOTES
// "BatchNorm v55 outcome").
template <typename A, typename S, int VEC>
struct ClPivotSums {
  A K[VEC];
  S s[VEC], q[VEC];
  __device__ __forceinline__ explicit ClPivotSums(const A (&pivots)[VEC]) {
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      K[k] = pivots[k];
      s[k] = q[k] = S(0);
    }
  }
  __device__ __forceinline__ void add(const A (&xv)[VEC]) {
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      const S d = centred<S>(xv[k], K[k]);
      s[k] += d;
      q[k] += d * d;
    }
  }
  // j 0 the sum, j 1 the squares
  __device__ __forceinline__ S sum(int k, int j) const { return j == 0 ? s[k] : q[k]; }
};

// Blocks an SM the kernel is built for: four, the plan's grid (BLOCKS_PER_SM_CL) and what its
// 64 registers fit (sm_90, NVRTC 13.5: 75 unbounded since v55's frame, no spills at 64).
#ifndef CUNORM_BN_CL_STATS_MIN_BLOCKS
#define CUNORM_BN_CL_STATS_MIN_BLOCKS 4
#endif

template <typename T, int VEC>
__global__ void __launch_bounds__(kBnBlock, CUNORM_BN_CL_STATS_MIN_BLOCKS)
bn_stats_cl(const T* __restrict__ x, i64 so, i64 C, i64 O, i64 per_chunk, int cshift,
            double* __restrict__ part) {
  typedef typename AccOf<T>::type A;
  typedef StatSum<A> S;
  constexpr int U = unroll_of<T, VEC, kStatsInflightBytes>();
  // the ring's slots, then (after a barrier) the block's sums s and q: one buffer (v55; v53's
  // 16 KB of double sums beside the 32 KB ring)
  constexpr bool kRing = ring_packs<T, VEC>();
  __shared__ union {
    typename Select<kRing, ClRing<(kClRing > 1 ? kClRing : 2), 1, T, VEC>, char>::type ring;
    S red[kBnBlock * VEC * 2];
  } sm;
  S* const red = sm.red;
  const ClTile t(cshift, VEC);
  const bool ok_c = t.c < C;  // VEC > 1 only when C % VEC == 0
  const i64 p0 = i64(blockIdx.x) * per_chunk, p1 = min(O, p0 + per_chunk);
  // the lane's channels' pivots (each channel's first element; every row's thread loads them,
  // the block's few distinct packs from L1)
  A K[VEC];
#pragma unroll
  for (int k = 0; k < VEC; ++k) K[k] = A(0);
  if (ok_c) load_pack<A, T, VEC>(x + t.c, K);
  ClPivotSums<A, S, VEC> acc(K);
  const auto add = [&](const Pack<T, VEC>& v) {
    A xv[VEC];
    unpack(v, xv);
    acc.add(xv);
  };
  if constexpr (kRing) {
    if (ok_c) {
      const T* const src[1] = {x};
      walk_cl_ring(p0, p1, t.ty, t.rshift, so, t.c, src, sm.ring, [&](const Pack<T, VEC> (&v)[1], Slot) { add(v[0]); });
    }
  } else if (ok_c) {
    walk_cl<U, VEC, false>(p0, p1, t.ty, t.rshift, so, t.c, [&](const Slot (&sl)[U]) {
      Pack<T, VEC> v[U];
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (sl[u].any()) v[u] = load_raw<VEC>(x + sl[u].off);
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (sl[u].any()) add(v[u]);
    });
  }
  if constexpr (kRing) __syncthreads();  // every thread's slots read before red reuses them
  // channel c + k's partial at part[c + k][blockIdx.x][j]: its sum (j 0), its squares (j 1)
  sum_rows_put<VEC, 2>(red, t, [&](int k, int j) { return acc.sum(k, j); },
                       [&](int lane, int k, int j, S total) {
                         const i64 c = t.lane_channel(lane, VEC);
                         if (c < C) part[((c + k) * gridDim.x + blockIdx.x) * 2 + j] = double(total);
                       });
}

// Dense channel-major x over short planes (so = C * I, sc = I, C * I a multiple of VEC, I at
// most a piece's L elements, so a channel lies in one or two pieces; the host takes this for
// half precision): each image's C * I elements are one contiguous span, cut into pieces of L
// elements with the same packs in every image. Block (k, g) sums piece k of images
// g * G ... (g + 1) * G - 1: a thread's packs are the same in every image, so their parts
// (in the pack's first channel, and in the channel that starts inside it) add up over the
// images in registers; then through shared memory a thread a channel adds its packs in order
// (deterministic, no atomics). Where bn_stats_nc gives a block one channel of a short plane
// (about six packs a thread: one chain of latencies, NOTES "where a small tensor's time
// goes"), this gives it several (NOTES "BatchNorm v8"). Slot 2 g + (k - the channel's first
// piece) of part [C, 2 * groups, 2], as bn_finalize and the flat apply read them; a channel
// that lies in one piece gets zeros in its second slot. Pivots are bn_stats_nc's (the
// channel's first element), so the partials add up the same way.
#ifndef CUNORM_BN_FLAT_STATS_PACKS
#define CUNORM_BN_FLAT_STATS_PACKS 2  // = the host's FLAT_STATS_PACKS
#endif
constexpr int kFlatStatsPacks = CUNORM_BN_FLAT_STATS_PACKS;
// Images a thread loads together (then sums): 1 measured best (NOTES "BatchNorm v8": 2
// images, 64 registers half precision, read -0.02 at 7 x 7 and 14 x 14; 1 image, 42-51
// registers, leaves five blocks an SM).
#ifndef CUNORM_BN_FLAT_STATS_DEPTH
#define CUNORM_BN_FLAT_STATS_DEPTH 1
#endif
constexpr int kFlatStatsDepth = CUNORM_BN_FLAT_STATS_DEPTH;
constexpr int kFlatChannels = 512;  // a flat piece's channels at most (the host's FLAT_CHANNELS)

// v, which the compiler must take as new on each trip of a loop over `trip`: what is derived
// from it is recomputed a trip rather than hoisted and held (bn_stats_flat's per-element
// pivot choices: held, they took 32-64 registers).
__device__ __forceinline__ int per_trip(int v, int trip) {
#if defined(CUNORM_HIP)
  asm("" : "+v"(v) : "v"(trip));
#else
  asm("" : "+r"(v) : "r"(trip));
#endif
  return v;
}

#ifndef CUNORM_BN_FLAT_STATS_MIN_BLOCKS
#define CUNORM_BN_FLAT_STATS_MIN_BLOCKS 4
#endif

// A bn_stats_flat / bn_bwd_sums_flat block's share of the tensor: piece k (elements [e0, e1)
// of an image: channels c0 .. c0 + nch - 1, np whole packs) of each image of group g (images
// [o0, o1)). Blocks go piece-major: block k * groups + g.
struct FlatShare {
  int k, g;
  i64 e0, e1;
  int c0, nch, np, o0, o1;
  __device__ __forceinline__ FlatShare(i64 CI, int I, int L, int O, int G, int groups, int vec) {
    k = blockIdx.x / groups;
    g = blockIdx.x - k * groups;
    e0 = i64(k) * L;
    e1 = min(CI, e0 + L);
    c0 = int(e0 / I);
    nch = int((e1 - 1) / I) - c0 + 1;
    np = int(e1 - e0) / vec;
    o0 = g * G;
    o1 = min(O, o0 + G);
  }
};

// This thread's pack u of a bn_stats_flat / bn_bwd_sums_flat piece at e0 (the same pack in
// every image): its first channel j (piece-local), the element cut where channel j + 1 starts
// (VEC where it does not), and the two channels' staged values (b = a where the pack holds
// one channel; zeros for a pack past the piece's np, never used).
template <int VEC, typename C>
__device__ __forceinline__ void flat_pack(int u, const FlatShare& sh, int I, const C* staged, int& j, int& cut, C& a,
                                          C& b) {
  const int e = int(sh.e0) + (threadIdx.x + u * kBnBlock) * VEC, c = e / I;
  const bool live = threadIdx.x + u * kBnBlock < sh.np;
  j = c - sh.c0;
  cut = min((c + 1) * I - e, VEC);
  a = live ? staged[j] : C{};
  b = live && cut < VEC ? staged[j + 1] : a;
}

// bn_stats_flat's and bn_bwd_sums_flat's end: this thread's P packs' parts (a: in the pack's
// first channel j, piece-local; b: in channel j + 1 from element pcut on) through shared
// memory (hi_* zeroed by the caller before its first barrier: channels that start on a pack
// boundary keep 0), then a thread a channel adds its packs in order (deterministic), q times
// q_scale[c] where given, into slot 2 g + (k - the channel's first piece) of part
// [C, 2 * groups, 2]; a channel that lies in one piece gets zeros in its second slot.
template <int VEC, int P, typename A, typename Out>
__device__ __forceinline__ void flat_sums_write(const int (&pj)[P], const int (&pcut)[P], const A (&as)[P],
                                                const A (&aq)[P], const A (&bs)[P], const A (&bq)[P],
                                                const FlatShare& sh, int I, int L, int groups, A* lo_s, A* lo_q,
                                                A* hi_s, A* hi_q, const A* q_scale, Out* part) {
#pragma unroll
  for (int u = 0; u < P; ++u) {
    const int pl = threadIdx.x + u * kBnBlock;
    if (pl < sh.np) {
      lo_s[pl] = as[u]; lo_q[pl] = aq[u];
      if (pcut[u] < VEC) { hi_s[pj[u] + 1] = bs[u]; hi_q[pj[u] + 1] = bq[u]; }
    }
  }
  __syncthreads();
  for (int j = threadIdx.x; j < sh.nch; j += kBnBlock) {
    const i64 c = sh.c0 + j;
    const int start = int(c * I - sh.e0);  // negative for a channel begun in the piece before
    const int a = start > 0 ? (start + VEC - 1) / VEC : 0, b = min(sh.np, (start + I + VEC - 1) / VEC);
    A ss = hi_s[j], qq = hi_q[j];
    for (int pl = a; pl < b; ++pl) { ss += lo_s[pl]; qq += lo_q[pl]; }
    const i64 first = c * I / L;
    Out* out = part + (c * 2 * groups + 2 * sh.g + (sh.k - first)) * 2;
    out[0] = Out(ss); out[1] = Out(q_scale ? qq * q_scale[c] : qq);
    if (sh.k == first && c * I + I <= sh.e1) { out[2] = Out(0); out[3] = Out(0); }  // the channel's one piece
  }
}

template <typename T, int VEC>
__global__ void __launch_bounds__(kBnBlock, CUNORM_BN_FLAT_STATS_MIN_BLOCKS)
bn_stats_flat(const T* __restrict__ x, i64 CI, int I, int L, int O, int G, int groups, double* __restrict__ part) {
  typedef typename AccOf<T>::type A;
  typedef StatSum<A> S;
  constexpr int P = kFlatStatsPacks, D = kFlatStatsDepth;
  __shared__ A pivot[kFlatChannels];
  __shared__ S lo_s[kBnBlock * P], lo_q[kBnBlock * P];  // a pack's part in its first channel
  __shared__ S hi_s[kFlatChannels], hi_q[kFlatChannels];  // a channel's part in the pack it starts inside
  const FlatShare sh(CI, I, L, O, G, groups, VEC);
  const T* xt = x + sh.e0 + threadIdx.x * VEC;  // this thread's first pack, image 0 (then + o * CI)
  // D images' packs a thread in flight at once, the first D's while the pivots are staged
  Pack<T, VEC> v[D][P];
  const auto load_images = [&](int o) {
#pragma unroll
    for (int d = 0; d < D; ++d)
#pragma unroll
      for (int u = 0; u < P; ++u)
        if (o + d < sh.o1 && threadIdx.x + u * kBnBlock < sh.np)
          v[d][u] = load_raw<VEC>(xt + i64(o + d) * CI + u * kBnBlock * VEC);
  };
  load_images(sh.o0);
  for (int j = threadIdx.x; j < sh.nch; j += kBnBlock) {
    pivot[j] = cvt<A>(x[i64(sh.c0 + j) * I]);
    hi_s[j] = S(0); hi_q[j] = S(0);  // stays 0 for channels that start on a pack boundary
  }
  __syncthreads();
  // This thread's packs are the same in every image: their parts add up over the images in
  // registers (a, the pack's first channel j; b, channel j + 1 from element cut on).
  int pj[P], pcut[P];
  A ka[P], kb[P];
  S as[P], aq[P], bs[P], bq[P];
#pragma unroll
  for (int u = 0; u < P; ++u) {
    flat_pack<VEC>(u, sh, I, pivot, pj[u], pcut[u], ka[u], kb[u]);
    as[u] = aq[u] = bs[u] = bq[u] = S(0);
  }
#pragma unroll 1
  for (int o = sh.o0; o < sh.o1; o += D) {
#pragma unroll
    for (int d = 0; d < D; ++d)
#pragma unroll
      for (int u = 0; u < P; ++u)
        if (o + d < sh.o1 && threadIdx.x + u * kBnBlock < sh.np) {
          A xv[VEC];
          unpack(v[d][u], xv);
          const int cut = per_trip(pcut[u], o + d);
#pragma unroll
          for (int e = 0; e < VEC; ++e) {
            const S dv = centred<S>(xv[e], e < cut ? ka[u] : kb[u]);
            if (e < cut) { as[u] += dv; aq[u] += dv * dv; } else { bs[u] += dv; bq[u] += dv * dv; }
          }
        }
    if (o + D < sh.o1) load_images(o + D);
  }
  flat_sums_write<VEC, P>(pj, pcut, as, aq, bs, bq, sh, I, L, groups, lo_s, lo_q, hi_s, hi_q,
                          static_cast<const S*>(nullptr), part);
}

// A channel's (sum, sum of squares) or (sum dz, sum dz * xhat) from its chunks' partials,
// one warp together: lanes over chunks in order, in double, then a fixed tree, so every lane
// ends with the same bits (bn_finalize / bn_bwd_finalize and the flat passes' staging alike).
struct ChunkSums {
  double s, q;
};

// Chunks first, first + step, ... of channel c, in order. One thread with step 1 is the
// flat passes' staging (a thread a channel, all in parallel, where a warp a channel would
// take the block's channels in turn).
template <typename A>
__device__ __forceinline__ ChunkSums serial_chunk_sums(const A* part, i64 chunks, i64 c, i64 first = 0,
                                                       i64 step = 1) {
  double s = 0, q = 0;
#pragma unroll 8  // the loads issued together, the sums still in chunk order
  for (i64 k = first; k < chunks; k += step) {
    const A* p = part + (c * chunks + k) * 2;
    s += double(p[0]); q += double(p[1]);
  }
  return ChunkSums{s, q};
}

template <typename A>
__device__ __forceinline__ ChunkSums warp_chunk_sums(const A* part, i64 chunks, i64 c, int lane) {
  const ChunkSums cs = serial_chunk_sums(part, chunks, c, lane, kWarp);
  return ChunkSums{group_warp_sum<kWarp>(cs.s), group_warp_sum<kWarp>(cs.q)};
}

// A channel's mean (its pivot plus the shifted mean), biased variance, and rstd in A.
struct ChannelMoments {
  double m, var;
};

__device__ __forceinline__ ChannelMoments moments_of(ChunkSums cs, double pivot, double n) {
  const double shift = cs.s / n;
  return ChannelMoments{pivot + shift, fmax(cs.q / n - shift * shift, 0.0)};
}

template <typename A>
__device__ __forceinline__ A rstd_of(ChannelMoments mo, double eps) { return A(1.0 / sqrt(mo.var + eps)); }

// Updates a channel's running statistics in place (where given; factor = momentum, or
// 1 / batches for the cumulative average; unbiased variance) from their values rm, rv read
// beforehand (a kernel may load them early to hide the latency).
template <typename A, typename R>
__device__ __forceinline__ void update_running(i64 c, ChannelMoments mo, double n, double factor, A rm, A rv,
                                               R* running_mean, R* running_var) {
  if (running_mean) running_mean[c] = cvt<R>((1.0 - factor) * double(rm) + factor * mo.m);
  if (running_var) {
    const double unbiased = n > 1 ? mo.var * n / (n - 1) : nan("");
    running_var[c] = cvt<R>((1.0 - factor) * double(rv) + factor * unbiased);
  }
}

// Writes a channel's mean and rstd and updates its running statistics.
template <typename A, typename R>
__device__ __forceinline__ void store_moments(i64 c, ChannelMoments mo, double n, double eps, double factor,
                                              R* running_mean, R* running_var, A* mean, A* rstd) {
  mean[c] = A(mo.m);
  rstd[c] = rstd_of<A>(mo, eps);
  update_running(c, mo, n, factor, running_mean ? cvt<A>(running_mean[c]) : A(0),
                 running_var ? cvt<A>(running_var[c]) : A(0), running_mean, running_var);
}

// Per channel (one warp each): mean and rstd from the partials (count elements each channel),
// and the running statistics updated in place (unbiased variance; factor = momentum, or
// 1 / batches for the cumulative average). Sums in double, lanes over chunks in order, then
// a fixed tree.
template <typename T, typename R>
__global__ void __launch_bounds__(128)
bn_finalize(const T* __restrict__ x, i64 pivot_stride, const double* __restrict__ part,
            i64 chunks, i64 C, double count, double eps, double factor, R* __restrict__ running_mean,
            R* __restrict__ running_var, typename AccOf<T>::type* __restrict__ mean,
            typename AccOf<T>::type* __restrict__ rstd) {
  typedef typename AccOf<T>::type A;
  const int lane = threadIdx.x % kWarp;
  const i64 c = i64(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  if (c >= C) return;
  const ChunkSums cs = warp_chunk_sums(part, chunks, c, lane);
  if (lane != 0) return;
  const ChannelMoments mo = moments_of(cs, double(cvt<A>(x[c * pivot_stride])), count);
  store_moments(c, mo, count, eps, factor, running_mean, running_var, mean, rstd);
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
// Blocks and packs in the opposite order of bn_stats (see the top of the file).
template <typename T, typename W, int VEC, int ACT, bool RES>
__global__ void __launch_bounds__(kBnBlock)
bn_apply_nc(const T* __restrict__ x, const T* __restrict__ res_arg, T* __restrict__ y, i64 so, i64 sc, i64 I,
            i64 IP, i64 packs, i64 per_chunk, const typename AccOf<T>::type* __restrict__ mean,
            const typename AccOf<T>::type* __restrict__ rstd, const W* __restrict__ w, const W* __restrict__ b,
            int act, typename AccOf<T>::type param) {
  typedef typename AccOf<T>::type A;
  const T* const res = RES ? res_arg : nullptr;  // a null constant: no residual packs held
  constexpr int U = unroll_of<T, VEC>();
  const auto tag = act_tag<ACT>(act);
  const i64 c = gridDim.y - 1 - blockIdx.y, chunk = gridDim.x - 1 - blockIdx.x;
  const Channel<A> ch = channel_of(c, mean, rstd, w, b);
  const i64 base = c * sc, p0 = chunk * per_chunk, p1 = min(packs, p0 + per_chunk);
  walk_nc<U, VEC, true>(x + base, p0, p1, so, I, IP, [&](const Slot (&sl)[U]) {
    Pack<T, VEC> v[U], r[U];
    load_x_res<U, VEC>(x, res, base, sl, v, r);
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (sl[u].any()) {
        A xv[VEC], rv[VEC], out[VEC];
        unpack(v[u], xv);
        unpack_or_zero(res, r[u], rv);
#pragma unroll
        for (int k = 0; k < VEC; ++k) out[k] = act_forward(tag(), ch.z(xv[k], rv[k]), param);
        store_slot<T>(y + base + sl[u].off, sl[u], out);
      }
  });
}

// v56: bn_apply_cl's loads through a ring of this many cp.async slots a thread (half as many
// a stream with the residual: two streams), RING - 1 packs in flight without holding them in
// registers, as the statistics pass reads (v23); 0: the register walk of U packs a trip.
// NVRTC 13 sm_90, bf16: 63 -> 55-60 registers, with the residual 90 -> 64. H100, NHWC (128,
// 64, 112, 112), both v56 rings against the register walks, two readings of the rings in one
// run (results/sweep-v57-53-h100.json): bf16 forward / backward 0.575 / 0.553 -> 0.584-0.590
// / 0.569-0.573 of copy, float32 0.629 / 0.584 -> 0.626-0.633 / 0.578-0.584 (NOTES
// "Fifty-third session's device calls").
#ifndef CUNORM_BN_APPLY_CL_RING
#if defined(CUNORM_HIP)
#define CUNORM_BN_APPLY_CL_RING 0  // HIP's copies pass through registers: the ring would only cost LDS
#else
#define CUNORM_BN_APPLY_CL_RING 8
#endif
#endif
constexpr int kApplyClRing = CUNORM_BN_APPLY_CL_RING;

template <typename T, typename W, int VEC, int ACT, bool RES>
__global__ void __launch_bounds__(kBnBlock)
bn_apply_cl(const T* __restrict__ x, const T* __restrict__ res_arg, T* __restrict__ y, i64 so, i64 C, i64 O,
            i64 per_chunk, int cshift, const typename AccOf<T>::type* __restrict__ mean,
            const typename AccOf<T>::type* __restrict__ rstd, const W* __restrict__ w, const W* __restrict__ b,
            int act, typename AccOf<T>::type param) {
  typedef typename AccOf<T>::type A;
  const T* const res = RES ? res_arg : nullptr;  // a null constant: no residual packs held
  constexpr int U = unroll_of<T, VEC>();
  const auto tag = act_tag<ACT>(act);
  const ClTile t(cshift, VEC);
  if (t.c >= C) return;  // no barriers below
  Channel<A> ch[VEC];
#pragma unroll
  for (int k = 0; k < VEC; ++k) ch[k] = channel_of(t.c + k, mean, rstd, w, b);
  const i64 chunk = gridDim.x - 1 - blockIdx.x;
  const i64 p0 = chunk * per_chunk, p1 = min(O, p0 + per_chunk);
  const auto apply = [&](const Pack<T, VEC>& v, const Pack<T, VEC>& r, i64 off) {
    A xv[VEC], rv[VEC], out[VEC];
    unpack(v, xv);
    unpack_or_zero(res, r, rv);
#pragma unroll
    for (int k = 0; k < VEC; ++k) out[k] = act_forward(tag(), ch[k].z(xv[k], rv[k]), param);
    store_pack<T>(y + off, out);
  };
  if constexpr (kApplyClRing > 1 && ring_packs<T, VEC>()) {
    constexpr int NS = RES ? 2 : 1, SLOTS = RES ? kApplyClRing / 2 : kApplyClRing, RING = SLOTS > 1 ? SLOTS : 2;
    __shared__ ClRing<RING, NS, T, VEC> ring;
    const T* const src[2] = {x, res};
    walk_cl_ring<RING, NS, VEC, true>(p0, p1, t.ty, t.rshift, so, t.c, src, ring,
                                      [&](const Pack<T, VEC> (&v)[NS], const Slot& sl) {
                                        apply(v[0], v[NS - 1], sl.off);
                                      });
  } else {
    walk_cl<U, VEC, true>(p0, p1, t.ty, t.rshift, so, t.c, [&](const Slot (&sl)[U]) {
      Pack<T, VEC> v[U], r[U];
      load_x_res<U, VEC>(x, res, 0, sl, v, r);
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (sl[u].any()) apply(v[u], r[u], sl[u].off);
    });
  }
}

// ---- the training forward's passes in one cooperative launch (NOTES "BatchNorm v50", "v52") --
// Where no stage of x fits on chip (planes of 112 x 112 and more), the statistics and apply
// passes read x twice from DRAM (ncu: the apply's second read is whole at 205 MB). Here every
// block is resident at once (a cooperative launch) and walks one chunk twice: it sums its
// chunk through the statistics passes' ring, the blocks meet in global memory (arrival
// counters zeroed by the host, v24's grid_arrive / grid_wait), the channels' partials are
// folded as bn_finalize does, and the block applies its chunk last pack first. A thread's
// ring slots still hold the last RING packs it read (applied from shared memory, not read
// again), and the packs before them are the last x the grid read, which the L2 holds as far
// as it reaches; they come through the same ring, RING - 1 packs ahead. RES: the residual
// through the ring's second stream (half the slots: static shared memory stops at 48 KiB).
// CUDA only (the grid barrier's acquire loads): the host never plans them on HIP.
// A channel's arrival counter to the next, in words: each on its own 128-byte L2 line
// (cunorm.ops._batch_norm.TWO_PHASE_COUNTER_WORDS).
constexpr int kTwoPhaseCounterWords = 32;
template <bool RES>
constexpr int two_phase_ring() { return RES ? (kClRing > 3 ? kClRing / 2 : 2) : (kClRing > 1 ? kClRing : 2); }

// The apply's walk: a thread's packs k = Kt - 1 down to 0 (``cur`` at pack Kt - 1, its next()
// one pack back), pack k in slot k & (RING - 1) as walk_ring placed them: packs [Kt - RING,
// Kt) hold the first HELD streams already (x), so only the other
// streams (the residual) are copied for them; each earlier pack's copies go into the slot of
// the pack applied just before it (k + RING: the same slot), RING - 1 packs ahead. f(the
// packs of the NS streams, slot) for each pack with elements.
template <int HELD, int RING, int NS, int VEC, typename T, typename Cur, typename F>
__device__ __forceinline__ void walk_back_held(int Kt, Cur cur, const T* const* src, ClRing<RING, NS, T, VEC>& ring,
                                               F&& f) {
  const int t = threadIdx.x;
  Cur ahead = cur;  // the next pack to copy
  const auto issue = [&](int k) {
    if (k >= 0) {
      const Slot sl = ahead.slot();
      if (sl.any()) {
#pragma unroll
        for (int s = 0; s < NS; ++s)
          if (s >= HELD || k < Kt - RING) copy16_async(&ring.slot[k & (RING - 1)][s][t], src[s] + sl.off, true);
      }
      ahead.next();
    }
    copies_commit();  // empty ones too: every thread's group count stays the same
  };
#pragma unroll
  for (int d = 0; d < RING - 1; ++d) issue(Kt - 1 - d);
  for (int j = 0; j < Kt; ++j) {
    const int k = Kt - 1 - j;
    copies_wait<RING - 2>();  // pack k's group has landed
    Pack<T, VEC> v[NS];
#pragma unroll
    for (int s = 0; s < NS; ++s) v[s] = ring.slot[k & (RING - 1)][s][t];
    issue(k - (RING - 1));  // into the slot of pack k + 1, applied just before
    const Slot sl = cur.slot();
    cur.next();
    if (sl.any()) f(v, sl);
  }
  copies_wait<0>();  // the empty groups: nothing lands after the walk
}

// y of one pack from its x and residual packs (the residual's read where RES: r is x's pack
// again without one, unread), the channel's constants c; whole 16-byte stores (store_slot's
// split into 2-byte ones: 55M L2 write sectors for 205 MB of y, NOTES "BatchNorm v52").
template <bool RES, int VEC, typename T, typename A, typename Tag>
__device__ __forceinline__ void two_phase_out(T* yp, const Slot& sl, const Pack<T, VEC>& v, const Pack<T, VEC>& r,
                                              const Channel<A>& c, Tag tag, A param) {
  A xv[VEC], rv[VEC], out[VEC];
  unpack(v, xv);
  if (RES) unpack(r, rv);
#pragma unroll
  for (int e = 0; e < VEC; ++e) out[e] = act_forward(tag(), RES ? c.z(xv[e], rv[e]) : c.z(xv[e]), param);
  if (sl.lo == 0 && sl.hi == VEC)
    store_pack_whole<T>(yp, out);
  else
    store_slot<T>(yp, sl, out);
}

// Channel-major: a block a (channel, chunk), blocks of a channel meeting at its own counter;
// warp 0 of each folds the channel's partials (the same bits in every block of the channel).
template <typename T, typename W, typename R, int VEC, int ACT, bool RES>
__global__ void __launch_bounds__(kBnBlock)
bn_fwd_two_phase_nc(const T* __restrict__ x, const T* __restrict__ res, T* __restrict__ y, i64 so, i64 sc, i64 I,
                    i64 IP, i64 packs, i64 per_chunk, int chunks, const W* __restrict__ w, const W* __restrict__ b,
                    int act, typename AccOf<T>::type param, double count, double eps, double factor,
                    R* __restrict__ running_mean, R* __restrict__ running_var,
                    typename AccOf<T>::type* __restrict__ mean, typename AccOf<T>::type* __restrict__ rstd,
                    double* __restrict__ part, unsigned* __restrict__ counters) {
#if !defined(CUNORM_HIP)
  typedef typename AccOf<T>::type A;
  typedef StatSum<A> S;
  static_assert(sizeof(Pack<T, VEC>) == 16, "the ring's 16-byte packs");
  constexpr int RING = two_phase_ring<RES>();
  constexpr int NS = RES ? 2 : 1;
  __shared__ S smem[2 * kWarp];
  __shared__ ClRing<RING, NS, T, VEC> ring;
  __shared__ A cons[2];  // the channel's mean and rstd
  const int t = threadIdx.x;
  const i64 c = blockIdx.x / chunks, chunk = blockIdx.x - c * chunks;
  const i64 base = c * sc;
  const T* xc = x + base;
  const A pivot = cvt<A>(xc[0]);
  const i64 p0 = chunk * per_chunk, p1 = min(packs, p0 + per_chunk);
  S s = S(0), q = S(0);
  {
    const T* src[NS];
    src[0] = xc;
    if (RES) src[NS - 1] = nullptr;  // (the second stream waits for the apply)
    walk_nc_ring(xc, p0, p1, so, I, IP, src, ring, [&](const Pack<T, VEC> (&v)[NS], const Slot& sl) {
      A xv[VEC];
      unpack(v[0], xv);
      each<VEC>(sl, [&](int k) { const S d = centred<S>(xv[k], pivot); s += d; q += d * d; });
    });
  }
  group_sum2<kBnBlock>(s, q, smem);
  if (t == 0) {
    double* out = part + (c * chunks + chunk) * 2;
    out[0] = double(s); out[1] = double(q);
    grid_arrive(counters + c * kTwoPhaseCounterWords);
  }
  grid_wait(counters + c * kTwoPhaseCounterWords, unsigned(chunks));
  if (t < kWarp) {  // bn_finalize's fold: lanes over the chunks in order, in double, then a tree
    double fs = 0, fq = 0;
    for (int k = t; k < chunks; k += kWarp) {
      const double* pk = part + (c * chunks + k) * 2;
      fs += __ldcg(pk); fq += __ldcg(pk + 1);
    }
    fs = group_warp_sum<kWarp>(fs);
    fq = group_warp_sum<kWarp>(fq);
    if (t == 0) {
      const ChannelMoments mo = moments_of(ChunkSums{fs, fq}, double(pivot), count);
      cons[0] = A(mo.m);
      cons[1] = rstd_of<A>(mo, eps);
      if (chunk == 0) store_moments(c, mo, count, eps, factor, running_mean, running_var, mean, rstd);
    }
  }
  __syncthreads();
  const Channel<A> ch = channel_from(c, cons[0], cons[1], w, b);
  const auto tag = act_tag<ACT>(act);
  const i64 first = p0 + t;
  const int Kt = first < p1 ? int((p1 - 1 - first) / kBnBlock) + 1 : 0;
  if (Kt == 0) return;  // (no barrier below)
  const NcWalk<VEC> nw(so, I, IP);
  const i64 base_mis = i64(reinterpret_cast<unsigned long long>(xc) / sizeof(T));
  const T* const src[2] = {xc, RES ? res + base : nullptr};  // the first NS
  walk_back_held<1>(Kt, NcRingCursor<VEC, true>{nw, NcCursor<VEC>(nw, first + i64(Kt - 1) * kBnBlock, base_mis)}, src,
                    ring, [&](const Pack<T, VEC> (&v)[NS], const Slot& sl) {
                      two_phase_out<RES>(y + base + sl.off, sl, v[0], v[NS - 1], ch, tag, param);
                    });
#endif
}

// ---- backward -----------------------------------------------------------------------------
// dz = dy * act'(z), z recomputed from x (never stored: fewer bytes than writing and reading
// it back); without an activation dz = dy and neither z nor the residual is needed.
// Partial (sum dz, sum dz * xhat) per channel and chunk -> part [C, chunks, 2]; the threads
// sum dz * (x - mean) and scale by rstd once.
template <int ACT, typename A, typename Tag>
__device__ __forceinline__ A element_dz(Tag tag, const Channel<A>& ch, A x, A g, A r, A param) {
  return ACT == 0 ? g : g * act_derivative(tag(), ch.z(x, r), param);
}

template <int ACT, typename A, typename Tag, int VEC>
__device__ __forceinline__ void dz_of(Tag tag, const Channel<A>& ch, const A (&xv)[VEC], const A (&gv)[VEC],
                                      const A (&rv)[VEC], A param, A (&dz)[VEC]) {
#pragma unroll
  for (int k = 0; k < VEC; ++k) dz[k] = element_dz<ACT>(tag, ch, xv[k], gv[k], rv[k], param);
}

template <typename T, typename W, int VEC, int ACT>
__global__ void __launch_bounds__(kBnBlock)
bn_bwd_sums_nc(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ res, i64 so, i64 sc,
               i64 I, i64 IP, i64 packs, i64 per_chunk, const typename AccOf<T>::type* __restrict__ mean,
               const typename AccOf<T>::type* __restrict__ rstd, const W* __restrict__ w, const W* __restrict__ b,
               int act, typename AccOf<T>::type param, typename AccOf<T>::type* __restrict__ part) {
  typedef typename AccOf<T>::type A;
  constexpr int U = unroll_of<T, VEC, kSumsInflightBytes>();
  const auto tag = act_tag<ACT>(act);
  const bool with_res = ACT != 0 && res;
  constexpr bool kRing = CUNORM_BN_BWD_SUMS_RING && ring_packs<T, VEC>();
  // x, dy and (an activation's) the residual through the ring, half the statistics pass's
  // slots a stream; the block sum's buffer shares its shared memory (static: 48 KB at most)
  constexpr int NS = ACT != 0 ? 3 : 2, RING = kClRing / 2 > 1 ? kClRing / 2 : 2;
  __shared__ union {
    typename Select<kRing, ClRing<RING, NS, T, VEC>, char>::type ring;  // none in a register walk
    A red[2 * kWarp];
  } sm;
  const i64 c = blockIdx.y;
  const Channel<A> ch = channel_of(c, mean, rstd, w, b);
  const i64 base = c * sc, p0 = i64(blockIdx.x) * per_chunk, p1 = min(packs, p0 + per_chunk);
  A s1 = A(0), s2 = A(0);
  const auto add = [&](const Pack<T, VEC>& v, const Pack<T, VEC>& g, const Pack<T, VEC>& r, const Slot& sl) {
    A xv[VEC], gv[VEC], rv[VEC], dz[VEC];
    unpack(v, xv);
    unpack(g, gv);
    unpack_or_zero(with_res, r, rv);
    dz_of<ACT>(tag, ch, xv, gv, rv, param, dz);
    each<VEC>(sl, [&](int k) { s1 += dz[k]; s2 += dz[k] * (xv[k] - ch.mean); });
  };
  if constexpr (kRing) {
    const T* const src[3] = {x + base, dy + base, with_res ? res + base : nullptr};  // the first NS
    walk_nc_ring(x + base, p0, p1, so, I, IP, src, sm.ring, [&](const Pack<T, VEC> (&v)[NS], const Slot& sl) {
      add(v[0], v[1], v[NS - 1], sl);  // v[NS - 1] is unread without a residual (with_res false)
    });
    __syncthreads();  // every thread's slots read before the block sum reuses them
  } else {
    walk_nc<U, VEC, false>(x + base, p0, p1, so, I, IP, [&](const Slot (&sl)[U]) {
      Pack<T, VEC> v[U], g[U], r[U];
      load_x_dy_res<U, VEC>(x, dy, res, with_res, base, sl, v, g, r);
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (sl[u].any()) add(v[u], g[u], r[u], sl[u]);
    });
  }
  s2 *= rstd[c];
  group_sum2<kBnBlock>(s1, s2, sm.red);
  if (threadIdx.x == 0) {
    A* out = part + (c * gridDim.x + blockIdx.x) * 2;
    out[0] = s1; out[1] = s2;
  }
}

template <typename T, typename W, int VEC, int ACT>
__global__ void __launch_bounds__(kBnBlock)
bn_bwd_sums_cl(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ res, i64 so, i64 C, i64 O,
               i64 per_chunk, int cshift, const typename AccOf<T>::type* __restrict__ mean,
               const typename AccOf<T>::type* __restrict__ rstd, const W* __restrict__ w, const W* __restrict__ b,
               int act, typename AccOf<T>::type param, typename AccOf<T>::type* __restrict__ part) {
  typedef typename AccOf<T>::type A;
  constexpr int U = unroll_of<T, VEC, kSumsClInflightBytes>();
  const auto tag = act_tag<ACT>(act);
  const bool with_res = ACT != 0 && res;
  constexpr bool kRing = CUNORM_BN_BWD_SUMS_RING && ring_packs<T, VEC>();
  // x, dy and (an activation's) the residual through the ring, half the statistics pass's
  // slots a stream; the row sums' buffer shares its shared memory (static: 48 KB at most)
  constexpr int NS = ACT != 0 ? 3 : 2, RING = kClRing / 2 > 1 ? kClRing / 2 : 2;
  __shared__ union {
    typename Select<kRing, ClRing<RING, NS, T, VEC>, char>::type ring;  // none in a register walk
    A red[kBnBlock * VEC * 2];  // s1 and s2 (sum_rows_put)
  } sm;
  A* red = sm.red;
  const ClTile t(cshift, VEC);
  const bool ok_c = t.c < C;
  A s1[VEC], s2[VEC];
#pragma unroll
  for (int k = 0; k < VEC; ++k) { s1[k] = A(0); s2[k] = A(0); }
  if (ok_c) {
    Channel<A> ch[VEC];
#pragma unroll
    for (int k = 0; k < VEC; ++k) ch[k] = channel_of(t.c + k, mean, rstd, w, b);
    const i64 p0 = i64(blockIdx.x) * per_chunk, p1 = min(O, p0 + per_chunk);
    const auto add = [&](const Pack<T, VEC>& v, const Pack<T, VEC>& g, const Pack<T, VEC>& r) {
      A xv[VEC], gv[VEC], rv[VEC];
      unpack(v, xv);
      unpack(g, gv);
      unpack_or_zero(with_res, r, rv);
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        const A dz = element_dz<ACT>(tag, ch[k], xv[k], gv[k], rv[k], param);
        s1[k] += dz;
        s2[k] += dz * (xv[k] - ch[k].mean);
      }
    };
    if constexpr (kRing) {
      const T* const src[3] = {x, dy, with_res ? res : nullptr};  // the first NS
      walk_cl_ring(p0, p1, t.ty, t.rshift, so, t.c, src, sm.ring, [&](const Pack<T, VEC> (&v)[NS], Slot) {
        add(v[0], v[1], v[NS - 1]);  // v[NS - 1] is unread without a residual (with_res false)
      });
    } else {
      walk_cl<U, VEC, false>(p0, p1, t.ty, t.rshift, so, t.c, [&](const Slot (&sl)[U]) {
        Pack<T, VEC> v[U], g[U], r[U];
        load_x_dy_res<U, VEC>(x, dy, res, with_res, 0, sl, v, g, r);
#pragma unroll
        for (int u = 0; u < U; ++u)
          if (sl[u].any()) add(v[u], g[u], r[u]);
      });
    }
#pragma unroll
    for (int k = 0; k < VEC; ++k) s2[k] *= rstd[t.c + k];
  }
  if constexpr (kRing) __syncthreads();  // every thread's slots read before red reuses them
  sum_rows_put<VEC, 2>(red, t, [&](int k, int j) { return j == 0 ? s1[k] : s2[k]; },
                       [&](int lane, int k, int j, A total) {
                         const i64 c = t.lane_channel(lane, VEC);
                         if (c < C) part[((c + k) * gridDim.x + blockIdx.x) * 2 + j] = total;
                       });
}

// bn_bwd_sums_nc's partials (sum dz, sum dz * xhat) for the shapes bn_stats_flat takes, the
// same way: block (k, g) sums piece k of images g * G ... (g + 1) * G - 1, each thread's
// packs' parts over the images in registers (two channels' constants a pack: the pack's
// first channel and the one that starts inside it), the slots as bn_stats_flat's.
#ifndef CUNORM_BN_FLAT_SUMS_PACKS
#define CUNORM_BN_FLAT_SUMS_PACKS 1  // = the host's FLAT_SUMS_PACKS
#endif
// Blocks an SM its registers are held to (NVRTC 13.0 sm_90, one pack a thread): 4 (bf16 56
// registers, ReLU 62), the generic activation 3 (at 4, 92 bytes spilled); -D sets one for all.
template <int ACT>
__host__ __device__ constexpr int flat_sums_min_blocks() {
#ifdef CUNORM_BN_FLAT_SUMS_MIN_BLOCKS
  return CUNORM_BN_FLAT_SUMS_MIN_BLOCKS;
#else
  return ACT == 2 ? 3 : 4;
#endif
}

template <typename T, typename W, int VEC, int ACT>
__global__ void __launch_bounds__(kBnBlock, (flat_sums_min_blocks<ACT>()))
bn_bwd_sums_flat(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ res, i64 CI, int I, int L,
                 int O, int G, int groups, const typename AccOf<T>::type* __restrict__ mean,
                 const typename AccOf<T>::type* __restrict__ rstd, const W* __restrict__ w, const W* __restrict__ b,
                 int act, typename AccOf<T>::type param, typename AccOf<T>::type* __restrict__ part) {
  typedef typename AccOf<T>::type A;
  constexpr int P = CUNORM_BN_FLAT_SUMS_PACKS;
  __shared__ Channel<A> staged[kFlatChannels];
  __shared__ A lo_s[kBnBlock * P], lo_q[kBnBlock * P];
  __shared__ A hi_s[kFlatChannels], hi_q[kFlatChannels];
  const auto tag = act_tag<ACT>(act);
  const bool with_res = ACT != 0 && res;
  const FlatShare sh(CI, I, L, O, G, groups, VEC);
  const i64 t0 = sh.e0 + threadIdx.x * VEC;  // this thread's first pack, image 0 (then + o * CI)
  Pack<T, VEC> v[P], gr[P], r[P];
  const auto load_image = [&](int o) {
#pragma unroll
    for (int u = 0; u < P; ++u)
      if (threadIdx.x + u * kBnBlock < sh.np) {
        const i64 at = i64(o) * CI + t0 + u * kBnBlock * VEC;
        v[u] = load_raw<VEC>(x + at);
        gr[u] = load_raw<VEC>(dy + at);
        if (with_res) r[u] = load_raw<VEC>(res + at);
      }
  };
  if (sh.o0 < sh.o1) load_image(sh.o0);
  for (int j = threadIdx.x; j < sh.nch; j += kBnBlock) {
    staged[j] = channel_of(sh.c0 + j, mean, rstd, w, b);
    hi_s[j] = A(0); hi_q[j] = A(0);
  }
  __syncthreads();
  int pj[P], pcut[P];
  Channel<A> ca[P], cb[P];
  A as[P], aq[P], bs[P], bq[P];
#pragma unroll
  for (int u = 0; u < P; ++u) {
    flat_pack<VEC>(u, sh, I, staged, pj[u], pcut[u], ca[u], cb[u]);
    as[u] = aq[u] = bs[u] = bq[u] = A(0);
  }
#pragma unroll 1
  for (int o = sh.o0; o < sh.o1; ++o) {
#pragma unroll
    for (int u = 0; u < P; ++u)
      if (threadIdx.x + u * kBnBlock < sh.np) {
        A xv[VEC], gv[VEC], rv[VEC];
        unpack(v[u], xv);
        unpack(gr[u], gv);
        unpack_or_zero(with_res, r[u], rv);
        const int cut = per_trip(pcut[u], o);
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          const bool in_a = e < cut;  // fields picked by value: a picked reference went to the stack
          const Channel<A> ch{in_a ? ca[u].mean : cb[u].mean, in_a ? ca[u].scale : cb[u].scale,
                              in_a ? ca[u].shift : cb[u].shift};
          const A dz = element_dz<ACT>(tag, ch, xv[e], gv[e], rv[e], param), xm = xv[e] - ch.mean;
          if (in_a) { as[u] += dz; aq[u] += dz * xm; } else { bs[u] += dz; bq[u] += dz * xm; }
        }
      }
    if (o + 1 < sh.o1) load_image(o + 1);
  }
  flat_sums_write<VEC, P>(pj, pcut, as, aq, bs, bq, sh, I, L, groups, lo_s, lo_q, hi_s, hi_q,
                          rstd, part);
}

// dbias and dweight (where asked for) from a channel's sums; the two means the dx pass
// subtracts are m1 = sum dz / count and m2 = sum dz * xhat / count (zero in eval).
template <typename W>
__device__ __forceinline__ void store_param_grads(i64 c, ChunkSums cs, W* dw, W* db) {
  if (db) db[c] = cvt<W>(cs.s);
  if (dw) dw[c] = cvt<W>(cs.q);
}

template <typename A>
__device__ __forceinline__ A grad_mean(double sum, double count, int training) { return training ? A(sum / count) : A(0); }

// Per channel: dbias = sum dz, dweight = sum dz * xhat (in W, where asked for), and the two
// means the dx pass subtracts (zero in eval, where the statistics are constants) -> coef [C, 2].
template <typename A, typename W>
__global__ void __launch_bounds__(128)
bn_bwd_finalize(const A* __restrict__ part, i64 chunks, i64 C, double count, int training, W* __restrict__ dw,
                W* __restrict__ db, A* __restrict__ coef) {
  const int lane = threadIdx.x % kWarp;
  const i64 c = i64(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  if (c >= C) return;
  const ChunkSums cs = warp_chunk_sums(part, chunks, c, lane);
  if (lane != 0) return;
  store_param_grads(c, cs, dw, db);
  coef[c * 2] = grad_mean<A>(cs.s, count, training);
  coef[c * 2 + 1] = grad_mean<A>(cs.q, count, training);
}

// dx = w * rstd * (dz - mean(dz) - xhat * mean(dz * xhat)), as
// dx = a * (dz - m1) - d * (x - mean) with a = w * rstd, d = w * rstd^2 * m2 folded per
// channel; dres = dz where asked for. Blocks and packs in the opposite order of bn_bwd_sums.
template <typename A>
struct ChannelGrad {
  A a, m1, d;
  __device__ __forceinline__ A dx(A dz, A x_minus_mean) const { return a * (dz - m1) - d * x_minus_mean; }
};

template <typename A, typename W>
__device__ __forceinline__ ChannelGrad<A> channel_grad_from(i64 c, const A* rstd, const W* w, A m1, A m2) {
  const A a = w ? rstd[c] * cvt<A>(w[c]) : rstd[c];
  return ChannelGrad<A>{a, m1, a * rstd[c] * m2};
}

template <typename A, typename W>
__device__ __forceinline__ ChannelGrad<A> channel_grad_of(i64 c, const A* rstd, const W* w, const A* coef) {
  return channel_grad_from(c, rstd, w, coef[c * 2], coef[c * 2 + 1]);
}

template <typename T, typename W, int VEC, int ACT, bool DRES>
__global__ void __launch_bounds__(kBnBlock)
bn_bwd_apply_nc(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ res, T* __restrict__ dx,
                T* __restrict__ dres_arg, i64 so, i64 sc, i64 I, i64 IP, i64 packs, i64 per_chunk,
                const typename AccOf<T>::type* __restrict__ mean, const typename AccOf<T>::type* __restrict__ rstd,
                const W* __restrict__ w, const W* __restrict__ b, int act, typename AccOf<T>::type param,
                const typename AccOf<T>::type* __restrict__ coef) {
  typedef typename AccOf<T>::type A;
  T* const dres = DRES ? dres_arg : nullptr;  // a null constant: no residual gradient kept live
  constexpr int U = unroll_of<T, VEC>();
  const auto tag = act_tag<ACT>(act);
  const bool with_res = ACT != 0 && res;
  const i64 c = gridDim.y - 1 - blockIdx.y, chunk = gridDim.x - 1 - blockIdx.x;
  const Channel<A> ch = channel_of(c, mean, rstd, w, b);
  const ChannelGrad<A> cg = channel_grad_of(c, rstd, w, coef);
  const i64 base = c * sc, p0 = chunk * per_chunk, p1 = min(packs, p0 + per_chunk);
  walk_nc<U, VEC, true>(x + base, p0, p1, so, I, IP, [&](const Slot (&sl)[U]) {
    Pack<T, VEC> v[U], g[U], r[U];
    load_x_dy_res<U, VEC>(x, dy, res, with_res, base, sl, v, g, r);
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (sl[u].any()) {
        A xv[VEC], gv[VEC], rv[VEC], dz[VEC], out[VEC];
        unpack(v[u], xv);
        unpack(g[u], gv);
        unpack_or_zero(with_res, r[u], rv);
        dz_of<ACT>(tag, ch, xv, gv, rv, param, dz);
#pragma unroll
        for (int k = 0; k < VEC; ++k) out[k] = cg.dx(dz[k], xv[k] - ch.mean);
        store_slot<T>(dx + base + sl[u].off, sl[u], out);
        if (dres) store_slot<T>(dres + base + sl[u].off, sl[u], dz);
      }
  });
}

// v56: bn_bwd_apply_cl's loads through a ring of this many cp.async slots a stream (x, dy and
// with an activation the residual: 32 or 48 KB of static shared memory a block), RING - 1
// packs of each in flight without holding them in registers; 0: the register walk. bf16 78
// -> 57 registers, with ReLU and the residual's gradient 132 -> 90; measured with the
// forward's (above).
#ifndef CUNORM_BN_BWD_APPLY_CL_RING
#if defined(CUNORM_HIP)
#define CUNORM_BN_BWD_APPLY_CL_RING 0  // as CUNORM_BN_APPLY_CL_RING
#else
#define CUNORM_BN_BWD_APPLY_CL_RING 4
#endif
#endif
constexpr int kBwdApplyClRing = CUNORM_BN_BWD_APPLY_CL_RING;

template <typename T, typename W, int VEC, int ACT, bool DRES>
__global__ void __launch_bounds__(kBnBlock)
bn_bwd_apply_cl(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ res, T* __restrict__ dx,
                T* __restrict__ dres_arg, i64 so, i64 C, i64 O, i64 per_chunk, int cshift,
                const typename AccOf<T>::type* __restrict__ mean, const typename AccOf<T>::type* __restrict__ rstd,
                const W* __restrict__ w, const W* __restrict__ b, int act, typename AccOf<T>::type param,
                const typename AccOf<T>::type* __restrict__ coef) {
  typedef typename AccOf<T>::type A;
  T* const dres = DRES ? dres_arg : nullptr;  // a null constant: no residual gradient kept live
  constexpr int U = unroll_of<T, VEC>();
  const auto tag = act_tag<ACT>(act);
  const bool with_res = ACT != 0 && res;
  const ClTile t(cshift, VEC);
  if (t.c >= C) return;  // no barriers below
  Channel<A> ch[VEC];
  ChannelGrad<A> cg[VEC];
  constexpr bool kFold = ACT == 0 && sizeof(T) == 2 && CUNORM_BN_BWD_FOLD_MEAN;
  A fold[VEC];  // kFold: a * m1 - d * mean, so dx = a * dy - d * x - fold
#pragma unroll
  for (int k = 0; k < VEC; ++k) {
    ch[k] = channel_of(t.c + k, mean, rstd, w, b);
    cg[k] = channel_grad_of(t.c + k, rstd, w, coef);
    if constexpr (kFold) fold[k] = cg[k].a * cg[k].m1 - cg[k].d * ch[k].mean;
  }
  const i64 chunk = gridDim.x - 1 - blockIdx.x;
  const i64 p0 = chunk * per_chunk, p1 = min(O, p0 + per_chunk);
  const auto apply = [&](const Pack<T, VEC>& v, const Pack<T, VEC>& g, const Pack<T, VEC>& r, i64 off) {
    A xv[VEC], gv[VEC], rv[VEC], dz[VEC], out[VEC];
    unpack(v, xv);
    unpack(g, gv);
    unpack_or_zero(with_res, r, rv);
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      dz[k] = element_dz<ACT>(tag, ch[k], xv[k], gv[k], rv[k], param);
      out[k] = kFold ? fmaf(cg[k].a, gv[k], -fmaf(cg[k].d, xv[k], fold[k])) : cg[k].dx(dz[k], xv[k] - ch[k].mean);
    }
    store_pack<T>(dx + off, out);
    if (dres) store_pack<T>(dres + off, dz);
  };
  if constexpr (kBwdApplyClRing > 1 && ring_packs<T, VEC>()) {
    // x, dy and (with an activation) the residual: a null stream is not copied
    constexpr int NS = ACT != 0 ? 3 : 2, RING = kBwdApplyClRing;
    __shared__ ClRing<RING, NS, T, VEC> ring;
    const T* const src[3] = {x, dy, with_res ? res : nullptr};
    walk_cl_ring<RING, NS, VEC, true>(p0, p1, t.ty, t.rshift, so, t.c, src, ring,
                                      [&](const Pack<T, VEC> (&v)[NS], const Slot& sl) {
                                        apply(v[0], v[1], v[NS - 1], sl.off);
                                      });
  } else {
    walk_cl<U, VEC, true>(p0, p1, t.ty, t.rshift, so, t.c, [&](const Slot (&sl)[U]) {
      Pack<T, VEC> v[U], g[U], r[U];
      load_x_dy_res<U, VEC>(x, dy, res, with_res, 0, sl, v, g, r);
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (sl[u].any()) apply(v[u], g[u], r[u], sl[u].off);
    });
  }
}

// ---- dense channel-major apply passes -------------------------------------------------------
// x dense channel-major (so = C * I, sc = I; every pointer 16-byte aligned; I >= VEC): each
// image's C * I elements are one contiguous span, so the apply passes need not follow the
// channels' runs. A block takes a piece of L elements of one image and walks whole packs over
// it; a pack holds elements of at most two channels, the second from its element `cut` on, and
// the piece's channels' constants are staged in shared memory first. The per-channel walk
// above masks both ends of every run that starts off a pack boundary (a 7 x 7 plane: every
// run), storing those ends element by element; this walk masks only a piece's two ends.
// Pieces go last channels, last images first: the opposite order of the channel-major sums
// pass before them, which they start on in L2.
// Blocks an SM the flat passes' registers are held to (NVRTC 13.0 -Xptxas -v on sm_90;
// measured in NOTES "BatchNorm v4"): the half-precision forward at 4 (64 registers, 12-24
// bytes spilled; bf16 +0.00-0.03 of copy over 3, which spills nothing at 71), its backward at
// 3 (76 registers; at 4, 50-70 bytes spilled and -0.02 to -0.04), the generic activation one
// fewer (72-288 bytes spilled otherwise), float32 at 4 (50-64), float64 at 2 (220 bytes
// spilled at 4). -DCUNORM_BN_FLAT_MIN_BLOCKS sets one for all (sweep_bn_variants.py).
// BatchNorm v20: the half-precision ReLU backward (ACT 1) at CUNORM_BN_RELU_BWD_MIN_BLOCKS,
// 2: at 3 it spilled 136 bytes (80 registers), at 2 none (107). H200, two rounds (results/
// sweep-bn-relu-backward-v20-h200.txt), bf16 NCHW backward with residual + ReLU, of copy:
// (32,256,56,56) / (128,64,112,112) / (256,2048,7,7) 0.42 / 0.47 / 0.42 -> 0.50 / 0.54 /
// 0.49, (64,1024,14,14) 0.49 level; the plain backward and every other kernel unchanged
// (fp16 takes the bound too, not measured).
#ifndef CUNORM_BN_RELU_BWD_MIN_BLOCKS
#define CUNORM_BN_RELU_BWD_MIN_BLOCKS 2
#endif
template <typename T, int ACT, bool BACKWARD>
__host__ __device__ constexpr int flat_min_blocks() {
#ifdef CUNORM_BN_FLAT_MIN_BLOCKS
  return CUNORM_BN_FLAT_MIN_BLOCKS;
#else
  if (sizeof(T) == 2 && BACKWARD && ACT == 1) return CUNORM_BN_RELU_BWD_MIN_BLOCKS;
  return sizeof(T) == 2 ? (BACKWARD ? 3 : 4) - (ACT == 2) : (sizeof(T) == 8 ? 2 : 4);
#endif
}

struct FlatPiece {
  i64 start, end;  // the piece's elements [start, end)
  i64 image;       // its image's first element, o * C * I
  i64 e0;          // its first element within the image
  int c0, nch;     // its first channel and its channel count
  bool first_image;
  __device__ __forceinline__ FlatPiece(i64 CI, int I, i64 L, int O) {
    const i64 item = blockIdx.x;  // pieces of every image at piece index k, then k - 1, ...
    const i64 pieces = (CI + L - 1) / L;
    const i64 k = pieces - 1 - item / O, o = O - 1 - item % O;
    const i64 e0 = k * L, e1 = min(CI, e0 + L);
    image = o * CI;
    this->e0 = e0;
    first_image = o == 0;
    start = image + e0;
    end = image + e1;
    c0 = int(e0 / I);
    nch = int((e1 - 1) / I) - c0 + 1;
  }
  // Whether channel c's per-channel outputs are this block's to write: the one piece of the
  // first image where the channel starts.
  __device__ __forceinline__ bool starts(i64 c, int I) const { return first_image && c * I >= e0; }
};

// A whole pack of the piece: its element offset, j the piece-local channel of its first
// element, its elements from cut on in channel j + 1.
struct FlatSlot {
  i64 off;
  int j, cut;
  __device__ __forceinline__ bool any() const { return off >= 0; }
};

// Calls f(slot[U]) for this thread's whole packs of the piece, U at a time (f issues all U
// loads before it uses any), then g(element, channel) for each element of the piece in a
// pack it shares with a neighbouring piece (only where C * I is not a multiple of VEC), one
// thread each end. Offsets within an image are below 2^31 (the host checks C * I).
template <int U, int VEC, typename F, typename G>
__device__ __forceinline__ void walk_flat(const FlatPiece& pc, int I, F&& f, G&& g) {
  const i64 p0 = (pc.start + VEC - 1) / VEC, p1 = pc.end / VEC;
  for (i64 p = p0 + threadIdx.x; p < p1; p += i64(U) * kBnBlock) {
    FlatSlot sl[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const i64 q = p + i64(u) * kBnBlock;
      const int e = int(q * VEC - pc.image);  // the pack's first element within its image
      const int c = e / I;
      sl[u] = q < p1 ? FlatSlot{q * VEC, c - pc.c0, (c + 1) * I - e} : FlatSlot{-1, 0, VEC};
    }
    f(sl);
  }
  const i64 lo_end = min(p0 * VEC, pc.end), hi_start = max(p1 * VEC, lo_end);
  if (threadIdx.x == kBnBlock - 1) {  // a thread with few whole packs
    for (i64 at = pc.start; at < lo_end; ++at) g(at, int(at - pc.image) / I - pc.c0);
    for (i64 at = hi_start; at < pc.end; ++at) g(at, int(at - pc.image) / I - pc.c0);
  }
}

// The two channels' constants a pack needs (the second only where the pack reaches it).
template <typename C>
__device__ __forceinline__ void pair_of(const C* staged, const FlatSlot& sl, int vec, C& a, C& b) {
  a = staged[sl.j];
  b = sl.cut < vec ? staged[sl.j + 1] : a;
}

// Training (part given): the statistics from the sums pass's partials, as bn_finalize takes
// them, each channel's mean, rstd and running statistics written by the block where it
// starts in the first image (no finalize launch between the two passes). Eval: mean and rstd
// read.
template <typename T, typename W, typename R, int VEC, int ACT>
__global__ void __launch_bounds__(kBnBlock, (flat_min_blocks<T, ACT, false>()))
bn_apply_flat(const T* __restrict__ x, const T* __restrict__ res, T* __restrict__ y, i64 CI, int I, i64 L, int O,
              typename AccOf<T>::type* __restrict__ mean, typename AccOf<T>::type* __restrict__ rstd,
              const W* __restrict__ w, const W* __restrict__ b, int act, typename AccOf<T>::type param,
              const double* __restrict__ part, i64 chunks, double count, double eps, double factor,
              R* __restrict__ running_mean, R* __restrict__ running_var) {
  typedef typename AccOf<T>::type A;
  constexpr int U = unroll_of<T, VEC>();
  __shared__ Channel<A> staged[kFlatChannels];
  const auto tag = act_tag<ACT>(act);
  const FlatPiece pc(CI, I, L, O);
  for (int j = threadIdx.x; j < pc.nch; j += kBnBlock) {
    const i64 c = pc.c0 + j;
    if (part) {
      const ChannelMoments mo = moments_of(serial_chunk_sums(part, chunks, c), double(cvt<A>(x[c * I])), count);
      staged[j] = channel_from(c, A(mo.m), rstd_of<A>(mo, eps), w, b);
      if (pc.starts(c, I)) store_moments(c, mo, count, eps, factor, running_mean, running_var, mean, rstd);
    } else {
      staged[j] = channel_of(c, mean, rstd, w, b);
    }
  }
  __syncthreads();
  walk_flat<U, VEC>(pc, I, [&](const FlatSlot (&sl)[U]) {
    Pack<T, VEC> v[U], r[U];
    load_x_res<U, VEC>(x, res, 0, sl, v, r);
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (sl[u].any()) {
        A xv[VEC], rv[VEC], out[VEC];
        unpack(v[u], xv);
        unpack_or_zero(res, r[u], rv);
        Channel<A> c1, c2;
        pair_of(staged, sl[u], VEC, c1, c2);
#pragma unroll
        for (int k = 0; k < VEC; ++k) out[k] = act_forward(tag(), (k < sl[u].cut ? c1 : c2).z(xv[k], rv[k]), param);
        store_pack<T>(y + sl[u].off, out);
      }
  }, [&](i64 at, int j) {
    const A r = res ? cvt<A>(res[at]) : A(0);
    y[at] = cvt<T>(act_forward(tag(), staged[j].z(cvt<A>(x[at]), r), param));
  });
}

// Both channel structs a backward element needs, staged together.
template <typename A>
struct ChannelBoth {
  Channel<A> ch;
  ChannelGrad<A> cg;
};

// The backward-sums pass's partials give each channel's two means here (bn_bwd_finalize's
// arithmetic, no launch between the passes); dweight / dbias are written by the block where
// the channel starts in the first image. Without part, bn_bwd_finalize's coef.
template <typename T, typename W, int VEC, int ACT>
__global__ void __launch_bounds__(kBnBlock, (flat_min_blocks<T, ACT, true>()))
bn_bwd_apply_flat(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ res, T* __restrict__ dx,
                  T* __restrict__ dres, i64 CI, int I, i64 L, int O, const typename AccOf<T>::type* __restrict__ mean,
                  const typename AccOf<T>::type* __restrict__ rstd, const W* __restrict__ w, const W* __restrict__ b,
                  int act, typename AccOf<T>::type param, const typename AccOf<T>::type* __restrict__ part,
                  i64 chunks, double count, int training, W* __restrict__ dw, W* __restrict__ db,
                  const typename AccOf<T>::type* __restrict__ coef) {
  typedef typename AccOf<T>::type A;
  constexpr int U = unroll_of<T, VEC>();
  __shared__ ChannelBoth<A> staged[kFlatChannels];
  const auto tag = act_tag<ACT>(act);
  const bool with_res = ACT != 0 && res;
  const FlatPiece pc(CI, I, L, O);
  for (int j = threadIdx.x; j < pc.nch; j += kBnBlock) {
    const i64 c = pc.c0 + j;
    if (part) {
      const ChunkSums cs = serial_chunk_sums(part, chunks, c);
      const ChannelGrad<A> cg =
          channel_grad_from(c, rstd, w, grad_mean<A>(cs.s, count, training), grad_mean<A>(cs.q, count, training));
      staged[j] = ChannelBoth<A>{channel_of(c, mean, rstd, w, b), cg};
      if (pc.starts(c, I)) store_param_grads(c, cs, dw, db);
    } else {  // bn_bwd_finalize ran (and wrote dweight / dbias)
      staged[j] = ChannelBoth<A>{channel_of(c, mean, rstd, w, b), channel_grad_of(c, rstd, w, coef)};
    }
  }
  __syncthreads();
  walk_flat<U, VEC>(pc, I, [&](const FlatSlot (&sl)[U]) {
    Pack<T, VEC> v[U], g[U], r[U];
    load_x_dy_res<U, VEC>(x, dy, res, with_res, 0, sl, v, g, r);
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (sl[u].any()) {
        A xv[VEC], gv[VEC], rv[VEC], dz[VEC], out[VEC];
        unpack(v[u], xv);
        unpack(g[u], gv);
        unpack_or_zero(with_res, r[u], rv);
        ChannelBoth<A> c1, c2;
        pair_of(staged, sl[u], VEC, c1, c2);
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          // spelled out: through element_dz NVRTC 13.0 spills the generic activation's
          // selected channel to local memory (sm_90: 48 more local loads in the kernel)
          const ChannelBoth<A>& c = k < sl[u].cut ? c1 : c2;
          dz[k] = ACT == 0 ? gv[k] : gv[k] * act_derivative(tag(), c.ch.z(xv[k], rv[k]), param);
          out[k] = c.cg.dx(dz[k], xv[k] - c.ch.mean);
        }
        store_pack<T>(dx + sl[u].off, out);
        if (dres) store_pack<T>(dres + sl[u].off, dz);
      }
  }, [&](i64 at, int j) {
    const ChannelBoth<A>& c = staged[j];
    const A xv = cvt<A>(x[at]), gv = cvt<A>(dy[at]), rv = with_res ? cvt<A>(res[at]) : A(0);
    const A dz = element_dz<ACT>(tag, c.ch, xv, gv, rv, param);
    dx[at] = cvt<T>(c.cg.dx(dz, xv - c.ch.mean));
    if (dres) dres[at] = cvt<T>(dz);
  });
}

// ---- one-read training forward: channels staged in shared memory (NOTES "BatchNorm v14c")
// Dense channel-major x (image stride so, channel stride I) with short channels. A block
// takes one stage of G consecutive channels (the host picks the widest copies CP, of 16, 8
// or 4 bytes, dividing so * sizeof(T) and the pointers' offsets whose stage fits, G the
// fewest channels whose span of an image is whole copies): it copies the stage's span of every image into shared memory with
// cp.async, a group of BLOCK / 32 / G warps a channel takes the channel's statistics from
// there in one pass (shifted by the channel's first element), writes y over x, and the block
// copies y out in CP-byte stores. x is read once, where the passes read it twice. Several
// blocks an SM (their shared memory permitting) overlap one's copies with another's
// arithmetic; a stage's fixed work is kept to a few dozen instructions a thread (v14b, one
// persistent block an SM, spent ~1,100 a stage of ~12 elements a thread).
// Blocks of 256 threads where four stages fit an SM's shared memory, 512 where fewer do:
// enough threads resident either way (NOTES "BatchNorm v14c"; both at 56-60 registers, no
// spills, for CUNORM_BN_STAGED_THREADS_PER_SM threads an SM). G <= BLOCK / 32 warps.
#ifndef CUNORM_BN_STAGED_THREADS_PER_SM
#define CUNORM_BN_STAGED_THREADS_PER_SM 1024  // 1536: 40 registers, 84-232 bytes spilled
#endif

// A staged word of VEC elements by value: one shared-memory load of the word's width. v22:
// unpacking through a reference into shared memory compiled to 4-byte loads (SASS, NVRTC
// 13.0 sm_90: bn_fwd_staged's bf16 8-byte words two LDS each, 29 LDS and one LDS.64 in all,
// 17 and 7 by value; float32 16-byte words four LDS, 92 LDS and one LDS.128, 68 and 7 by
// value). CUNORM_BN_STAGED_WORD_LOADS=0: the reference, as before (sweep_bn_variants.py
// staged_narrow_loads).
#ifndef CUNORM_BN_STAGED_WORD_LOADS
#define CUNORM_BN_STAGED_WORD_LOADS 1
#endif
template <typename T, int VEC>
__device__ __forceinline__ Pack<T, VEC> staged_word(const void* p) {
#if CUNORM_BN_STAGED_WORD_LOADS
  return load_raw<VEC>(reinterpret_cast<const T*>(p));
#else
  return *reinterpret_cast<const Pack<T, VEC>*>(p);
#endif
}

// Every (image, word) of one channel's staged runs, EPW elements a word, lanes over them
// flattened (a lane's next word is ``lanes`` further on, across runs), its shared-memory
// element offset kept without a division a word: f(offset, image, word in the run).
template <typename F>
__device__ __forceinline__ void walk_staged(int lane, int lanes, int O, int I, int EPW, int GI, int gI, F&& f) {
  const int IW = I / EPW;
  const int o_step = lanes / IW, iw_step = lanes - o_step * IW;
  int o = lane / IW, iw = lane - o * IW;
  int off = o * GI + gI + iw * EPW;
  const int d_off = o_step * GI + iw_step * EPW, d_wrap = GI - I, end = O * GI;
  while (off < end) {  // gI + iw * EPW < GI, so off < end exactly while o < O
    f(off, o, iw);
    off += d_off;
    o += o_step;
    iw += iw_step;
    if (iw >= IW) {
      iw -= IW;
      off += d_wrap;
      ++o;
    }
  }
}

// Each (image, chunk) of a stage's spans, ``per`` chunks an image, the block's threads over
// them flattened, without a division a chunk: f(image, chunk).
template <int BLOCK, typename F>
__device__ __forceinline__ void walk_chunks(int O, int per, F&& f) {
  const int o_step = BLOCK / per, k_step = BLOCK - o_step * per;
  int o = threadIdx.x / per, k = threadIdx.x - o * per;
  while (o < O) {
    f(o, k);
    o += o_step;
    k += k_step;
    if (k >= per) {
      k -= per;
      ++o;
    }
  }
}

// Two sums over a group of ``wpc`` consecutive warps (runtime: G is the host's): each warp
// of the group adds the group's warp sums with the same shuffle tree, so every thread of the
// group ends with the same bits. All threads of the block call it together.
template <int WARPS, typename A>
__device__ __forceinline__ void staged_group_sum2(A& a, A& b, A* red, int wpc) {
  a = group_warp_sum<kWarp>(a);
  b = group_warp_sum<kWarp>(b);
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, first = warp / wpc * wpc;
  if (lane == 0) {
    red[warp] = a;
    red[WARPS + warp] = b;
  }
  __syncthreads();
  a = lane < wpc ? red[first + lane] : A(0);
  b = lane < wpc ? red[WARPS + first + lane] : A(0);
  a = group_warp_sum<kWarp>(a);
  b = group_warp_sum<kWarp>(b);
}

template <int CP>
__device__ __forceinline__ void store_chunk(unsigned char* dst, const unsigned char* src) {
  if constexpr (CP == 16) store16_global(dst, *reinterpret_cast<const uint4*>(src));
  else if constexpr (CP == 8) *reinterpret_cast<uint2*>(dst) = *reinterpret_cast<const uint2*>(src);
  else *reinterpret_cast<unsigned*>(dst) = *reinterpret_cast<const unsigned*>(src);
}

// A stage's span of every image: ``span`` bytes at src + o * so (bytes), staged at dst + o *
// pitch, copied in CP-byte pieces (the last of a span zero-filled past its end: nothing past
// it is read). Committed by the caller.
template <int BLOCK, int CP>
__device__ __forceinline__ void stage_in(unsigned char* dst, const unsigned char* src, i64 so, int O, int span,
                                         int pitch) {
  const int per = (span + CP - 1) / CP;
  walk_chunks<BLOCK>(O, per, [&](int o, int k) {
    copy_async_part<CP>(dst + o * pitch + k * CP, src + o * so + k * CP, min(CP, span - k * CP));
  });
}

// The reverse: the staged spans stored to dst + o * so, the last piece of a span element by
// element (E-byte elements).
template <int BLOCK, int CP, int E>
__device__ __forceinline__ void stage_out(unsigned char* dst, const unsigned char* src, i64 so, int O, int span,
                                          int pitch) {
  const int per = (span + CP - 1) / CP;
  walk_chunks<BLOCK>(O, per, [&](int o, int k) {
    unsigned char* d = dst + o * so + k * CP;
    const unsigned char* from = src + o * pitch + k * CP;
    const int bytes = min(CP, span - k * CP);
    if (bytes == CP) {
      store_chunk<CP>(d, from);
    } else {
      for (int e = 0; e < bytes; e += E) {
        if constexpr (E == 8) *reinterpret_cast<uint2*>(d + e) = *reinterpret_cast<const uint2*>(from + e);
        else if constexpr (E == 4) *reinterpret_cast<unsigned*>(d + e) = *reinterpret_cast<const unsigned*>(from + e);
        else *reinterpret_cast<unsigned short*>(d + e) = *reinterpret_cast<const unsigned short*>(from + e);
      }
    }
  });
}

// A channel's mean and rstd as the apply uses them: float arithmetic for float x (double for
// double), about the pivot.
template <typename A>
struct StagedMoments {
  A mean, rstd;
  __device__ __forceinline__ StagedMoments(A s, A q, A pivot, A n, double eps) {
    const A shift = s / n;
    const A var = q / n - shift * shift;
    mean = pivot + shift;
    rstd = rsqrt_acc(var > A(0) ? var + A(eps) : A(eps));
  }
};

// A stage's channel (mean, scale, shift) from its pivot-shifted sums; the writer stores mean
// and rstd as y uses them and the running statistics from the same sums in double.
template <typename A, typename R>
__device__ __forceinline__ Channel<A> staged_channel(i64 c, A s, A q, A pivot, double n, double eps, double factor,
                                                     bool writer, A rm, A rv, R* running_mean, R* running_var,
                                                     A* mean, A* rstd, A wc, A bc) {
  const StagedMoments<A> mo(s, q, pivot, A(n), eps);
  if (writer) {
    mean[c] = mo.mean;
    rstd[c] = mo.rstd;
    update_running(c, moments_of(ChunkSums{double(s), double(q)}, double(pivot), n), n, factor, rm, rv,
                   running_mean, running_var);
  }
  return Channel<A>{mo.mean, mo.rstd * wc, bc};
}

// The block's share of a stage (v17): the whole stage unclustered; split over the K blocks
// of a thread-block cluster, OB images a block from rank r's first (the last blocks fewer or
// none).
template <bool CLUSTER>
struct StagedShare {
  int stage, rank, o0, O;
  __device__ __forceinline__ StagedShare(int K, int OB, int O_total) {
    if (CLUSTER) {
      stage = blockIdx.x / K;
      rank = blockIdx.x - stage * K;
      o0 = rank * OB;
      O = max(0, min(OB, O_total - o0));
    } else {
      stage = blockIdx.x;
      rank = o0 = 0;
      O = O_total;
    }
  }
  // The share of a given stage (a persistent grid's blocks walk several; BatchNorm v24). Not
  // the constructor above with the stage passed in: delegating to this one took the NCHW
  // staged kernels 2-4 registers up (NVRTC 13.0 sm_90).
  __device__ __forceinline__ StagedShare(int K, int OB, int O_total, int given_stage) {
    stage = given_stage;
    if (CLUSTER) {
      rank = blockIdx.x % K;
      o0 = rank * OB;
      O = max(0, min(OB, O_total - o0));
    } else {
      rank = o0 = 0;
      O = O_total;
    }
  }
};

// The group sums (a, b of channel group g) added over the K blocks of the cluster in rank
// order, so every block ends with the same bits (sm_90). ``xpart`` (2 kMaxStagedGroups
// words of this block's shared memory) is read by the others until staged_cluster_end's
// barrier. All threads call it.
constexpr int kMaxStagedGroups = 16;

template <typename A>
__device__ __forceinline__ void staged_cluster_sum2(A& a, A& b, A* xpart, int g, int lane, int K) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && !defined(CUNORM_HIP)
  if (lane == 0) {
    xpart[2 * g] = a;
    xpart[2 * g + 1] = b;
    cluster_fence();
  }
  cluster_barrier();
  A ta = A(0), tb = A(0);
  for (int r = 0; r < K; ++r) {
    ta += load_cluster(xpart + 2 * g, unsigned(r));
    tb += load_cluster(xpart + 2 * g + 1, unsigned(r));
  }
  a = ta;
  b = tb;
#endif
}

// No block of a cluster leaves while another may still read its partial sums.
__device__ __forceinline__ void staged_cluster_end() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && !defined(CUNORM_HIP)
  cluster_barrier();
#endif
}

// v53: whether the stage's statistics go again about each channel's pivot + shift, the
// pivot (the channel's first element) lying far from the mean of one of the stage's
// channels (common.cuh pivot_far; `far` this thread's channel's answer, false where it has
// none): the float sums of x - pivot lose about eps * R * k of var (R = shift^2 / var, at
// most the channel's count), which read y up to 520x float32's tolerance (NOTES "BatchNorm's
// pivots"); about pivot + shift they keep it. The data are on chip, so only such a stage
// pays (a second walk and exchange): every block of a stage holds the same bits of its
// sums, so all take the same branch. All threads call it (a block barrier; none where
// CUNORM_REPIVOT is 0: the kernels as before v53, for sweeps).
__device__ __forceinline__ bool stage_far(bool far) { return CUNORM_REPIVOT && __syncthreads_or(far) != 0; }
// A stage's sums s, q of d = x - pivot over its n elements, shift = s / n: pivot_far about the
// mean (the variance about it, q / n - shift^2, is what the test weighs the shift against).
template <typename A>
__device__ __forceinline__ bool sums_far(A shift, A q, A n) {
  return pivot_far(shift, q / n - shift * shift);
}

// v54: stage_far asked at a block barrier the kernel takes anyway (the one that publishes its
// channels' constants): a barrier either way, no extra one where no channel is far.
#ifndef CUNORM_BN_FOLDED_VOTE
#define CUNORM_BN_FOLDED_VOTE 1
#endif
__device__ __forceinline__ bool barrier_far(bool far) {
  if (CUNORM_REPIVOT) return __syncthreads_or(far) != 0;
  __syncthreads();
  return false;
}

// CLUSTER (v17): a stage too large for one block's shared memory (56 x
// 56 planes) splits its images over the K blocks of a cluster; each block sums its images
// about the channel's first element read from global memory (the pivot every block shares)
// and the partial sums are added through distributed shared memory. Unclustered, the code
// is the one-block stage of v14c as it was (its own kernel: v16 put both in one and cost the
// 14 x 14 planes 0.1 of copy).
template <int BLOCK, int CP, typename T, typename W, typename R, int EPW, int ACT, bool CLUSTER>
__device__ __forceinline__ void staged_forward(const T* __restrict__ x, const T* __restrict__ res, T* __restrict__ y,
                                               i64 so, int I, int O_total, int C, int G, int K, int OB,
                                               const W* __restrict__ w, const W* __restrict__ b, int act,
                                               typename AccOf<T>::type param, double eps, double factor,
                                               R* __restrict__ running_mean, R* __restrict__ running_var,
                                               typename AccOf<T>::type* __restrict__ mean,
                                               typename AccOf<T>::type* __restrict__ rstd, unsigned char* staged,
                                               typename AccOf<T>::type* red, typename AccOf<T>::type* xpart) {
  typedef typename AccOf<T>::type A;
  typedef Pack<T, EPW> Word;
  const auto tag = act_tag<ACT>(act);
  const StagedShare<CLUSTER> sh(K, OB, O_total);
  const int O = sh.O, c0 = sh.stage * G, count = min(G, C - c0), GI = G * I;
  const int span = count * I * int(sizeof(T)), pitch = GI * int(sizeof(T));
  const i64 base = i64(c0) * I + i64(sh.o0) * so, so_bytes = so * i64(sizeof(T));
  stage_in<BLOCK, CP>(staged, reinterpret_cast<const unsigned char*>(x + base), so_bytes, O, span, pitch);
  copies_commit();
  constexpr int kWarps = BLOCK / kWarp;
  const int wpc = kWarps / G, lanes = wpc * kWarp;
  const int g = threadIdx.x / lanes, lane = threadIdx.x - g * lanes, gI = g * I;
  const bool active = g < count;
  const bool writer = active && lane == 0 && sh.rank == 0;
  const i64 c = c0 + g;
  // the channel's parameters (clustered: and its first element) load while the copies land
  const A wc = active && w ? cvt<A>(w[c]) : A(1), bc = active && b ? cvt<A>(b[c]) : A(0);
  const A rm = writer && running_mean ? cvt<A>(running_mean[c]) : A(0);
  const A rv = writer && running_var ? cvt<A>(running_var[c]) : A(0);
  A pivot = CLUSTER && active ? cvt<A>(x[c * I]) : A(0);
  copies_wait<0>();
  __syncthreads();
  T* sx = reinterpret_cast<T*>(staged);
  if (!CLUSTER && active) pivot = cvt<A>(sx[gI]);  // the channel's first element
  const double n = double(O_total) * double(I);
  A s, q;
#pragma unroll 1
  for (int pass = 0;; ++pass) {  // (v53: a second pass about pivot + shift where stage_far)
    s = q = A(0);
    if (active)
      walk_staged(lane, lanes, O, I, EPW, GI, gI, [&](int off, int, int) {
        A v[EPW];
        unpack_words(staged_word<T, EPW>(sx + off), v);
#pragma unroll
        for (int e = 0; e < EPW; ++e) {
          const A d = v[e] - pivot;
          s += d;
          q += d * d;
        }
      });
    staged_group_sum2<kWarps>(s, q, red, wpc);
    if (CLUSTER) {
      if (pass == 1) staged_cluster_end();  // every block has read the others' first xpart
      staged_cluster_sum2(s, q, xpart, g, lane, K);
    }
    const A shift = s / A(n);
    if (pass == 1 || !stage_far(active && sums_far(shift, q, A(n)))) break;
    pivot += shift;
  }
  if (active) {
    const Channel<A> ch = staged_channel(c, s, q, pivot, n, eps, factor, writer, rm, rv, running_mean, running_var,
                                         mean, rstd, wc, bc);
    const T* rc = res ? (CLUSTER ? res + base + gI : res + c * I) : nullptr;
    walk_staged(lane, lanes, O, I, EPW, GI, gI, [&](int off, int o, int iw) {
      A v[EPW], r[EPW], out[EPW];
      unpack_words(staged_word<T, EPW>(sx + off), v);
      if (rc) {
        unpack(*reinterpret_cast<const Word*>(rc + o * so + iw * EPW), r);
      } else {
#pragma unroll
        for (int e = 0; e < EPW; ++e) r[e] = A(0);
      }
#pragma unroll
      for (int e = 0; e < EPW; ++e) out[e] = act_forward(tag(), ch.z(v[e], r[e]), param);
      *reinterpret_cast<Word*>(sx + off) = convert_pack<T>(out);
    });
  }
  __syncthreads();
  stage_out<BLOCK, CP, sizeof(T)>(reinterpret_cast<unsigned char*>(y + base), staged, so_bytes, O, span, pitch);
  if (CLUSTER) staged_cluster_end();
}

// CLUSTER: the stage split over clusters of K blocks (sm_90; launched with the cluster
// dimension at run time, so one build serves K = 2, 4, 8), OB images a block; else K = 1,
// OB = O. Each copy width CP (``cp``: 16, 8 or 4 bytes) its own compiled body.
template <int BLOCK, typename T, typename W, typename R, int EPW, int ACT, bool CLUSTER>
__global__ void __launch_bounds__(BLOCK, CUNORM_BN_STAGED_THREADS_PER_SM / BLOCK)
bn_fwd_staged(const T* __restrict__ x, const T* __restrict__ res, T* __restrict__ y, i64 so, int I, int O, int C,
              int G, int cp, int K, int OB, const W* __restrict__ w, const W* __restrict__ b, int act,
              typename AccOf<T>::type param, double eps, double factor, R* __restrict__ running_mean,
              R* __restrict__ running_var, typename AccOf<T>::type* __restrict__ mean,
              typename AccOf<T>::type* __restrict__ rstd) {
  typedef typename AccOf<T>::type A;
  extern __shared__ __align__(16) unsigned char staged_spans[];
  __shared__ A red[2 * BLOCK / kWarp];
  __shared__ A xpart[CLUSTER ? 2 * kMaxStagedGroups : 1];
  if (cp == 16)
    staged_forward<BLOCK, 16, T, W, R, EPW, ACT, CLUSTER>(x, res, y, so, I, O, C, G, K, OB, w, b, act, param, eps,
                                                          factor, running_mean, running_var, mean, rstd, staged_spans,
                                                          red, xpart);
  else if (cp == 8)
    staged_forward<BLOCK, 8, T, W, R, EPW, ACT, CLUSTER>(x, res, y, so, I, O, C, G, K, OB, w, b, act, param, eps,
                                                         factor, running_mean, running_var, mean, rstd, staged_spans,
                                                         red, xpart);
  else
    staged_forward<BLOCK, 4, T, W, R, EPW, ACT, CLUSTER>(x, res, y, so, I, O, C, G, K, OB, w, b, act, param, eps,
                                                         factor, running_mean, running_var, mean, rstd, staged_spans,
                                                         red, xpart);
}

// ---- one-read backward: x and dy staged in shared memory (NOTES "BatchNorm v15")
// v31: with an activation, the staged backwards' first walk writes dz (rounded to T, as dres
// is) over the staged dy and stores dres there, so the second walk reads dz from the stage:
// the residual is read from global memory once, where both walks read it to recompute z
// (bn_bwd_staged_cl has done so since v21). Exact for ReLU (dz is dy or 0) and for float32 /
// float64; half precision's smooth activations take dz rounded to T in dx's first term.
// 0: v30's walks.
#ifndef CUNORM_BN_STAGED_DZ_BACK
#define CUNORM_BN_STAGED_DZ_BACK 1
#endif
// The layout and stages of bn_fwd_staged, with dy's spans staged after x's (2 O G I elements
// a block). A group of warps a channel sums dz and dz (x - mean) over its staged elements
// (dz = dy act'(z), z recomputed from x and the residual, read from global memory where an
// activation needs it), writes dweight / dbias itself (the block holds the whole channel: no
// partials, no finalize), then dx over x in shared memory (and dres = dz to global memory),
// which the block stores in CP-byte pieces. One launch reading x and dy once, where the
// passes take three and read both twice.
template <int BLOCK, int CP, typename T, typename W, int EPW, int ACT>
__device__ __forceinline__ void staged_backward(const T* __restrict__ dy, const T* __restrict__ x,
                                                const T* __restrict__ res, T* __restrict__ dx, T* __restrict__ dres,
                                                i64 so, int I, int O, int C, int G,
                                                const typename AccOf<T>::type* __restrict__ mean,
                                                const typename AccOf<T>::type* __restrict__ rstd,
                                                const W* __restrict__ w, const W* __restrict__ b, int act,
                                                typename AccOf<T>::type param, int training, W* __restrict__ dw,
                                                W* __restrict__ db, unsigned char* staged,
                                                typename AccOf<T>::type* red) {
  typedef typename AccOf<T>::type A;
  typedef Pack<T, EPW> Word;
  const auto tag = act_tag<ACT>(act);
  const int c0 = blockIdx.x * G, count = min(G, C - c0), GI = G * I;
  const int span = count * I * int(sizeof(T)), pitch = GI * int(sizeof(T)), half = O * pitch;
  const i64 c0I = i64(c0) * I, so_bytes = so * i64(sizeof(T));
  stage_in<BLOCK, CP>(staged, reinterpret_cast<const unsigned char*>(x + c0I), so_bytes, O, span, pitch);
  stage_in<BLOCK, CP>(staged + half, reinterpret_cast<const unsigned char*>(dy + c0I), so_bytes, O, span, pitch);
  copies_commit();
  constexpr int kWarps = BLOCK / kWarp;
  const int wpc = kWarps / G, lanes = wpc * kWarp;
  const int g = threadIdx.x / lanes, lane = threadIdx.x - g * lanes, gI = g * I;
  const bool active = g < count;
  const i64 c = c0 + g;
  // the channel's constants load while the copies land
  const Channel<A> ch = active ? channel_of(c, mean, rstd, w, b) : Channel<A>{A(0), A(0), A(0)};
  const A rs = active ? rstd[c] : A(0), wc = active && w ? cvt<A>(w[c]) : A(1);
  copies_wait<0>();
  __syncthreads();
  constexpr bool kDzBack = ACT != 0 && CUNORM_BN_STAGED_DZ_BACK;
  T* sx = reinterpret_cast<T*>(staged);
  T* sg = reinterpret_cast<T*>(staged + half);
  const T* rc = ACT != 0 && res ? res + c * I : nullptr;
  T* const drc_first = kDzBack && dres ? dres + c * I : nullptr;  // dres from the first walk (v31)
  const auto dz_at = [&](int off, int o, int iw, A (&xv)[EPW], A (&dz)[EPW]) {
    A gv[EPW], rv[EPW];
    unpack_words(staged_word<T, EPW>(sx + off), xv);
    unpack_words(staged_word<T, EPW>(sg + off), gv);
    if (rc) {
      unpack(*reinterpret_cast<const Word*>(rc + o * so + iw * EPW), rv);
    } else {
#pragma unroll
      for (int e = 0; e < EPW; ++e) rv[e] = A(0);
    }
#pragma unroll
    for (int e = 0; e < EPW; ++e) dz[e] = element_dz<ACT>(tag, ch, xv[e], gv[e], rv[e], param);
  };
  A s1 = A(0), s2 = A(0);
  if (active)
    walk_staged(lane, lanes, O, I, EPW, GI, gI, [&](int off, int o, int iw) {
      A xv[EPW], dz[EPW];
      dz_at(off, o, iw, xv, dz);
#pragma unroll
      for (int e = 0; e < EPW; ++e) {
        s1 += dz[e];
        s2 += dz[e] * (xv[e] - ch.mean);
      }
      if (kDzBack) {  // this thread's word again in the second walk: no other thread reads it
        *reinterpret_cast<Word*>(sg + off) = convert_pack<T>(dz);
        if (drc_first) *reinterpret_cast<Word*>(drc_first + o * so + iw * EPW) = convert_pack<T>(dz);
      }
    });
  staged_group_sum2<kWarps>(s1, s2, red, wpc);
  if (active) {
    const A sq = s2 * rs;  // sum dz * xhat
    const double n = double(O) * double(I);
    if (lane == 0) store_param_grads(c, ChunkSums{double(s1), double(sq)}, dw, db);
    const A a = rs * wc, m2 = grad_mean<A>(double(sq), n, training);
    const ChannelGrad<A> cg{a, grad_mean<A>(double(s1), n, training), a * rs * m2};
    T* drc = !kDzBack && dres ? dres + c * I : nullptr;
    walk_staged(lane, lanes, O, I, EPW, GI, gI, [&](int off, int o, int iw) {
      A xv[EPW], dz[EPW], out[EPW];
      if (kDzBack) {
        unpack_words(staged_word<T, EPW>(sx + off), xv);
        unpack_words(staged_word<T, EPW>(sg + off), dz);
      } else {
        dz_at(off, o, iw, xv, dz);
        if (drc) *reinterpret_cast<Word*>(drc + o * so + iw * EPW) = convert_pack<T>(dz);
      }
#pragma unroll
      for (int e = 0; e < EPW; ++e) out[e] = cg.dx(dz[e], xv[e] - ch.mean);
      *reinterpret_cast<Word*>(sx + off) = convert_pack<T>(out);
    });
  }
  __syncthreads();
  stage_out<BLOCK, CP, sizeof(T)>(reinterpret_cast<unsigned char*>(dx + c0I), staged, so_bytes, O, span, pitch);
}

template <int BLOCK, typename T, typename W, int EPW, int ACT>
__global__ void __launch_bounds__(BLOCK, CUNORM_BN_STAGED_THREADS_PER_SM / BLOCK)
bn_bwd_staged(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ res, T* __restrict__ dx,
              T* __restrict__ dres, i64 so, int I, int O, int C, int G, int cp,
              const typename AccOf<T>::type* __restrict__ mean, const typename AccOf<T>::type* __restrict__ rstd,
              const W* __restrict__ w, const W* __restrict__ b, int act, typename AccOf<T>::type param, int training,
              W* __restrict__ dw, W* __restrict__ db) {
  typedef typename AccOf<T>::type A;
  extern __shared__ __align__(16) unsigned char staged_spans[];
  __shared__ A red[2 * BLOCK / kWarp];
  if (cp == 16)
    staged_backward<BLOCK, 16, T, W, EPW, ACT>(dy, x, res, dx, dres, so, I, O, C, G, mean, rstd, w, b, act, param,
                                               training, dw, db, staged_spans, red);
  else if (cp == 8)
    staged_backward<BLOCK, 8, T, W, EPW, ACT>(dy, x, res, dx, dres, so, I, O, C, G, mean, rstd, w, b, act, param,
                                              training, dw, db, staged_spans, red);
  else
    staged_backward<BLOCK, 4, T, W, EPW, ACT>(dy, x, res, dx, dres, so, I, O, C, G, mean, rstd, w, b, act, param,
                                              training, dw, db, staged_spans, red);
}

// ---- one-read forward and backward of short planes, in span words (NOTES "BatchNorm v25") -
// bn_fwd_staged's stages (G channels of every image in shared memory, the images split over
// a thread-block cluster where a stage exceeds a block's share) for planes whose runs are no
// whole number of 8-byte words (7 x 7: 49 elements), where bn_fwd_staged's walk of one
// element a word lost to the passes (NOTES "BatchNorm v14c": bf16 0.33, float32 0.49 of copy
// against 0.41 / 0.50). Here the threads walk the staged spans in 16-byte words, as
// bn_stats_flat walks x: each thread takes one word of an image's span (NW words, the same
// in every image) in images row, row + rows, ... (rows = BLOCK / NW rows of threads); a word
// lies in at most two channels (I >= VEC): its first, lo, and from element ``cut`` on lo + 1.
// A thread's two channels' partial sums go through shared memory, where a warp a channel adds
// its words' in order (deterministic), then the cluster its blocks' in rank order (every
// block ends with the same bits); the outputs are made word by word with each element's
// channel's constants and stored straight to global memory or written over the staged x and
// copied out as bn_fwd_staged stores them (v26, CUNORM_BN_SPAN_FWD_DIRECT). G is the
// fewest channels whose span is whole 16-byte copies (bf16 7 x 7: 8 channels, 49 words).
// Word classes: a span's words that lie in one channel (42 of bf16 7 x 7's 49) go to the
// block's first threads, those across a channel boundary (7) after them, so all but one warp
// take one kind of word and the one-channel words skip the per-element channel choice (a
// pivot or constants select, both pairs of sums predicated). SASS (NVRTC 13.0, sm_90), bf16,
// a one-channel word's loop body in words in order -> with the classes: the forward's
// statistics 69 -> 39 instructions, y 175 -> 66; the backward's sums 80 -> 50, dx 220 -> 79.
// Without them thread t takes word t % NW, row t / NW, every warp both kinds of word. H200
// (NOTES "BatchNorm v25 outcome", results/sweep-bn-v25-h200.txt): the block still waits at
// its barriers for the boundary words' warps, whose work the classes do not shorten, so
// fewer instructions gained only the bf16 forward at full-GPU grids ((256, 2048, 7, 7) 0.441
// -> 0.492 of copy, (256, 256, 9, 9) 0.239 -> 0.273); grids under one wave lost 0.02, the
// float32 forward 0.03-0.06, every backward 0.01-0.11. Once y went straight out (v26) and
// the apply lost the residual's loads (v27), the classes lost the bf16 forward too: H100
// (NOTES "BatchNorm v27 outcome", results/sweep-bn-v27-h100.txt), words in order with direct
// stores against the classes 0.731 / 0.656 of copy at (256, 2048, 7, 7), 0.526 / 0.434 at
// (64, 1024, 7, 7), 0.487 / 0.433 at 9 x 9, 0.355 / 0.284 at 11 x 11; float32 level.
// CUNORM_BN_SPAN_CLASSES_FWD: 0 never (the default), 1 half precision, 2 every dtype;
// CUNORM_BN_SPAN_CLASSES_BWD: 0 (the default) or 1.
#ifndef CUNORM_BN_SPAN_CLASSES_FWD
#define CUNORM_BN_SPAN_CLASSES_FWD 0
#endif
#ifndef CUNORM_BN_SPAN_CLASSES_BWD
#define CUNORM_BN_SPAN_CLASSES_BWD 0
#endif

template <typename T, bool CLASSES>
struct SpanWord {
  static constexpr int VEC = 16 / int(sizeof(T));
  int row, rows, slot, e0, lo, hi, cut, valid;
  bool live;
  // this thread's word of a stage of ``count`` channels of I elements (G * I / VEC words a
  // span, at most ``threads``: the host's plan); ``slot``, row * words + word, where its
  // partial sums go (-1 for threads past the rows)
  __device__ __forceinline__ SpanWord(int G, int I, int count, int threads) {
    const int words = G * I / VEC;
    rows = threads / words;
    int t = threadIdx.x, j;
    if (CLASSES) {
      int across = 0;  // words with a channel boundary inside: g I / VEC, where g I is off the words
      for (int g = 1; g < G; ++g) across += (g * I) % VEC != 0;
      const int within = words - across;
      if (t < within * rows) {  // the k-th word in one channel: k, stepped past the boundary words up to it
        row = t / within;
        j = t - row * within;
        for (int g = 1; g < G; ++g) j += (g * I) % VEC != 0 && (g * I) / VEC <= j;
      } else {  // the k-th boundary word
        t -= within * rows;
        row = across ? t / across : rows;
        int k = across ? t - row * across : 0;
        j = 0;
        for (int g = 1; g < G; ++g)
          if ((g * I) % VEC != 0 && k-- == 0) j = (g * I) / VEC;
      }
    } else {
      row = t / words;
      j = t - row * words;
    }
    slot = row < rows ? row * words + j : -1;
    e0 = j * VEC;
    lo = e0 / I;
    hi = min(lo + 1, kMaxStagedGroups - 1);  // a word ending on its channel's end has no second (cut = VEC)
    cut = min((lo + 1) * I - e0, VEC);
    valid = min(VEC, count * I - e0);  // elements of the span (the last stage's span may end inside)
    live = row < rows && lo < count;
  }
};

// f(o, cut, valid) for each image o of this thread's word from o (its next: row, row + rows,
// ...; left at the next one for a later call) up to ``end``: cut, where the word's second
// channel starts, and valid, its elements inside the span; both a constant VEC for a word in
// one channel where the classes keep such words together (the element loops then fold their
// channel choice away; such a word lies in the span, whose last stage ends on a channel's
// end).
template <typename T, bool CLASSES, typename F>
__device__ __forceinline__ void span_images_upto(const SpanWord<T, CLASSES>& sw, int& o, int end, F&& f) {
  constexpr int VEC = SpanWord<T, CLASSES>::VEC;
  if (CLASSES && sw.cut == VEC) {
    for (; o < end; o += sw.rows) f(o, VEC, VEC);
  } else {
    for (; o < end; o += sw.rows) f(o, per_trip(sw.cut, o), sw.valid);
  }
}

// span_images_upto over all of the thread's images (< O).
template <typename T, bool CLASSES, typename F>
__device__ __forceinline__ void span_images(const SpanWord<T, CLASSES>& sw, int O, F&& f) {
  int o = sw.row;
  span_images_upto(sw, o, O, f);
}

// A span walk's image o (of O M: each image's one-channel plane in M pieces of IW elements)
// in global memory from the stage's first element: image o / M's, plus piece o % M's (o IW -
// (o / M) I: no branch, one division); with M = 1 plainly o so (no division).
struct SpanWalkAt {
  i64 so, past;
  int IW, M;
  __device__ __forceinline__ SpanWalkAt(i64 so_, int I, int M_) : so(so_), past(so_ - I), IW(I / M_), M(M_) {}
  __device__ __forceinline__ i64 operator()(int o) const { return M == 1 ? o * so : i64(o / M) * past + i64(o) * IW; }
};

// The shared memory of a span kernel beside its stage: each thread's word's two pairs of
// partial sums, NCONS constants a channel, and the cluster's exchange.
template <typename A, int BLOCK, int NCONS, bool CLUSTER>
struct SpanScratch {
  A lo_s[BLOCK], lo_q[BLOCK], hi_s[BLOCK], hi_q[BLOCK];
  A cons[NCONS][kMaxStagedGroups];
  A xpart[CLUSTER ? 2 * kMaxStagedGroups : 1];
};

// Channel g's sums from the words' partial sums (``lo``: in a word's first channel; ``hi``:
// in the channel that starts inside it, zero where none does), rows x words of them (slot
// row * words + word), added by one warp: lanes over (word, row) in order, then the warp's
// tree; every lane ends with the same bits. g < the stage's channels.
template <typename A, typename Scratch>
__device__ __forceinline__ void span_channel_sum2(A& s, A& q, const Scratch& sm, int g, int I, int vec, int words,
                                                  int rows, int lane) {
  const int ja = g * I / vec, n = ((g * I + I - 1) / vec - ja + 1) * rows;
  for (int k = lane; k < n; k += kWarp) {
    const int jj = ja + k / rows, t = (k - (k / rows) * rows) * words + jj;
    const bool first = jj * vec >= g * I;  // the word starts in channel g, else in g - 1
    s += first ? sm.lo_s[t] : sm.hi_s[t];
    q += first ? sm.lo_q[t] : sm.hi_q[t];
  }
  s = group_warp_sum<kWarp>(s);
  q = group_warp_sum<kWarp>(q);
}

// The stage's two sums of channel c0 + warp (zeros for warps past the stage's channels):
// this thread's word's partial sums (ls, lq in its first channel; hs, hq in the second)
// through shared memory (at the word's slot: every slot a channel's sum reads has a thread),
// a warp a channel, then over the cluster's blocks. All threads call it.
template <bool CLUSTER, typename A, typename Scratch, typename Span>
__device__ __forceinline__ void span_stage_sum2(A& s, A& q, A ls, A lq, A hs, A hq, Scratch& sm, const Span& sw,
                                                bool owner, int warp, int lane, int GI, int I, int K) {
  if (sw.slot >= 0) {
    sm.lo_s[sw.slot] = ls;
    sm.lo_q[sw.slot] = lq;
    sm.hi_s[sw.slot] = hs;
    sm.hi_q[sw.slot] = hq;
  }
  __syncthreads();
  s = q = A(0);
  if (owner) span_channel_sum2(s, q, sm, warp, I, Span::VEC, GI / Span::VEC, sw.rows, lane);
  if (CLUSTER) staged_cluster_sum2(s, q, sm.xpart, warp, lane, K);
}

// The residual's word at rw + off in global memory, or zeros where there is none (rw null);
// where only its first ``count`` elements lie in the tensor (a span kernel's last stage may
// end inside a word), those alone, the rest zeros. WORDS: widened as widen says.
template <bool WORDS = false, typename A, typename T, int VEC>
__device__ __forceinline__ void residual_word(const T* rw, i64 off, A (&r)[VEC], int count = VEC) {
  if (rw && count == VEC) {
    widen<WORDS>(load_raw<VEC>(rw + off), r);
  } else {
#pragma unroll
    for (int e = 0; e < VEC; ++e) r[e] = rw && e < count ? cvt<A>(rw[off + e]) : A(0);
  }
}

// VEC results of a word of channels from cw, stored to p in global memory: whole, or the
// channels before ``count`` alone (the stage's last word may run past C).
template <typename T, typename A, int VEC>
__device__ __forceinline__ void store_word_part(T* p, const A (&v)[VEC], int cw, int count) {
  if (cw + VEC <= count) {
    store_pack<T>(p, v);
  } else {
#pragma unroll
    for (int e = 0; e < VEC; ++e)
      if (cw + e < count) p[e] = cvt<T>(v[e]);
  }
}

// Channel g's constants from a span kernel's cons rows (mean, scale, shift).
template <typename A>
__device__ __forceinline__ Channel<A> channel_at(const A (*cons)[kMaxStagedGroups], int g) {
  return Channel<A>{cons[0][g], cons[1][g], cons[2][g]};
}

// v26: y stored from the apply straight to global memory (CUNORM_BN_SPAN_FWD_DIRECT: 0
// never, 1 for 4- and 8-byte x, 2 always) where v25 wrote it over the stage and then copied
// the stage out; and a block's share staged in CUNORM_BN_SPAN_FWD_PARTS groups of copies
// (the statistics of one part while the next lands). Measured on an H100 (NOTES "BatchNorm
// v26 outcome"): direct stores +0.04-0.06 of copy for float32 at every shape swept, but
// -0.09 for bf16 at issue 5's (256, 2048, 7, 7) (+0.04 at its grids of one wave); two or
// four parts level for float32, -0.04 for bf16 there. So one part. bf16's loss was the
// word classes' (v27 outcome, above CUNORM_BN_SPAN_CLASSES_FWD): with words in order and
// v27's lean apply, direct stores gained bf16 0.07-0.16 of copy over v26's form, so direct
// for every dtype.
#ifndef CUNORM_BN_SPAN_FWD_PARTS
#define CUNORM_BN_SPAN_FWD_PARTS 1
#endif
#ifndef CUNORM_BN_SPAN_FWD_DIRECT
#define CUNORM_BN_SPAN_FWD_DIRECT 2
#endif
// v27: the apply's word loop built twice, with the residual's loads and without them (a call
// without one paid eight predicated loads and adds a word), and for half precision the
// channel's mean folded into its shift (one FFMA an element; y's rounding to 8 or 11 bits
// hides float32's cancellation, as the channels-last backward's fold of v19). 0: v26's loop.
#ifndef CUNORM_BN_SPAN_FWD_LEAN
#define CUNORM_BN_SPAN_FWD_LEAN 1
#endif
static_assert(CUNORM_BN_SPAN_FWD_PARTS >= 1 && CUNORM_BN_SPAN_FWD_PARTS <= 4, "copies_wait_upto waits on 0-3 groups");

// Launched with bn_fwd_staged's arguments, the copies' bytes (always 16 here) replaced by M:
// as bn_bwd_staged_span's (v33), a one-channel plane walked as M images of I / M elements.
// CUNORM_BN_SPAN_FWD_PIECES 0: M taken as 1 at compile time (v32's code, for sweeps; the host
// must then plan no pieces).
#ifndef CUNORM_BN_SPAN_FWD_PIECES
#define CUNORM_BN_SPAN_FWD_PIECES 1
#endif
template <int BLOCK, typename T, typename W, typename R, int ACT, bool CLUSTER>
__global__ void __launch_bounds__(BLOCK, CUNORM_BN_STAGED_THREADS_PER_SM / BLOCK)
bn_fwd_staged_span(const T* __restrict__ x, const T* __restrict__ res, T* __restrict__ y, i64 so, int I, int O_total,
                   int C, int G, int M_arg, int K, int OB, const W* __restrict__ w,
                   const W* __restrict__ b, int act, typename AccOf<T>::type param, double eps, double factor,
                   R* __restrict__ running_mean, R* __restrict__ running_var,
                   typename AccOf<T>::type* __restrict__ mean, typename AccOf<T>::type* __restrict__ rstd) {
  typedef typename AccOf<T>::type A;
  typedef SpanWord<T, CUNORM_BN_SPAN_CLASSES_FWD == 2 || (CUNORM_BN_SPAN_CLASSES_FWD == 1 && sizeof(T) == 2)> Span;
  constexpr int VEC = Span::VEC, kWarps = BLOCK / kWarp;
  constexpr bool kDirect = CUNORM_BN_SPAN_FWD_DIRECT == 2 || (CUNORM_BN_SPAN_FWD_DIRECT == 1 && sizeof(T) >= 4);
  static_assert(kWarps <= kMaxStagedGroups, "a warp a channel");
  extern __shared__ __align__(16) unsigned char staged[];
  __shared__ SpanScratch<A, BLOCK, 4, CLUSTER> sm;  // cons: a channel's mean, scale, shift, pivot
  A(&pivots)[kMaxStagedGroups] = sm.cons[3];
  const auto tag = act_tag<ACT>(act);
  const StagedShare<CLUSTER> sh(K, OB, O_total);
  const int O = sh.O, c0 = sh.stage * G, count = min(G, C - c0), GI = G * I;
  const int span = count * I * int(sizeof(T)), pitch = GI * int(sizeof(T));
  const i64 base = i64(c0) * I + i64(sh.o0) * so, so_bytes = so * i64(sizeof(T));
  constexpr int kParts = CUNORM_BN_SPAN_FWD_PARTS;
  const auto part_end = [&](int p) { return p == kParts - 1 ? O : (p + 1) * O / kParts; };
#pragma unroll
  for (int p = 0; p < kParts; ++p) {
    const int o0 = p == 0 ? 0 : part_end(p - 1);
    stage_in<BLOCK, 16>(staged + o0 * pitch, reinterpret_cast<const unsigned char*>(x + base) + o0 * so_bytes,
                        so_bytes, part_end(p) - o0, span, pitch);
    copies_commit();
  }
  // warp g owns channel c0 + g: its constants (and the pivot every block of a cluster shares,
  // the channel's first element) load while the copies land
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const bool owner = warp < count, writer = owner && lane == 0 && sh.rank == 0;
  const i64 c = c0 + warp;
  const A wc = owner && w ? cvt<A>(w[c]) : A(1), bc = owner && b ? cvt<A>(b[c]) : A(0);
  const A rm = writer && running_mean ? cvt<A>(running_mean[c]) : A(0);
  const A rv = writer && running_var ? cvt<A>(running_var[c]) : A(0);
  A pivot = owner ? cvt<A>(x[c * I]) : A(0);
  if (lane == 0) pivots[warp] = pivot;  // zeros past the stage's channels: never summed, never stored
  const int M = CUNORM_BN_SPAN_FWD_PIECES ? M_arg : 1;
  const int IW = I / M, GW = G * IW;  // the walk's images: O M of GW elements
  const Span sw(G, IW, count, BLOCK);
  T* sx = reinterpret_cast<T*>(staged) + sw.e0;  // this thread's word in image 0
  A ls = A(0), lq = A(0), hs = A(0), hq = A(0);
  // a word's sums (images from next to end) about its channels' pivots
  const auto sum_words = [&](int& next, int end) {
    const A pl = pivots[sw.lo], ph = pivots[sw.hi];
    span_images_upto(sw, next, end, [&](int o, int cut, int) {
      A v[VEC];
      unpack_words(staged_word<T, VEC>(sx + o * GW), v);
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const A d = v[e] - (e < cut ? pl : ph);
        if (e < cut) { ls += d; lq += d * d; } else { hs += d; hq += d * d; }
      }
    });
  };
  int next = sw.row;  // this thread's next image, part to part
#pragma unroll
  for (int p = 0; p < kParts; ++p) {
    copies_wait_upto(kParts - 1 - p);
    __syncthreads();  // the part's copies (and, the first time, the pivots) seen by the block
    if (sw.live) sum_words(next, part_end(p) * M);
  }
  A s, q;
  span_stage_sum2<CLUSTER>(s, q, ls, lq, hs, hq, sm, sw, owner, warp, lane, GW, IW, K);
  const double n = double(O_total) * double(I);
  // v53: the stage once more about each channel's pivot + shift where stage_far; v54: asked
  // at the barrier that publishes the constants (a far stage's writer then stores its mean,
  // rstd and running statistics twice, the second from the same values read beforehand)
  const auto repivot = [&](A shift) {
    pivot += shift;
    if (lane == 0) pivots[warp] = pivot;
    __syncthreads();
    ls = lq = hs = hq = A(0);
    next = sw.row;
    if (sw.live) sum_words(next, O * M);
    if (CLUSTER) staged_cluster_end();  // every block has read the others' first xpart
    span_stage_sum2<CLUSTER>(s, q, ls, lq, hs, hq, sm, sw, owner, warp, lane, GW, IW, K);
  };
  const auto publish = [&] {  // the channels' constants, for the apply
    if (lane == 0) {
      Channel<A> ch{A(0), A(0), A(0)};
      if (owner)
        ch = staged_channel(c, s, q, pivot, n, eps, factor, writer, rm, rv, running_mean, running_var, mean, rstd, wc,
                            bc);
      sm.cons[0][warp] = ch.mean;
      sm.cons[1][warp] = ch.scale;
      sm.cons[2][warp] = ch.shift;
    }
  };
  const A shift = s / A(n);
  const bool far = owner && sums_far(shift, q, A(n));
  if (!CUNORM_BN_FOLDED_VOTE && stage_far(far)) repivot(shift);  // (v53's vote of its own)
  publish();
  if (CUNORM_BN_FOLDED_VOTE ? barrier_far(far) : (__syncthreads(), false)) {
    repivot(shift);
    publish();
    __syncthreads();
  }
  if (sw.live) {
    Channel<A> cl = channel_at<A>(sm.cons, sw.lo), ch = channel_at<A>(sm.cons, sw.hi);
    if (CUNORM_BN_SPAN_FWD_LEAN && sizeof(T) == 2) {  // z = x scale + (shift - mean scale)
      cl = Channel<A>{A(0), cl.scale, cl.shift - cl.mean * cl.scale};
      ch = Channel<A>{A(0), ch.scale, ch.shift - ch.mean * ch.scale};
    }
    const T* rw = res ? res + base + sw.e0 : nullptr;
    T* yw = y + base + sw.e0;  // 16-byte aligned as the copies' x is (the planner's condition for both)
    const SpanWalkAt at(so, I, M);
    const auto apply = [&](auto with_res) {
      span_images(sw, O * M, [&](int o, int cut, int valid) {
        A v[VEC], r[VEC], out[VEC];
        unpack_words(staged_word<T, VEC>(sx + o * GW), v);
        if constexpr (decltype(with_res)::value) residual_word<true>(rw, at(o), r, valid);
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          const Channel<A>& k = e < cut ? cl : ch;
          const A z = decltype(with_res)::value ? k.z(v[e], r[e]) : k.z(v[e]);
          out[e] = act_forward(tag(), z, param);
        }
        if (kDirect) store_word_part<T>(yw + at(o), out, 0, valid);
        else *reinterpret_cast<Pack<T, VEC>*>(sx + o * GW) = convert_pack<T>(out);
      });
    };
    if (!CUNORM_BN_SPAN_FWD_LEAN || rw) apply(Flag<true>{});
    else apply(Flag<false>{});
  }
  if (!kDirect) {
    __syncthreads();
    stage_out<BLOCK, 16, sizeof(T)>(reinterpret_cast<unsigned char*>(y + base), staged, so_bytes, O, span, pitch);
  }
  if (CLUSTER) staged_cluster_end();
}

// The backward of the same stages: x and dy staged (dy's spans after x's, 2 OB G I elements a
// block), a word's dz = dy act'(z) (z recomputed from x and the residual, read from global
// memory where an activation needs it) summed with dz (x - mean) into its two channels' pairs,
// dweight / dbias written by the cluster's first block, then dx over the staged x (and dres =
// dz to global memory) stored as bn_bwd_staged stores it. One launch reading x and dy once.
// M > 1 (v30; G = 1 alone, I a multiple of M VEC): each image's plane walked as M images of
// I / M elements (staged back to back, as one channel's images are), so a plane of more words
// than threads (float32 56 x 56: 784) takes the same one-word-a-thread walk; only the global
// reads and writes of the residual and dres map a walk image back to (image, piece).
template <int BLOCK, typename T, typename W, int ACT, bool CLUSTER>
__global__ void __launch_bounds__(BLOCK, CUNORM_BN_STAGED_THREADS_PER_SM / BLOCK)
bn_bwd_staged_span(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ res, T* __restrict__ dx,
                   T* __restrict__ dres, i64 so, int I, int O_total, int C, int G, int K, int OB, int M,
                   const typename AccOf<T>::type* __restrict__ mean, const typename AccOf<T>::type* __restrict__ rstd,
                   const W* __restrict__ w, const W* __restrict__ b, int act, typename AccOf<T>::type param,
                   int training, W* __restrict__ dw, W* __restrict__ db) {
  typedef typename AccOf<T>::type A;
  typedef SpanWord<T, CUNORM_BN_SPAN_CLASSES_BWD != 0> Span;
  constexpr int VEC = Span::VEC, kWarps = BLOCK / kWarp;
  static_assert(kWarps <= kMaxStagedGroups, "a warp a channel");
  extern __shared__ __align__(16) unsigned char staged[];
  __shared__ SpanScratch<A, BLOCK, 6, CLUSTER> sm;  // cons: a channel's mean, scale, shift, then a, m1, d
  const auto tag = act_tag<ACT>(act);
  const StagedShare<CLUSTER> sh(K, OB, O_total);
  const int O = sh.O, c0 = sh.stage * G, count = min(G, C - c0), GI = G * I;
  const int span = count * I * int(sizeof(T)), pitch = GI * int(sizeof(T)), half = O * pitch;
  const i64 base = i64(c0) * I + i64(sh.o0) * so, so_bytes = so * i64(sizeof(T));
  stage_in<BLOCK, 16>(staged, reinterpret_cast<const unsigned char*>(x + base), so_bytes, O, span, pitch);
  stage_in<BLOCK, 16>(staged + half, reinterpret_cast<const unsigned char*>(dy + base), so_bytes, O, span, pitch);
  copies_commit();
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const bool owner = warp < count;
  const i64 c = c0 + warp;
  // warp g's channel constants load while the copies land
  const Channel<A> own = owner ? channel_of(c, mean, rstd, w, b) : Channel<A>{A(0), A(0), A(0)};
  const A rs = owner ? rstd[c] : A(0), wc = owner && w ? cvt<A>(w[c]) : A(1);
  if (lane == 0) {
    sm.cons[0][warp] = own.mean;
    sm.cons[1][warp] = own.scale;
    sm.cons[2][warp] = own.shift;
  }
  const int IW = I / M, GW = G * IW, OW = O * M;  // the walk's images: OW of GW elements
  const Span sw(G, IW, count, BLOCK);
  copies_wait<0>();
  __syncthreads();
  constexpr bool kDzBack = ACT != 0 && CUNORM_BN_STAGED_DZ_BACK;
  T* sx = reinterpret_cast<T*>(staged) + sw.e0;
  T* sg = reinterpret_cast<T*>(staged + half) + sw.e0;
  const Channel<A> cl = channel_at<A>(sm.cons, sw.lo), ch = channel_at<A>(sm.cons, sw.hi);
  const T* rw = ACT != 0 && res ? res + base + sw.e0 : nullptr;
  T* const drw_first = kDzBack && dres ? dres + base + sw.e0 : nullptr;  // dres from the first walk (v31)
  const SpanWalkAt at(so, I, M);
  // this thread's word of x and its dz in image o (elements from ``cut`` on in the second channel)
  const auto dz_at = [&](int o, int cut, int valid, A (&xv)[VEC], A (&dz)[VEC]) {
    A gv[VEC], rv[VEC];
    unpack_words(staged_word<T, VEC>(sx + o * GW), xv);
    unpack_words(staged_word<T, VEC>(sg + o * GW), gv);
    residual_word<true>(rw, rw ? at(o) : i64(0), rv, valid);
#pragma unroll
    for (int e = 0; e < VEC; ++e) dz[e] = element_dz<ACT>(tag, e < cut ? cl : ch, xv[e], gv[e], rv[e], param);
  };
  A l1 = A(0), l2 = A(0), h1 = A(0), h2 = A(0);
  if (sw.live)
    span_images(sw, OW, [&](int o, int cut, int valid) {
      A xv[VEC], dz[VEC];
      dz_at(o, cut, valid, xv, dz);
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const A xm = xv[e] - (e < cut ? cl.mean : ch.mean);
        if (e < cut) { l1 += dz[e]; l2 += dz[e] * xm; } else { h1 += dz[e]; h2 += dz[e] * xm; }
      }
      if (kDzBack) {  // the thread's own word: the second walk reads it back, no other thread
        *reinterpret_cast<Pack<T, VEC>*>(sg + o * GW) = convert_pack<T>(dz);
        if (drw_first) store_word_part<T>(drw_first + at(o), dz, 0, valid);
      }
    });
  A s1, s2;
  span_stage_sum2<CLUSTER>(s1, s2, l1, l2, h1, h2, sm, sw, owner, warp, lane, GW, IW, K);
  if (lane == 0) {
    ChannelGrad<A> cg{A(0), A(0), A(0)};
    if (owner) {
      const A sq = s2 * rs;  // sum dz * xhat
      const double n = double(O_total) * double(I);
      if (sh.rank == 0) store_param_grads(c, ChunkSums{double(s1), double(sq)}, dw, db);
      const A a = rs * wc, m2 = grad_mean<A>(double(sq), n, training);
      cg = ChannelGrad<A>{a, grad_mean<A>(double(s1), n, training), a * rs * m2};
    }
    sm.cons[3][warp] = cg.a;
    sm.cons[4][warp] = cg.m1;
    sm.cons[5][warp] = cg.d;
  }
  __syncthreads();
  if (sw.live) {
    const ChannelGrad<A> gl{sm.cons[3][sw.lo], sm.cons[4][sw.lo], sm.cons[5][sw.lo]},
                         gh{sm.cons[3][sw.hi], sm.cons[4][sw.hi], sm.cons[5][sw.hi]};
    T* drw = !kDzBack && dres ? dres + base + sw.e0 : nullptr;
    span_images(sw, OW, [&](int o, int cut, int valid) {
      A xv[VEC], dz[VEC], out[VEC];
      if (kDzBack) {
        unpack_words(staged_word<T, VEC>(sx + o * GW), xv);
        unpack_words(staged_word<T, VEC>(sg + o * GW), dz);
      } else {
        dz_at(o, cut, valid, xv, dz);
        if (drw) store_word_part<T>(drw + at(o), dz, 0, valid);
      }
#pragma unroll
      for (int e = 0; e < VEC; ++e)
        out[e] = e < cut ? gl.dx(dz[e], xv[e] - cl.mean) : gh.dx(dz[e], xv[e] - ch.mean);
      *reinterpret_cast<Pack<T, VEC>*>(sx + o * GW) = convert_pack<T>(out);
    });
  }
  __syncthreads();
  stage_out<BLOCK, 16, sizeof(T)>(reinterpret_cast<unsigned char*>(dx + base), staged, so_bytes, O, span, pitch);
  if (CLUSTER) staged_cluster_end();
}

// ---- one-read forward and backward, channels last (NOTES "BatchNorm v21") -----------------
// x as (O positions, C channels innermost, position stride so). A stage is G consecutive
// channels (``pitch`` = G * sizeof(T) bytes a position: 16, 32, 64 or 128) over the positions,
// split over the K blocks of a thread-block cluster (OB positions a block from rank r's first;
// K = 1 unclustered). The forward stages x, the backward x and dy, with 16-byte cp.async
// copies (the host sees to pointers and so * sizeof(T) being multiples of 16). Thread t takes
// the 16-byte word t % WPP (VEC channels; WPP = G / VEC words a position) of its block's
// positions t / WPP, t / WPP + BLOCK / WPP, ...: a warp reads 512 contiguous staged bytes (no
// bank conflicts). A channel's two sums go lanes (butterfly over the lanes of one word) ->
// warps (in warp order, through shared memory) -> blocks (in rank order, through distributed
// shared memory): the same bits in every block of the cluster, run after run. Then threads
// t < G fold channel t's constants into shared memory, every thread takes its word's, writes
// its results over the staged x, and the block stores the spans. The passes read x (and dy)
// twice, and their channels-last kernels hold 8 channels' constants a thread across a
// strided walk (NOTES "BatchNorm v2", v19).
constexpr int kClStageBytes = 128;  // a position's span of a stage at most (one 128-byte line)

template <typename T>
struct ClStage {
  static constexpr int kVec = 16 / int(sizeof(T));              // channels a word
  static constexpr int kMaxChannels = kClStageBytes / int(sizeof(T));  // G at most
};

// This thread's word of a position (``word``, its first channel ``cw`` in the stage) and rows.
struct ClWord {
  int word, cw, row, rows;
  __device__ __forceinline__ ClWord(int wshift, int block, int vec) {
    word = threadIdx.x & ((1 << wshift) - 1);
    cw = word * vec;
    row = threadIdx.x >> wshift;
    rows = block >> wshift;
  }
};

// A stage's shared scratch: the warps' sums, the block's (xpart, read by the cluster's other
// blocks), the cluster's, and the channels' folded constants (three a channel).
template <typename A, int BLOCK, int MAXG, bool CLUSTER>
struct ClScratch {
  A red[BLOCK / kWarp * 2 * MAXG];
  A xpart[2 * MAXG];
  A tot_cluster[CLUSTER ? 2 * MAXG : 1];
  A cons[3 * MAXG];
  __device__ __forceinline__ A* tot() { return CLUSTER ? tot_cluster : xpart; }
  // channel t's three constants (thread t < G), then, after a block barrier, a word's VEC
  // channels' from cw as Ch (Channel, ChannelGrad)
  __device__ __forceinline__ void fold(int t, int G, A a, A b, A c) {
    cons[t] = a;
    cons[G + t] = b;
    cons[2 * G + t] = c;
  }
  template <typename Ch, int VEC>
  __device__ __forceinline__ void take(Ch (&out)[VEC], int cw, int G) const {
#pragma unroll
    for (int e = 0; e < VEC; ++e) out[e] = Ch{cons[cw + e], cons[G + cw + e], cons[2 * G + cw + e]};
  }
};

#ifndef CUNORM_BN_CL_COPY_ROWS
#define CUNORM_BN_CL_COPY_ROWS 1  // v44 (ClPart::copy_in)
#endif
// v48 (bn_fwd_staged_cl): a stage's copies in committed in this many groups of positions
#ifndef CUNORM_BN_CL_GROUPS
#define CUNORM_BN_CL_GROUPS 4
#endif
constexpr int kClGroups = CUNORM_BN_CL_GROUPS;
static_assert(kClGroups >= 1 && kClGroups <= 4, "copies_wait_upto waits for at most three groups behind");
// the first position past group g of a block's O (the groups split O evenly; a thread's
// positions fall in them in order)
__device__ __forceinline__ int cl_group_end(int O, int g) { return int((i64(O) * (g + 1)) / kClGroups); }
// f(o) for a thread's positions o = row, row + rows, ... group by group, each group after this
// thread's own copies of it landed (ClPart::copy_in_groups' commits; no barrier: its own)
template <typename F>
__device__ __forceinline__ void cl_walk_groups(int O, int row, int rows, F f) {
  int o = row;
#pragma unroll
  for (int g = 0; g < kClGroups; ++g) {
    copies_wait_upto(kClGroups - 1 - g);
    for (const int end = cl_group_end(O, g); o < end; o += rows) f(o);
  }
}

// The block's part of stage ``stage``: positions (O of them from the share's first, ``rank``
// among the stage's blocks), channels [c0, c0 + count), bytes a position (span live, pitch
// staged), the first position's element offset in x and the position stride in bytes; it
// copies its spans of a tensor (x, dy) into shared memory and its results back out.
struct ClPart {
  int O, stage, rank, c0, count, span, pitch;
  i64 base, so_bytes;
  template <bool CLUSTER>
  __device__ __forceinline__ ClPart(Flag<CLUSTER>, int K, int OB, int O_total, int C, int G, i64 so, int itemsize,
                                    int given_stage) {
    const StagedShare<CLUSTER> sh(K, OB, O_total, given_stage);
    O = sh.O;
    stage = sh.stage;
    rank = sh.rank;
    c0 = sh.stage * G;
    count = min(G, C - c0);
    span = count * itemsize;
    pitch = G * itemsize;
    base = c0 + i64(sh.o0) * so;
    so_bytes = so * itemsize;
  }
  // v44: where a span's chunks divide the block (16-128-byte spans: 1, 2, 4 or 8 chunks), each
  // thread copies the same chunk of every (BLOCK / per)-th position, its addresses stepped a
  // row: 12 instructions a 16-byte chunk (three of them ptxas's placeholder LDS) where
  // stage_in's general walk (any span, any count of chunks) took ~30 (SASS, sm_90).
  // CUNORM_BN_CL_COPY_ROWS=0: stage_in always.
  template <int BLOCK, typename T>
  __device__ __forceinline__ void copy_in(unsigned char* staged, const T* src) const {
    const int per = (span + 15) / 16;
    if (CUNORM_BN_CL_COPY_ROWS && BLOCK % per == 0) {
      const int k = threadIdx.x % per;
      copy_rows(staged, src, threadIdx.x / per, O, BLOCK / per, k, min(16, span - k * 16));
    } else {
      stage_in<BLOCK, 16>(staged, reinterpret_cast<const unsigned char*>(src + base), so_bytes, O, span, pitch);
    }
  }
  // v44's walk: `bytes` of chunk k of positions o, o + rows, ... below `end`, source and
  // destination stepped a row; returns the next position
  template <typename T>
  __device__ __forceinline__ int copy_rows(unsigned char* staged, const T* src, int o, int end, int rows, int k,
                                           int bytes) const {
    const unsigned char* from = reinterpret_cast<const unsigned char*>(src + base) + i64(o) * so_bytes + k * 16;
    unsigned char* to = staged + o * pitch + k * 16;
    const i64 from_step = i64(rows) * so_bytes;
    const int to_step = rows * pitch;
    for (; o < end; o += rows, from += from_step, to += to_step) copy_async_part<16>(to, from, bytes);
    return o;
  }
  // v48: v44's rows where a span fills its pitch (the chunks are ClWord's words), committed in
  // kClGroups groups of positions (cl_group_end), which cl_walk_groups waits for one by one
  // (the backward: x into staged and, where src2 is given, dy into staged2, in the same groups)
  template <typename T>
  __device__ __forceinline__ void copy_in_groups(unsigned char* staged, const T* src, int row, int rows, int k,
                                                 unsigned char* staged2 = nullptr, const T* src2 = nullptr) const {
    int o = row;
#pragma unroll
    for (int g = 0; g < kClGroups; ++g) {
      const int end = cl_group_end(O, g);
      if (src2) copy_rows(staged2, src2, o, end, rows, k, 16);
      o = copy_rows(staged, src, o, end, rows, k, 16);
      copies_commit();
    }
  }
  template <int BLOCK, typename T>
  __device__ __forceinline__ void copy_out(T* dst, const unsigned char* staged) const {
    stage_out<BLOCK, 16, sizeof(T)>(reinterpret_cast<unsigned char*>(dst + base), staged, so_bytes, O, span, pitch);
  }
};

// Where a stage's K blocks meet when they are not one thread-block cluster (NOTES "BatchNorm
// v24"): global memory, the K consecutive blocks of a stage all resident at once (a
// cooperative launch). ``parts``: 2 G sums a block, in block order; ``counters``: one arrival
// counter a stage, zeroed by the host. Null pointers: the blocks are a cluster (or K = 1).
template <typename A>
struct ClGridExchange {
  A* parts;
  unsigned* counters;
};

// v39: a grid-only stage's fold (more blocks than a cluster holds: 16-128) over every thread of
// the block. Each of the 2 G sums is folded by U = BLOCK / (2 G) threads (G a power of two,
// 2 G <= BLOCK), thread u of them taking blocks [u K / U, (u + 1) K / U) in rank order,
// kClFoldLoads loads issued before any is added; then the U partials go through ``red`` and
// are added in u order. The same bits in every block of the stage (no cluster exchange runs
// such a stage, so rank order from zero is not needed there). The rank-order loop it replaces
// left 2 G threads an SM issuing K dependent-in-turn L2 loads each (128 at the bench's bf16
// NHWC 56 x 56 forward) while the rest of the block and the stage's memory traffic waited.
// CUNORM_BN_CL_GRID_FOLD=0: that loop for every K (sweep_bn_variants.py cl_fold_rank_order).
#ifndef CUNORM_BN_CL_GRID_FOLD
#define CUNORM_BN_CL_GRID_FOLD 1
#endif
constexpr int kClFoldLoads = 8;
constexpr int kClClusterMax = 8;  // = max(_batch_norm.STAGED_CL_CLUSTERS): clustered stages keep rank order

template <int BLOCK, typename A>
__device__ __forceinline__ A cl_fold_spread(const A* parts, int G, int K, A* red) {
  const int t = threadIdx.x, n = 2 * G, U = BLOCK / n, u = t / n, j = t - u * n;
  const int r0 = u * K / U, r1 = (u + 1) * K / U;
  A sum = A(0);
  for (int r = r0; r < r1; r += kClFoldLoads) {
    A v[kClFoldLoads];
#pragma unroll
    for (int k = 0; k < kClFoldLoads; ++k) v[k] = r + k < r1 ? __ldcg(parts + i64(r + k) * n + j) : A(0);
#pragma unroll
    for (int k = 0; k < kClFoldLoads; ++k) sum += v[k];
  }
  red[t] = sum;  // (U * 2 G = BLOCK values: red holds BLOCK / kWarp * 2 * MAXG >= BLOCK)
  __syncthreads();
  A tot = A(0);
  if (t < n)
    for (int k = 0; k < U; ++k) tot += red[k * n + t];
  return tot;
}

// The block's (cluster's) per-channel totals of the two sums s, q (VEC channels a thread from
// cw) -> sm.tot()[0, G) and [G, 2G), through sm.red (BLOCK / kWarp * 2 * G values) and
// sm.xpart (2 G, read by the cluster's other blocks until the kernel's closing cluster_wait;
// or copied to xg.parts where the stage's blocks meet in global memory). Up to a cluster's
// blocks (K <= kClClusterMax), their sums are added in rank order from zero: the same bits in
// every block, and in both exchanges; past it (grid-only stages), cl_fold_spread's order, the
// same bits in every block. All threads call it; it ends with a block barrier.
template <int BLOCK, int VEC, bool CLUSTER, typename A, typename Scratch>
__device__ __forceinline__ void cl_stage_sums(A (&s)[VEC], A (&q)[VEC], Scratch& sm, int G, int wpp, int cw, int K,
                                              ClGridExchange<A> xg, const ClPart& pt, int round = 0) {
  constexpr int kWarps = BLOCK / kWarp;
  A *red = sm.red, *xpart = sm.xpart, *tot = sm.tot();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && !defined(CUNORM_HIP)
  // a second round (v53's re-pivot): the first one's arrive waited for, so every block has
  // read this one's xpart before it is written again
  if (CLUSTER && !xg.counters && round > 0) cluster_wait();
#endif
  for (int m = wpp; m < kWarp; m <<= 1)  // the lanes of one word are wpp apart
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      s[e] += shfl_xor(s[e], m);
      q[e] += shfl_xor(q[e], m);
    }
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, t = threadIdx.x;
  if (lane < wpp)
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      red[warp * 2 * G + cw + e] = s[e];
      red[warp * 2 * G + G + cw + e] = q[e];
    }
  __syncthreads();
  if (t < 2 * G) {
    A sum = A(0);
    for (int w = 0; w < kWarps; ++w) sum += red[w * 2 * G + t];
    xpart[t] = sum;
  }
#if !defined(CUNORM_HIP)
  if (CLUSTER && xg.counters) {
    const i64 first = i64(pt.stage) * K;  // the stage's blocks' sums, in rank order
    if (t < 2 * G) xg.parts[(first + pt.rank) * 2 * G + t] = xpart[t];
    __syncthreads();
    if (t == 0) grid_arrive(xg.counters + pt.stage);
    grid_wait(xg.counters + pt.stage, unsigned(K * (round + 1)));  // (each round K arrivals)
    if (CUNORM_BN_CL_GRID_FOLD && K > kClClusterMax) {
      const A sum = cl_fold_spread<BLOCK>(xg.parts + first * 2 * G, G, K, red);
      if (t < 2 * G) tot[t] = sum;
    } else if (t < 2 * G) {
      A sum = A(0);
      for (int r = 0; r < K; ++r) sum += __ldcg(xg.parts + (first + r) * 2 * G + t);
      tot[t] = sum;
    }
  }
#endif
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && !defined(CUNORM_HIP)
  if (CLUSTER && !xg.counters) {
    if (t < 2 * G) cluster_fence();
    cluster_barrier();
    if (t < 2 * G) {
      A sum = A(0);
      for (int r = 0; r < K; ++r) sum += load_cluster(xpart + t, unsigned(r));
      tot[t] = sum;
    }
    cluster_arrive();  // this block has read the others' xpart; each waits before it exits
  }
#endif
  __syncthreads();
}

// No block of a cluster exits while another may still read its xpart (blocks meeting in
// global memory read only the copies there).
template <bool CLUSTER, typename A>
__device__ __forceinline__ void cl_stage_end(ClGridExchange<A> xg) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && !defined(CUNORM_HIP)
  if (CLUSTER && !xg.counters) cluster_wait();
#endif
}

// v42: the channels-last stages store y (dx) from the apply's registers straight to global
// memory, each thread its word of a position (a warp writes whole 32-byte sectors: spans are
// 32-128 bytes since v36), where they wrote it over the stage, met at a barrier and copied the
// stage out: a shared store and load a word and a barrier a stage fewer. The profile of the
// forty-sixth session (NOTES) found these kernels barrier-stalled first, with 25-38 thread
// instructions an element. CUNORM_BN_CL_DIRECT=0: the copy out (sweep_bn_variants.py
// cl_copy_out).
#ifndef CUNORM_BN_CL_DIRECT
#define CUNORM_BN_CL_DIRECT 1
#endif
// v43: the forward's apply loop built with the residual's loads and without them, and for
// half precision the channel's mean folded into its shift (one FFMA an element), and the
// half-precision backward's dx in two FFMAs an element (the mean and m1 in one constant a
// channel): the span forward's v27 and the channels-last passes' v19, which the staged
// channels-last kernels lacked. CUNORM_BN_CL_LEAN=0: the loops before (sweep cl_lean_off).
#ifndef CUNORM_BN_CL_LEAN
#define CUNORM_BN_CL_LEAN 1
#endif

// v48: where a stage's spans fill their pitch (every stage but a last one of fewer channels),
// the copy's 16-byte chunks are the sums' words (v44's rows and ClWord's map agree), so each
// thread sums exactly the words it copied: the forward commits its copies in kClGroups groups
// of positions and sums each group as soon as its own copies of it land (cp.async.wait_group,
// no block barrier), where it waited for the whole stage and a barrier before summing any of
// it. The whole stage stays in flight (loading the words into registers instead kept two in
// flight a thread at 64 registers: ptxas used the first before issuing the third, SASS).
// CUNORM_BN_CL_FUSED_SUMS=0: the wait for all, the barrier, then the sums (sweep
// cl_fused_sums_off); CUNORM_BN_CL_GROUPS: the groups (1-4).
#ifndef CUNORM_BN_CL_FUSED_SUMS
#define CUNORM_BN_CL_FUSED_SUMS 1
#endif

template <int BLOCK, typename T, typename W, typename R, int ACT, bool CLUSTER>
__global__ void __launch_bounds__(BLOCK, CUNORM_BN_STAGED_THREADS_PER_SM / BLOCK)
bn_fwd_staged_cl(const T* __restrict__ x, const T* __restrict__ res, T* __restrict__ y, i64 so, int O_total, int C,
                 int G, int wshift, int K, int OB, const W* __restrict__ w, const W* __restrict__ b, int act,
                 typename AccOf<T>::type param, double eps, double factor, R* __restrict__ running_mean,
                 R* __restrict__ running_var, typename AccOf<T>::type* __restrict__ mean,
                 typename AccOf<T>::type* __restrict__ rstd, typename AccOf<T>::type* __restrict__ parts,
                 unsigned* __restrict__ counters) {
  typedef typename AccOf<T>::type A;
  constexpr int VEC = ClStage<T>::kVec, kMaxG = ClStage<T>::kMaxChannels;
  const ClGridExchange<A> xg{parts, counters};
  typedef Pack<T, VEC> Word;
  extern __shared__ __align__(16) unsigned char staged[];
  __shared__ ClScratch<A, BLOCK, kMaxG, CLUSTER> sm;
  const A* tot = sm.tot();
  const auto tag = act_tag<ACT>(act);
  // a stage of K blocks at a time (once, but where a persistent grid's blocks walk several)
  for (int stage = blockIdx.x / K, stages = (C + G - 1) / G; stage < stages; stage += gridDim.x / K) {
    const ClPart pt(Flag<CLUSTER>{}, K, OB, O_total, C, G, so, sizeof(T), stage);
    const int O = pt.O, c0 = pt.c0, count = pt.count, pitch = pt.pitch;
    const bool fused = CUNORM_BN_CL_FUSED_SUMS && pt.span == pitch;  // v48 (block-uniform)
    const ClWord wd(wshift, BLOCK, VEC);
    if (fused) {
      pt.copy_in_groups(staged, x, wd.row, wd.rows, wd.word);
    } else {
      pt.copy_in<BLOCK>(staged, x);
      copies_commit();
    }
    const bool active = wd.cw < count;
    // while the copies land: the word's pivots (each channel's first element: every block of
    // the cluster shares them), and channel t's parameters, pivot and running statistics
    A pivot[VEC];
#pragma unroll
    for (int e = 0; e < VEC; ++e) pivot[e] = wd.cw + e < count ? cvt<A>(x[c0 + wd.cw + e]) : A(0);
    const int t = threadIdx.x;
    const bool chan = t < count, writer = chan && pt.rank == 0;
    const i64 c = c0 + t;
    const A wc = chan && w ? cvt<A>(w[c]) : A(1), bc = chan && b ? cvt<A>(b[c]) : A(0);
    A pc = chan ? cvt<A>(x[c]) : A(0);
    const A rm = writer && running_mean ? cvt<A>(running_mean[c]) : A(0);
    const A rv = writer && running_var ? cvt<A>(running_var[c]) : A(0);
    A s[VEC], q[VEC];
#pragma unroll
    for (int e = 0; e < VEC; ++e) s[e] = q[e] = A(0);
    auto sum_word = [&](const Word& raw) {
      A v[VEC];
      unpack_words(raw, v);
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const A d = v[e] - pivot[e];
        s[e] += d;
        q[e] += d * d;
      }
    };
    const auto sum_at = [&](int o) { sum_word(staged_word<T, VEC>(staged + o * pitch + wd.word * 16)); };
    if (fused) {  // every word live: this thread's own copies, summed group by group as they land
      cl_walk_groups(O, wd.row, wd.rows, sum_at);
    } else {
      copies_wait<0>();
      __syncthreads();
      if (active)
        for (int o = wd.row; o < O; o += wd.rows) sum_at(o);
    }
    cl_stage_sums<BLOCK, VEC, CLUSTER>(s, q, sm, G, 1 << wshift, wd.cw, K, xg, pt);
    const double n = double(O_total);
    // v53: the stage once more about each channel's pivot + shift where stage_far; v54: asked
    // at the barrier that publishes the constants (a far stage's writer then stores its mean,
    // rstd and running statistics twice, the second from the same values read beforehand)
    const auto repivot = [&](A shift) {
      pc += shift;  // (zero past the stage's channels)
      if (t < G) sm.cons[t] = pc;  // (the fold's constants are taken only after the last pass)
      __syncthreads();
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        pivot[e] = wd.cw + e < count ? sm.cons[wd.cw + e] : A(0);
        s[e] = q[e] = A(0);
      }
      if (active)  // (fused: each thread's own copies, landed)
        for (int o = wd.row; o < O; o += wd.rows) sum_at(o);
      // the grid exchange's second round in the second half of the host's scratch
      const i64 region = i64((C + G - 1) / G) * K * 2 * G;
      const ClGridExchange<A> xg2{xg.counters ? xg.parts + region : nullptr, xg.counters};
      cl_stage_sums<BLOCK, VEC, CLUSTER>(s, q, sm, G, 1 << wshift, wd.cw, K, xg2, pt, 1);
    };
#pragma unroll 1  // (a loop: the constants' code once; written out twice it spilled 8-12 bytes, sm_90)
    for (int pass = 0;; ++pass) {
      const A shift = chan ? tot[t] / A(n) : A(0);
      const bool far = pass == 0 && chan && sums_far(shift, tot[G + t], A(n));
      if (!CUNORM_BN_FOLDED_VOTE && stage_far(far)) {  // (v53's vote of its own)
        repivot(shift);
        continue;  // (the constants from the second sums)
      }
      if (t < G) {  // channel t's constants (zeros past C: computed on, never stored)
        A cm = A(0), cs = A(0);
        if (chan) {
          const StagedMoments<A> mo(tot[t], tot[G + t], pc, A(n), eps);
          cm = mo.mean;
          cs = mo.rstd * wc;
          if (writer) {  // mean and rstd as y uses them; the running statistics from the same sums in double
            mean[c] = mo.mean;
            rstd[c] = mo.rstd;
            update_running(c, moments_of(ChunkSums{double(tot[t]), double(tot[G + t])}, double(pc), n), n, factor,
                           rm, rv, running_mean, running_var);
          }
        }
        sm.fold(t, G, cm, cs, bc);
      }
      if (!barrier_far(CUNORM_BN_FOLDED_VOTE && far)) break;
      repivot(shift);
    }
    if (active) {
      Channel<A> ch[VEC];
      sm.take(ch, wd.cw, G);
      if (CUNORM_BN_CL_LEAN && sizeof(T) == 2)  // z = x scale + (shift - mean scale)
#pragma unroll
        for (int e = 0; e < VEC; ++e) ch[e] = Channel<A>{A(0), ch[e].scale, ch[e].shift - ch[e].mean * ch[e].scale};
      const T* rw = res ? res + pt.base + wd.cw : nullptr;
      // y's word a row walked by a pointer (no 64-bit o * so a word)
      T* yp = y + pt.base + wd.cw + i64(wd.row) * so;
      const i64 ystep = i64(wd.rows) * so;
      const auto apply = [&](auto with_res) {
        for (int o = wd.row; o < O; o += wd.rows, yp += ystep) {
          Word* p = reinterpret_cast<Word*>(staged + o * pitch + wd.word * 16);
          A v[VEC], r[VEC], out[VEC];
          unpack_words(staged_word<T, VEC>(staged + o * pitch + wd.word * 16), v);
          if constexpr (decltype(with_res)::value) residual_word(rw, o * so, r);
#pragma unroll
          for (int e = 0; e < VEC; ++e) {
            const A z = decltype(with_res)::value ? ch[e].z(v[e], r[e]) : ch[e].z(v[e]);
            out[e] = act_forward(tag(), z, param);
          }
          if (CUNORM_BN_CL_DIRECT) store_word_part<T>(yp, out, wd.cw, count);
          else *p = convert_pack<T>(out);
        }
      };
      if (!CUNORM_BN_CL_LEAN || rw) apply(Flag<true>{});
      else apply(Flag<false>{});
    }
    if (!CUNORM_BN_CL_DIRECT) {
      __syncthreads();
      pt.copy_out<BLOCK>(y, staged);
    }
    cl_stage_end<CLUSTER>(xg);
    __syncthreads();  // (the next stage's copies land where this one's were read out)
  }
}

// The backward: x and dy staged (dy's spans after x's), dz = dy act'(z) (z recomputed from x
// and the residual, read from global memory where an activation needs it), the sums of dz and
// dz (x - mean) per channel as above, dres = dz to global memory where asked for; rank 0
// writes dbias and dweight; then dx over the staged x. One launch reading x and dy once, where
// the passes take three launches and read both twice. With an activation the first walk
// writes dz (rounded to T, as dres is) over the staged dy, so the second reads it instead of
// recomputing it: the residual is read once, and the forward's constants (three a channel)
// are not live beside dx's. Exact for ReLU (dz is dy or 0) and for float32 / float64 x; half
// precision's smooth activations take dz rounded to T in dx's first term. (NVRTC 13.0 sm_90,
// bf16 with ReLU at 64 registers: recomputed dz and 16-byte words spilled 76 bytes, dz
// written back 64, that and 8-byte words none.)
template <int BLOCK, typename T, typename W, int ACT, bool CLUSTER>
__global__ void __launch_bounds__(BLOCK, CUNORM_BN_STAGED_THREADS_PER_SM / BLOCK)
bn_bwd_staged_cl(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ res, T* __restrict__ dx,
                 T* __restrict__ dres, i64 so, int O_total, int C, int G, int wshift, int K, int OB,
                 const typename AccOf<T>::type* __restrict__ mean, const typename AccOf<T>::type* __restrict__ rstd,
                 const W* __restrict__ w, const W* __restrict__ b, int act, typename AccOf<T>::type param,
                 int training, W* __restrict__ dw, W* __restrict__ db, typename AccOf<T>::type* __restrict__ parts,
                 unsigned* __restrict__ counters) {
  typedef typename AccOf<T>::type A;
  const ClGridExchange<A> xg{parts, counters};
  // half precision with an activation walks 8-byte words (4 channels a thread: the forward's
  // constants and dx's for 8 channels spilled 64 bytes at 64 registers with ReLU)
  constexpr int kWordBytes = ACT != 0 && sizeof(T) == 2 ? 8 : 16;
  constexpr int VEC = kWordBytes / int(sizeof(T)), kMaxG = ClStage<T>::kMaxChannels;
  typedef Pack<T, VEC> Word;
  extern __shared__ __align__(16) unsigned char staged[];
  __shared__ ClScratch<A, BLOCK, kMaxG, CLUSTER> sm;
  const A* tot = sm.tot();
  const auto tag = act_tag<ACT>(act);
  wshift += kWordBytes == 8;  // the host counts 16-byte words
  for (int stage = blockIdx.x / K, stages = (C + G - 1) / G; stage < stages; stage += gridDim.x / K) {
    const ClPart pt(Flag<CLUSTER>{}, K, OB, O_total, C, G, so, sizeof(T), stage);
    const int O = pt.O, c0 = pt.c0, count = pt.count, pitch = pt.pitch, half = O * pitch;
    // v48 as the forward's, where the words are the copy's 16-byte chunks (not the 8-byte
    // words of half precision with an activation); float64 (staged only where the host lifts
    // STAGED_CL_BWD_MAX_ITEMSIZE) keeps the wait: with it its generic activation spilled 20-24 bytes
    const bool fused = CUNORM_BN_CL_FUSED_SUMS && kWordBytes == 16 && sizeof(T) <= 4 && pt.span == pitch;
    const ClWord wd(wshift, BLOCK, VEC);
    if (fused) {
      pt.copy_in_groups(staged, x, wd.row, wd.rows, wd.word, staged + half, dy);
    } else {
      pt.copy_in<BLOCK>(staged, x);
      pt.copy_in<BLOCK>(staged + half, dy);
      copies_commit();
    }
    const bool active = wd.cw < count;
    // while the copies land: the word's forward constants (z where an activation needs it)
    Channel<A> ch[VEC];
#pragma unroll
    for (int e = 0; e < VEC; ++e)
      ch[e] = wd.cw + e < count ? channel_of(c0 + wd.cw + e, mean, rstd, w, b) : Channel<A>{A(0), A(0), A(0)};
    const int t = threadIdx.x;
    const bool chan = t < count;
    const i64 c = c0 + t;
    const A rs = chan ? rstd[c] : A(0), wc = chan && w ? cvt<A>(w[c]) : A(1);
    if (!fused) {
      copies_wait<0>();
      __syncthreads();
    }
    const T* rw = ACT != 0 && res ? res + pt.base + wd.cw : nullptr;
    const auto dz_at = [&](int o, A (&xv)[VEC], A (&dz)[VEC]) {
      A gv[VEC], rv[VEC];
      unpack_words(staged_word<T, VEC>(staged + o * pitch + wd.word * kWordBytes), xv);
      unpack_words(staged_word<T, VEC>(staged + half + o * pitch + wd.word * kWordBytes), gv);
      residual_word(rw, o * so, rv);
#pragma unroll
      for (int e = 0; e < VEC; ++e) dz[e] = element_dz<ACT>(tag, ch[e], xv[e], gv[e], rv[e], param);
    };
    T* drw = dres ? dres + pt.base + wd.cw : nullptr;
    A s1[VEC], s2[VEC];
#pragma unroll
    for (int e = 0; e < VEC; ++e) s1[e] = s2[e] = A(0);
    const auto sum_word = [&](int o) {
      A xv[VEC], dz[VEC];
      dz_at(o, xv, dz);
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        s1[e] += dz[e];
        s2[e] += dz[e] * (xv[e] - ch[e].mean);
      }
      if (ACT != 0) *reinterpret_cast<Word*>(staged + half + o * pitch + wd.word * kWordBytes) = convert_pack<T>(dz);
      if (drw) store_word_part<T>(drw + o * so, dz, wd.cw, count);
    };
    if (fused) {  // every word live: this thread's own copies, group by group as they land
      cl_walk_groups(O, wd.row, wd.rows, sum_word);
    } else if (active) {
      for (int o = wd.row; o < O; o += wd.rows) sum_word(o);
    }
    A mu[VEC];
#pragma unroll
    for (int e = 0; e < VEC; ++e) mu[e] = ch[e].mean;
    cl_stage_sums<BLOCK, VEC, CLUSTER>(s1, s2, sm, G, 1 << wshift, wd.cw, K, xg, pt);
    if (t < G) {  // channel t's dx constants (zeros past C: computed on, never stored)
      A ca = A(0), cm1 = A(0), cd = A(0);
      if (chan) {
        const A sq = tot[G + t] * rs;  // sum dz * xhat
        const double n = double(O_total);
        if (pt.rank == 0) store_param_grads(c, ChunkSums{double(tot[t]), double(sq)}, dw, db);
        ca = rs * wc;
        cm1 = grad_mean<A>(double(tot[t]), n, training);
        cd = ca * rs * grad_mean<A>(double(sq), n, training);
      }
      sm.fold(t, G, ca, cm1, cd);
    }
    __syncthreads();
    if (active) {
      ChannelGrad<A> cg[VEC];
      sm.take(cg, wd.cw, G);
      // half precision: dx = a dz - d x + (d mean - a m1), two FFMAs an element (v43)
      constexpr bool kLean = CUNORM_BN_CL_LEAN && sizeof(T) == 2;
      if (kLean)
#pragma unroll
        for (int e = 0; e < VEC; ++e) mu[e] = cg[e].d * mu[e] - cg[e].a * cg[e].m1;
      T* dxp = dx + pt.base + wd.cw + i64(wd.row) * so;
      const i64 dxstep = i64(wd.rows) * so;
      for (int o = wd.row; o < O; o += wd.rows, dxp += dxstep) {
        A xv[VEC], dz[VEC], out[VEC];
        unpack_words(staged_word<T, VEC>(staged + o * pitch + wd.word * kWordBytes), xv);
        unpack_words(staged_word<T, VEC>(staged + half + o * pitch + wd.word * kWordBytes), dz);  // dy or dz
#pragma unroll
        for (int e = 0; e < VEC; ++e)
          out[e] = kLean ? cg[e].a * dz[e] + (mu[e] - cg[e].d * xv[e]) : cg[e].dx(dz[e], xv[e] - mu[e]);
        if (CUNORM_BN_CL_DIRECT) store_word_part<T>(dxp, out, wd.cw, count);
        else *reinterpret_cast<Word*>(staged + o * pitch + wd.word * kWordBytes) = convert_pack<T>(out);
      }
    }
    if (!CUNORM_BN_CL_DIRECT) {
      __syncthreads();
      pt.copy_out<BLOCK>(dx, staged);
    }
    cl_stage_end<CLUSTER>(xg);
    __syncthreads();
  }
}
