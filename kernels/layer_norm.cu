// LayerNorm and RMSNorm over the last axis of a (rows x N) view, forward and backward.
// RMSNorm is LayerNorm without centring: the template flag RMS drops the mean, nothing else.
//
// Work is split into tiles: TPR threads ("a row group") hold one tile of PACKS packs of VEC
// elements of one row in registers; lane l owns columns c0 + (p * TPR + l) * VEC + [0, VEC).
//   kFullRow   : one tile spans the whole row (TPR * PACKS * VEC >= N); statistics are computed
//                in the kernel. Blocks of max(TPR, 128) threads hold 128 / TPR rows (one for
//                TPR >= 128).
//   kChunk*    : rows longer than one tile ("split" path): the row is cut into C tiles of one
//                block each, per-tile statistics are merged by a small finalize kernel, then an
//                apply pass writes the output. Keeps the GPU busy when rows are long and few.
#include "row_norm.cuh"

using namespace cunorm;

enum { kFullRow = 0, kChunkStats = 1, kChunkApply = 2 };
// A split tile's summary in tile_stats: its pivot, its mean less the pivot, its M2 (v113;
// cunorm.ops._row_norm.TILE_STAT_WORDS).
constexpr int kTileStatWords = 3;

// The split forward's two passes over x meet in the L2: the apply pass walks the tiles last to
// first, right after the statistics pass read them first to last, so it starts on the tens
// of MB the L2 (50 MB on the H200) may still hold: bf16 / fp32 forward N = 262144 and 1M
// +0.01-0.02 of copy in two rounds. The backward's tile sums walked last to first (its main
// pass starts at row 0) measured no change, 0.38-0.50 both ways. 0: in order (NOTES v33).
#ifndef CUNORM_SPLIT_L2_ORDER
#define CUNORM_SPLIT_L2_ORDER 1
#endif
// v118: the apply pass (last to first, above) loads x and stores y with .cs (evict first), so
// that the tiles the statistics pass read last, which the apply reads first, are not pushed
// out of L2 by the apply's own dead loads and its stores before it reaches them: on an H100
// it then finds ~17-19 MB of x in L2 rather than ~9-11 (split_l2_reuse.py), forward at 1M
// bf16 LayerNorm 0.572 -> 0.596 of copy, float32 0.577 -> 0.618 (sweep_split_l2_hints.py;
// benchmarks/NOTES.md, "Fifty-sixth session's device calls"). 2: loads and stores; 1: loads
// alone (lost to both: 0.563 / 0.596); 0: plain. The streaming stores hold the float32
// apply's weight and bias loads behind them (NVRTC 13 sm_90: 40 -> 63 registers, six blocks
// an SM to four), and it still wins.
#ifndef CUNORM_SPLIT_L2_HINTS
#define CUNORM_SPLIT_L2_HINTS 2
#endif
// v34 (prepared, measured by sweep_fwd_variant.py, off): the shared-memory forward's mean pass
// for half-precision x sums a pack's values raw and subtracts VEC * pivot once a pack (9
// instructions a pack of 8 where x - pivot summed takes 16). A pack's sum of 8 half values is
// exact in float unless their exponents span more than 16 binades.
#ifndef CUNORM_FWD_PACK_SUM
#define CUNORM_FWD_PACK_SUM 0
#endif
#ifndef CUNORM_FWD_ONE_PASS
#define CUNORM_FWD_ONE_PASS 0  // 1: the register tiles' statistics in one reduction (v11, sweep_fwd_variant.py)
#endif
// The shared-memory forward (half-precision x) centres each value by one subtraction of
// shift = pivot + mu, rounded to float once a row, instead of subtracting pivot, then mu: one
// instruction fewer an element in the squared-deviation and output passes: bf16 LayerNorm
// forward 0.73-0.79 -> 0.77-0.83 of copy at N = 512-16384, errors identical (NOTES v26). The
// rounding of shift (one float ulp of the row's mean) is far below the half-precision
// input's own ulp at that magnitude. 0: the two subtractions (sweep_fwd_variant.py).
#ifndef CUNORM_FWD_SHIFT_ONCE
#define CUNORM_FWD_SHIFT_ONCE 1
#endif
// v42-v43 (benchmarks/NOTES.md), half-precision LayerNorm: the shared-memory forward without
// per-pack bounds tests on rows that fill the tile, and with an output pass of its own for a
// call with its weight and bias. 0: as before (sweep_fwd_variant.py).
#ifndef CUNORM_FWD_FULL_TILES
#define CUNORM_FWD_FULL_TILES 1
#endif
#ifndef CUNORM_FWD_AFFINE_CASES
#define CUNORM_FWD_AFFINE_CASES 1
#endif
// v98: the shared-memory forward of half-precision LayerNorm takes its statistics in one pass
// over x (sums of x and x^2, one reduction) where row_norm.cuh's kOnePassTrust holds (mean^2
// <= 64 var): two reads of the row instead of three, one reduction instead of two. A row it
// does not trust (further than 8 sigma from zero, constant, NaN) takes that pass again about
// the first pass's mean, which centres it to within rounding (a constant row exactly, so its
// y is exactly its bias); _RETRY=0 takes v26's two passes about its first element instead.
// y keeps v26's (x - shift) * r (the multiply-add form rounds mean * r: NOTES v43).
// 0: the two passes always.
#ifndef CUNORM_FWD_SMEM_ONE_PASS
#define CUNORM_FWD_SMEM_ONE_PASS 1
#endif
#ifndef CUNORM_FWD_SMEM_ONE_PASS_RETRY
#define CUNORM_FWD_SMEM_ONE_PASS_RETRY 1
#endif



// ------------------------------------------------------------------------------------------
// v22: the full-row forward of 16-byte half-precision packs keeps its row in shared memory
// (row_norm.cuh, FwdInSmem; the kernel norm_fwd_smem below): three passes read it back, no
// value is live in registers through the reductions.
template <typename T, typename W, int VEC, int PACKS, int TPR, bool RMS, typename A>
__device__ __forceinline__ void fwd_rows_in_smem(const T* __restrict__ x, const RowMap& xmap, T* __restrict__ y,
                                                 const W* __restrict__ weight, const W* __restrict__ bias,
                                                 A* __restrict__ mean, A* __restrict__ rstd, i64 M, i64 N, A eps) {
  constexpr int kBlock = GroupShape<TPR>::kBlock, kRows = GroupShape<TPR>::kRows;
  constexpr i64 kTile = i64(TPR) * PACKS * VEC;
  // dynamic (PACKS * kBlock packs, the host's smem_row_bytes): past 48 KiB, static shared
  // memory is refused, and bf16 N = 32768 takes 64 KiB (v29)
  extern __shared__ __align__(16) unsigned char row_smem[];
  Pack<T, VEC>* const slots = reinterpret_cast<Pack<T, VEC>*>(row_smem);
  __shared__ A red[2 * kWarp];
  const Pack<T, VEC>* mine = slots + threadIdx.x;  // pack p at mine[p * kBlock]
  const int lane = threadIdx.x % TPR, ty = threadIdx.x / TPR;
  const i64 items = (M + kRows - 1) / kRows;
  constexpr bool kPackSum = CUNORM_FWD_PACK_SUM && sizeof(T) < sizeof(A);

  for (i64 it = blockIdx.x; it < items; it += gridDim.x) {  // block-uniform, as norm_fwd
    const i64 row = it * kRows + ty;
    const bool row_ok = row < M;
    const i64 safe_row = row_ok ? row : 0;
    const int limit = tile_limit(N, 0, kTile, row_ok);
    const T* xrow = x + xmap.offset(safe_row);
    stage_tile<VEC, PACKS, TPR, kBlock>(slots, xrow, limit, lane);
    copies_commit();
    constexpr bool kOnePass = CUNORM_FWD_SMEM_ONE_PASS && !RMS && sizeof(T) < sizeof(A);
    // as norm_fwd: the two passes sum x - pivot (v98's one pass loads it only where it falls back)
    A pivot = RMS || kOnePass ? A(0) : cvt<A>(xrow[0]);
    copies_wait<0>();

    // v42: a half-precision LayerNorm row that fills the tile (the usual case) takes every pass
    // without a bounds test a pack; one past M or of a shorter N keeps them. (RMSNorm lost
    // 0.00-0.05 of copy with it, NOTES v42; float32 x or float32 parameters would spill 32-76
    // bytes at these launch bounds, NVRTC -Xptxas -v.)
    constexpr bool kLean = !RMS && sizeof(T) < sizeof(A) && sizeof(W) == sizeof(T);
    const bool full = CUNORM_FWD_FULL_TILES && kLean && limit == kTile;
    auto each_pack = [&](auto&& body) {
      if (full) {
#pragma unroll
        for (int p = 0; p < PACKS; ++p) body(p);
      } else {
#pragma unroll
        for (int p = 0; p < PACKS; ++p)
          if (pack_col<VEC, TPR>(p, lane) < limit) body(p);
      }
    };
    A v[VEC];
    A mu = A(0), q = A(0), r;
    bool two_passes = true;
    if constexpr (kOnePass) {  // v98
      // the shifted sums of d = x - centre and d^2, whether they are trusted, mu (the mean of
      // d) and r; centre 0 first (Flag<true>: no subtraction), then, for a row not trusted,
      // the first pass's mean, which centres d to within rounding and a constant row exactly
      auto one_pass = [&](A centre, auto from_zero) {
        A s = A(0), ss = A(0);
        each_pack([&](int p) {
          unpack_words(read_slot(mine + p * kBlock), v);
#pragma unroll
          for (int k = 0; k < VEC; ++k) {
            const A d = decltype(from_zero)::value ? v[k] : v[k] - centre;
            s += d;
            ss += d * d;
          }
        });
        const A count = A(limit > 0 ? limit : 1);
        // uniform over the rows that share barriers, as the branch needs
        const bool distrusted = one_pass_distrusted<TPR>(s, ss, count, red);
        mu = s / count;
        r = rsqrt_acc(ss / count - mu * mu + eps);
        return !distrusted;
      };
      two_passes = false;
      if (!one_pass(A(0), Flag<true>{})) {
        if (CUNORM_FWD_SMEM_ONE_PASS_RETRY) {
          pivot = mu;
          one_pass(pivot, Flag<false>{});  // trusted but for rows of NaN or inf
        } else {  // v26's two passes about the first element
          pivot = cvt<A>(xrow[0]);
          mu = A(0);
          two_passes = true;
        }
      }
    }
    A shift = pivot + mu;
    // Half-precision x only: for float32 x the shift's rounding is the input's own precision at
    // that magnitude (v31: rows offset by 1e4, N = 4096: max |error| 5.8e-7 -> 4.9e-4).
    constexpr bool kShiftOnce = CUNORM_FWD_SHIFT_ONCE && sizeof(T) < sizeof(A);
    auto centred = [&](A value) { return kShiftOnce ? value - shift : value - pivot - mu; };
    // the two passes, and (v113, common.cuh pivot_far) again about pivot + mu for a row far
    // from its pivot, with every row it shares barriers with
#pragma unroll 1
    for (int pass = 0; two_passes; ++pass) {
      if constexpr (!RMS) {
        A s = A(0);
        each_pack([&](int p) {
          unpack_words(read_slot(mine + p * kBlock), v);
          if constexpr (kPackSum) {
            A ps = A(0);
#pragma unroll
            for (int k = 0; k < VEC; ++k) ps += v[k];
            s += ps - A(VEC) * pivot;
          } else {
#pragma unroll
            for (int k = 0; k < VEC; ++k) s += v[k] - pivot;
          }
        });
        mu = group_sum<TPR>(s, red) / A(limit > 0 ? limit : 1);
      }
      shift = pivot + mu;
      q = A(0);
      each_pack([&](int p) {
        unpack_words(read_slot(mine + p * kBlock), v);
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          const A d = centred(v[k]);
          q += d * d;
        }
      });
      q = group_sum<TPR>(q, red);
      r = rsqrt_acc(q / A(N) + eps);
      if (RMS || pass == 1 || !groups_any<TPR>(pivot_far(mu, q / A(limit > 0 ? limit : 1)))) break;
      pivot += mu;
    }
    if (lane == 0 && row_ok && rstd) {  // inference callers may skip the statistics
      if (!RMS) mean[row] = pivot + mu;
      rstd[row] = r;
    }
    T* yrow = y + safe_row * N;
    // v43, half-precision LayerNorm (RMSNorm read 0.01-0.03 lower with it): a weight and bias
    // given, the usual call, take an output pass without null tests and fills a pack. (xhat as
    // one FMA, x * r - shift * r, was tried and dropped: on a constant row shift * r rounds
    // to a y of 0.117 where 0 is exact, bf16 rows of 9984, NOTES v43.)
    auto out_pack = [&](int p, auto affine) {
      const int col = pack_col<VEC, TPR>(p, lane);
      A wv[VEC], bv[VEC], out[VEC];
      if constexpr (decltype(affine)::value) {
        unpack_words(load_raw<VEC>(weight + col), wv);
        unpack_words(load_raw<VEC>(bias + col), bv);
      } else {
        load_param<VEC>(weight, col, A(1), wv);
        load_param<VEC>(bias, col, A(0), bv);
      }
      unpack_words(read_slot(mine + p * kBlock), v);
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        out[k] = centred(v[k]) * r * wv[k] + bv[k];
      }
      store_pack<T>(yrow + col, out);
    };
    if (CUNORM_FWD_AFFINE_CASES && kLean && weight && bias)
      each_pack([&](int p) { out_pack(p, Flag<true>{}); });
    else
      each_pack([&](int p) { out_pack(p, Flag<false>{}); });
  }
}

// ------------------------------------------------------------------------------------------
// Forward. kFullRow writes y, mean, rstd; kChunkStats writes (tile mean, tile M2) pairs to
// `tile_stats` [M, C, 2]; kChunkApply reads the finalized statistics and writes y.
//
// LayerNorm sums x - pivot, the pivot being the tile's first element (a full row's first),
// taken again about pivot + mu where that lies far from the mean (v113): a row with a large
// common offset (1e4 + noise in fp32) then keeps its digits, where a plain fp32 sum of the
// raw values would lose them. y uses the shifted mean; the stored mean is pivot + shift.
// On the split path `tile_stats` [M, C, kTileStatWords] carries each tile's (pivot, mean
// less it, M2) and `row_shift` [M, 2] the row's (mean rounded, the rest) to the apply.
template <typename T, typename W, int VEC, int PACKS, int TPR, bool RMS, int MODE>
__global__ void __launch_bounds__(GroupShape<TPR>::kBlock)
norm_fwd(const T* __restrict__ x, CUNORM_ROWMAP_PARAMS(xm), T* __restrict__ y,
         const W* __restrict__ weight, const W* __restrict__ bias,
         typename AccOf<T>::type* __restrict__ mean, typename AccOf<T>::type* __restrict__ rstd,
         typename AccOf<T>::type* __restrict__ tile_stats,
         typename AccOf<T>::type* __restrict__ row_shift, i64 M, i64 N, i64 C,
         typename AccOf<T>::type eps) {
  typedef typename AccOf<T>::type A;
  constexpr int kRows = GroupShape<TPR>::kRows;
  constexpr i64 kTile = i64(TPR) * PACKS * VEC;
  __shared__ A smem[2 * kWarp];
  const RowMap xmap = CUNORM_ROWMAP(xm);
  const int lane = threadIdx.x % TPR, ty = threadIdx.x / TPR;
  const i64 items = (M + kRows - 1) / kRows * C;

  // Block-uniform loop: every thread runs every iteration, so the barriers in group_sum hold.
  for (i64 it = blockIdx.x; it < items; it += gridDim.x) {
    const i64 item = MODE == kChunkApply && CUNORM_SPLIT_L2_ORDER ? items - 1 - it : it;  // last to first
    const i64 row = item / C * kRows + ty;
    const i64 c0 = item % C * kTile;
    const bool row_ok = row < M;
    const i64 safe_row = row_ok ? row : 0;
    const int limit = tile_limit(N, c0, kTile, row_ok);
    const T* xrow = x + xmap.offset(safe_row);
    A v[PACKS][VEC];
    constexpr bool kStream = MODE == kChunkApply && CUNORM_SPLIT_L2_HINTS >= 1 && CUNORM_SPLIT_L2_ORDER;
    constexpr bool kStreamStores = kStream && CUNORM_SPLIT_L2_HINTS >= 2;
    load_tile<VEC, PACKS, TPR, false, kStream>(xrow + c0, limit, lane, v);

    // v becomes x - pivot, then x - pivot - mu (the centred value), in place; with the
    // one-pass statistics the output subtracts mu instead (mu_done false).
    A pivot = A(0), mu = A(0), r;
    bool mu_done = false;
    if constexpr (MODE == kChunkApply) {
      if constexpr (!RMS) {
        pivot = row_shift[safe_row * 2];
        mu = row_shift[safe_row * 2 + 1];
      }
      r = rstd[safe_row];
#pragma unroll
      for (int p = 0; p < PACKS; ++p)
#pragma unroll
        for (int k = 0; k < VEC; ++k) v[p][k] = v[p][k] - pivot - mu;
      mu_done = true;
    } else {
      A q = A(0);
#if CUNORM_FWD_ONE_PASS
      // One pass, one reduction: sums of t = x - pivot and of t^2 together, then the tile's
      // M2 = sum t^2 - (sum t)^2 / n. The pivot is one of the row's values, so t is centred
      // to within the row's spread and the subtraction keeps its digits; v stays x - pivot
      // and the output subtracts mu.
      if constexpr (!RMS) pivot = cvt<A>(xrow[0]);
      A s;
      shifted_sums<VEC, PACKS, TPR>(v, limit, lane, pivot, s, q);
      if constexpr (RMS) {
        q = group_sum<TPR>(q, smem);
      } else {
        group_sum2<TPR>(s, q, smem);
        const A n = A(limit > 0 ? limit : 1);
        mu = s / n;
        q = q - s * mu > A(0) ? q - s * mu : A(0);
      }
#else
      // the tile's first element (v113: a split row's tiles each about their own, merged in
      // double by norm_fwd_finalize)
      if constexpr (!RMS) pivot = cvt<A>(xrow[c0]);
      // v113 (common.cuh pivot_far): a tile far from its pivot is reloaded (v holds x -
      // pivot - mu, rounded) and centred again about pivot + mu, with every group it shares
      // barriers with (those about their own pivot + mu: as good a pivot); one copy of the
      // loop's body (two copies spilled 8-12 bytes in float32 tiles).
#pragma unroll 1
      for (int pass = 0;; ++pass) {
        q = centre_tile<VEC, PACKS, TPR, RMS>(v, limit, lane, pivot, smem, mu);
        if (RMS || pass == 1 || !groups_any<TPR>(pivot_far(mu, q / A(limit > 0 ? limit : 1)))) break;
        load_tile<VEC, PACKS, TPR>(xrow + c0, limit, lane, v);
        pivot += mu;
      }
      mu_done = true;
#endif
      if constexpr (MODE == kChunkStats) {
        if (lane == 0 && row_ok) {
          A* st = tile_stats + (row * C + item % C) * kTileStatWords;
          st[0] = pivot;
          st[1] = mu;
          st[2] = q;
        }
        continue;
      }
      r = rsqrt_acc(q / A(N) + eps);
      if (lane == 0 && row_ok && rstd) {  // inference callers may skip the statistics
        if (!RMS) mean[row] = pivot + mu;
        rstd[row] = r;
      }
    }
    T* ytile = y + (safe_row * N + c0);
#pragma unroll
    for (int p = 0; p < PACKS; ++p) {
      const int col = pack_col<VEC, TPR>(p, lane);
      if (col >= limit) continue;
      A wv[VEC], bv[VEC], out[VEC];
      load_param<VEC>(weight, c0 + col, A(1), wv);
      load_param<VEC>(bias, c0 + col, A(0), bv);
#pragma unroll
      for (int k = 0; k < VEC; ++k) out[k] = (mu_done ? v[p][k] : v[p][k] - mu) * r * wv[k] + bv[k];
      if constexpr (kStreamStores) store_pack_whole<T, true>(ytile + col, out);
      else store_pack<T>(ytile + col, out);
    }
  }
}

// The full-row forward with its row in shared memory (fwd_rows_in_smem): norm_fwd's
// arguments, so the host launches either the same way; its own kernel so the register
// tiles keep their launch bounds (an explicit minimum of one block an SM let NVRTC give
// them 6-16 more registers: fp32 40 -> 46-54).
template <typename T, typename W, int VEC, int PACKS, int TPR, bool RMS>
__global__ void __launch_bounds__(GroupShape<TPR>::kBlock, (FwdInSmem<T, W, VEC, PACKS, TPR>::min_blocks))
norm_fwd_smem(const T* __restrict__ x, CUNORM_ROWMAP_PARAMS(xm), T* __restrict__ y, const W* __restrict__ weight,
              const W* __restrict__ bias, typename AccOf<T>::type* __restrict__ mean,
              typename AccOf<T>::type* __restrict__ rstd, typename AccOf<T>::type* __restrict__ tile_stats,
              typename AccOf<T>::type* __restrict__ row_shift, i64 M, i64 N, i64 C, typename AccOf<T>::type eps) {
  static_assert(FwdInSmem<T, W, VEC, PACKS, TPR>::value, "a tile the host holds in shared memory");
  fwd_rows_in_smem<T, W, VEC, PACKS, TPR, RMS>(x, CUNORM_ROWMAP(xm), y, weight, bias, mean, rstd, M, N, eps);
}

// Merges the C tile summaries of each row into mean and rstd (split path). One warp a row;
// lanes fold tiles lane, lane + 32, ... in order, then a fixed tree folds the lanes, in
// double (v113): each tile's mean is its pivot plus its mean less the pivot, exact in double
// whatever the pivots, and the row's mean is rounded once, into row_shift[r, 0] (the apply's
// pivot, within rounding of the mean) and the remainder into row_shift[r, 1].
template <typename A, bool RMS>
__global__ void __launch_bounds__(128)
norm_fwd_finalize(const A* __restrict__ tile_stats, A* __restrict__ row_shift, A* __restrict__ mean,
                  A* __restrict__ rstd, i64 M, i64 N, i64 C, i64 tile, A eps) {
  const int lane = threadIdx.x % kWarp;
  const i64 warps = i64(gridDim.x) * (blockDim.x / kWarp);
  for (i64 row = i64(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp; row < M; row += warps) {
    const A* st = tile_stats + row * C * kTileStatWords;
    Welford<double> acc{0.0, 0.0, 0.0};
    for (i64 c = lane; c < C; c += kWarp) {
      const i64 n = N - c * tile < tile ? N - c * tile : tile;
      const A* t = st + c * kTileStatWords;
      acc.merge(Welford<double>{double(n), double(t[0]) + double(t[1]), double(t[2])});
    }
#pragma unroll
    for (int o = kWarp / 2; o > 0; o /= 2) {
      Welford<double> other{shfl_down(acc.count, o), shfl_down(acc.mean, o), shfl_down(acc.m2, o)};
      acc.merge(other);
    }
    if (lane == 0) {
      if (!RMS) {
        const A pivot = A(acc.mean);
        row_shift[row * 2] = pivot;
        row_shift[row * 2 + 1] = A(acc.mean - double(pivot));
        mean[row] = pivot;
      }
      // For RMS the tile "M2" is the plain sum of squares (tile mean is 0), so the merge adds
      // them up unchanged.
      rstd[row] = rsqrt_acc(A(acc.m2 / double(N)) + eps);
    }
  }
}

// ------------------------------------------------------------------------------------------
// Backward. dx = rstd * (w*dy - mean(w*dy) - xhat * mean(w*dy*xhat)), without the mean(w*dy)
// term for RMSNorm (row_norm.cuh holds the per-thread parts the cluster kernel shares).
//
// One row step: dx for this group's row of the tile at c0, from its x and dy tiles (xv is
// overwritten with xhat).
// With ACC, adds the row's dy*xhat and dy into the group's dW / dB accumulators. kFullRow
// computes the two row sums here; kChunkApply reads them from `row_sums` [M, 2] (split path).
// With WSLOTS (v71, in place only), the weight comes from the thread's stage_weight slots.
template <typename T, typename W, int VEC, int PACKS, int TPR, bool RMS, int MODE, bool ACC, bool WSLOTS = false,
          typename A>
__device__ __forceinline__ void bwd_row(A (&xv)[PACKS][VEC], A (&g)[PACKS][VEC], const W* __restrict__ weight,
                                        const RowStats<A>& st, const A* __restrict__ row_sums, T* __restrict__ dx,
                                        i64 row, i64 M, i64 N, i64 c0, int lane, A* smem, A (&dw_acc)[PACKS][VEC],
                                        A (&db_acc)[PACKS][VEC], const float4* wslots = nullptr) {
  constexpr i64 kTile = i64(TPR) * PACKS * VEC;
  const bool row_ok = row < M;
  const i64 safe_row = row_ok ? row : 0;
  const int limit = tile_limit(N, c0, kTile, row_ok);
  // in place (v61), a row past M takes 0 for both (its stats are row 0's, which need not be
  // finite), so it adds zeros to the accumulators (xhat_sums_wdy)
  constexpr bool kInPlace = WdyInPlace<T>::value;
  const A mu = kInPlace && !row_ok ? A(0) : st.mean, r = kInPlace && !row_ok ? A(0) : st.rstd;

  // xv becomes xhat; g stays dy, or becomes w*dy (row_norm.cuh, CUNORM_BWD_WDY_IN_PLACE)
  A c1, c2;
  if constexpr (WSLOTS) {
    static_assert(kInPlace && sizeof(A) == 4, "weight slots serve the in-place float accumulation");
    xhat_sums_wdy_with<VEC, PACKS, TPR, ACC>(
        xv, g, [&](int p, int, bool, A (&wv)[VEC]) { read_weight_slot<VEC, GroupShape<TPR>::kBlock>(wslots, p, wv); },
        limit, lane, mu, r, c1, c2, dw_acc, db_acc);
  } else {
    bwd_first_pass<VEC, PACKS, TPR, ACC, kInPlace>(xv, g, weight, c0, limit, lane, mu, r, c1, c2, dw_acc, db_acc);
  }
  if constexpr (MODE == kFullRow) {
    if constexpr (RMS) c2 = group_sum<TPR>(c2, smem);
    else group_sum2<TPR, kPairedRowSums<TPR>>(c1, c2, smem);
  } else {
    c1 = row_sums[safe_row * 2];
    c2 = row_sums[safe_row * 2 + 1];
  }
  const A inv_n = A(1) / A(N);
  bwd_dx_pass<T, VEC, PACKS, TPR, ACC, kInPlace>(xv, g, weight, r, RMS ? A(0) : c1 * inv_n, c2 * inv_n,
                                                 dx + (safe_row * N + c0), c0, limit, lane, dw_acc, db_acc);
}

// Row groups are persistent: group g handles rows g, g + G, ... and keeps its columns' dW =
// sum(dy * xhat) and dB = sum(dy) in registers, writing one fp32 (fp64) partial row per group
// at the end; norm_reduce_partials folds the G rows in fixed order. On the split path the
// block owns column tile blockIdx.x % C.
// BwdOccupancy (row_norm.cuh) holds one-pack tiles to two blocks an SM.

template <typename T, typename W, int VEC, int PACKS, int TPR, bool RMS, int MODE>
__global__ void __launch_bounds__(GroupShape<TPR>::kBlock, (BwdOccupancy<T, VEC, PACKS, TPR>::min_blocks))
norm_bwd(const T* __restrict__ dy, CUNORM_ROWMAP_PARAMS(dym), const T* __restrict__ x,
         CUNORM_ROWMAP_PARAMS(xm), const W* __restrict__ weight,
         const typename AccOf<T>::type* __restrict__ mean,
         const typename AccOf<T>::type* __restrict__ rstd,
         const typename AccOf<T>::type* __restrict__ row_sums, T* __restrict__ dx,
         typename AccOf<T>::type* __restrict__ dw_part,
         typename AccOf<T>::type* __restrict__ db_part, i64 M, i64 N, i64 C) {
  typedef typename AccOf<T>::type A;
  constexpr int kRows = GroupShape<TPR>::kRows;
  __shared__ A smem[2 * kWarp];
  const RowMap dymap = CUNORM_ROWMAP(dym), xmap = CUNORM_ROWMAP(xm);
  const int lane = threadIdx.x % TPR, ty = threadIdx.x / TPR;
  const i64 c0 = i64(blockIdx.x % C) * (i64(TPR) * PACKS * VEC);
  const i64 group_block = blockIdx.x / C;
  const i64 stride = i64(gridDim.x / C) * kRows;  // rows advanced per step, = groups G

  A dw_acc[PACKS][VEC], db_acc[PACKS][VEC];
  zero_tile(dw_acc);
  zero_tile(db_acc);

  if constexpr (MODE == kFullRow && Staged<T, VEC>::value) {
    // dynamic shared memory: [depth buffers][x, dy][PACKS][block] packs (_row_norm.stage_bytes)
    extern __shared__ __align__(16) unsigned char stage_smem[];
    constexpr int kBlock = GroupShape<TPR>::kBlock, kSet = PACKS * kBlock, kDepth = StagePolicy<TPR, RMS>::depth;
    Pack<T, VEC>* slots = reinterpret_cast<Pack<T, VEC>*>(stage_smem);
    __shared__ A stats[kDepth * 2 * StatsSlots<TPR, kBlock>::value];  // rows' mean and rstd, where staged
    constexpr int kRingBytes = kDepth * 2 * kSet * int(sizeof(Pack<T, VEC>));
    constexpr bool kWeightSlots = CUNORM_BWD_WEIGHT_SMEM && WdyInPlace<T>::value && VEC % 4 == 0 &&
                                  WeightSlotsFit<kRingBytes, PACKS * VEC * 4 * kBlock>::value;
    __shared__ __align__(16) float4 wslots[kWeightSlots ? PACKS * VEC / 4 * kBlock : 1];
    if constexpr (kWeightSlots) stage_weight<VEC, PACKS, TPR, kBlock>(wslots, weight, c0, N, lane);
    // a row's backward from ring buffer buf, however its copies were issued and waited for;
    // its statistics read after its x and dy (stats_of(): the order both loops were tuned in)
    auto staged_row = [&](int buf, auto stats_of, i64 row) {
      A xv[PACKS][VEC], g[PACKS][VEC];
      unstage_tile<VEC, PACKS, kBlock>(slots + 2 * buf * kSet, xv);
      unstage_tile<VEC, PACKS, kBlock>(slots + (2 * buf + 1) * kSet, g);
      bwd_row<T, W, VEC, PACKS, TPR, RMS, MODE, true, kWeightSlots>(xv, g, weight, stats_of(), row_sums, dx, row, M, N,
                                                                    c0, lane, smem, dw_acc, db_acc, wslots);
    };
    if constexpr (BulkRows<T, VEC, TPR, RMS>::value) {
      // 16-byte packs: the host gives them only rows that start on 16-byte boundaries (x, dy
      // and every row stride; _launch.pick_vec, tests/test_dispatch.py), as a bulk copy needs
      __shared__ unsigned long long bars[kDepth];  // a buffer's row: its bytes and 2 arrivals
      __shared__ A row_stats_of[kDepth * 2];       // [buffer][mean, rstd]
      const int limit = tile_limit(N, c0, i64(TPR) * PACKS * VEC, true);
      const unsigned bytes = unsigned(limit) * unsigned(sizeof(T));
#pragma unroll
      for (int b = 0; b < 2 * kDepth; ++b)
#pragma unroll
        for (int p = 0; p < PACKS; ++p)
          if (pack_col<VEC, TPR>(p, lane) >= limit) slots[b * kSet + p * kBlock + threadIdx.x] = Pack<T, VEC>{};
      if (threadIdx.x == 0)
        for (int b = 0; b < kDepth; ++b) mbar_init(&bars[b], 2);
      __syncthreads();
      // by thread 0, into buffer b whose last row every thread has read (the previous
      // step's sums passed a block barrier after those reads); rows past M are never read,
      // so never copied, and every row copied is waited for before the loop ends
      auto issue = [&](i64 r, int b) {
        if (threadIdx.x != 0 || r >= M) return;
        mbar_arrive_expect(&bars[b], 2 * bytes);
        bulk_copy(slots + 2 * b * kSet, x + xmap.offset(r) + c0, bytes, &bars[b]);
        bulk_copy(slots + (2 * b + 1) * kSet, dy + dymap.offset(r) + c0, bytes, &bars[b]);
        copy_row_stats<RMS>(row_stats_of + 2 * b, row_stats_of + 2 * b + 1, mean, rstd, r);
        mbar_arrive_copies(&bars[b]);
      };
      StageRing<kDepth> ring;
      ring.fill([&](int ahead, int b) { issue(group_block + ahead * stride, b); });
      unsigned parity = 0;  // bit b: the phase buffer b's next row completes
      for (i64 row = group_block; row < M; row += stride) {  // block-uniform
        ring.refill([&](int ahead, int b) { issue(row + ahead * stride, b); });
        const int buf = ring.buf;
        mbar_wait(&bars[buf], (parity >> buf) & 1u);
        parity ^= 1u << buf;
        staged_row(buf, [&] { return RowStats<A>{RMS ? A(0) : row_stats_of[2 * buf], row_stats_of[2 * buf + 1]}; }, row);
        ring.advance();
      }
    } else {
      auto stage_row = [&](i64 base, int buf) {  // rows past M stage zeros, never read
        const i64 r = base + ty;
        const i64 safe = r < M ? r : 0;
        const int limit = tile_limit(N, c0, i64(TPR) * PACKS * VEC, r < M);
        stage_tile<VEC, PACKS, TPR, kBlock>(slots + 2 * buf * kSet, x + xmap.offset(safe) + c0, limit, lane);
        stage_tile<VEC, PACKS, TPR, kBlock>(slots + (2 * buf + 1) * kSet, dy + dymap.offset(safe) + c0, limit, lane);
        stage_stats<RMS, TPR, kBlock>(stats, buf, mean, rstd, r, M);
        copies_commit();
      };
      StageRing<kDepth> ring;
      ring.fill([&](int ahead, int b) { stage_row(group_block * kRows + ahead * stride, b); });
      for (i64 base = group_block * kRows; base < M; base += stride) {  // block-uniform
        ring.refill_and_wait([&](int ahead, int b) { stage_row(base + ahead * stride, b); });
        const int buf = ring.buf;
        staged_row(buf, [&] { return staged_stats<RMS, TPR, kBlock>(stats, buf, mean, rstd, base + ty, M); }, base + ty);
        ring.advance();
      }
      copies_wait<0>();  // the copies past the last row land before the block's shared memory goes
    }
  } else {
    for (i64 base = group_block * kRows; base < M; base += stride) {  // block-uniform
      A xv[PACKS][VEC], g[PACKS][VEC];
      load_row<VEC, PACKS, TPR>(dy, dymap, x, xmap, base + ty, M, N, c0, lane, xv, g);
      bwd_row<T, W, VEC, PACKS, TPR, RMS, MODE, true>(xv, g, weight, row_stats<RMS>(mean, rstd, base + ty, M),
                                                       row_sums, dx, base + ty, M, N, c0, lane, smem, dw_acc, db_acc);
    }
  }

  store_partials<VEC, PACKS, TPR>(dw_acc, db_acc, dw_part, db_part, group_block * kRows + ty, N, c0, lane);
}

// Backward of rows of 8193-16384 elements (32768 for half-precision RMSNorm, v66 below) on
// one GPU block a row (v63): 1024 threads, 16 bytes of x a thread in each of two (half
// precision) or four (float32, v65) packs. The
// row's x is staged in shared memory (64 KiB a row, DEPTH rows in the ring), and so is dy for
// half precision (another 64 KiB); both passes read them from there, so registers hold only
// the thread's 32 dW / dB accumulators and one pack at a time. A float32 row's dy would make
// 128 KiB a row, so it is loaded from global memory in each pass instead (the second read
// mostly from L2). The register tile of two packs (norm_bwd) would need 64 values live next
// to the accumulators; the staged cluster backward (layer_norm_cluster.cu), which took the
// half-precision rows before, pays a cluster barrier a row (ncu at N = 16384: barrier stalls
// 4.25 cycles an issue against 1.05 at 8192, NOTES v63). The arguments are norm_bwd's;
// row_sums and C are unused. Persistent: one dW / dB partial row a block
// (norm_reduce_partials folds them).
// COLS is the tile (columns a block holds). v66: half-precision RMSNorm rows of
// 16385-32768 elements the float32 way, four packs of 8 a thread, x staged and dy loaded in
// each pass: RMSNorm has no dB, so its 32 dW accumulators fit where LayerNorm's 64 would not
// (one SM's 64K registers could not hold a 32768-column row's dW and dB at all).
// The rows are row_norm.cuh's wide_bwd_rows, which the cluster form (layer_norm_cluster.cu
// norm_bwd_wide_cluster, v68) shares.
template <typename T, typename W, bool RMS, int DEPTH, int COLS>
__global__ void __launch_bounds__(1024, 1)
norm_bwd_wide(const T* __restrict__ dy, CUNORM_ROWMAP_PARAMS(dym), const T* __restrict__ x,
              CUNORM_ROWMAP_PARAMS(xm), const W* __restrict__ weight, const float* __restrict__ mean,
              const float* __restrict__ rstd, const float* __restrict__ row_sums, T* __restrict__ dx,
              float* __restrict__ dw_part, float* __restrict__ db_part, i64 M, i64 N, i64 C) {
  wide_bwd_rows<T, W, RMS, DEPTH, COLS>(dy, CUNORM_ROWMAP(dym), x, CUNORM_ROWMAP(xm), weight, mean, rstd, dx,
                                        dw_part, db_part, M, N, 0, blockIdx.x, gridDim.x, blockIdx.x,
                                        [](float&, float&) {});
}

// Column blocks of norm_bwd_columns: lanes of kColLanes threads span kColLanes * VEC
// columns (one 128-byte line of bf16 / fp32 at the widest pack), the block's other threads
// step down the rows; each thread sums dy * xhat and dy over its rows in order, then a
// fixed tree over the row lanes in shared memory gives the column's total.
constexpr int kColLanes = 8;  // = cunorm/_config.py COLUMN_LANES

template <int BLOCK, int VEC, typename A, typename W>
__device__ __forceinline__ void column_total(A (&acc)[VEC], A* red, W* out, i64 col, bool col_ok) {
  constexpr int kRowLanes = BLOCK / kColLanes;
#pragma unroll
  for (int k = 0; k < VEC; ++k) red[threadIdx.x * VEC + k] = acc[k];
  __syncthreads();
  const int rl = threadIdx.x / kColLanes;
#pragma unroll
  for (int h = kRowLanes / 2; h > 0; h /= 2) {
    if (rl < h) {
#pragma unroll
      for (int k = 0; k < VEC; ++k) red[threadIdx.x * VEC + k] += red[(threadIdx.x + h * kColLanes) * VEC + k];
    }
    __syncthreads();
  }
  if (rl == 0 && col_ok) {
    A v[VEC];
#pragma unroll
    for (int k = 0; k < VEC; ++k) v[k] = red[threadIdx.x * VEC + k];
    store_pack<W>(out + col, v);
  }
  __syncthreads();  // red is reused by the next gradient
}

// Backward for few rows, in one launch and without partial rows: blocks [0, row_blocks)
// write dx (row groups as in norm_bwd, no accumulators); the remaining blocks each own
// kColLanes * VEC columns and reduce dW = sum(dy * xhat) and dB = sum(dy) over all M rows,
// written straight to `dw` / `db` in W. x and dy are read twice (once by each kind of block),
// which for few rows costs less than G partial rows written and read back, and a second
// launch (benchmarks/NOTES.md, v6).
template <typename T, typename W, int VEC, int PACKS, int TPR, bool RMS>
__global__ void __launch_bounds__(GroupShape<TPR>::kBlock)
norm_bwd_columns(const T* __restrict__ dy, CUNORM_ROWMAP_PARAMS(dym), const T* __restrict__ x,
                 CUNORM_ROWMAP_PARAMS(xm), const W* __restrict__ weight,
                 const typename AccOf<T>::type* __restrict__ mean,
                 const typename AccOf<T>::type* __restrict__ rstd, T* __restrict__ dx,
                 W* __restrict__ dw, W* __restrict__ db, i64 M, i64 N, i64 row_blocks) {
  typedef typename AccOf<T>::type A;
  constexpr int kBlock = GroupShape<TPR>::kBlock, kRows = GroupShape<TPR>::kRows;
  constexpr int kRowLanes = kBlock / kColLanes;
  __shared__ A smem[2 * kWarp];
  __shared__ A red[kBlock * VEC];
  const RowMap dymap = CUNORM_ROWMAP(dym), xmap = CUNORM_ROWMAP(xm);
  if (blockIdx.x < row_blocks) {
    const int lane = threadIdx.x % TPR, ty = threadIdx.x / TPR;
    A unused[PACKS][VEC];
    for (i64 base = i64(blockIdx.x) * kRows; base < M; base += row_blocks * kRows) {  // block-uniform
      A xv[PACKS][VEC], g[PACKS][VEC];
      load_row<VEC, PACKS, TPR>(dy, dymap, x, xmap, base + ty, M, N, 0, lane, xv, g);
      bwd_row<T, W, VEC, PACKS, TPR, RMS, kFullRow, false>(xv, g, weight, row_stats<RMS>(mean, rstd, base + ty, M),
                                                            static_cast<const A*>(nullptr), dx, base + ty, M, N, 0,
                                                            lane, smem, unused, unused);
    }
    return;
  }
  const i64 col = ((i64(blockIdx.x) - row_blocks) * kColLanes + threadIdx.x % kColLanes) * VEC;
  const bool col_ok = col < N;  // VEC > 1 only when N % VEC == 0: a pack is wholly in or out
  A dwa[VEC], dba[VEC];
#pragma unroll
  for (int k = 0; k < VEC; ++k) { dwa[k] = A(0); dba[k] = A(0); }
  if (col_ok) {
#pragma unroll 4
    for (i64 r = threadIdx.x / kColLanes; r < M; r += kRowLanes) {
      A xv[VEC], g[VEC];
      load_pack<A, T, VEC>(x + xmap.offset(r) + col, xv);
      load_pack<A, T, VEC>(dy + dymap.offset(r) + col, g);
      const A mu = RMS ? A(0) : mean[r], rs = rstd[r];
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        dwa[k] += g[k] * ((xv[k] - mu) * rs);
        dba[k] += g[k];
      }
    }
  }
  if (dw) column_total<kBlock, VEC>(dwa, red, dw, col, col_ok);
  if (db) column_total<kBlock, VEC>(dba, red, db, col, col_ok);
}

// Split-path backward, first step: per tile partial sums of w*dy and w*dy*xhat -> [M, C, 2].
template <typename T, typename W, int VEC, int PACKS, int TPR, bool RMS>
__global__ void __launch_bounds__(GroupShape<TPR>::kBlock)
norm_bwd_tile_sums(const T* __restrict__ dy, CUNORM_ROWMAP_PARAMS(dym), const T* __restrict__ x,
                   CUNORM_ROWMAP_PARAMS(xm), const W* __restrict__ weight,
                   const typename AccOf<T>::type* __restrict__ mean,
                   const typename AccOf<T>::type* __restrict__ rstd,
                   typename AccOf<T>::type* __restrict__ tile_sums, i64 M, i64 N, i64 C) {
  typedef typename AccOf<T>::type A;
  constexpr i64 kTile = i64(TPR) * PACKS * VEC;
  static_assert(GroupShape<TPR>::kRows == 1, "split tiles are one block each");
  __shared__ A smem[2 * kWarp];
  const RowMap dymap = CUNORM_ROWMAP(dym), xmap = CUNORM_ROWMAP(xm);
  const int lane = threadIdx.x;
  for (i64 it = blockIdx.x; it < M * C; it += gridDim.x) {
    const i64 row = it / C, c0 = it % C * kTile;
    const int limit = tile_limit(N, c0, kTile, true);
    A xv[PACKS][VEC], g[PACKS][VEC];
    load_tile<VEC, PACKS, TPR>(x + xmap.offset(row) + c0, limit, lane, xv);
    load_tile<VEC, PACKS, TPR>(dy + dymap.offset(row) + c0, limit, lane, g);
    A c1, c2;
    xhat_and_sums<VEC, PACKS, TPR>(xv, g, weight, c0, limit, lane, RMS ? A(0) : mean[row], rstd[row], c1, c2);
    group_sum2<TPR>(c1, c2, smem);
    if (lane == 0) {
      tile_sums[it * 2] = c1;
      tile_sums[it * 2 + 1] = c2;
    }
  }
}

// Split-path backward, second step: row_sums[r] = sum over tiles of tile_sums[r], fixed order.
template <typename A>
__global__ void __launch_bounds__(128)
norm_bwd_finalize(const A* __restrict__ tile_sums, A* __restrict__ row_sums, i64 M, i64 C) {
  const int lane = threadIdx.x % kWarp;
  const i64 warps = i64(gridDim.x) * (blockDim.x / kWarp);
  for (i64 row = i64(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp; row < M; row += warps) {
    const A* ts = tile_sums + row * C * 2;
    A c1 = A(0), c2 = A(0);
    for (i64 c = lane; c < C; c += kWarp) { c1 += ts[2 * c]; c2 += ts[2 * c + 1]; }
    c1 = group_warp_sum<kWarp>(c1);
    c2 = group_warp_sum<kWarp>(c2);
    if (lane == 0) { row_sums[row * 2] = c1; row_sums[row * 2 + 1] = c2; }
  }
}

// dW / dB: out[col] = sum over g of part[g, col], the G partial rows folded in a fixed tree.
// blockIdx.y picks the weight (0) or bias (1) gradient; an absent one has a null `out`.
// Blocks of 1024 threads: blockDim.y = R row lanes (a power of two up to 32, the host's
// next power of two of G) by blockDim.x = 1024 / R columns. Lane y sums rows y, y + R, ...
// in order, then a tree folds the lanes; for G <= R the lanes past G hold zeros, so any R
// >= G gives the same bits as R = 32. (With R fixed at 32, the split backward's few partial
// rows at N = 1M launched 65536 blocks of mostly idle threads: v30.)
template <typename A, typename OUT>
__global__ void __launch_bounds__(1024)
norm_reduce_partials(const A* __restrict__ dw_part, OUT* __restrict__ dw,
                     const A* __restrict__ db_part, OUT* __restrict__ db, i64 G, i64 N) {
  __shared__ A tile[1024 + 32];  // [R][blockDim.x + 1]: the padding keeps lanes off one bank
  const A* part = blockIdx.y == 0 ? dw_part : db_part;
  OUT* out = blockIdx.y == 0 ? dw : db;
  if (out == nullptr) return;
  const int lanes = blockDim.y, width = blockDim.x + 1;
  const i64 col = i64(blockIdx.x) * blockDim.x + threadIdx.x;
  A s = A(0);
  if (col < N)
    for (i64 g = threadIdx.y; g < G; g += lanes) s += part[g * N + col];
  tile[threadIdx.y * width + threadIdx.x] = s;
  __syncthreads();
  for (int h = lanes / 2; h > 0; h /= 2) {
    if (threadIdx.y < h) tile[threadIdx.y * width + threadIdx.x] += tile[(threadIdx.y + h) * width + threadIdx.x];
    __syncthreads();
  }
  if (threadIdx.y == 0 && col < N) out[col] = cvt<OUT>(tile[threadIdx.x]);
}
