"""v122's share of the SMs for the persistent cluster backward's grid (PERSISTENT_BWD_SM_SHARE,
key (x's element size, blocks a cluster)): main's table (`v122`: 0.67, 22 of the H100's 30
counted clusters of four) against every counted cluster (`count`, the table empty, the
planner before v122) and other shares of the key (2, 4): `share55` .. `share79` put 18 .. 26
clusters on 132 SMs, `share100` / `share133` 33 / 44 (only the 512-thread clusters of four,
two blocks an SM, count past 30). Cases: the rows the key caps (bf16 65536 in 1024-thread
clusters of four; with float32 parameters too; half-precision RMSNorm 32768 with a float32
weight, v109's 512-thread clusters of four, which read +0.03 at v122's 22 against the
count's in the sixty-second session's check without being what the share was measured on)
and two it does not (bf16 32768 in clusters of two; float32 65536). Host-only: each variant
drops the loaded modules (the plans hold their pointers) and recompiles from CuPy's cache.
Builds alternate ROUNDS times in one process.

    python benchmarks/sweep_bwd_cluster_cap.py [--variants v122,count,...] [--json out.json]
"""
from __future__ import annotations

import numpy

from cunorm import _compile, _config
from cunorm._checks import BFLOAT16
from _sweep_cli import backward_sweep, chosen, config_builds  # benchmarks/ is the script's directory

# name: (NVRTC options added to the defaults, PERSISTENT_BWD_SM_SHARE)
VARIANTS = {"v122": ((), dict(_config.PERSISTENT_BWD_SM_SHARE)), "count": ((), {}),
            **{f"share{round(100 * share)}": ((), {(2, 4): share}) for share in (0.55, 0.61, 0.73, 0.79, 1.0, 4 / 3)}}
ROUNDS = 2
FLOAT32 = numpy.dtype(numpy.float32)
CASES = [(op, BFLOAT16, n) for op in ("layer_norm", "rms_norm") for n in (32768, 65536)] + \
        [("layer_norm", BFLOAT16, 65536, FLOAT32), ("rms_norm", BFLOAT16, 65536, FLOAT32),
         ("rms_norm", BFLOAT16, 32768, FLOAT32), ("layer_norm", FLOAT32, 65536)]


def sweep(log=print, names=None) -> list[dict]:
    use = config_builds(_compile.COMPILE_OPTIONS, "PERSISTENT_BWD_SM_SHARE")
    return backward_sweep(chosen(VARIANTS, names), ROUNDS, use, VARIANTS["v122"], CASES, log)


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__, VARIANTS)
