"""Does the GPU check's process state move the torch overhead reading? In one process: the
overhead measured fresh, again after the CuPy benchmark of bf16 LayerNorm (what the check
runs before it), then after gc.collect() + gc.freeze(), then with the collector off, then
with every thread of the process held to one core, and to two (is the cost a cross-core
wakeup of torch's autograd device thread and of the caller waiting on it?), and freed again.

    python benchmarks/profile_overhead_state.py

(Thirteenth session: the check read torch's own (1, 4096) forward + backward at 186 us
where a fresh process on the same machine read 95-104 us, and ours x1.8 against x1.38-1.45.
Fourteen checks so far: the slower torch's own loop, the higher our ratio, NOTES v54.)
"""
from __future__ import annotations

import gc
import os

from cunorm import _bench, _bench_torch
from cunorm._checks import BFLOAT16


def show(label: str) -> None:
    for r in _bench_torch.overhead(log=lambda s: None):
        print(f"{label:28s} {tuple(r['shape'])}: torch {r['torch_fwdbwd_wall_us']:7.1f} us, cunorm "
              f"{r['cunorm_fwdbwd_wall_us']:7.1f} us, x{r['fwdbwd_wall_ratio']}; gc counts {gc.get_count()}, "
              f"tracked {len(gc.get_objects())}", flush=True)


def pin(cpus) -> None:
    """Every thread of this process (torch's autograd threads included) onto ``cpus``."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except OSError:  # a thread that ended meanwhile
            pass


def main():
    show("fresh")
    _bench.run(ops=("layer_norm",), dtypes=(BFLOAT16,), log=lambda s: None)
    show("after the CuPy benchmark")
    show("again")
    gc.collect()
    gc.freeze()
    show("after gc.freeze()")
    gc.disable()
    show("collector off")
    gc.enable()
    allowed = sorted(os.sched_getaffinity(0))
    pin({allowed[-1]})
    show(f"one core ({allowed[-1]})")
    pin(set(allowed[-2:]))
    show(f"two cores ({allowed[-2]}, {allowed[-1]})")
    pin(set(allowed))
    show(f"all {len(allowed)} cores again")


if __name__ == "__main__":
    main()
