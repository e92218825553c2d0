"""A few calls of one op at one shape, for a kernel profiler to wrap:

    ncu -k regex:norm_fwd --launch-skip 2 --launch-count 1 --section SpeedOfLight \\
        python benchmarks/kernel_target.py layer_norm bfloat16 16384 4096 [fwd|bwd|fp8]
    ncu -k regex:^bn_ ... python benchmarks/kernel_target.py batch_norm bfloat16 64x1024x14x14 nhwc [fwd|bwd]

BatchNorm as the GPU check times it (cunorm/_bench_bn.py: training, parameters in x's dtype;
nhwc is channels last, C innermost). fp8: the forward with FP8 e4m3 out, scale 4 and amax, as
the GPU check's fused rows time it (the norm_fwd_fused kernel). CUNORM_TARGET_DEFINES and
CUNORM_TARGET_HOST select a variant build (apply_variant; profile_stalls.py --define / --host).
"""
from __future__ import annotations

import ast
import importlib
import os
import sys

import cupy

import cunorm
from cunorm._bench_bn import bn_calls
from cunorm._checks import BFLOAT16

# A variant build for the profiler (profile_stalls.py --define / --host): NVRTC -D options
# added to the defaults, space separated ("CUNORM_BWD_BULK=0"), and host settings
# ("ops._row_norm.FWD_PREFETCH=False": a cunorm module, an attribute, a Python literal).
DEFINES_ENV, HOST_ENV = "CUNORM_TARGET_DEFINES", "CUNORM_TARGET_HOST"


def apply_variant(defines: str, host: str) -> None:
    """Sets this process's build and host settings before any kernel compiles."""
    from cunorm import _compile

    _compile.COMPILE_OPTIONS = (*_compile.COMPILE_OPTIONS, *(f"-D{d}" for d in defines.split()))
    for setting in host.split():
        target, value = setting.split("=", 1)
        module, attr = target.rsplit(".", 1)
        mod = importlib.import_module(f"cunorm.{module}")
        if not hasattr(mod, attr):
            raise SystemExit(f"{HOST_ENV}: cunorm.{module} has no {attr}")
        setattr(mod, attr, ast.literal_eval(value))


def batch_norm_call(dt, shape: str, layout: str, direction: str):
    """The BatchNorm call to repeat (the GPU check's own, cunorm/_bench_bn.py)."""
    fwd, bwd = bn_calls(tuple(int(v) for v in shape.split("x")), dt, {"nhwc": True, "nchw": False}[layout])[:2]
    return fwd if direction == "fwd" else bwd


def row_norm_call(op: str, dt, m: str, n: str, direction: str):
    """The LayerNorm / RMSNorm call to repeat on (m, n) rows (statistics made once)."""
    m, n = int(m), int(n)
    rng = cupy.random.default_rng(0)
    x = rng.standard_normal((m, n), dtype="float32").astype(dt)
    dy = rng.standard_normal((m, n), dtype="float32").astype(dt)
    w = cupy.ones(n, dt)
    if direction == "fp8":
        import ml_dtypes

        params = (w,) if op == "rms_norm" else (w, cupy.zeros(n, dt))
        return lambda: getattr(cunorm, op)(x, *params, out_dtype=ml_dtypes.float8_e4m3fn, out_scale=4.0,
                                           return_amax=True)
    if op == "layer_norm":
        b = cupy.zeros(n, dt)
        _, mean, rstd = cunorm.layer_norm(x, w, b, return_stats=True)
        call = (lambda: cunorm.layer_norm(x, w, b)) if direction == "fwd" else \
            (lambda: cunorm.layer_norm_backward(dy, x, w, mean, rstd))
    else:
        _, rstd = cunorm.rms_norm(x, w, return_stats=True)
        call = (lambda: cunorm.rms_norm(x, w)) if direction == "fwd" else \
            (lambda: cunorm.rms_norm_backward(dy, x, w, rstd))
    return call


def main(op="layer_norm", dtype="bfloat16", m="16384", n="4096", direction="fwd") -> None:
    # batch_norm: m is the shape NxCxHxW, n the layout
    apply_variant(os.environ.get(DEFINES_ENV, ""), os.environ.get(HOST_ENV, ""))
    dt = BFLOAT16 if dtype == "bfloat16" else dtype
    call = batch_norm_call(dt, m, n, direction) if op == "batch_norm" else row_norm_call(op, dt, m, n, direction)
    for _ in range(4):  # (benchmarks/profile_stalls.py CALLS)
        call()
    cupy.cuda.runtime.deviceSynchronize()


if __name__ == "__main__":
    main(*sys.argv[1:])
