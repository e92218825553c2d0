"""The wide clusters' pushed row sums ((p8), (p9)) chosen per instantiation by the rule of
kernels/layer_norm_cluster.cu WideClusterExchange, with v109's 512-thread blocks for
half-precision rows with float32 parameters, against main (the fenced exchange in v93's
1024-thread blocks).

Why: the first sweep (sweep_wide_push_sums_p8.py, 1024-thread blocks) measured (p8) best in
clusters of two half-precision blocks, (p9) in clusters of three to eight and in float32
clusters of sixteen, and both losing in float32 clusters of three or four; v109's blocks were
measured with the fenced exchange only.

Variants: ``main`` (fenced, no v109), ``v109`` (fenced, v109), ``rule`` (the rule, v109),
``rule-1024`` (the rule without v109), ``p8`` / ``p9`` (forced, v109; p8 past 2048 threads a
cluster takes the rule). As it ran (results/sweep-wide-push-rule-h200.txt), v109 took every
half-precision row with float32 parameters; from its numbers v109 keeps RMSNorm rows to 32768
(_config.WIDE_CLUSTER_BWD_HALF_FLOAT_PARAMS_TO), so ``rule`` is now what landed and ``v109``
/ ``p8`` / ``p9`` cover fewer rows than they did. Backward of copy; each variant's first round checks dx / dW / dB of
five shapes against the float64 reference (_sweep_cli.backward_checks). Builds alternate
ROUNDS times in one process.

    python benchmarks/sweep_wide_push_rule.py [--variants main,rule] [--json out.json]
"""
from __future__ import annotations

import numpy

from cunorm import _compile, _config
from cunorm._checks import BFLOAT16
from _sweep_cli import backward_checks, chosen, config_builds, pass_sweep  # benchmarks/ is the script's directory

F16, F32 = numpy.dtype(numpy.float16), numpy.dtype(numpy.float32)
HALF_512 = _config.TileConfig(8, 2, 512)
VARIANTS = {"main": (("-DCUNORM_WIDE_PUSH_SUMS=0",), None), "v109": (("-DCUNORM_WIDE_PUSH_SUMS=0",), HALF_512),
            "rule": ((), HALF_512), "rule-1024": ((), None),
            "p8": (("-DCUNORM_WIDE_PUSH_SUMS=1",), HALF_512), "p9": (("-DCUNORM_WIDE_PUSH_SUMS=2",), HALF_512)}
ROUNDS = 2
CASES = [("layer_norm", BFLOAT16, n) for n in (20000, 32768, 49152, 65536, 98304, 131072)] + \
        [("rms_norm", BFLOAT16, n) for n in (24576, 32768, 65536, 131072)] + [("layer_norm", F16, 65536)] + \
        [("rms_norm", BFLOAT16, n, F32) for n in (24576, 32768, 65536, 131072)] + \
        [("layer_norm", BFLOAT16, n, F32) for n in (32768, 65536, 131072)] + \
        [("layer_norm", F32, n) for n in (16384, 24576, 40000, 65536, 131072)] + \
        [("rms_norm", F32, n) for n in (32768, 65536, 131072)]
CHECKS = [("layer_norm", BFLOAT16, 37, 32768, BFLOAT16), ("rms_norm", BFLOAT16, 40, 65536, BFLOAT16),
          ("layer_norm", F16, 41, 49152, F32), ("layer_norm", F32, 23, 24576, F32),
          ("layer_norm", BFLOAT16, 29, 131072, F32), ("rms_norm", F32, 19, 131072, F32)]


def sweep(log=print, names=None) -> list[dict]:
    return pass_sweep(chosen(VARIANTS, names), ROUNDS,
                      config_builds(_compile.COMPILE_OPTIONS, "WIDE_CLUSTER_BWD_HALF_FLOAT_PARAMS"),
                      VARIANTS["rule"], CASES, ("bwd",), log, extra=backward_checks(CHECKS, log))


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__, VARIANTS)
