"""Run by tests/test_scale_and_threads.py in a fresh interpreter: eight threads, each on its
own non-blocking CuPy stream, call every op family at once while the kernel cache is cold;
then the same calls run serially. Prints one JSON line: errors, outputs that differ bitwise,
how many kernels were built and which were built more than once."""
from __future__ import annotations

import json
import threading

import cupy
import numpy

import cunorm
from cunorm._checks import BFLOAT16

THREADS, ROUNDS = 8, 5


def workload(seed):
    """Every op family once on its own inputs (deterministic kernels: any two runs of a seed
    agree bitwise)."""
    rng = cupy.random.default_rng(seed)
    x = rng.standard_normal((96, 3072), dtype=numpy.float32).astype(BFLOAT16)
    r = rng.standard_normal((96, 3072), dtype=numpy.float32).astype(BFLOAT16)
    w = rng.standard_normal(3072, dtype=numpy.float32)
    y, mean, rstd = cunorm.layer_norm(x, w, w, return_stats=True)
    g = cunorm.layer_norm_backward(x, x, w, mean, rstd)
    z, zr = cunorm.rms_norm(x, w, return_stats=True)
    gz = cunorm.rms_norm_backward(x, x, w, zr)
    f = cunorm.rms_norm(x, w, residual=r, weight_offset=1.0)
    long = cunorm.layer_norm(rng.standard_normal((4, 200000), dtype=numpy.float32))
    img = rng.standard_normal((8, 16, 12, 12), dtype=numpy.float32)
    bn, bm, br = cunorm.batch_norm(img, return_stats=True)
    bg = cunorm.batch_norm_backward(img, img, None, None, bm, br)
    outs = [y, *g, z, *gz, *f, long, bn, bg[0]]
    return [None if o is None else o.get() for o in outs]


def main() -> None:
    builds: dict = {}
    lock = threading.Lock()
    real = cupy.RawModule

    def counting(*args, **kw):
        with lock:
            for name in kw.get("name_expressions", ()):
                builds[name] = builds.get(name, 0) + 1
        return real(*args, **kw)

    cupy.RawModule = counting
    results, errors = {}, []
    start = threading.Barrier(THREADS)

    def worker(seed):
        try:
            with cupy.cuda.Device(0), cupy.cuda.Stream(non_blocking=True) as stream:
                start.wait()
                for _ in range(ROUNDS):
                    results[seed] = workload(seed)
                stream.synchronize()
        except Exception as err:  # reported with the thread's seed
            errors.append(f"seed {seed}: {type(err).__name__}: {err}")

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    mismatches = []
    for seed in range(THREADS):
        if seed not in results:
            continue
        for i, (a, b) in enumerate(zip(workload(seed), results[seed])):
            if a is not None and not numpy.array_equal(a.view(numpy.uint8), b.view(numpy.uint8)):
                mismatches.append(f"seed {seed}, output {i}")
    print(json.dumps({"errors": errors, "mismatches": mismatches, "kernels_built": len(builds),
                      "built_twice": sorted(k for k, v in builds.items() if v > 1)}))


if __name__ == "__main__":
    main()
