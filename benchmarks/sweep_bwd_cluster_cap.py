"""v122: the persistent cluster backward's grid capped at PERSISTENT_BWD_SM_SHARE's share of
the SMs (bf16 rows in wide clusters of four: 22 of the H100's 30 counted clusters), against
every counted cluster (the table empty, the planner before v122), on the benchmark's rows
those clusters serve and their neighbours (bf16 LayerNorm / RMSNorm 16384 / 32768 / 65536,
float32 65536; 16384 is the single wide block's, which the table caps where it names (2, 1)). Host-only: each variant drops the loaded modules (the plans hold their pointers) and
recompiles from CuPy's cache. Builds alternate ROUNDS times in one process.

    python benchmarks/sweep_bwd_cluster_cap.py [--variants v122,count] [--json out.json]
"""
from __future__ import annotations

import numpy

from cunorm import _compile, _config
from cunorm._checks import BFLOAT16
from _sweep_cli import backward_sweep, chosen, config_builds  # benchmarks/ is the script's directory

# name: (NVRTC options added to the defaults, PERSISTENT_BWD_SM_SHARE)
VARIANTS = {"v122": ((), dict(_config.PERSISTENT_BWD_SM_SHARE)), "count": ((), {})}
ROUNDS = 2
CASES = [(op, BFLOAT16, n) for op in ("layer_norm", "rms_norm") for n in (16384, 32768, 65536)] + \
        [("layer_norm", numpy.dtype(numpy.float32), 65536)]


def sweep(log=print, names=None) -> list[dict]:
    use = config_builds(_compile.COMPILE_OPTIONS, "PERSISTENT_BWD_SM_SHARE")
    return backward_sweep(chosen(VARIANTS, names), ROUNDS, use, VARIANTS["v122"], CASES, log)


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__, VARIANTS)
