"""The wide cluster backward (norm_bwd_wide_cluster, v68) on rows that walk every cluster
through a second row, where each block writes its sums' partials again: bf16 and float32
LayerNorm / RMSNorm at N = 32768 (2 and 4 blocks a row) and 40000 (3 blocks in bf16, the
last block's tile past the row) with 70 rows. Each gradient is checked against the float64
reference, so a run with the block sums' closing barrier dropped (v78,
CUNORM_WIDE_CLUSTER_OPEN_SUMS=1) shows wrong sums as well as the sanitizer's races. Row
lengths on the command line replace those two (v93: 100000 and 131072 take 7 and 8 blocks;
40 rows walk the H200's 16 clusters of 8 through a third row):

    compute-sanitizer --tool racecheck python benchmarks/sanitize_wide_cluster.py [N ...] [--rows M]
"""
import argparse

import cupy
import ml_dtypes
import numpy

import cunorm
from cunorm import reference
from cunorm.ops import _row_norm


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("lengths", nargs="*", type=int, default=[32768, 40000])
    ap.add_argument("--rows", type=int, default=70)
    args = ap.parse_args()
    rng = cupy.random.default_rng(0)
    worst = 0.0
    for dt, tol in ((numpy.dtype(ml_dtypes.bfloat16), 3e-2), (numpy.dtype(numpy.float32), 1e-4)):
        for n in args.lengths:
            m = args.rows
            x = rng.standard_normal((m, n), dtype=numpy.float32).astype(dt)
            dy = rng.standard_normal((m, n), dtype=numpy.float32).astype(dt)
            w = rng.standard_normal(n, dtype=numpy.float32)
            for rms in (False, True):
                plan = _row_norm.backward_plan((m, n), (n, 1), (n, 1), dt, dt, dt, 1, rms, 0, 0, 0)
                host = [cupy.asnumpy(a.astype(numpy.float32)).astype(numpy.float64) for a in (dy, x, w)]
                if rms:
                    _, rstd = cunorm.rms_norm(x, w, return_stats=True)
                    got = cunorm.rms_norm_backward(dy, x, w, rstd)
                    want = reference.rms_norm_backward(*host, cupy.asnumpy(rstd).astype(numpy.float64))
                else:
                    _, mean, rstd = cunorm.layer_norm(x, w, w, return_stats=True)
                    got = cunorm.layer_norm_backward(dy, x, w, mean, rstd)[:2]
                    want = reference.layer_norm_backward(*host, *(cupy.asnumpy(s).astype(numpy.float64)
                                                                  for s in (mean, rstd)))[:2]
                errs = [float(numpy.abs(cupy.asnumpy(g.astype(numpy.float32)) - r).max() / numpy.abs(r).max())
                        for g, r in zip(got, want)]
                worst = max(worst, max(errs) / tol)
                print(f"{dt.name:9s} N={n} rms={rms!s:5s} block={plan.block} blocks={plan.blocks} smem={plan.smem} "
                      f"rel.err dx / dw {errs[0]:.2e} / {errs[1]:.2e}")
                assert max(errs) < tol, (dt, n, rms, errs)
    cupy.cuda.runtime.deviceSynchronize()
    print(f"wide cluster backward: all within tolerance (worst {worst:.2f} of it)")


if __name__ == "__main__":
    main()
