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
// Cluster operations are PTX (sm_90): cooperative_groups' cluster API needs libcu++ headers
// that NVRTC's wheels do not ship, and CI compiles every kernel without a CUDA install.
#include "common.cuh"

using namespace cunorm;

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

__device__ __forceinline__ void cluster_fence() { asm volatile("fence.acq_rel.cluster;" ::: "memory"); }

// The float at `local` (a shared-memory variable) in the block of cluster rank `rank`.
__device__ __forceinline__ float load_cluster(const float* local, unsigned rank) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(local));
  unsigned remote;
  float v;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(addr), "r"(rank));
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote) : "memory");
  return v;
}

// The sum over the cluster of one value a block, in rank order, the same bits in every block.
// `slot` is this block's shared word for this exchange: exchanges alternate two slots, since
// a block may still be reading the other one of its neighbours. Every thread of every block
// of the cluster calls it; it ends with the cluster-wide barrier's reads done block-locally.
template <int CLUSTER>
__device__ __forceinline__ float cluster_sum(float block_value, float* slot, float* bcast) {
  typedef float A;
  if (threadIdx.x == 0) {
    *slot = block_value;
    cluster_fence();
  }
  cluster_barrier();  // every block's slot written (and the previous use of *bcast read)
  if (threadIdx.x < kWarp) {
    A v = threadIdx.x < CLUSTER ? load_cluster(slot, threadIdx.x) : A(0);
    v = group_warp_sum<kWarp>(v);
    if (threadIdx.x == 0) *bcast = v;
  }
  __syncthreads();
  return *bcast;
}

// The row's mean (relative to the pivot) and M2 from each block's slice sum and slice M2
// (about the slice's own mean), merged in rank order: the same bits in every block. `slot`
// holds this block's two words for this exchange (alternating as in cluster_sum); a rank's
// element count follows from its rank, the row length and the slice width.
template <int CLUSTER>
__device__ __forceinline__ void cluster_mean_m2(float sum, float m2, float* slot, float* bcast, i64 n, i64 slice,
                                                float& mean, float& row_m2) {
  typedef float A;
  if (threadIdx.x == 0) {
    slot[0] = sum;
    slot[1] = m2;
    cluster_fence();
  }
  cluster_barrier();
  if (threadIdx.x < kWarp) {
    const i64 c0 = i64(threadIdx.x) * slice;
    const bool rank = threadIdx.x < CLUSTER;
    const A s = rank ? load_cluster(slot, threadIdx.x) : A(0);
    const A q = rank ? load_cluster(slot + 1, threadIdx.x) : A(0);
    const A count = !rank || n <= c0 ? A(0) : A(n - c0 < slice ? n - c0 : slice);
    const A mu = group_warp_sum<kWarp>(s) / A(n);
    const A d = count > A(0) ? s / count - mu : A(0);
    const A total = group_warp_sum<kWarp>(q + count * d * d);
    if (threadIdx.x == 0) {
      bcast[0] = mu;
      bcast[1] = total;
    }
  }
  __syncthreads();
  mean = bcast[0];
  row_m2 = bcast[1];
}

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
  __shared__ A bcast[2];
  static_assert(sizeof(A) == 4, "clusters serve float accumulation (float64 takes the split path)");
  const unsigned rank = cluster_rank();
  const i64 c0 = i64(rank) * kSlice;
  const int limit = N <= c0 ? 0 : int(N - c0 < kSlice ? N - c0 : kSlice);
  const RowMap xmap = CUNORM_ROWMAP(xm);
  const i64 clusters = gridDim.x / CLUSTER;
  int exchange = 0;

  for (i64 row = blockIdx.x / CLUSTER; row < M; row += clusters) {  // uniform over the cluster
    const T* xrow = x + xmap.offset(row);
    Pack<T, VEC> raw[PACKS];  // the slice stays in its own width: half the registers for bf16
#pragma unroll
    for (int p = 0; p < PACKS; ++p) {
      const int col = (p * TPB + int(threadIdx.x)) * VEC;
      if (col < limit) raw[p] = load_raw<VEC>(xrow + c0 + col);
    }
    A pivot = A(0), slice_sum = A(0), slice_mu = A(0), q = A(0);
    if constexpr (!RMS) {
      pivot = cvt<A>(xrow[0]);
      A s = A(0);
#pragma unroll
      for (int p = 0; p < PACKS; ++p) {
        if ((p * TPB + int(threadIdx.x)) * VEC >= limit) continue;
        A v[VEC];
        unpack(raw[p], v);
#pragma unroll
        for (int k = 0; k < VEC; ++k) s += v[k] - pivot;
      }
      slice_sum = group_sum<TPB>(s, smem);
      slice_mu = limit > 0 ? slice_sum / A(limit) : A(0);
    }
#pragma unroll
    for (int p = 0; p < PACKS; ++p) {
      if ((p * TPB + int(threadIdx.x)) * VEC >= limit) continue;
      A v[VEC];
      unpack(raw[p], v);
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        const A d = v[k] - pivot - slice_mu;
        q += d * d;
      }
    }
    q = group_sum<TPB>(q, smem);
    A mu = A(0), var;  // mu: the row's mean less the pivot
    if constexpr (RMS) {
      var = cluster_sum<CLUSTER>(q, &slots[exchange][0], &bcast[0]) / A(N);
    } else {
      A m2;
      cluster_mean_m2<CLUSTER>(slice_sum, q, slots[exchange], bcast, N, kSlice, mu, m2);
      var = m2 / A(N);
    }
    const A r = rsqrt_acc(var + eps);
    exchange ^= 1;
    if (threadIdx.x == 0 && rank == 0 && rstd) {  // inference callers may skip them
      if (!RMS) mean[row] = pivot + mu;
      rstd[row] = r;
    }
    T* yrow = y + row * N + c0;
#pragma unroll
    for (int p = 0; p < PACKS; ++p) {
      const int col = (p * TPB + int(threadIdx.x)) * VEC;
      if (col >= limit) continue;
      A v[VEC], wv[VEC], bv[VEC], out[VEC];
      unpack(raw[p], v);
      if (weight) load_pack<A, W, VEC>(weight + c0 + col, wv);
      if (bias) load_pack<A, W, VEC>(bias + c0 + col, bv);
#pragma unroll
      for (int k = 0; k < VEC; ++k)
        out[k] = (v[k] - pivot - mu) * r * (weight ? wv[k] : A(1)) + (bias ? bv[k] : A(0));
      store_pack<T>(yrow + col, out);
    }
  }
  cluster_barrier();  // no block leaves while another may still read its slots
}
