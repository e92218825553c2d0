"""v101: the wide clusters' weight slots in a half-precision weight's own type (COLS * 2
bytes) where rows and weight are half precision, and the half-precision LayerNorm clusters'
ring at three rows (v91's loop) beside them (``v101``: the defaults), against v81's float
slots, which do not fit beside a ring of three 64 KiB rows (``v100``: two rows for
LayerNorm, three without slots for RMSNorm). The first sweep (results/sweep-wide-half-slots-
v101-h200.txt) ran an earlier form with half slots in the single wide block too (its RMSNorm
ring of three lost 0.03 at 16384). Builds alternate ROUNDS times in one process.

    python benchmarks/sweep_wide_half_slots.py [--variants v100,v101] [--json out.json]
"""
from __future__ import annotations

from cunorm import _compile, _config
from cunorm._checks import BFLOAT16
from _sweep_cli import backward_sweep, chosen, rebuild_row_norms  # benchmarks/ is the script's directory

# name: CUNORM_WIDE_HALF_SLOTS (and _config.WIDE_BWD_HALF_SLOTS)
VARIANTS = {"v100": 0, "v101": 1}
ROUNDS = 2
CASES = [("rms_norm", BFLOAT16, 16384)] + [("layer_norm", BFLOAT16, n) for n in (32768, 65536, 131072)] + \
        [("rms_norm", BFLOAT16, n) for n in (65536, 131072)]
_BASE = _compile.COMPILE_OPTIONS


def _use(half: int) -> None:
    _config.WIDE_BWD_HALF_SLOTS = bool(half)
    rebuild_row_norms((*_BASE, f"-DCUNORM_WIDE_HALF_SLOTS={half}"))


def sweep(log=print, names=None) -> list[dict]:
    return backward_sweep(chosen(VARIANTS, names), ROUNDS, _use, VARIANTS["v101"], CASES, log)


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__, VARIANTS)
