"""Do the long-row forwards pay for re-reading the weight and bias every row? The forward of
bf16 (and float32) rows at 8192-262144 timed with the parameters in x's dtype, in float32
(torch.autocast's case: 0.68x at bf16 LayerNorm 32768 in b0cda0593bfc's record), and with
none (weight=None, bias=None; RMSNorm without weight). Every kernel here reads each row's
parameters from global memory (through the L2: a row's worth of parameters, up to 2 MB at
262144 float32, is more than an SM's L1 keeps), so if the L2 is what limits them, the
parameter-free forward is the ceiling a parameter-resident kernel could reach. Nothing is
changed: same sources, three calls each. Kernel time, fraction of copy.

    python benchmarks/probe_param_traffic.py [--json out.json]
"""
from __future__ import annotations

import numpy

F32 = numpy.dtype(numpy.float32)
ROWS = (8192, 16384, 32768, 65536, 131072, 262144)


def probe(log=print) -> list[dict]:
    import cupy

    from cunorm._bench import copy_gbps, queued_time_ms, row_norm_calls
    from cunorm._checks import BFLOAT16

    copy = copy_gbps()
    log(f"copy {copy:.1f} GB/s")
    stream = cupy.cuda.get_current_stream().ptr
    rows = []
    for dtype in (BFLOAT16, F32):
        for op in ("layer_norm", "rms_norm"):
            for n in ROWS:
                row = {"op": op, "dtype": numpy.dtype(dtype).name, "N": n}
                for name, params in (("own", dtype), ("float32", F32), ("none", None)):
                    if name == "float32" and dtype == F32:
                        continue
                    fwd, bwd, m, _ = row_norm_calls(op, dtype, n, w_dtype=params, params=params is not None)
                    ms = queued_time_ms(fwd, stream)
                    row[name] = round(2 * m * n * numpy.dtype(dtype).itemsize / ms / 1e6 / copy, 3)
                    del fwd, bwd
                cupy.get_default_memory_pool().free_all_blocks()
                log(f"{op:10s} {row['dtype']:8s} N={n:<7d} fwd of copy: params in x's dtype {row['own']}, "
                    f"float32 {row.get('float32', '-')}, none {row['none']}")
                rows.append(row)
    return rows


if __name__ == "__main__":
    from _sweep_cli import main  # benchmarks/ is the script's directory

    main(probe, __doc__)
