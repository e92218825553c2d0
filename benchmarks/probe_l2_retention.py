"""How much of a buffer one kernel read a second kernel finds in L2 (no profiler replay: ncu's
memory save and restore between passes disturbs the L2 it would measure, NOTES "Where the
BatchNorm passes' second read comes from"). The split row forward past the clusters and the
BatchNorm passes at (128, 64, 112, 112) read x twice, once a kernel; whether the second read
can come from L2 decides whether ordering or chunking those passes can win anything (v110's
L2-sized chunks of the split forward lost; bn_l2_reuse.py found only ~1/5 of a 25.7 MB x
in L2 for the BatchNorm apply, on a 60 MB L2).

For buffers of S MiB, each timed as the median of REPS (events around the second kernel
only; a 256 MiB read before each rep flushes L2):
  cold       the read kernel alone, after the flush
  same       a read, then the same read again (same block order)
  reversed   a read, then the read with its blocks in reverse order
  rev+write  a read, then a reversed read that writes as many bytes elsewhere (an apply
             pass), against the same read-and-write kernel after the flush
  chunked rev+write  the same with each block walking a contiguous chunk of its own, forward
             then backward (the BatchNorm channels-last statistics and apply passes' walk)
  chunked rev+write.cs  the same with the second kernel's stores streaming (st.global.cs):
             whether writes that do not stay in L2 leave more of the source there
  chunked rev+write.cs+ldcs  and its loads streaming too (ld.global.cs): a line the apply
             has read is dead, and should not be kept over lines it has yet to read
  last half  a read, then a read of the buffer's second half alone (the bytes read last)
and each warm case's bytes from L2 as (cold - warm) / cold x S, against the L2's size.
The read kernels are persistent grids of BLOCKS_PER_SM 1024-thread blocks an SM, 16-byte
loads, a block's chunk a step, the sum written per block so nothing is optimised away.

    python benchmarks/probe_l2_retention.py [--json out.json]
"""
from __future__ import annotations

import argparse
import json

import cupy
import numpy

SIZES_MIB = (8, 16, 24, 32, 40, 48, 64)
REPS = 15
FLUSH_MIB = 256
BLOCKS_PER_SM = 2
THREADS = 1024

_SOURCE = r"""
// pack i read (and copied to dst where given), with the streaming bits below
__device__ __forceinline__ float touch(const float4* __restrict__ src, float4* __restrict__ dst, long long i,
                                       int streaming) {
  const float4 v = (streaming & 2) ? __ldcs(src + i) : src[i];
  if (dst) {
    if (streaming & 1) __stcs(dst + i, v);
    else dst[i] = v;
  }
  return v.x + v.y + v.z + v.w;
}

extern "C" __global__ void read_sum(const float4* __restrict__ src, float4* __restrict__ dst, long long n16,
                                    int reverse, int chunked, int streaming, float* __restrict__ sink) {
  // interleaved: block b walks steps b, b + grid, ... of blockDim packs (the whole grid sweeps
  // the buffer from its start); chunked: block b walks its own contiguous chunk of n16 / grid
  // packs (the BatchNorm channels-last passes' walk); reverse: the same packs, last first;
  // streaming bit 1: dst stored with st.global.cs (evict first), so the writes need not push
  // the source's lines out of L2; bit 2: src loaded with ld.global.cs, so a line read (dead to
  // an apply pass from then on) is not kept over the source's lines still to be read
  const long long step = blockDim.x;
  float acc = 0.f;
  if (chunked) {
    const long long per = (n16 + gridDim.x - 1) / gridDim.x, p0 = blockIdx.x * per;
    const long long p1 = p0 + per < n16 ? p0 + per : n16;
    const long long trips = p1 > p0 ? (p1 - p0 + step - 1) / step : 0;
    for (long long k = 0; k < trips; ++k) {
      const long long i = p0 + (reverse ? trips - 1 - k : k) * step + threadIdx.x;
      if (i < p1) {
        acc += touch(src, dst, i, streaming);
      }
    }
  } else {
    const long long chunks = (n16 + step - 1) / step;
    for (long long k = blockIdx.x; k < chunks; k += gridDim.x) {
      const long long c = reverse ? chunks - 1 - k : k;
      const long long i = c * step + threadIdx.x;
      if (i < n16) {
        acc += touch(src, dst, i, streaming);
      }
    }
  }
  if (acc == 12345.678f) sink[blockIdx.x] = acc;  // never true for the ones written below
}
"""


def _kernel():
    return cupy.RawKernel(_SOURCE, "read_sum")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    kern = _kernel()
    dev = cupy.cuda.Device()
    sms = dev.attributes["MultiProcessorCount"]
    l2 = dev.attributes["L2CacheSize"]
    grid = sms * BLOCKS_PER_SM
    sink = cupy.zeros(grid, numpy.float32)
    flush_buf = cupy.ones(FLUSH_MIB << 18, numpy.float32)

    def read(src, n16, reverse=0, dst=None, chunked=0, streaming=0):
        kern((grid,), (THREADS,), (src, dst if dst is not None else numpy.uint64(0), numpy.int64(n16),
                                   numpy.int32(reverse), numpy.int32(chunked), numpy.int32(streaming), sink))

    def flush():
        read(flush_buf, flush_buf.size // 4)

    def timed(first, second) -> float:
        times = []
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        for _ in range(REPS):
            flush()
            if first is not None:
                first()
            start.record()
            second()
            end.record()
            end.synchronize()
            times.append(cupy.cuda.get_elapsed_time(start, end) * 1e3)
        return float(numpy.median(times))

    print(f"{dev.pci_bus_id}: {sms} SMs, L2 {l2 >> 20} MiB; grid {grid} x {THREADS}; medians of {REPS}")
    rows = []
    for mib in SIZES_MIB:
        buf = cupy.ones(mib << 18, numpy.float32)
        out = cupy.empty_like(buf)
        half = buf[: buf.size // 2]
        n16, h16 = buf.size // 4, half.size // 4
        cold = timed(None, lambda: read(buf, n16))
        cases = {
            "same": timed(lambda: read(buf, n16), lambda: read(buf, n16)),
            "reversed": timed(lambda: read(buf, n16), lambda: read(buf, n16, 1)),
            "rev+write": timed(lambda: read(buf, n16), lambda: read(buf, n16, 1, out)),
            # the BatchNorm channels-last statistics pass, then its apply
            "chunked rev+write": timed(lambda: read(buf, n16, chunked=1), lambda: read(buf, n16, 1, out, 1)),
            # and with the apply's stores streaming (st.global.cs)
            "chunked rev+write.cs": timed(lambda: read(buf, n16, chunked=1), lambda: read(buf, n16, 1, out, 1, 1)),
            # and its loads too (ld.global.cs)
            "chunked rev+write.cs+ldcs": timed(lambda: read(buf, n16, chunked=1), lambda: read(buf, n16, 1, out, 1, 3)),
        }
        cold_write = timed(None, lambda: read(buf, n16, 1, out))
        cold_chunked = timed(None, lambda: read(buf, n16, 1, out, 1))
        cold_cs = timed(None, lambda: read(buf, n16, 1, out, 1, 1))
        cold_cs_ld = timed(None, lambda: read(buf, n16, 1, out, 1, 3))
        bases = {"rev+write": cold_write, "chunked rev+write": cold_chunked, "chunked rev+write.cs": cold_cs,
                 "chunked rev+write.cs+ldcs": cold_cs_ld}
        row = {"MiB": mib, "cold_us": round(cold, 2), "cold_write_us": round(cold_write, 2),
               "cold_chunked_write_us": round(cold_chunked, 2), "cold_chunked_write_cs_us": round(cold_cs, 2),
               "cold_chunked_write_cs_ldcs_us": round(cold_cs_ld, 2)}
        line = f"{mib:4d} MiB: cold {cold:7.1f} us ({mib * 1.048576 / cold * 1e3:6.0f} GB/s)"
        for name, t in cases.items():
            base = bases.get(name, cold)
            from_l2 = max(0.0, (base - t) / base) * mib
            row[name + "_us"], row[name + "_from_l2_MiB"] = round(t, 2), round(from_l2, 1)
            line += f"; {name} {t:7.1f} us (~{from_l2:4.1f} MiB from L2)"
        # the second half read again right after the whole buffer's forward read: the last
        # bytes read, the likeliest to be in L2
        tail = timed(lambda: read(buf, n16), lambda: read(buf[buf.size // 2:], h16))
        tail_cold = timed(None, lambda: read(buf[buf.size // 2:], h16))
        row["tail_half_us"], row["tail_half_cold_us"] = round(tail, 2), round(tail_cold, 2)
        line += f"; last half again {tail:6.1f} us (cold {tail_cold:6.1f})"
        print(line, flush=True)
        rows.append(row)
        del buf, out, half
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"sms": sms, "l2_bytes": l2, "grid": grid, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
