"""Run by tests/test_kernel_cache.py in a fresh interpreter whose CUPY_CACHE_DIR the test
prepared: one forward and backward of each op family, against the NumPy reference. Prints
one JSON line: the largest error, the warnings cunorm raised, and whether kernels were
compiled in memory. With ``read-only`` as its argument, CuPy's cache writes of cunorm's
kernels fail the way a read-only file system makes them (EROFS, injected into CuPy's cache
backend: a root user writes through a 0o555 directory, and CuPy's own kernels, which a
read-only cache fails too, are CuPy's business)."""
from __future__ import annotations

import errno
import json
import sys
import warnings

import numpy

import cunorm
from cunorm import _compile


# In every cunorm kernel's source (common.cuh's first line, inlined by _compile).
MARKER = "Shared device code for every cunorm kernel"


def _fail_writes() -> None:
    from cupy.cuda import compiler

    backend = compiler._kernel_cache_backend
    real_save = backend.save

    def save(name, cubin, source):
        if MARKER in source:
            raise OSError(errno.EROFS, "Read-only file system", backend._cache_dir)
        return real_save(name, cubin, source)

    backend.save = save


def main() -> None:
    import cupy

    assert MARKER in _compile.kernel_source("layer_norm.cu")
    if "read-only" in sys.argv[1:]:
        _fail_writes()
    rng = numpy.random.default_rng(3)
    x, dy = (rng.standard_normal((37, 1533)).astype(numpy.float32) for _ in range(2))
    w = rng.standard_normal(1533).astype(numpy.float32)
    img = rng.standard_normal((4, 6, 5, 7)).astype(numpy.float32)
    err = 0.0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for xp in (cupy, numpy):  # the GPU, then the reference on the same inputs
            xs, dys, ws, imgs = (xp.asarray(a) for a in (x, dy, w, img))
            y, mean, rstd = cunorm.layer_norm(xs, ws, ws, return_stats=True)
            z, zr = cunorm.rms_norm(xs, ws, return_stats=True)
            b, bm, br = cunorm.batch_norm(imgs, return_stats=True)
            outs = [y, *cunorm.layer_norm_backward(dys, xs, ws, mean, rstd), z,
                    *cunorm.rms_norm_backward(dys, xs, ws, zr), b,
                    cunorm.batch_norm_backward(imgs, imgs, None, None, bm, br)[0]]
            outs = [numpy.asarray(o.get() if xp is cupy else o, dtype=numpy.float64) for o in outs]
            if xp is cupy:
                got = outs
        err = max(float(numpy.max(numpy.abs(g - r) / (1 + numpy.abs(r)))) for g, r in zip(got, outs))
    print(json.dumps({"max_error": err, "in_memory": bool(_compile._cache_unusable),
                      "warnings": [str(c.message) for c in caught if "cunorm" in str(c.message)]}))


if __name__ == "__main__":
    main()
