"""float32 RMSNorm's cluster forward stages no rows (ClusterFwdStage: float32 RMSNorm 0 rows
at every tile; v49 measured staging lose 0.08-0.12 at 512 threads), and its 1024-thread
tile (v92, rows of 131073-262144) inherited that rule unmeasured. The probe found that tile
at 0.654 of copy with a weight and 0.373 without one (benchmarks/probe_param_traffic.py,
again in sweep_fwd_wide_params_v106.py's three alternations: 0.652-0.653 / 0.374-0.375):
the unstaged loop loads a row, exchanges, then stores, and without the weight's loads
between them its stores leave in one burst before the next row's loads can start.
Staging the next row in shared memory (as float32 LayerNorm does from 512 threads) keeps
its copies in flight through the exchange and the stores.

Variants: ``main``; ``stage1`` (one staged row on every cluster forward tile:
``-DCUNORM_CLUSTER_FWD_STAGE=1``, ``_config.CLUSTER_FWD_STAGE_ROWS = 1``; only the float32
RMSNorm cases below change, the half-precision and float32 LayerNorm tiles at these lengths
stage one row already). Forward of copy, with a weight and without. Builds alternate ROUNDS
times in one process.

    python benchmarks/sweep_cluster_fwd_stage_f32_rms.py [--variants main,stage1] [--json out.json]
"""
from __future__ import annotations

import numpy

from cunorm import _compile
from _sweep_cli import NO_PARAMS, chosen, config_builds, pass_sweep  # benchmarks/ is the script's directory

F32 = numpy.dtype(numpy.float32)
# name: (NVRTC options added to the defaults, the host's staged rows)
VARIANTS = {"main": ((), None), "stage1": (("-DCUNORM_CLUSTER_FWD_STAGE=1",), 1)}
ROUNDS = 2
CASES = [("rms_norm", F32, n, w) for n in (32768, 65536, 131072, 262144) for w in (F32, NO_PARAMS)] + \
        [("layer_norm", F32, 262144, w) for w in (F32, NO_PARAMS)]


def sweep(log=print, names=None) -> list[dict]:
    from cunorm.ops import _row_norm

    build = config_builds(_compile.COMPILE_OPTIONS, "CLUSTER_FWD_STAGE_ROWS")

    def use(variant):
        build(variant)
        for n in (131072, 262144):
            p = _row_norm.forward_plan((256, n), (n, 1), F32, F32, 1, True, 1e-5, 0, 0, 0)
            log(f"  float32 {n} RMSNorm: grid {p.grid} block {p.block} smem {p.smem}")

    return pass_sweep(chosen(VARIANTS, names), ROUNDS, use, VARIANTS["main"], CASES, ("fwd",), log)


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__, VARIANTS)
