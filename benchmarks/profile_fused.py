"""The fused forward's launches for a kernel profiler: FP8 out (with scale and amax) for
RMSNorm and LayerNorm, and the residual forward for RMSNorm, bf16, M = 16384, N = 4096 (the
benchmark's middle fused row). Each case runs twice; profile the second launch of each
(``--launch-skip`` past the first, or read the second of each pair).

    ncu --kernel-name regex:norm_fwd_fused --section SpeedOfLight --section Occupancy \\
        --section WarpStateStats --section SchedulerStats \\
        --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio \\
        python benchmarks/profile_fused.py
"""
from __future__ import annotations

import cupy
import ml_dtypes
import numpy

import cunorm
from cunorm._checks import BFLOAT16

M, N = 16384, 4096


def main() -> None:
    rng = cupy.random.default_rng(0)
    x, r = (rng.standard_normal((M, N), dtype=numpy.float32).astype(BFLOAT16) for _ in range(2))
    w = (1 + 0.1 * rng.standard_normal(N, dtype=numpy.float32)).astype(BFLOAT16)
    b = (0.1 * rng.standard_normal(N, dtype=numpy.float32)).astype(BFLOAT16)
    fp8 = dict(out_dtype=ml_dtypes.float8_e4m3fn, out_scale=4.0, return_amax=True)
    cases = [("fp8 rms_norm", lambda: cunorm.rms_norm(x, w, **fp8)),
             ("fp8 layer_norm", lambda: cunorm.layer_norm(x, w, b, **fp8)),
             ("residual rms_norm", lambda: cunorm.rms_norm(x, w, residual=r))]
    for name, call in cases:
        for _ in range(2):
            call()
        cupy.cuda.get_current_stream().synchronize()
        print(name, "done", flush=True)


if __name__ == "__main__":
    main()
