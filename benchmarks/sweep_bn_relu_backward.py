"""Candidate (h) of NOTES "Next": BatchNorm's backward with a residual and ReLU (the ResNet
case; the benchmark times the plain backward and the residual + ReLU forward only). Its flat
apply pass in bf16, `bn_bwd_apply_flat<T, W, 8, 1>`, spills 136 bytes at 80 registers under
three blocks an SM (NVRTC 13, sm_90); at two (``-DCUNORM_BN_FLAT_MIN_BLOCKS=2``, which sets
every flat kernel's bound: only ReLU's and the bf16 ones below 64 registers change) it takes
107 registers and spills nothing. Kernel time (_bench.queued_time_ms) of the backward with
residual and ReLU, and of the plain backward for reference, as fractions of copy (bytes: x,
dy, residual read and dx, dresidual written, 5 * numel * s; the plain one 3 * numel * s).
Builds alternate ROUNDS times in one process.

    python benchmarks/sweep_bn_relu_backward.py [--variants default,two_blocks] [--json out.json]
"""
from __future__ import annotations

import numpy

from cunorm import _bench, _compile
from cunorm._checks import BFLOAT16
from _sweep_cli import chosen, rebuild_batch_norm  # benchmarks/ is the script's directory

SHAPES = ((32, 256, 56, 56), (128, 64, 112, 112), (64, 1024, 14, 14), (256, 2048, 7, 7))
# name: NVRTC options added to the defaults
VARIANTS = {"default": (), "two_blocks": ("-DCUNORM_BN_FLAT_MIN_BLOCKS=2",)}
ROUNDS = 2
_BASE = _compile.COMPILE_OPTIONS


def _use(options) -> None:
    rebuild_batch_norm((*_BASE, *options))


def _calls(shape, dtype, channels_last):
    """(plain backward, backward with residual and ReLU) on one case, inputs drawn once."""
    import cupy

    import cunorm

    rng = cupy.random.default_rng(0)
    n, c, h, w = shape
    phys = (n, h, w, c) if channels_last else shape
    x, dy, r = (rng.standard_normal(phys, dtype=numpy.float32).astype(dtype) for _ in range(3))
    wt, b = cupy.ones(c, dtype), cupy.zeros(c, dtype)
    axis = -1 if channels_last else 1
    _, mean, rstd = cunorm.batch_norm(x, wt, b, channel_axis=axis, return_stats=True, residual=r, activation="relu")
    plain = lambda: cunorm.batch_norm_backward(dy, x, wt, b, mean, rstd, channel_axis=axis)  # noqa: E731
    relu = lambda: cunorm.batch_norm_backward(dy, x, wt, b, mean, rstd, channel_axis=axis,  # noqa: E731
                                              residual=r, activation="relu")
    return plain, relu


def sweep(log=print, names=None) -> list[dict]:
    import cupy

    from _sweep_cli import alternate

    rows = []
    stream = cupy.cuda.get_current_stream().ptr
    for round_, name, copy in alternate(chosen(VARIANTS, names), ROUNDS, _use, (), log):
        for shape in SHAPES:
            for dtype in (BFLOAT16, numpy.dtype(numpy.float32)):
                for cl in (False, True):
                    plain, relu = _calls(shape, dtype, cl)
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
