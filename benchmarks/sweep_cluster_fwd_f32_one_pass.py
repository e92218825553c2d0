"""v112: float32 LayerNorm cluster forward rows in one pass within two standard deviations of
zero (``one_pass``: kernels built as by default) against the two passes every float32 row took
before (``two_pass``: ``-DCUNORM_CLUSTER_FWD_ONE_PASS_F32=0``); v112b takes the one pass in tiles of
512 threads or more alone, ``one_pass_every_tile`` in all (v112 as first measured). Not bit-equal (the statistics
and y round differently; the tests hold both to the float64 reference). Float32 RMSNorm and
bf16 LayerNorm are the same code in both builds (controls). Builds alternate ROUNDS times in
one process; the best rounds' table comes last.

    python benchmarks/sweep_cluster_fwd_f32_one_pass.py [--variants two_pass,one_pass] [--json out.json]
"""
from __future__ import annotations

import numpy

from cunorm import _compile
from cunorm._checks import BFLOAT16
from _sweep_cli import adding_options, chosen, pass_sweep  # benchmarks/ is the script's directory

VARIANTS = {"two_pass": ("-DCUNORM_CLUSTER_FWD_ONE_PASS_F32=0",), "one_pass": (),
            "one_pass_every_tile": ("-DCUNORM_CLUSTER_FWD_ONE_PASS_F32_MIN_TPB=0",)}
ROUNDS = 3
F32 = numpy.dtype(numpy.float32)
CASES = [("layer_norm", F32, n) for n in (24576, 32768, 65536, 131072, 262144)] + \
        [("rms_norm", F32, 131072), ("layer_norm", BFLOAT16, 65536)]


def sweep(log=print, names=None) -> list[dict]:
    variants = chosen(VARIANTS, names)
    return pass_sweep(variants, ROUNDS, adding_options(_compile.COMPILE_OPTIONS), VARIANTS["one_pass"], CASES,
                      ("fwd",), log)


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__, VARIANTS)
