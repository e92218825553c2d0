"""v106 (landed; results/sweep-fwd-wide-params-v106-h200.txt): half-precision
rows with float32 parameters (torch autocast's) from ``_config.FWD_CLUSTER_WIDE_PARAMS_FROM``
take the cluster forward instead of the shared-memory forward, whose block holds the whole
row and reloads all its parameters every row (the record's bf16 LayerNorm 32768 with float32
w + b: 0.57 of copy, x0.68); LayerNorm's 256-thread cluster tiles then keep float32 w + b in
slots (``-DCUNORM_CLUSTER_FWD_WIDE_PARAM_SLOTS``, v105's sweep: +0.036 at 65536).

Variants: ``v105`` (main: neither), ``route`` (the clusters from 16385, no new slots),
``v106`` (both), ``v106-8193`` (both, the clusters from 8193). Forward of copy. Then, apart
(the probe's outlier, NOTES "Next" (p4)): float32 RMSNorm 262144 with and without a weight,
three turns each. Builds alternate ROUNDS times in one process.

    python benchmarks/sweep_fwd_wide_params_v106.py [--variants v105,route,v106,v106-8193] [--json out.json]
"""
from __future__ import annotations

import numpy

from cunorm import _compile
from cunorm._checks import BFLOAT16
from _sweep_cli import chosen, config_builds, pass_sweep  # benchmarks/ is the script's directory

F32 = numpy.dtype(numpy.float32)
# name: (NVRTC options added to the defaults, the host's change-over, its LayerNorm slots)
VARIANTS = {"v105": (("-DCUNORM_CLUSTER_FWD_WIDE_PARAM_SLOTS=0",), None, False),
            "route": (("-DCUNORM_CLUSTER_FWD_WIDE_PARAM_SLOTS=0",), 16385, False),
            "v106": ((), 16385, True),
            "v106-8193": ((), 8193, True)}
ROUNDS = 2
CASES = [(op, BFLOAT16, n, F32) for op in ("layer_norm", "rms_norm") for n in (12288, 16384, 24576, 32768, 65536)] + \
        [(op, BFLOAT16, 32768) for op in ("layer_norm", "rms_norm")]


def _outlier(log) -> list[dict]:
    """float32 RMSNorm 262144 forward with and without a weight, alternating (probe (p4))."""
    import cupy

    import cunorm
    from cunorm._bench import TOTAL_ELEMENTS, copy_gbps, queued_time_ms

    n = 262144
    m = TOTAL_ELEMENTS // n
    rng = cupy.random.default_rng(0)
    x = rng.standard_normal((m, n), dtype=numpy.float32)
    w = 1 + 0.1 * rng.standard_normal(n, dtype=numpy.float32)
    copy, stream, rows = copy_gbps(), cupy.cuda.get_current_stream().ptr, []
    for turn in range(3):
        for name, weight in (("weight", w), ("none", None)):
            ms = queued_time_ms(lambda: cunorm.rms_norm(x, weight, return_stats=True), stream)
            rows.append({"turn": turn, "case": name, "fwd_of_copy": round(2 * x.nbytes / ms / 1e6 / copy, 3)})
            log(f"float32 rms_norm 262144 {name}: fwd {rows[-1]['fwd_of_copy']} of copy")
    return rows


def sweep(log=print, names=None) -> list[dict]:
    use = config_builds(_compile.COMPILE_OPTIONS, "FWD_CLUSTER_WIDE_PARAMS_FROM", "CLUSTER_FWD_WIDE_PARAM_SLOTS")
    rows = pass_sweep(chosen(VARIANTS, names), ROUNDS, use, VARIANTS["v106"], CASES, ("fwd",), log)
    return rows + _outlier(log)


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__, VARIANTS)
