"""The staged row backwards' copies, three builds: v84 (each thread's cp.async, the
statistics in a slot a warp: ``-DCUNORM_BWD_SHARED_STATS=0 -DCUNORM_BWD_BULK=0``), v85
(``-DCUNORM_BWD_BULK=0``: the fused residual backward's statistics in a slot a row group,
copied by its first thread a step ahead) and v86 (the default: also, on sm_90, norm_bwd's
one-row blocks of 128-512 threads take x and dy as one bulk copy each, by one thread,
completing on an mbarrier). All read the same values, so every output must equal the first
build's bit for bit (checked). The bf16 rows of 128-1024 threads (N = 1024-8192), LayerNorm
and RMSNorm, and the fused residual backward; warp rows (N = 512) and float32 rows (not
staged) are controls. Builds alternate ROUNDS times in one process; the best rounds' table
comes last. results/sweep-row-copies-v85-v86-h200.txt is the run that chose the gates (then
v85 served norm_bwd's rows too, and both served its 1024-thread rows).

    python benchmarks/sweep_row_copies.py [--variants v84,v85,v86] [--json out.json]
"""
from __future__ import annotations

import numpy

from cunorm import _compile
from cunorm._checks import BFLOAT16
from _sweep_cli import adding_options, chosen  # benchmarks/ is the script's directory
from sweep_bwd_stage import bits_sweep

VARIANTS = {"v84": ("-DCUNORM_BWD_SHARED_STATS=0", "-DCUNORM_BWD_BULK=0"), "v85": ("-DCUNORM_BWD_BULK=0",), "v86": ()}
ROUNDS = 2
CASES = [(op, BFLOAT16, n) for op in ("layer_norm", "rms_norm") for n in (512, 1024, 2048, 4096, 8192)] + \
        [("layer_norm", numpy.dtype(numpy.float32), 4096)]
FUSED_ROW_LENGTHS = (2048, 4096, 8192)


def sweep(log=print, names=None) -> list[dict]:
    variants = chosen(VARIANTS, names)
    return bits_sweep(variants, ROUNDS, adding_options(_compile.COMPILE_OPTIONS), (), CASES, FUSED_ROW_LENGTHS,
                      ("fwd_of_copy", "bwd_of_copy", "fused_residual_bwd_of_copy"), log)


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__, VARIANTS)
