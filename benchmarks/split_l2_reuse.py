"""Whether the split row forward's apply pass gets x from L2, as bn_l2_reuse.py asks of the
BatchNorm apply passes: the forward at N = 524288 and 1M (the benchmark's 64 Mi elements:
the split path, three launches: tile statistics, finalize, apply) timed as it runs, and with
a 256 MiB read queued before its apply launch (evicting what the statistics pass left in
L2), less that read's own time. Equal times: the apply finds nothing in L2 (what v118's
hints would change); flushed slower: the difference is what it finds there now.

    python benchmarks/split_l2_reuse.py
"""
from __future__ import annotations

import cupy
import numpy

from cunorm import _bench
from cunorm._checks import BFLOAT16
from cunorm.ops import _row_norm

FLUSH_BYTES = 256 << 20
ROW_LENGTHS = (524288, 1 << 20)
ELEMENTS = 64 << 20


def _timed(fn, stream: int, flush=None) -> float | None:
    """µs a call of fn; with flush() queued before each call's apply launch where given (None
    where the call is not the split forward's three launches)."""
    if flush is None:
        return _bench.queued_time_ms(fn, stream) * 1e3
    real, seen = _row_norm.launch, []

    def count(*args, **kw):
        seen.append(1)
        real(*args, **kw)

    _row_norm.launch = count
    try:
        fn()
    finally:
        _row_norm.launch = real
    n, calls = len(seen), [0]
    if n != 3:
        print(f"  not the split forward: {n} launches a call")
        return None

    def launch(*args, **kw):
        if calls[0] % n == n - 1:
            flush()
        calls[0] += 1
        real(*args, **kw)

    _row_norm.launch = launch
    try:
        return _bench.queued_time_ms(fn, stream) * 1e3
    finally:
        _row_norm.launch = real


def main() -> None:
    import cunorm
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-D", dest="defines", action="append", default=[],
                    help="NVRTC defines to build the kernels with (e.g. CUNORM_SPLIT_L2_HINTS=0), repeatable")
    args = ap.parse_args()
    if args.defines:
        from cunorm import _compile
        from _sweep_cli import rebuild_row_norms  # benchmarks/ is the script's directory

        rebuild_row_norms((*_compile.COMPILE_OPTIONS, *(f"-D{d}" for d in args.defines)))
        print("built with " + " ".join(f"-D{d}" for d in args.defines))

    stream = cupy.cuda.get_current_stream().ptr
    junk = cupy.ones(FLUSH_BYTES // 4, numpy.float32)
    sink = cupy.empty((), numpy.float32)

    def flush():
        cupy.sum(junk, out=sink)

    flush_us = _bench.queued_time_ms(flush, stream) * 1e3
    print(f"flush: {FLUSH_BYTES >> 20} MiB read in {flush_us:.1f} us")
    for n in ROW_LENGTHS:
        for dtype in (BFLOAT16, numpy.dtype(numpy.float32)):
            x = cupy.asarray(numpy.random.default_rng(0).standard_normal((ELEMENTS // n, n), numpy.float32)).astype(dtype)
            w = cupy.ones(n, dtype)
            for op, fn in (("layer_norm", lambda: cunorm.layer_norm(x, w, w)), ("rms_norm", lambda: cunorm.rms_norm(x, w))):
                t0, t1 = _timed(fn, stream), _timed(fn, stream, flush)
                if t1 is None:
                    continue
                t1 -= flush_us
                mb = x.nbytes / 1e6
                print(f"{op:10s} {dtype.name:8s} N={n:<8d} x {mb:6.1f} MB: {t0:7.1f} us, L2 flushed before the "
                      f"apply {t1:7.1f} us ({t1 / t0:.3f}; ~{max(0.0, t1 - t0) * 1e-6 * 2.9e12 / 1e6:5.1f} MB "
                      f"from L2 at 2.9 TB/s)", flush=True)
            del x


if __name__ == "__main__":
    main()
