"""The channels-last staged BatchNorm kernels (bn_fwd_staged_cl / bn_bwd_staged_cl, BatchNorm
v21) under compute-sanitizer, each call's outputs checked against the float64 reference so
that a wrong exchange shows as a wrong value as well as a race: one block a stage (float32,
24 channels: the last words of the stage past C), clusters of 2 / 4 / 8 blocks (bf16 64,
40 and 72 channels; positions uneven over the blocks), with ReLU and a residual (the
backward's dz written over the staged dy) and without; stages of several blocks meeting in
global memory (BatchNorm v24's grid), then as clusters.

    compute-sanitizer --tool racecheck python benchmarks/sanitize_bn_staged_cl.py
    compute-sanitizer --tool memcheck python benchmarks/sanitize_bn_staged_cl.py
"""
import cupy
import ml_dtypes
import numpy

import cunorm
from cunorm import reference
from cunorm._launch import contiguous_strides
from cunorm.ops import _batch_norm

CASES = [((4, 9, 11, 24), numpy.float32), ((3, 17, 23, 64), ml_dtypes.bfloat16),
         ((5, 25, 21, 40), ml_dtypes.bfloat16), ((9, 29, 23, 72), ml_dtypes.bfloat16)]


def _worst(name, got, want, scale) -> float:
    err = float(numpy.abs(cupy.asnumpy(got).astype(numpy.float64) - want).max()) / scale
    print(f"  {name}: max error {err:.2e} (of {scale:.2e})")
    return err


def main() -> None:
    rng = numpy.random.default_rng(0)
    worst = 0.0
    for (shape, dt), grid in [(case, grid) for grid in (True, False) for case in CASES]:
        _batch_norm.USE_STAGED_CL_GRID = grid
        _batch_norm.plan.cache_clear()
        C = shape[-1]
        lay = _batch_norm.layout(shape, contiguous_strides(shape), len(shape) - 1)
        p = _batch_norm.plan(lay, numpy.dtype(dt), numpy.dtype(numpy.float32), 0, cupy.cuda.Device().id)
        print(shape, numpy.dtype(dt).name, p.staged_cl, p.staged_cl_bwd)
        for act, with_res in ((None, False), ("relu", True)):
            x64 = rng.standard_normal(shape) * 1.5 + 0.3
            r64, dy64 = rng.standard_normal(shape), rng.standard_normal(shape)
            w64, b64 = 1 + 0.2 * rng.standard_normal(C), 0.2 * rng.standard_normal(C)
            x, dy = cupy.asarray(x64.astype(dt)), cupy.asarray(dy64.astype(dt))
            r = cupy.asarray(r64.astype(dt)) if with_res else None
            w, b = cupy.asarray(w64.astype(numpy.float32)), cupy.asarray(b64.astype(numpy.float32))
            y, mean, rstd = cunorm.batch_norm(x, w, b, residual=r, activation=act, channel_axis=-1, return_stats=True)
            dx, dw, db, dr = cunorm.batch_norm_backward(dy, x, w, b, mean, rstd, residual=r, activation=act,
                                                        channel_axis=-1)
            xs = x.get().astype(numpy.float64)
            rs = None if r is None else r.get().astype(numpy.float64)
            ry, _, _ = reference.batch_norm(xs, w64.astype(numpy.float32), b64.astype(numpy.float32), residual=rs,
                                            activation=act, channel_axis=-1, return_stats=True)
            rdx, rdw, rdb, _ = reference.batch_norm_backward(dy.get().astype(numpy.float64), xs,
                                                             w64.astype(numpy.float32), b64.astype(numpy.float32),
                                                             mean.get(), rstd.get(), residual=rs, activation=act,
                                                             channel_axis=-1)
            n = x.size // C
            root_n = float(numpy.sqrt(n))
            worst = max(worst, _worst("y", y, ry, 1.0), _worst("dx", dx, rdx, float(rstd.max().get())),
                        _worst("dweight", dw, rdw, root_n), _worst("dbias", db, rdb, root_n))
    cupy.cuda.runtime.deviceSynchronize()
    print(f"worst scaled error {worst:.2e}")


if __name__ == "__main__":
    main()
