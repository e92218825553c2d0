"""Next (p1), after v105: cluster forward tiles of half the values a thread (16 instead of
32: ``_config.CLUSTER_VALUES``), so a row takes twice the threads, each block's slice of the
parameters halves, and v105's slots fit beside the staged rows without costing resident
blocks (bf16 65536: 512-thread blocks of 8192 columns, 48 KiB of rows and 32 KiB of w + b,
two blocks an SM, as the 512-thread tile holds now). Host configuration only: the kernels
are the committed ones (the instantiations these tiles need compile on first use), so the
shapes below serve rows to 131072 (262144 leaves the clusters in ``v16``; not a case here).

Variants: ``main``; ``v16`` (16 values a thread, v105's slots where they serve); ``v16+all``
(16 values, slots on every tile where they fit: ``-DCUNORM_CLUSTER_FWD_PARAM_SLOTS_ALL=1``
with ``_config.CLUSTER_FWD_PARAM_SLOTS_SERVE_ALL``). Forward of copy; parameters in x's
dtype and, for bf16, float32. Builds alternate ROUNDS times in one process.

    python benchmarks/sweep_cluster_fwd_half_values.py [--variants main,v16,v16+all] [--json out.json]
"""
from __future__ import annotations

import numpy

from cunorm import _compile, _config
from cunorm._checks import BFLOAT16
from _sweep_cli import chosen, config_builds, pass_sweep  # benchmarks/ is the script's directory

F32 = numpy.dtype(numpy.float32)
_MAIN = (_config.CLUSTER_VALUES, _config.CLUSTER_SHAPES)
_HALF = (16, ((256, 2), (256, 4), (256, 8), (512, 8), (1024, 8)))
# name: (NVRTC options added to the defaults, values a thread, shapes, slots on every tile)
VARIANTS = {"main": ((), *_MAIN, False),
            "v16": ((), *_HALF, False),
            "v16+all": (("-DCUNORM_CLUSTER_FWD_PARAM_SLOTS_ALL=1",), *_HALF, True)}
ROUNDS = 2
CASES = [(op, BFLOAT16, n, w) for op in ("layer_norm", "rms_norm") for n in (65536, 131072) for w in (BFLOAT16, F32)] + \
        [(op, F32, n) for op in ("layer_norm", "rms_norm") for n in (32768, 65536, 131072)]


def sweep(log=print, names=None) -> list[dict]:
    from cunorm.ops import _row_norm

    build = config_builds(_compile.COMPILE_OPTIONS, "CLUSTER_VALUES", "CLUSTER_SHAPES",
                          "CLUSTER_FWD_PARAM_SLOTS_SERVE_ALL")

    def use(variant):
        build(variant)
        for dtype, n in ((BFLOAT16, 65536), (BFLOAT16, 131072), (F32, 65536)):
            p = _row_norm.forward_plan((512, n), (n, 1), dtype, dtype, 1, False, 1e-5, 0, 0, 0)
            log(f"  {dtype.name} {n} LayerNorm: grid {p.grid} block {p.block} smem {p.smem}")

    return pass_sweep(chosen(VARIANTS, names), ROUNDS, use, VARIANTS["main"], CASES, ("fwd",), log)


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__, VARIANTS)
