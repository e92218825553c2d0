"""What the L2-reuse scripts share (bn_l2_reuse.py, split_l2_reuse.py): a call timed as it
runs and with a large read queued before its last launch (the apply pass), which evicts
whatever the passes before it left in L2; the kernels rebuilt with ``-D`` defines first."""
from __future__ import annotations


def count_launches(module, fn) -> int:
    """The launches one call of fn makes through ``module.launch``."""
    real, count = module.launch, [0]

    def counting(*args, **kw):
        count[0] += 1
        real(*args, **kw)

    module.launch = counting
    try:
        fn()
    finally:
        module.launch = real
    return count[0]


def timed(module, fn, stream: int, flush=None, launches: int | None = None) -> float:
    """µs a call of fn (_bench.queued_time_ms); with flush() queued before each call's last
    launch through ``module.launch`` where given (``launches``: the call's, counted if None)."""
    from cunorm import _bench

    if flush is None:
        return _bench.queued_time_ms(fn, stream) * 1e3
    n, real, seen = launches or count_launches(module, fn), module.launch, [0]

    def launch(*args, **kw):
        if seen[0] % n == n - 1:
            flush()
        seen[0] += 1
        real(*args, **kw)

    module.launch = launch
    try:
        return _bench.queued_time_ms(fn, stream) * 1e3
    finally:
        module.launch = real


def flusher(nbytes: int, stream: int):
    """(flush, its µs): a full read of an ``nbytes`` buffer, timed alone."""
    import cupy
    import numpy

    from cunorm import _bench

    junk = cupy.ones(nbytes // 4, numpy.float32)
    sink = cupy.empty((), numpy.float32)  # a full reduction writes a 0-d array

    def flush():
        cupy.sum(junk, out=sink)

    return flush, _bench.queued_time_ms(flush, stream) * 1e3


def build_from_args(doc: str) -> None:
    """The command line's ``-D NAME=VALUE`` (repeatable): the kernels rebuilt with those NVRTC
    defines before anything is timed."""
    import argparse

    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("-D", dest="defines", action="append", default=[],
                    help="NVRTC defines to build the kernels with (e.g. CUNORM_SPLIT_L2_HINTS=0), repeatable")
    args = ap.parse_args()
    if args.defines:
        from cunorm import _compile
        from _sweep_cli import rebuild_row_norms  # benchmarks/ is the script's directory

        rebuild_row_norms((*_compile.COMPILE_OPTIONS, *(f"-D{d}" for d in args.defines)))
        print("built with " + " ".join(f"-D{d}" for d in args.defines))


def start(doc: str, nbytes: int):
    """A script's start: the kernels built as the command line asks (build_from_args), then
    (stream, flush, its µs) for an ``nbytes`` read on the current stream, its time printed."""
    import cupy

    build_from_args(doc)
    stream = cupy.cuda.get_current_stream().ptr
    flush, flush_us = flusher(nbytes, stream)
    print(f"flush: {nbytes >> 20} MiB read in {flush_us:.1f} us")
    return stream, flush, flush_us
