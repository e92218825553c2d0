// Shared device code for every cunorm kernel: compute-type traits, vector packs,
// conversions, row addressing and warp/block reductions. Nothing op-specific lives here.
//
// The host inlines this file into each .cu before compiling (CuPy's disk-cache key covers
// the source string only, so an #include'd header edit would otherwise run stale kernels).
#pragma once

// CUDA by default. Compiled by hipcc for an AMD target (HIP source), the few
// CUDA-only names the kernels use map onto HIP's: the half and bfloat16 types and their
// conversions, and the warp shuffles (AMD wavefronts have no lane masks). Only compiling for
// AMD is verified (CI, tests/test_compile.py); running there is not (benchmarks/NOTES.md).
#if defined(__HIP__) || defined(__HIP_PLATFORM_AMD__)  // clang defines __HIP__ for HIP source
#define CUNORM_HIP 1
#include <hip/hip_runtime.h>
#include <hip/hip_fp16.h>
#include <hip/hip_bfloat16.h>
typedef hip_bfloat16 __nv_bfloat16;
__device__ __forceinline__ float __bfloat162float(__nv_bfloat16 v) { return static_cast<float>(v); }
__device__ __forceinline__ __nv_bfloat16 __float2bfloat16_rn(float v) { return __nv_bfloat16(v); }  // nearest even
__device__ __forceinline__ __nv_bfloat16 __double2bfloat16(double v) { return __nv_bfloat16(static_cast<float>(v)); }
// through float: a second rounding CUDA's direct conversion does not make (float64 -> half only)
__device__ __forceinline__ __half __double2half(double v) { return __float2half(static_cast<float>(v)); }
#else
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#endif

#ifndef CUNORM_WARP_SIZE
#if defined(CUNORM_HIP)
#define CUNORM_WARP_SIZE 64  // AMD wavefronts; every reduction below is written against it
#else
#define CUNORM_WARP_SIZE 32
#endif
#endif

namespace cunorm {

typedef long long i64;
constexpr int kWarp = CUNORM_WARP_SIZE;

// Warp shuffles over all lanes of the warp (CUDA's full mask; HIP's wavefront has none).
template <typename T>
__device__ __forceinline__ T shfl_xor(T v, int lane_mask, int width = kWarp) {
#if defined(CUNORM_HIP)
  return __shfl_xor(v, lane_mask, width);
#else
  return __shfl_xor_sync(0xffffffffu, v, lane_mask, width);
#endif
}

template <typename T>
__device__ __forceinline__ T shfl_down(T v, unsigned delta) {
#if defined(CUNORM_HIP)
  return __shfl_down(v, delta);
#else
  return __shfl_down_sync(0xffffffffu, v, delta);
#endif
}

// Whether the predicate holds on any lane of the warp (every lane calls it together).
__device__ __forceinline__ bool warp_any(bool p) {
#if defined(CUNORM_HIP)
  return __any(p);
#else
  return __any_sync(0xffffffffu, p);
#endif
}

// A barrier of the warp that also orders its threads' shared-memory accesses.
__device__ __forceinline__ void sync_warp() {
#if defined(CUNORM_HIP)
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "wavefront");
  __builtin_amdgcn_wave_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "wavefront");
#else
  __syncwarp();
#endif
}

// ---- compute-type traits ------------------------------------------------------------
// Half-precision and float inputs accumulate in float, double in double.
template <typename T> struct AccOf { typedef float type; };
template <> struct AccOf<double> { typedef double type; };

// ---- conversions ---------------------------------------------------------------------
template <typename To> struct Cvt;
template <> struct Cvt<float> {
  static __device__ __forceinline__ float from(float v) { return v; }
  static __device__ __forceinline__ float from(double v) { return static_cast<float>(v); }
  static __device__ __forceinline__ float from(__half v) { return __half2float(v); }
  static __device__ __forceinline__ float from(__nv_bfloat16 v) { return __bfloat162float(v); }
};
template <> struct Cvt<double> {
  static __device__ __forceinline__ double from(float v) { return v; }
  static __device__ __forceinline__ double from(double v) { return v; }
  static __device__ __forceinline__ double from(__half v) { return __half2float(v); }
  static __device__ __forceinline__ double from(__nv_bfloat16 v) { return __bfloat162float(v); }
};
template <> struct Cvt<__half> {
  static __device__ __forceinline__ __half from(float v) { return __float2half_rn(v); }
  static __device__ __forceinline__ __half from(double v) { return __double2half(v); }
};
template <> struct Cvt<__nv_bfloat16> {
  static __device__ __forceinline__ __nv_bfloat16 from(float v) { return __float2bfloat16_rn(v); }
  static __device__ __forceinline__ __nv_bfloat16 from(double v) { return __double2bfloat16(v); }
};

template <typename To, typename From>
__device__ __forceinline__ To cvt(From v) { return Cvt<To>::from(v); }

__device__ __forceinline__ float rsqrt_acc(float v) { return rsqrtf(v); }
__device__ __forceinline__ double rsqrt_acc(double v) { return rsqrt(v); }

// ---- vector packs --------------------------------------------------------------------
// A pack of VEC elements, loaded and stored as one (or, past 16 bytes, several) wide memory
// operations. The host only picks VEC > 1 when every pointer and row stride is aligned to
// min(16, VEC * sizeof(T)) bytes and the row length is a multiple of VEC.
template <typename T, int VEC>
struct alignas(sizeof(T) * VEC < 16 ? sizeof(T) * VEC : 16) Pack {
  T v[VEC];
};

template <typename A, typename T, int VEC>
__device__ __forceinline__ void unpack(const Pack<T, VEC>& pk, A (&out)[VEC]) {
#pragma unroll
  for (int k = 0; k < VEC; ++k) out[k] = cvt<A>(pk.v[k]);
}

// bf16 to float is the 16 bits moved into a float's high half. A pack read as 32-bit words
// takes one instruction a value (the low element shifted up, the high one masked), where
// NVRTC converts each 16-bit half and spends a PRMT and a shift on the high one; the same
// values either way. Used where it measured faster (the shared-memory forward: bf16
// LayerNorm +0.00-0.06 of copy, NOTES v41); in every kernel, the RMSNorm bf16 backward at
// N = 512 lost 0.06-0.08. 0: element by element.
#ifndef CUNORM_BF16_WORDS
#define CUNORM_BF16_WORDS 1
#endif
template <typename T> struct IsBf16 { static constexpr bool value = false; };
template <> struct IsBf16<__nv_bfloat16> { static constexpr bool value = true; };

template <typename A, typename T, int VEC>
__device__ __forceinline__ void unpack_words(const Pack<T, VEC>& pk, A (&out)[VEC]) {
  if constexpr (CUNORM_BF16_WORDS && IsBf16<T>::value && sizeof(A) == 4 && VEC % 2 == 0) {  // to float
    const unsigned* words = reinterpret_cast<const unsigned*>(&pk);
#pragma unroll
    for (int k = 0; k < VEC / 2; ++k) {
      out[2 * k] = __uint_as_float(words[k] << 16);
      out[2 * k + 1] = __uint_as_float(words[k] & 0xffff0000u);
    }
  } else {
    unpack(pk, out);
  }
}

// unpack, or unpack_words where WORDS: the kernels' word switches (CUNORM_*_WORDS) pick it.
template <bool WORDS, typename A, typename T, int VEC>
__device__ __forceinline__ void widen(const Pack<T, VEC>& pk, A (&out)[VEC]) {
  if constexpr (WORDS) unpack_words(pk, out);
  else unpack(pk, out);
}

// The pack is copied into registers first: unpack() reading through a reference into global
// memory compiled to one narrow load an element (the LayerNorm bf16 forward fell from 0.75 to
// 0.46 of copy in the GPU check until this copy came back). WORDS: widened as widen says.
template <typename A, typename T, int VEC, bool WORDS = false>
__device__ __forceinline__ void load_pack(const T* p, A (&out)[VEC]) {
  const Pack<T, VEC> pk = *reinterpret_cast<const Pack<T, VEC>*>(p);
  widen<WORDS>(pk, out);
}

// The raw pack (held in its own width until used: half the registers of converted bf16).
// STREAM: a 16-byte pack loaded with .cs (evict first in L1 and L2) for a pass whose data is
// dead once read (v118, the split forward's apply); other packs, and HIP, load plainly.
template <int VEC, bool STREAM = false, typename T>
__device__ __forceinline__ Pack<T, VEC> load_raw(const T* p) {
#if !defined(CUNORM_HIP)
  if constexpr (STREAM && sizeof(Pack<T, VEC>) == 16) {
    const uint4 v = __ldcs(reinterpret_cast<const uint4*>(p));
    Pack<T, VEC> pk;
    *reinterpret_cast<uint4*>(&pk) = v;
    return pk;
  }
#endif
  return *reinterpret_cast<const Pack<T, VEC>*>(p);
}

// VEC values rounded to T, as one pack.
template <typename T, typename A, int VEC>
__device__ __forceinline__ Pack<T, VEC> convert_pack(const A (&in)[VEC]) {
  Pack<T, VEC> pk;
#pragma unroll
  for (int k = 0; k < VEC; ++k) pk.v[k] = cvt<T>(in[k]);
  return pk;
}

template <typename T, typename A, int VEC>
__device__ __forceinline__ void store_pack(T* p, const A (&in)[VEC]) {
  *reinterpret_cast<Pack<T, VEC>*>(p) = convert_pack<T>(in);
}

// One 16-byte global store as one instruction (v47). NVVM split some kernels' pack stores:
// the backwards' dx packs into four 4-byte stores (st.global.v2.u16 in the PTX), the cluster
// forward's y packs into 2-byte ones, half of each dW / dB partial pack into 4-byte ones;
// four to eight store instructions a pack. Used only there: in the forwards held to 32-40
// registers (norm_fwd_smem, float32 norm_fwd), whose stores stayed whole, it made NVRTC
// spill 8-216 bytes. Measured in benchmarks/NOTES.md, v47 (float32 backward N = 8192
// 0.80 -> 0.89-0.92 of copy). CUNORM_STORE16=0: the plain store (benchmarks/sweep_store16.py).
#ifndef CUNORM_STORE16
#define CUNORM_STORE16 1
#endif
// STREAM: with .cs (evict first in L1 and L2: output this call will not read again, v118).
template <bool STREAM = false>
__device__ __forceinline__ void store16_global(void* p, uint4 v) {
#if defined(CUNORM_HIP)
  *static_cast<uint4*>(p) = v;
#else  // the memory clobber keeps other accesses on their side (without it: the same speed, v47)
  if constexpr (STREAM) __stcs(static_cast<uint4*>(p), v);
  else asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                    : "memory");
#endif
}

// store_pack to global memory in whole 16-byte chunks where the pack is made of them
// (STREAM as store16_global's).
template <typename T, bool STREAM = false, typename A, int VEC>
__device__ __forceinline__ void store_pack_whole(T* p, const A (&in)[VEC]) {
  if constexpr (CUNORM_STORE16 && sizeof(Pack<T, VEC>) % 16 == 0) {  // Pack's alignment is 16 here
    const Pack<T, VEC> pk = convert_pack<T>(in);
#pragma unroll
    for (int c = 0; c < int(sizeof(pk)) / 16; ++c)
      store16_global<STREAM>(reinterpret_cast<uint4*>(p) + c, reinterpret_cast<const uint4*>(&pk)[c]);
  } else {
    store_pack<T>(p, in);
  }
}

// The 32-bit address in the shared window that PTX's .shared instructions take (CUDA only).
#if !defined(CUNORM_HIP)
__device__ __forceinline__ unsigned shared_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
#endif

// ---- asynchronous copies global -> shared (cp.async; plain copies on HIP) --------------------
// A thread's copies land in shared memory without passing through its registers; it waits
// for its own with copies_wait (a barrier then shows them to the block).
__device__ __forceinline__ void copy16_async(void* smem, const void* gmem, bool inside) {
#if defined(CUNORM_HIP)
  *static_cast<uint4*>(smem) = inside ? *static_cast<const uint4*>(gmem) : make_uint4(0, 0, 0, 0);
#else
  const unsigned dst = shared_address(smem);
  // src-size 0 fills the chunk with zeros (packs past the row)
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(inside ? 16 : 0)
               : "memory");
#endif
}

__device__ __forceinline__ void copy4_async(void* smem, const void* gmem) {
#if defined(CUNORM_HIP)
  *static_cast<unsigned*>(smem) = *static_cast<const unsigned*>(gmem);
#else
  const unsigned dst = shared_address(smem);
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(gmem) : "memory");
#endif
}

// CP (4, 8 or 16) bytes, of which the first ``bytes`` are read and the rest filled with zeros
// (a span's end inside a chunk: nothing past it is read).
template <int CP>
__device__ __forceinline__ void copy_async_part(void* smem, const void* gmem, int bytes) {
#if defined(CUNORM_HIP)
  for (int k = 0; k < CP; ++k)
    static_cast<unsigned char*>(smem)[k] = k < bytes ? static_cast<const unsigned char*>(gmem)[k] : 0;
#else
  const unsigned dst = shared_address(smem);
  if constexpr (CP == 16)  // .cg (L2 only) exists for 16-byte copies alone
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(bytes) : "memory");
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(gmem), "n"(CP), "r"(bytes)
                 : "memory");
#endif
}

__device__ __forceinline__ void copies_commit() {
#if !defined(CUNORM_HIP)
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

// Waits until at most PENDING committed groups of this thread's copies are still in flight.
template <int PENDING>
__device__ __forceinline__ void copies_wait() {
#if !defined(CUNORM_HIP)
  asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING) : "memory");
#endif
}

// copies_wait for a count known at run time (0-3; more waits as for 3, never less): one wait where
// the caller's loop is unrolled.
__device__ __forceinline__ void copies_wait_upto(int pending) {
  if (pending <= 0) copies_wait<0>();
  else if (pending == 1) copies_wait<1>();
  else if (pending == 2) copies_wait<2>();
  else copies_wait<3>();
}


// ---- bulk copies global -> shared (sm_90: cp.async.bulk, completed on an mbarrier) -------
// v86: one thread copies a whole row (16-byte aligned, a multiple of 16 bytes) with one
// instruction, where cp.async needs one a thread; the row's mbarrier completes when the bytes
// have landed and its expected arrivals have come, and any thread that waits on its phase
// then sees them. On other targets kBulkCopies is false and callers take cp.async.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && !defined(CUNORM_HIP)
#define CUNORM_BULK_COPIES 1
#else
#define CUNORM_BULK_COPIES 0
#endif
constexpr bool kBulkCopies = CUNORM_BULK_COPIES;

// One thread initialises the barrier for `arrivals` arrivals a phase; a block barrier must
// follow before any thread uses it.
__device__ __forceinline__ void mbar_init(unsigned long long* bar, unsigned arrivals) {
#if CUNORM_BULK_COPIES
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(shared_address(bar)), "r"(arrivals) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

// An arrival that also tells the barrier to expect `bytes` more from bulk copies this phase.
__device__ __forceinline__ void mbar_arrive_expect(unsigned long long* bar, unsigned bytes) {
#if CUNORM_BULK_COPIES
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(shared_address(bar)), "r"(bytes)
               : "memory");
#endif
}

// `bytes` (a multiple of 16; both addresses 16-byte aligned) from global to shared memory,
// counted against `bar`'s expected bytes.
__device__ __forceinline__ void bulk_copy(void* smem, const void* gmem, unsigned bytes, unsigned long long* bar) {
#if CUNORM_BULK_COPIES
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   shared_address(smem)),
               "l"(gmem), "r"(bytes), "r"(shared_address(bar))
               : "memory");
#endif
}

// K (1 or 2) floats into the shared memory of cluster rank `rank` at this block's `local`
// address, counted as 4 K bytes against that rank's mbarrier at this block's `bar` address:
// no fence, the barrier's phase completion makes them visible to its waiters (the pushed
// exchanges of layer_norm_cluster.cu; K = 2 needs `local` 8-byte aligned).
template <int K>
__device__ __forceinline__ void push_cluster_values(float* local, unsigned long long* bar, unsigned rank,
                                             const float (&v)[K]) {
  static_assert(K == 1 || K == 2, "one or two floats a push");
#if CUNORM_BULK_COPIES
  unsigned remote, remote_bar;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(shared_address(local)), "r"(rank));
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote_bar) : "r"(shared_address(bar)), "r"(rank));
  if constexpr (K == 2)
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [%0], {%1, %2}, [%3];" ::"r"(remote),
                 "f"(v[0]), "f"(v[1]), "r"(remote_bar)
                 : "memory");
  else
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.f32 [%0], %1, [%2];" ::"r"(remote),
                 "f"(v[0]), "r"(remote_bar)
                 : "memory");
#endif
}

// An arrival on `bar` once this thread's earlier cp.async copies have landed (counted in the
// barrier's arrivals: .noinc).
__device__ __forceinline__ void mbar_arrive_copies(unsigned long long* bar) {
#if CUNORM_BULK_COPIES
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(shared_address(bar)) : "memory");
#endif
}

// Waits for the phase of parity `parity` to complete (acquire: its copies are visible).
__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned parity) {
#if CUNORM_BULK_COPIES
  asm volatile(
      "{\n .reg .pred done;\n WAIT:\n mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n @!done bra WAIT;\n}\n" ::"r"(
          shared_address(bar)),
      "r"(parity)
      : "memory");
#endif
}

// A compile-time branch taken by a generic lambda (``if constexpr (decltype(flag)::value)``).
template <bool B> struct Flag { static constexpr bool value = B; };
// A compile-time choice of type (std::conditional, which NVRTC's headers lack).
template <bool B, typename A, typename C> struct Select { typedef A type; };
template <typename A, typename C> struct Select<false, A, C> { typedef C type; };
// A type without its reference (std::remove_reference): a forwarding reference's deduced
// type names the reference for an lvalue argument.
template <typename T> struct RemoveRef { typedef T type; };
template <typename T> struct RemoveRef<T&> { typedef T type; };
template <typename T> struct RemoveRef<T&&> { typedef T type; };

// ---- row addressing ------------------------------------------------------------------
// Maps a flat row index to an element offset for up to four leading axes with arbitrary
// strides (the host collapses the leading axes first, so the common cases are one axis).
// inner sizes n1..n3 belong to the three innermost leading axes, s0..s3 are their strides.
// A RowMap as seven kernel arguments (the host's Rows.args() order), and back.
#define CUNORM_ROWMAP_PARAMS(p) i64 p##_s0, i64 p##_s1, i64 p##_s2, i64 p##_s3, i64 p##_n1, i64 p##_n2, i64 p##_n3
#define CUNORM_ROWMAP(p) RowMap{p##_s0, p##_s1, p##_s2, p##_s3, p##_n1, p##_n2, p##_n3}

struct RowMap {
  i64 s0, s1, s2, s3;
  i64 n1, n2, n3;
  __device__ __forceinline__ i64 offset(i64 r) const {
    if (n1 == 1 && n2 == 1 && n3 == 1) return r * s0;
    const i64 i3 = r % n3; r /= n3;
    const i64 i2 = r % n2; r /= n2;
    const i64 i1 = r % n1;
    const i64 i0 = r / n1;
    return i0 * s0 + i1 * s1 + i2 * s2 + i3 * s3;
  }
};

// v113: a LayerNorm row whose pivot (its first element) lies more than four standard
// deviations from its mean (mu^2 > kRepivotFar var, mu the mean less the pivot) takes its
// statistics again about pivot + mu, within rounding of the mean: every d = x - pivot is
// then about the pivot's distance, and float32 sums of them lose the mean's low digits
// (rows of 32768 with x[0] = 600: y 1.3x float32's tolerance; NOTES "Rows whose first
// element is an outlier"). Ordinary rows take it about once in 16000. NaN and inf rows:
// false. 0: never (as before v113). BatchNorm's staged kernels re-pivot a channel the same
// way (v53).
#ifndef CUNORM_REPIVOT
#define CUNORM_REPIVOT 1
#endif
constexpr int kRepivotFar = 16;
template <typename A>
__device__ __forceinline__ bool pivot_far(A mu, A var) {
  return CUNORM_REPIVOT && mu * mu > A(kRepivotFar) * var;
}

// ---- reductions ----------------------------------------------------------------------
// Butterfly sums over aligned groups of WIDTH lanes. Every lane of the group ends with the
// same bits (each step adds the same two operands, only swapped), so results never depend
// on which lane stores them, and the fixed tree makes them identical run after run.
template <int WIDTH, typename A>
__device__ __forceinline__ A group_warp_sum(A v) {
#pragma unroll
  for (int o = WIDTH / 2; o > 0; o /= 2) v += shfl_xor(v, o, WIDTH);
  return v;
}

// v72: the second level of a group's sum, over its kWarps warp partials, as a butterfly of
// kWarps lanes, each lane reading partial lane % kWarps, instead of 32 lanes with zeros past
// kWarps: log2(32 / kWarps) shuffle-adds fewer a value (3 at 128-thread rows). The same
// bits: the dropped steps added exact zeros. H200, two rounds (benchmarks/
// sweep_bwd_overhead.py): bf16 norm_bwd N = 1024 / 2048 / 4096 LayerNorm +0.034 / +0.025 /
// +0.013 of copy, RMSNorm +0.01-0.02; forwards within 0.004; float32 LayerNorm backward
// 4096 -0.008 and the fused RMSNorm backward 2048 -0.005-0.01, the cases it lost. 0: 32 lanes.
#ifndef CUNORM_NARROW_SECOND_SUM
#define CUNORM_NARROW_SECOND_SUM 1
#endif

// Lane `lane`'s share of the group's kWarps partials at smem[first ..], summed over the warp.
template <int kWarps, typename A>
__device__ __forceinline__ A second_level_sum(const A* partials, int lane) {
  if constexpr (CUNORM_NARROW_SECOND_SUM) return group_warp_sum<kWarps>(partials[lane % kWarps]);
  else return group_warp_sum<kWarp>(lane < kWarps ? partials[lane] : A(0));
}

// v84: two sums in one butterfly. A butterfly's first step over WIDTH lanes adds each lane's
// value to its partner's across the group's halves; for two sums the lower half keeps a's
// pair sums and the upper half b's (one shuffle, not two), and the remaining log2(WIDTH) - 1
// steps run on that one value. Each lane adds the same operands in the same order as two
// group_warp_sum calls, so the sums keep their bits. ncu's source counters (twenty-fourth
// session, bf16 LayerNorm backward at N = 8192, 283 instructions a warp a row) put 40 of
// them in the two sums' shuffles and adds. 0: two butterflies everywhere.
#ifndef CUNORM_PAIRED_SUM2
#define CUNORM_PAIRED_SUM2 1
#endif

// The lower half of each aligned WIDTH-lane group returns a's group sum, the upper half b's.
template <int WIDTH, typename A>
__device__ __forceinline__ A paired_half_sum(A a, A b) {
  const bool upper = threadIdx.x & (WIDTH / 2);
  A keep = upper ? b : a;
  keep += shfl_xor(upper ? a : b, WIDTH / 2, WIDTH);
  return group_warp_sum<WIDTH / 2>(keep);
}

// paired_half_sum's result back into both sums on every lane of the group.
template <int WIDTH, typename A>
__device__ __forceinline__ void unpair(A half, A& a, A& b) {
  const bool upper = threadIdx.x & (WIDTH / 2);
  const A other = shfl_xor(half, WIDTH / 2, WIDTH);
  a = upper ? other : half;
  b = upper ? half : other;
}

// group_sum2's sums before its closing barrier (TPR > warp: that barrier is the caller's, so
// smem may be reused only after it). PAIRED: one butterfly for both sums at each level.
template <int TPR, bool PAIRED = false, typename A>
__device__ __forceinline__ void group_sum2_open(A& a, A& b, A* smem) {
  constexpr int kWarps = TPR / kWarp;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int first = warp / kWarps * kWarps;  // the group's first warp
  static_assert(kWarps >= 2 && (kWarps & (kWarps - 1)) == 0, "a butterfly of a power of two of warps");
  if constexpr (PAIRED && CUNORM_NARROW_SECOND_SUM) {
    // lane 0 holds the warp's a, lane kWarp / 2 its b; the second level pairs the same way,
    // each lane reading its own partial and its first step's partner from smem
    const A half = paired_half_sum<kWarp>(a, b);
    if (lane % (kWarp / 2) == 0) smem[lane / (kWarp / 2) * kWarp + warp] = half;
    __syncthreads();
    const int i = lane % kWarps;
    const A* partials = smem + (lane & (kWarps / 2) ? kWarp : 0) + first;
    unpair<kWarps>(group_warp_sum<kWarps / 2>(partials[i] + partials[i ^ (kWarps / 2)]), a, b);
  } else {
    a = group_warp_sum<kWarp>(a);
    b = group_warp_sum<kWarp>(b);
    if (lane == 0) { smem[warp] = a; smem[kWarp + warp] = b; }
    __syncthreads();
    a = second_level_sum<kWarps>(smem + first, lane);
    b = second_level_sum<kWarps>(smem + kWarp + first, lane);
  }
}

// Sum over the TPR threads of a row group. TPR <= warp: shuffles only. TPR > warp: the
// group is TPR / warp whole warps of the block (several groups may share a block); warp
// partials go through `smem` (2 * kWarp elements) behind block-wide barriers, so every
// thread of the block must call it together. Every thread returns its group's total; ends
// with a barrier so `smem` can be reused at once. Two sums at once (backward needs sum(w*dy)
// and sum(w*dy*xhat) together) share one barrier pair.
template <int TPR, bool PAIRED = false, typename A>
__device__ __forceinline__ void group_sum2(A& a, A& b, A* smem) {
  if constexpr (TPR <= kWarp) {
    a = group_warp_sum<TPR>(a);
    b = group_warp_sum<TPR>(b);
  } else {
    group_sum2_open<TPR, PAIRED>(a, b, smem);
    __syncthreads();
  }
}

// group_sum2, returning as well whether `flag(a, b)` holds on the totals of any row group
// that shares barriers with this one: the block's groups (TPR > warp; the closing barrier
// is a __syncthreads_or) or the warp's (TPR <= warp, whose sums take no barrier). A branch
// on it is uniform wherever the reductions inside it need every thread. v98: the block's
// answer passes through a warp vote as well, which changes no bit of it but lets the
// compiler see the branch as uniform over the warp: without it a branch on the answer spilled
// 80-130 bytes at 32 registers in the shared-memory forward (NVRTC 13, sm_90), none with it.
// 0: the barrier's answer alone.
#ifndef CUNORM_UNIFORM_ANY
#define CUNORM_UNIFORM_ANY 1
#endif
template <int TPR, typename A, typename Flag>
__device__ __forceinline__ bool group_sum2_any(A& a, A& b, A* smem, Flag flag) {
  if constexpr (TPR <= kWarp) {
    a = group_warp_sum<TPR>(a);
    b = group_warp_sum<TPR>(b);
    return warp_any(flag(a, b));
  } else {
    group_sum2_open<TPR>(a, b, smem);
    const bool any = __syncthreads_or(flag(a, b));
    return CUNORM_UNIFORM_ANY ? warp_any(any) : any;
  }
}

// group_sum's sum before its closing barrier (TPR > warp: as group_sum2_open).
template <int TPR, typename A>
__device__ __forceinline__ A group_sum_open(A v, A* smem) {
  if constexpr (TPR <= kWarp) {
    return group_warp_sum<TPR>(v);
  } else {
    constexpr int kWarps = TPR / kWarp;
    const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
    const int first = warp / kWarps * kWarps;  // the group's first warp
    v = group_warp_sum<kWarp>(v);
    if (lane == 0) smem[warp] = v;
    __syncthreads();
    return second_level_sum<kWarps>(smem + first, lane);
  }
}

template <int TPR, typename A>
__device__ __forceinline__ A group_sum(A v, A* smem) {
  v = group_sum_open<TPR>(v, smem);
  if constexpr (TPR > kWarp) __syncthreads();
  return v;
}

// Chan et al.'s merge of two (count, mean, M2) summaries; exact in exact arithmetic and
// free of the cancellation that E[x^2] - E[x]^2 suffers for large means.
template <typename A>
struct Welford {
  A count, mean, m2;
  __device__ __forceinline__ void merge(const Welford& o) {
    if (o.count == A(0)) return;
    if (count == A(0)) { *this = o; return; }
    const A n = count + o.count;
    const A delta = o.mean - mean;
    const A frac = o.count / n;
    mean += delta * frac;
    m2 += o.m2 + delta * delta * count * frac;
    count = n;
  }
};

// ---- grid barriers through an arrival counter in global memory (blocks that all run at once:
// a cooperative launch; the host zeroes the counters). CUDA only (sm_80: acquire loads).
#if !defined(CUNORM_HIP)
__device__ __forceinline__ unsigned load_acquire_gpu(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// This block's arrival at a step's barrier: thread 0, after the block barrier that follows
// every group's partials (the fence publishes them, cumulatively, before the arrival; the
// pattern of cooperative_groups' grid sync).
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

// ---- thread-block clusters (sm_90 PTX: cooperative_groups' cluster API needs libcu++
// headers that NVRTC's wheels do not ship). Callers guard their use to sm_90 and later.
#if !defined(CUNORM_HIP)
__device__ __forceinline__ unsigned cluster_rank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

// All threads of all blocks of the cluster. Relaxed: the one thread whose shared write must
// be seen across the cluster fences it first (cluster_fence); the default release/acquire
// barrier compiled to a GPU-wide MEMBAR on every thread, which also waits for the previous
// row's global stores.
__device__ __forceinline__ void cluster_barrier() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n\tbarrier.cluster.wait.aligned;" ::: "memory");
}

// cluster_barrier in two halves, for work between them (v90): a thread arrives once, then
// waits once, before it arrives again.
__device__ __forceinline__ void cluster_arrive() { asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory"); }
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.aligned;" ::: "memory"); }

__device__ __forceinline__ void cluster_fence() { asm volatile("fence.acq_rel.cluster;" ::: "memory"); }

__device__ __forceinline__ unsigned cluster_address(const void* local, unsigned rank) {
  const unsigned addr = shared_address(local);
  unsigned remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(addr), "r"(rank));
  return remote;
}

// The float (double) at `local` (a shared-memory variable) in the block of cluster rank `rank`.
__device__ __forceinline__ float load_cluster(const float* local, unsigned rank) {
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(cluster_address(local, rank)) : "memory");
  return v;
}

__device__ __forceinline__ double load_cluster(const double* local, unsigned rank) {
  double v;
  asm volatile("ld.shared::cluster.f64 %0, [%1];" : "=d"(v) : "r"(cluster_address(local, rank)) : "memory");
  return v;
}
#endif

}  // namespace cunorm
