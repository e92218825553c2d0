"""The replayed crashing order (benchmarks/results/crash-bn-43-h100-order.txt) in one process,
each call of the BatchNorm host's cluster occupancy query and cooperative launch written to
stderr before it reaches the driver: ``python benchmarks/probe_bn_trace.py ORDER_FILE``."""
from __future__ import annotations

import os
import sys

import pytest

from cunorm.ops import _batch_norm
from cupy_backends.cuda.api import driver


def say(text: str) -> None:
    os.write(2, (text + "\n").encode())


def attrs(fn: int) -> str:
    try:
        return (f"threads<={driver.funcGetAttribute(driver.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, fn)} "
                f"dyn_smem<={driver.funcGetAttribute(driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, fn)}")
    except Exception as err:  # noqa: BLE001 - what the driver says of the handle is the point
        return f"attributes refused: {err}"


def main(order: str) -> int:
    query, cooperative = _batch_norm.max_active_clusters, _batch_norm.launch_cooperative

    def traced_query(fn, block, smem, cluster, at_launch=False):
        misses = query.cache_info().misses
        say(f"TRACE query fn={fn:#x} block={block} smem={smem} cluster={cluster} at_launch={at_launch} "
            f"misses={misses} {attrs(fn)} ctx={driver.ctxGetCurrent():#x}")
        got = query(fn, block, smem, cluster, at_launch)
        say(f"TRACE   -> {got} (misses {query.cache_info().misses})")
        return got

    def traced_cooperative(fn, grid, block, args, stream, smem):
        say(f"TRACE coop fn={fn:#x} grid={grid} block={block} smem={smem} stream={stream:#x} nargs={len(args)} "
            f"{attrs(fn)}")
        return cooperative(fn, grid, block, args, stream, smem)

    _batch_norm.max_active_clusters, _batch_norm.launch_cooperative = traced_query, traced_cooperative
    tests = open(order).read().split()
    return pytest.main(["-q", "-s", "-p", "no:xdist", "-p", "no:cacheprovider", *tests])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
