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

from cunorm._checks import BFLOAT16
from cunorm.ops import _row_norm
from _l2_flush import count_launches, start, timed  # benchmarks/ is the script's directory

FLUSH_BYTES = 256 << 20
ROW_LENGTHS = (524288, 1 << 20)
ELEMENTS = 64 << 20
SPLIT_LAUNCHES = 3  # tile statistics, finalize, apply


def main() -> None:
    import cunorm

    stream, flush, flush_us = start(__doc__, FLUSH_BYTES)
    for n in ROW_LENGTHS:
        for dtype in (BFLOAT16, numpy.dtype(numpy.float32)):
            x = cupy.asarray(numpy.random.default_rng(0).standard_normal((ELEMENTS // n, n), numpy.float32)).astype(dtype)
            w = cupy.ones(n, dtype)
            for op, fn in (("layer_norm", lambda: cunorm.layer_norm(x, w, w)), ("rms_norm", lambda: cunorm.rms_norm(x, w))):
                n_launches = count_launches(_row_norm, fn)
                if n_launches != SPLIT_LAUNCHES:
                    print(f"  {op} {dtype.name} N={n}: not the split forward ({n_launches} launches a call)")
                    continue
                t0 = timed(_row_norm, fn, stream)
                t1 = timed(_row_norm, fn, stream, flush, n_launches) - flush_us
                mb = x.nbytes / 1e6
                print(f"{op:10s} {dtype.name:8s} N={n:<8d} x {mb:6.1f} MB: {t0:7.1f} us, L2 flushed before the "
                      f"apply {t1:7.1f} us ({t1 / t0:.3f}; ~{max(0.0, t1 - t0) * 1e-6 * 2.9e12 / 1e6:5.1f} MB "
                      f"from L2 at 2.9 TB/s)", flush=True)
            del x


if __name__ == "__main__":
    main()
