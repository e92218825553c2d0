"""(p10) the cluster forward's row exchanges by push: thread 0 sends the block's sums into
every rank's mail with st.async, counted on that rank's mbarrier, in place of thread 0's
fence (MEMBAR.ALL.GPU and an L1 invalidation a row, NOTES "(p7)") and the cluster barrier;
the statistics' bits unchanged (kernels/layer_norm_cluster.cu MailSlot, ClusterFwdPush,
norm_fwd_cluster).

Variants: ``main`` (``-DCUNORM_CLUSTER_FWD_PUSH=0``), ``p10`` (1: what landed, ClusterFwdPush's
rule), ``p10-all`` (2: every tile; the first sweep's p10). The second sweep also ran p10b
(only warp 0, whose lanes read the mail, waiting on the mbarrier): level or lower, removed.
Forward of copy at the cluster forward's rows (32768-262144: clusters of 4-8 blocks of
256-1024 threads), bf16, fp16 and float32, and bf16 with float32 parameters (where p10 spills
12 bytes at 512 and 1024 threads). Each variant's first round checks y, mean and rstd of five
shapes against the float64 reference (_sweep_cli.forward_checks). Builds alternate ROUNDS
times in one process.

    python benchmarks/sweep_cluster_fwd_push_p10.py [--variants main,p10] [--json out.json]
"""
from __future__ import annotations

import numpy

from cunorm import _compile
from cunorm._checks import BFLOAT16
from _sweep_cli import adding_options, chosen, forward_checks, pass_sweep  # benchmarks/ is the script's directory

F16, F32 = numpy.dtype(numpy.float16), numpy.dtype(numpy.float32)
VARIANTS = {"main": ("-DCUNORM_CLUSTER_FWD_PUSH=0",), "p10": ("-DCUNORM_CLUSTER_FWD_PUSH=1",),
            "p10-all": ("-DCUNORM_CLUSTER_FWD_PUSH=2",)}
ROUNDS = 2
CASES = [("layer_norm", BFLOAT16, n) for n in (32768, 65536, 131072, 262144)] + \
        [("rms_norm", BFLOAT16, n) for n in (32768, 65536, 131072, 262144)] + \
        [("rms_norm", F16, 65536), ("rms_norm", BFLOAT16, 65536, F32), ("layer_norm", BFLOAT16, 65536, F32)] + \
        [("layer_norm", F32, n) for n in (65536, 131072)] + [("rms_norm", F32, n) for n in (131072, 262144)] + \
        [("layer_norm", F16, 65536), ("layer_norm", BFLOAT16, 131072, F32)]
CHECKS = [("layer_norm", BFLOAT16, 37, 65536, BFLOAT16), ("rms_norm", BFLOAT16, 29, 262144, BFLOAT16),
          ("layer_norm", F32, 23, 131072, F32), ("layer_norm", F16, 31, 40000, F32),
          ("rms_norm", BFLOAT16, 33, 65536, BFLOAT16)]


def sweep(log=print, names=None) -> list[dict]:
    return pass_sweep(chosen(VARIANTS, names), ROUNDS, adding_options(_compile.COMPILE_OPTIONS), (), CASES,
                      ("fwd",), log, extra=forward_checks(CHECKS, log))


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__, VARIANTS)
