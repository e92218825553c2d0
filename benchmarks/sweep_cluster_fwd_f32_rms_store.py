"""v107: float32 RMSNorm's cluster forward stores y with the plain pack store, which NVRTC
compiles to four 4-byte STG.E a pack (v47 kept it there: whole stores lost 0.03-0.04 on the
tiles of then). ncu on the 1024-thread tile (v92, rows of 131073-262144; NOTES probe (p4))
without a weight: 43 of 99 cycles an issue stalled on the LG queue, 0.373 of copy against
0.654 with a weight, whose loads space the stores out (benchmarks/ncu_f32_rms_weight.py).

Variants (``-DCUNORM_CLUSTER_FWD_F32_RMS_STORE16_FROM``, the smallest block that stores
whole 16-byte packs): ``main`` (2048: none; v106's build), ``s1024`` (the 1024-thread tile),
``s0`` (every float32 RMSNorm tile, v107's default), ``s0+slots`` (s0 with v105's weight
slots on every tile where they fit, ``-DCUNORM_CLUSTER_FWD_PARAM_SLOTS_ALL=1`` and
``_config.CLUSTER_FWD_PARAM_SLOTS_SERVE_ALL``: new for float32 RMSNorm only at 1024 threads,
whose unstaged rows leave room for 128 KiB of them; the LayerNorm tiles it also changes are
not cases here). Forward of copy, with a weight and without. Builds alternate ROUNDS times
in one process. Results (a run of main, s1024, s0, then one of main, s0, s0+slots):
results/sweep-cluster-fwd-f32-rms-store-v107-h200.txt.

    python benchmarks/sweep_cluster_fwd_f32_rms_store.py [--variants main,s1024,s0,s0+slots] [--json out.json]
"""
from __future__ import annotations

import numpy

from cunorm import _compile
from _sweep_cli import NO_PARAMS, chosen, config_builds, pass_sweep  # benchmarks/ is the script's directory

F32 = numpy.dtype(numpy.float32)
# name: (NVRTC options added to the defaults, the host's slots on every tile)
VARIANTS = {"main": (("-DCUNORM_CLUSTER_FWD_F32_RMS_STORE16_FROM=2048",), False),
            "s1024": (("-DCUNORM_CLUSTER_FWD_F32_RMS_STORE16_FROM=1024",), False),
            "s0": ((), False),
            "s0+slots": (("-DCUNORM_CLUSTER_FWD_PARAM_SLOTS_ALL=1",), True)}
ROUNDS = 2
CASES = [("rms_norm", F32, n, w) for n in (24576, 32768, 65536, 131072, 262144) for w in (F32, NO_PARAMS)]


def sweep(log=print, names=None) -> list[dict]:
    use = config_builds(_compile.COMPILE_OPTIONS, "CLUSTER_FWD_PARAM_SLOTS_SERVE_ALL")
    return pass_sweep(chosen(VARIANTS, names), ROUNDS, use, VARIANTS["s0"], CASES, ("fwd",), log)


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__, VARIANTS)
