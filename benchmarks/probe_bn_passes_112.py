"""Issue 5's last forward misses, (128, 64, 112, 112) NCHW / NHWC (bf16 0.582 / 0.588 of copy
on an H100, the passes: statistics, finalize, apply), one pass at a time: each launch's own
kernel time (bn_pass_times) under the pass grids' settings, against what a read of the same
bytes and a copy of them take on this GPU (the roofline each pass has: the statistics pass
reads x, the apply reads x and writes y). NOTES "BatchNorm v49".

    python benchmarks/probe_bn_passes_112.py [--variants a,b]
"""
from __future__ import annotations

import argparse

import numpy

from cunorm import _bench, _compile
from cunorm._checks import BFLOAT16
from cunorm.ops import _batch_norm
from bn_pass_times import _use as use_settings, call_times  # benchmarks/ is the script's directory
from _sweep_cli import rebuild_batch_norm

SHAPE = (128, 64, 112, 112)
SETTINGS = ("BLOCKS_PER_SM", "BLOCKS_PER_SM_CL", "CL_GRID_FITS", "FLAT_PACKS", "NC_GRID_FITS", "NC_GRID_FITS_BWD_SUMS")
# name: (NVRTC defines, host settings of _batch_norm)
VARIANTS = {
    "default": ((), {}),
    "nc_grid_fits": ((), {"NC_GRID_FITS": True, "NC_GRID_FITS_BWD_SUMS": True}),
    "nc_fits_off": ((), {"NC_GRID_FITS": False, "NC_GRID_FITS_BWD_SUMS": False}),
    "nc_blocks_4": ((), {"BLOCKS_PER_SM": 4, "NC_GRID_FITS": False}),
    "nc_blocks_12": ((), {"BLOCKS_PER_SM": 12}),
    "nc_blocks_16": ((), {"BLOCKS_PER_SM": 16}),
    "nc_blocks_24": ((), {"BLOCKS_PER_SM": 24}),
    "cl_blocks_2": ((), {"BLOCKS_PER_SM_CL": 2}),
    "cl_blocks_8": ((), {"BLOCKS_PER_SM_CL": 8}),
    "flat_packs_4": ((), {"FLAT_PACKS": 4}),
    "flat_packs_16": ((), {"FLAT_PACKS": 16}),
    "ring_4": (("-DCUNORM_BN_CL_RING=4",), {}),
    "ring_16": (("-DCUNORM_BN_CL_RING=16",), {}),
    "default_again": ((), {}),
    "nc_grid_fits_again": ((), {"NC_GRID_FITS": True, "NC_GRID_FITS_BWD_SUMS": True}),
}

# A read of n 16-byte words, each thread U words in flight a trip, a sum kept so the loads
# stay: the statistics pass's roofline.
_READ_SRC = r"""
extern "C" __global__ void read16(const int4* __restrict__ x, long long n, int* out) {
  int acc = 0;
  const long long stride = (long long)gridDim.x * blockDim.x;
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    int4 a = x[i], b = x[i + stride], c = x[i + 2 * stride], d = x[i + 3 * stride];
    acc ^= a.x ^ a.w ^ b.y ^ b.z ^ c.x ^ c.w ^ d.y ^ d.z;
  }
  for (; i < n; i += stride) acc ^= x[i].x;
  if (acc == 0x7fffffff) out[0] = acc;
}
"""


def read_gbps(nbytes: int, blocks_per_sm: int) -> float:
    import cupy

    x = cupy.ones(nbytes // 4, numpy.int32)
    out = cupy.zeros(1, numpy.int32)
    k = cupy.RawKernel(_READ_SRC, "read16")
    grid = blocks_per_sm * cupy.cuda.Device().attributes["MultiProcessorCount"]
    n = numpy.int64(nbytes // 16)
    ms = _bench.time_ms(lambda: k((grid,), (256,), (x, n, out)))
    return nbytes / ms / 1e6


def _use(options, settings: dict) -> None:
    use_settings(settings)
    rebuild_batch_norm(options)


def main() -> None:
    import cupy

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    names = ap.parse_args().variants.split(",")
    nbytes = {d.name: int(numpy.prod(SHAPE)) * d.itemsize for d in (BFLOAT16, numpy.dtype(numpy.float32))}
    copy = _bench.copy_gbps()
    print(f"copy {copy:.0f} GB/s (read + write)")
    for bps in (4, 8, 16):
        print(f"read of bf16 x ({nbytes['bfloat16'] / 1e6:.0f} MB), {bps} blocks an SM: "
              f"{read_gbps(nbytes['bfloat16'], bps):.0f} GB/s")
    defaults = (_compile.COMPILE_OPTIONS, {k: getattr(_batch_norm, k) for k in SETTINGS if hasattr(_batch_norm, k)})
    stream = cupy.cuda.get_current_stream().ptr
    rows = []
    try:
        for name in names:
            options, settings = VARIANTS[name]
            _use(defaults[0] + options, {**defaults[1], **settings})
            for dtype in (BFLOAT16, numpy.dtype(numpy.float32)):
                for layout in ("nchw", "nhwc"):
                    axis = 1 if layout == "nchw" else -1
                    phys = SHAPE if layout == "nchw" else (SHAPE[0], *SHAPE[2:], SHAPE[1])
                    x = cupy.asarray(numpy.random.default_rng(0).standard_normal(phys, numpy.float32)).astype(dtype)
                    c = SHAPE[1]
                    w, b = cupy.ones(c, numpy.float32), cupy.zeros(c, numpy.float32)
                    rm, rv = cupy.zeros(c, numpy.float32), cupy.ones(c, numpy.float32)
                    f, g = call_times(x, w, b, rm, rv, x, axis, stream)
                    nb = nbytes[dtype.name]
                    line = (f"{name:18s} {dtype.name:8s} {layout}: forward {' + '.join(f'{t:.1f}' for t in f[:-1])} "
                            f"(whole {f[-1]:.1f} us, {2 * nb / f[-1] / 1e3 / copy:.3f} of copy; statistics "
                            f"{nb / f[0] / 1e3:.0f} GB/s read); backward whole {g[-1]:.1f} us "
                            f"({3 * nb / g[-1] / 1e3 / copy:.3f})")
                    print(line, flush=True)
                    rows.append(line)
                    del x
    finally:
        _use(*defaults)


if __name__ == "__main__":
    main()
