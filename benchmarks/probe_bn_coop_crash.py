"""Probe for the pytest worker crash (a segfault inside cuLaunchKernelEx's cooperative launch)
seen in test_gpu_staged_cl_grid_exchange_matches_the_cluster[64x14x14x1024-bf16] under 8
workers: one setting of that test's loop, repeated, in one of several processes sharing the
GPU. ``python benchmarks/probe_bn_coop_crash.py {grid,walked,cluster,mixed} SECONDS``; prints
the calls made; a crash shows as the process's exit status -11. ``mixed`` cycles through the
test's five settings call after call (cooperative, cluster, refused, 4-SM-walked launches of
the same kernels in one process, planned afresh each time), as the test does and the first
three settings alone (eight processes, 90 s, forty-third session) did not."""
from __future__ import annotations

import faulthandler
import sys
import time

import cupy
import numpy

import cunorm
from cunorm import _launch
from cunorm._checks import BFLOAT16
from cunorm.ops import _batch_norm


def main(setting: str, seconds: float) -> None:
    faulthandler.enable()
    shape, c = (64, 14, 14, 1024), 1024
    _batch_norm.STAGED_CL_BWD_MAX_ITEMSIZE = 8
    _batch_norm.STAGED_CL_GRID_RULE = False
    sms, cooperative = _batch_norm.sm_count, _batch_norm.launch_cooperative

    def refuse(*args, **kwargs):
        raise _launch.CooperativeLaunchRefused("cooperative launch refused (probe)")

    # (grid exchange, cooperative launch, SM count) as the test's loop sets them
    cycle = {"grid": [(True, cooperative, sms)], "cluster": [(False, cooperative, sms)],
             "walked": [(True, cooperative, lambda device: 4)],
             "mixed": [(True, cooperative, sms), (True, cooperative, sms), (False, cooperative, sms),
                       (True, refuse, sms), (True, cooperative, lambda device: 4)]}[setting]
    rng = numpy.random.default_rng(0)
    x = cupy.asarray((rng.standard_normal(shape) * 2 + 30).astype(BFLOAT16))
    dy, res = (cupy.asarray(rng.standard_normal(shape).astype(BFLOAT16)) for _ in range(2))
    w, b = (cupy.asarray(rng.standard_normal(c).astype(numpy.float32)) for _ in range(2))
    end, n = time.time() + seconds, 0
    while time.time() < end:
        grid, launch, sm_count = cycle[n % len(cycle)]
        if len(cycle) > 1 or n == 0:
            _batch_norm.USE_STAGED_CL_GRID, _batch_norm.launch_cooperative = grid, launch
            _batch_norm.sm_count = sm_count
            _batch_norm.plan.cache_clear()
        rm, rv = cupy.zeros(c, numpy.float32), cupy.ones(c, numpy.float32)
        y, mean, rstd = cunorm.batch_norm(x, w, b, running_mean=rm, running_var=rv, channel_axis=-1, residual=res,
                                          activation="relu", return_stats=True)
        cunorm.batch_norm_backward(dy, x, w, b, mean, rstd, channel_axis=-1, residual=res, activation="relu")
        n += 1
        if n % 50 == 0:
            cupy.cuda.Device().synchronize()
    cupy.cuda.Device().synchronize()
    print(f"{setting}: {n} forward + backward calls, no crash")


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]))
