"""v91: the wide cluster backward (half-precision rows of 16385-65536 elements on sm_90) with
row j + 1's first pass and published sums before row j's exchange is collected (``pipe``:
kernels built as by default) against v68's loop (``v68``: ``-DCUNORM_WIDE_CLUSTER_PIPE=0``).
The pipelined loop serves rings of three rows or more, which only half-precision RMSNorm's
is by default; the ``-d3`` variants give every wide ring three rows (the host's
``_row_norm.WIDE_DEPTH``; LayerNorm then loses its weight slots, which do not fit beside
three rows), so LayerNorm's gain or loss from the pipeline shows against v68 at the same
depth. Same sums in the same order: outputs and gradients must equal the first build's bit
for bit (checked). Builds alternate ROUNDS times in one process; the best rounds' table
comes last.

    python benchmarks/sweep_wide_cluster_pipe.py [--variants v68,pipe,v68-d3,pipe-d3] [--json out.json]
"""
from __future__ import annotations

import numpy

from cunorm import _compile
from cunorm._checks import BFLOAT16
from cunorm.ops import _row_norm
from _sweep_cli import chosen, rebuild_row_norms  # benchmarks/ is the script's directory
from sweep_bwd_stage import bits_sweep

# name: (wide ring depth, None: _config.wide_bwd_depth; NVRTC options added to the defaults)
VARIANTS = {"v68": (None, ("-DCUNORM_WIDE_CLUSTER_PIPE=0",)), "pipe": (None, ()),
            "v68-d3": (3, ("-DCUNORM_WIDE_CLUSTER_PIPE=0",)), "pipe-d3": (3, ())}
ROUNDS = 2
CASES = [("layer_norm", BFLOAT16, n) for n in (32768, 65536)] + [("rms_norm", BFLOAT16, 65536)] + \
        [("rms_norm", numpy.dtype(numpy.float16), 40000)]


def _use(variant, base=_compile.COMPILE_OPTIONS) -> None:
    depth, options = variant
    _row_norm.WIDE_DEPTH = depth
    rebuild_row_norms((*base, *options))


def sweep(log=print, names=None) -> list[dict]:
    variants = chosen(VARIANTS, names)
    return bits_sweep(variants, ROUNDS, _use, VARIANTS["pipe"], CASES, (), ("bwd_of_copy",), log)


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__, VARIANTS)
