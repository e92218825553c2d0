"""BatchNorm kernel variants compiled side by side at issue 5's shapes: the statistics pass's
own in-flight bytes and the block size, against the defaults. Kernel time
(_bench.queued_time_ms), training forward and backward, fractions of copy.

    python benchmarks/sweep_bn_variants.py [--json out.json]
"""
from __future__ import annotations

import numpy

from cunorm import _bench, _compile
from cunorm._checks import BFLOAT16
from cunorm.ops import _batch_norm
from sweep_bn_config import SHAPES, _case

# name: (NVRTC defines, host BLOCK)
VARIANTS = {
    "default": ((), 256),
    "stats_inflight_64": (("-DCUNORM_BN_STATS_INFLIGHT_BYTES=64",), 256),
    "block_128": (("-DCUNORM_BN_BLOCK_LOG2=7",), 128),
    "block_128_stats_64": (("-DCUNORM_BN_BLOCK_LOG2=7", "-DCUNORM_BN_STATS_INFLIGHT_BYTES=64"), 128),
}


def _use(options, block: int) -> None:
    _compile.COMPILE_OPTIONS = tuple(options)
    _compile._modules.clear()
    _batch_norm.BLOCK = block
    _batch_norm.plan.cache_clear()
    _batch_norm._passes.cache_clear()


def sweep(log=print) -> list[dict]:
    defaults = (_compile.COMPILE_OPTIONS, _batch_norm.BLOCK)
    copy = _bench.copy_gbps()
    rows = []
    try:
        for name, (options, block) in VARIANTS.items():
            _use(options, block)
            for shape in SHAPES:
                for dtype in (BFLOAT16, numpy.dtype(numpy.float32)):
                    for cl in (False, True):
                        f, b = _case(shape, dtype, cl)
                        row = {"variant": name, "shape": list(shape), "dtype": dtype.name,
                               "layout": "nhwc" if cl else "nchw", "fwd_of_copy": round(f / copy, 3),
                               "bwd_of_copy": round(b / copy, 3)}
                        log(f"{name:20s} {dtype.name:8s} {row['layout']} {shape}: fwd {row['fwd_of_copy']:.3f} "
                            f"bwd {row['bwd_of_copy']:.3f}")
                        rows.append(row)
    finally:
        _use(*defaults)
    return rows


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__)
