"""(p8, p9: the first sweep, results/sweep-wide-push-sums-p8-h200.txt) the wide clusters' row
sums pushed with st.async into every rank's slots and counted on an mbarrier, in place of
thread 0's fence (MEMBAR.ALL.GPU and an L1 invalidation a row, NOTES "(p7)") and the cluster
barrier. p8: each warp's sums pushed, no block barrier a row (ClusterPushSums); p9: the
block's sums pushed by thread 0 after the block sums' barriers, any cluster
(ClusterPushRowSums), no broadcast barrier.

Variants: ``main`` (``-DCUNORM_WIDE_PUSH_SUMS=0``), ``p8`` (1), ``p9`` (2). As it ran (the
parked patch), p8 served clusters of up to four blocks; the kernels now keep a forced p8 to
clusters of 2048 threads (WideClusterExchange), so its three- and four-block cases take the
rule. Cases: bf16 / fp16 / float32 rows in clusters of two to four blocks, and of eight and
sixteen (131072). Backward of copy; each variant's first round checks dx / dW / dB of five
shapes against the float64 reference (_sweep_cli.backward_checks). Builds alternate ROUNDS
times in one process.

    python benchmarks/sweep_wide_push_sums_p8.py [--variants main,p8,p9] [--json out.json]
"""
from __future__ import annotations

import numpy

from cunorm import _compile
from cunorm._checks import BFLOAT16
from _sweep_cli import adding_options, backward_checks, chosen, pass_sweep  # benchmarks/ is the script's directory

F16, F32 = numpy.dtype(numpy.float16), numpy.dtype(numpy.float32)
VARIANTS = {"main": ("-DCUNORM_WIDE_PUSH_SUMS=0",), "p8": ("-DCUNORM_WIDE_PUSH_SUMS=1",),
            "p9": ("-DCUNORM_WIDE_PUSH_SUMS=2",)}
ROUNDS = 3
CASES = [("layer_norm", BFLOAT16, n) for n in (24576, 32768, 49152, 65536, 131072)] + \
        [("rms_norm", BFLOAT16, n) for n in (32768, 65536, 131072)] + \
        [("layer_norm", F16, 65536), ("rms_norm", BFLOAT16, 24576, F32), ("layer_norm", BFLOAT16, 32768, F32),
         ("layer_norm", F32, 24576), ("layer_norm", F32, 32768), ("rms_norm", F32, 32768), ("rms_norm", F32, 131072)]
CHECKS = [("layer_norm", BFLOAT16, 37, 32768, BFLOAT16), ("rms_norm", BFLOAT16, 40, 65536, BFLOAT16),
          ("layer_norm", F16, 41, 49152, F32), ("layer_norm", F32, 23, 24576, F32),
          ("layer_norm", BFLOAT16, 29, 131072, BFLOAT16)]


def sweep(log=print, names=None) -> list[dict]:
    return pass_sweep(chosen(VARIANTS, names), ROUNDS, adding_options(_compile.COMPILE_OPTIONS), (), CASES,
                      ("bwd",), log, extra=backward_checks(CHECKS, log))


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__, VARIANTS)
