"""The wide backward (norm_bwd_wide, v63) under compute-sanitizer: bf16 LayerNorm and RMSNorm
at N = 12000 (the tile's last packs past the row) and 16384, with 3 rows (most blocks idle)
and 140 (some blocks walk two rows through the ring). cunorm._sanitize, which the GPU check
runs, did not reach this path before branch wide-bwd-float32 added (140, 12000) to its
ROW_CASES; this ran it by hand:

    compute-sanitizer --tool racecheck python benchmarks/sanitize_wide_bwd.py

(results/sanitizer-wide-bwd-v63-h200.txt).
"""
import cupy
import ml_dtypes
import numpy

import cunorm
from cunorm.ops import _row_norm


def main() -> None:
    rng = cupy.random.default_rng(0)
    calls = 0
    for n in (12000, 16384):
        for m in (3, 140):
            x = rng.standard_normal((m, n), dtype=numpy.float32).astype(ml_dtypes.bfloat16)
            dy = rng.standard_normal((m, n), dtype=numpy.float32).astype(ml_dtypes.bfloat16)
            w = rng.standard_normal(n, dtype=numpy.float32)
            for rms in (False, True):
                plan = _row_norm.backward_plan((m, n), (n, 1), (n, 1), x.dtype, x.dtype, x.dtype, 1, rms, 0, 0, 0)
                assert plan.smem in (2 * 65536, 3 * 65536) and plan.block == 1024, plan
                if rms:
                    _, rstd = cunorm.rms_norm(x, w, return_stats=True)
                    cunorm.rms_norm_backward(dy, x, w, rstd)
                else:
                    _, mean, rstd = cunorm.layer_norm(x, w, w, return_stats=True)
                    cunorm.layer_norm_backward(dy, x, w, mean, rstd)
                calls += 1
    cupy.cuda.runtime.deviceSynchronize()
    print("wide backward calls", calls)


if __name__ == "__main__":
    main()
