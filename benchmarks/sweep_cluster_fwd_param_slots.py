"""v105: the cluster forward's parameters staged once a block in shared memory against
loading them every row (``v104``: ``-DCUNORM_CLUSTER_FWD_PARAM_SLOTS=0``, the host's
``_config.CLUSTER_FWD_PARAM_SLOTS`` off). The sweep that chose v105's tiles (results/sweep-
cluster-fwd-param-slots-v105-h200.txt) ran ``slots``: every tile where rows and slots fit
(``-DCUNORM_CLUSTER_FWD_PARAM_SLOTS_ALL=1``, ``_config.CLUSTER_FWD_PARAM_SLOTS_SERVE_ALL``);
``slots+stage1`` also stages one row ahead on every tile (``-DCUNORM_CLUSTER_FWD_STAGE=1``
with ``_config.CLUSTER_FWD_STAGE_ROWS = 1``): float32 tiles of 256-thread blocks stage none,
so with the slots alone their clusters turn persistent (the host's rule for any shared
memory) with nothing in flight. ``v121`` is the landed choice of tiles (the defaults: v105's,
and since v121 LayerNorm's clusters of eight for float32 rows and half-precision rows with
float32 w + b in 512-thread blocks); ``v120`` the choice before v121
(``-DCUNORM_CLUSTER_FWD_EIGHT_PARAM_SLOTS=0``, ``_config.CLUSTER_FWD_EIGHT_PARAM_SLOTS`` off).
Forward, bf16 and float32 rows, parameters in x's dtype and, for bf16, float32 (torch
autocast's). The probe (results/probe-param-traffic-h200.json) gives each case's ceiling
without parameters. Builds alternate ROUNDS times in one process.

    python benchmarks/sweep_cluster_fwd_param_slots.py [--variants v104,slots,slots+stage1,v121,v120] [--json out.json]
"""
from __future__ import annotations

import numpy

from cunorm import _compile
from cunorm._checks import BFLOAT16
from _sweep_cli import chosen, config_builds, pass_sweep  # benchmarks/ is the script's directory

F32 = numpy.dtype(numpy.float32)
# name: (NVRTC options added to the defaults, the host's parameter slots, its serve-all
# switch, forced staged rows, v121's clusters of eight)
_ALL = ("-DCUNORM_CLUSTER_FWD_PARAM_SLOTS_ALL=1",)
VARIANTS = {"v104": (("-DCUNORM_CLUSTER_FWD_PARAM_SLOTS=0",), False, False, None, True),
            "slots": (_ALL, True, True, None, True),
            "slots+stage1": ((*_ALL, "-DCUNORM_CLUSTER_FWD_STAGE=1"), True, True, 1, True),
            "v121": ((), True, False, None, True),
            "v120": (("-DCUNORM_CLUSTER_FWD_EIGHT_PARAM_SLOTS=0",), True, False, None, False)}
ROUNDS = 2
CASES = [(op, BFLOAT16, n, w) for op in ("layer_norm", "rms_norm") for n in (65536, 131072) for w in (BFLOAT16, F32)] + \
        [(op, BFLOAT16, 32768, F32) for op in ("layer_norm", "rms_norm")] + \
        [(op, F32, n) for op in ("layer_norm", "rms_norm") for n in (32768, 65536, 131072)]


def sweep(log=print, names=None) -> list[dict]:
    from cunorm.ops import _row_norm

    default = VARIANTS["v121"]
    build = config_builds(_compile.COMPILE_OPTIONS, "CLUSTER_FWD_PARAM_SLOTS", "CLUSTER_FWD_PARAM_SLOTS_SERVE_ALL",
                          "CLUSTER_FWD_STAGE_ROWS", "CLUSTER_FWD_EIGHT_PARAM_SLOTS")

    def use(variant):
        build(variant)
        for dtype, w, n in ((BFLOAT16, BFLOAT16, 65536), (BFLOAT16, F32, 65536), (F32, F32, 32768)):
            for rms in (False, True):
                p = _row_norm.forward_plan((1024, n), (n, 1), dtype, w, 1, rms, 1e-5, 0, 0, 0)
                log(f"  {dtype.name}/w:{w.name} {n} rms={rms}: grid {p.grid} block {p.block} smem {p.smem}")

    return pass_sweep(chosen(VARIANTS, names), ROUNDS, use, default, CASES, ("fwd",), log)


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__, VARIANTS)
