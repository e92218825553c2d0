"""v75 (nineteenth session): the staged half-precision backward's ring depth after v70-v74
(weight in shared memory, statistics staged from 128-thread rows). StagePolicy's depths were
measured in v44, when the weight and the statistics were still loaded each row step; each
variant here forces one depth for every tile (``CUNORM_BWD_STAGE_DEPTH`` with the host's
``_row_norm.STAGE_DEPTH``) against the policy. Builds alternate ROUNDS times in one process;
every build's forward outputs and gradients must equal the first's bit for bit.

    python benchmarks/sweep_bwd_depth.py [--variants policy,depth2,...] [--json out.json]
"""
from __future__ import annotations

from cunorm import _compile
from cunorm._checks import BFLOAT16
from cunorm.ops import _row_norm
from _sweep_cli import chosen, rebuild_row_norms  # benchmarks/ is the script's directory
from sweep_bwd_stage import bits_sweep

# name: rows in the ring (None: StagePolicy / _config.bwd_stage_depth)
VARIANTS = {"policy": None, "depth2": 2, "depth3": 3, "depth4": 4}
ROUNDS = 2
CASES = [(op, BFLOAT16, n) for op in ("layer_norm", "rms_norm") for n in (512, 1024, 2048, 4096, 8192)]
FUSED_ROW_LENGTHS = (2048, 4096, 8192)


def _use(depth: int | None, base=_compile.COMPILE_OPTIONS) -> None:
    _row_norm.STAGE_DEPTH = depth
    rebuild_row_norms((*base, *((f"-DCUNORM_BWD_STAGE_DEPTH={depth}",) if depth else ())))


def sweep(log=print, names=None) -> list[dict]:
    variants = chosen(VARIANTS, names)
    return bits_sweep(variants, ROUNDS, _use, None, CASES, FUSED_ROW_LENGTHS,
                      ("bwd_of_copy", "fused_residual_bwd_of_copy"), log)


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__, VARIANTS)
