"""Does BatchNorm's training forward / backward read faster on fewer SMs? bwaves (NOTES
"bwaves outcome") found the row norms' persistent wide-cluster backward at bf16 65536 0.09
of copy faster on 88 of 132 SMs than on 120. This plans BatchNorm's passes as if the GPU
had ``share`` of its SMs (``_batch_norm.sm_count`` scaled, the loaded modules dropped so
every plan is made anew; the clustered stages, sized by the driver's cluster count, keep
theirs) and times the whole training forward and backward (_bench.queued_time_ms) at issue
5's 56 x 56 and 112 x 112 shapes in both layouts, bf16 and float32, on the GPU check's
inputs and calls (_bench_bn.bn_calls). Bytes: forward 2 x numel x s, backward 3 x numel x s
(the benchmark's).

    python benchmarks/probe_bn_sm_share.py [share ...]        (default: 1 0.85 0.75 0.67 0.6)
"""
from __future__ import annotations

import math
import sys

from cunorm import _bench, _compile
from cunorm._bench_bn import bn_calls
from cunorm._checks import BFLOAT16
from cunorm.ops import _batch_norm

SHAPES = ((32, 256, 56, 56), (128, 64, 112, 112))
SHARES = (1.0, 0.85, 0.75, 0.67, 0.6)


def main(shares=SHARES) -> None:
    import cupy
    import numpy

    stream = cupy.cuda.get_current_stream().ptr
    copy = _bench.copy_gbps()
    real = _batch_norm.sm_count
    try:
        for shape in SHAPES:
            for dtype in (BFLOAT16, numpy.dtype(numpy.float32)):
                for layout in ("nhwc", "nchw"):
                    # the benchmark's inputs and calls (their statistics made once); each call plans anew
                    fwd, bwd = bn_calls(shape, dtype, layout == "nhwc")[:2]
                    nbytes = math.prod(shape) * dtype.itemsize
                    for share in shares:
                        _batch_norm.sm_count = lambda device, share=share: max(1, int(share * real(device)))
                        _compile.drop_modules()
                        f = _bench.queued_time_ms(fwd, stream) * 1e3
                        g = _bench.queued_time_ms(bwd, stream) * 1e3
                        print(f"{dtype.name:8s} {layout} {str(shape):20s} share {share:4.2f} "
                              f"({_batch_norm.sm_count(0):3d} SMs): forward {f:7.1f} us "
                              f"{2 * nbytes / f / 1e3 / copy:.3f}, backward {g:7.1f} us "
                              f"{3 * nbytes / g / 1e3 / copy:.3f} of copy", flush=True)
    finally:
        _batch_norm.sm_count = real
        _compile.drop_modules()


if __name__ == "__main__":
    main(tuple(float(a) for a in sys.argv[1:]) or SHARES)
