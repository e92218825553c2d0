"""BatchNorm v20 (candidate (h) of NOTES "Next"): BatchNorm's backward with a residual and
ReLU (the ResNet case, which the benchmark timed only forward before v20). Its flat apply pass in bf16, `bn_bwd_apply_flat<T, W, 8, 1>`, spilled 136
bytes at 80 registers under three blocks an SM (NVRTC 13, sm_90; ``default``: as before
v20); held to two (``relu_two``, v20's default: ``-DCUNORM_BN_RELU_BWD_MIN_BLOCKS=2``, that
kernel alone) it takes 107 registers and spills nothing; ``two_blocks``
(``-DCUNORM_BN_FLAT_MIN_BLOCKS=2``) sets every flat kernel's bound (only ReLU's and the bf16
ones below 64 registers change). Kernel time (_bench.queued_time_ms) of the backward with
residual and ReLU, and of the plain backward for reference, as fractions of copy (bytes: x,
dy, residual read and dx, dresidual written, 5 * numel * s; the plain one 3 * numel * s).
Builds alternate ROUNDS times in one process.

    python benchmarks/sweep_bn_relu_backward.py [--variants default,relu_two,two_blocks] [--json out.json]
"""
from __future__ import annotations

import numpy

from cunorm import _bench, _compile
from cunorm._bench_bn import SHAPES, bn_calls
from cunorm._checks import BFLOAT16
from _sweep_cli import chosen, rebuild_batch_norm  # benchmarks/ is the script's directory

# name: NVRTC options added to the defaults (() at the end: the defaults themselves)
VARIANTS = {"default": ("-DCUNORM_BN_RELU_BWD_MIN_BLOCKS=3",), "relu_two": ("-DCUNORM_BN_RELU_BWD_MIN_BLOCKS=2",),
            "two_blocks": ("-DCUNORM_BN_FLAT_MIN_BLOCKS=2",)}
ROUNDS = 2
_BASE = _compile.COMPILE_OPTIONS


def _use(options) -> None:
    rebuild_batch_norm((*_BASE, *options))


def sweep(log=print, names=None) -> list[dict]:
    import cupy

    from _sweep_cli import alternate

    rows = []
    stream = cupy.cuda.get_current_stream().ptr
    for round_, name, copy in alternate(chosen(VARIANTS, names), ROUNDS, _use, (), log):
        for shape in SHAPES:
            for dtype in (BFLOAT16, numpy.dtype(numpy.float32)):
                for cl in (False, True):
                    _, plain, _, relu = bn_calls(shape, dtype, cl)
                    size = int(numpy.prod(shape)) * dtype.itemsize
                    p_ms, r_ms = (_bench.queued_time_ms(f, stream) for f in (plain, relu))
                    row = {"variant": name, "round": round_, "shape": list(shape), "dtype": dtype.name,
                           "layout": "nhwc" if cl else "nchw", "plain_of_copy": round(3 * size / p_ms / 1e6 / copy, 3),
                           "relu_res_of_copy": round(5 * size / r_ms / 1e6 / copy, 3),
                           "relu_res_vs_plain_time": round(r_ms / p_ms, 3)}
                    log(f"{name:10s} {dtype.name:8s} {row['layout']} {shape}: plain {row['plain_of_copy']:.3f} "
                        f"relu+res {row['relu_res_of_copy']:.3f} (x{row['relu_res_vs_plain_time']} the plain time)")
                    rows.append(row)
    return rows


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__, VARIANTS)
