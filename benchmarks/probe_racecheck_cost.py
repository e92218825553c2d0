"""Where racecheck's seconds go in the sanitizer's slowest row cases (cunorm._sanitize's WALK
rows of 150000 and 100000, which took 19-93 s each under racecheck in the fifty-sixth
session's H100 check whether they ran 40 rows in every cluster or 9 in two). Run it under the
tool; it times each call alone (LayerNorm and RMSNorm, forward and backward), at 1 and 9 rows,
in at most two clusters as the check's racecheck runs them, after one untimed warm-up call of
each (module loads), and names the path each plan takes.

    compute-sanitizer --tool racecheck python3 benchmarks/probe_racecheck_cost.py [--dtypes float32,bfloat16]

Without the tool the same lines give the plain seconds (the baseline the tool's are over).
"""
from __future__ import annotations

import argparse
import time

import numpy

from cunorm import _sanitize


def _seconds(call) -> float:
    import cupy

    cupy.cuda.runtime.deviceSynchronize()
    start = time.monotonic()
    call()
    cupy.cuda.runtime.deviceSynchronize()
    return time.monotonic() - start


def _path(m: int, n: int, dtype, rms: bool) -> str:
    from cunorm.ops import _row_norm

    dt = numpy.dtype(dtype)
    f = _row_norm.forward_plan((m, n), (n, 1), dt, numpy.dtype(numpy.float32), 1, rms, 1e-5, 0, 0, 0)
    b = _row_norm.backward_plan((m, n), (n, 1), (n, 1), dt, numpy.dtype(numpy.float32), numpy.dtype(numpy.float32),
                                1, rms, 0, 0, 0)
    fwd = "grid rows" if f.grid_rows is not None else "split" if f.tiles > 1 else f"{f.grid} x {f.block}"
    bwd = "grid rows" if b.grid_rows is not None else "split" if b.split is not None else f"{b.blocks} x {b.block}"
    return f"fwd {fwd}, bwd {bwd}"


def probe(dtypes, rows=(1, 9), lengths=(150000, 100000), cap: int = 2) -> None:
    import cupy

    import cunorm

    rng = cupy.random.default_rng(0)
    for name in dtypes:
        dt = _sanitize._dtype(name)
        for n in lengths:
            for m in rows:
                x, dy = (rng.standard_normal((m, n), dtype=numpy.float32).astype(dt) for _ in range(2))
                w = rng.standard_normal(n, dtype=numpy.float32)
                with _sanitize.clusters_at_most(cap):
                    for op, rms in (("layer_norm", False), ("rms_norm", True)):
                        if op == "layer_norm":
                            fwd = lambda: cunorm.layer_norm(x, w, w, return_stats=True)  # noqa: E731
                            _, mean, rstd = fwd()  # the warm-up (module loads)
                            bwd = lambda: cunorm.layer_norm_backward(dy, x, w, mean, rstd)  # noqa: E731
                        else:
                            fwd = lambda: cunorm.rms_norm(x, w, return_stats=True)  # noqa: E731
                            _, rstd = fwd()
                            bwd = lambda: cunorm.rms_norm_backward(dy, x, w, rstd)  # noqa: E731
                        bwd()
                        tf, tb = _seconds(fwd), _seconds(bwd)
                        print(f"{name:9s} {op:10s} {m} x {n}: fwd {tf:6.1f} s, bwd {tb:6.1f} s "
                              f"({_path(m, n, dt, rms)}; at most {cap} clusters)", flush=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtypes", default="float32,bfloat16")
    args = ap.parse_args(argv)
    probe(args.dtypes.split(","))


if __name__ == "__main__":
    main()
