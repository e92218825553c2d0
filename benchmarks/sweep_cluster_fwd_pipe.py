"""v90: the half-precision cluster forward (rows of 32769-131072 elements on sm_90) with
row j + 1's block sums published before row j's exchange is collected (the cluster
barrier's arrive and wait split; ``pipe``: the host's ``_config.CLUSTER_FWD_PIPE`` and the
kernel as built by default) against v50's loop, which waits where it publishes (``v50``:
the host flag off and ``-DCUNORM_CLUSTER_FWD_PIPE=0``). Both compute the same sums in the
same order, so outputs and gradients must equal the first build's bit for bit (checked).
bf16 and fp16 LayerNorm and RMSNorm at 65536 and 131072; float32 (not pipelined) and the
backward are controls. Builds alternate ROUNDS times in one process; the best rounds'
table comes last.

    python benchmarks/sweep_cluster_fwd_pipe.py [--variants v50,pipe] [--json out.json]
"""
from __future__ import annotations

import numpy

from cunorm import _compile, _config
from cunorm._checks import BFLOAT16
from _sweep_cli import chosen, rebuild_row_norms  # benchmarks/ is the script's directory
from sweep_bwd_stage import bits_sweep

# name: (host flag, NVRTC options added to the defaults)
VARIANTS = {"v50": (False, ("-DCUNORM_CLUSTER_FWD_PIPE=0",)), "pipe": (True, ())}
ROUNDS = 2
CASES = [(op, BFLOAT16, n) for op in ("layer_norm", "rms_norm") for n in (65536, 131072)] + \
        [(op, numpy.dtype(numpy.float16), 65536) for op in ("layer_norm", "rms_norm")] + \
        [("layer_norm", numpy.dtype(numpy.float32), 65536)]


def _use(variant, base=_compile.COMPILE_OPTIONS) -> None:
    pipe, options = variant
    _config.CLUSTER_FWD_PIPE = pipe
    rebuild_row_norms((*base, *options))


def sweep(log=print, names=None) -> list[dict]:
    variants = chosen(VARIANTS, names)
    return bits_sweep(variants, ROUNDS, _use, VARIANTS["pipe"], CASES, (), ("fwd_of_copy", "bwd_of_copy"), log)


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__, VARIANTS)
