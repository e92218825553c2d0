"""Does a forward's speed depend on where y lies relative to x? The probe (and
sweep_cluster_fwd_stage_f32_rms.py) found float32 RMSNorm 262144 at 0.373 of copy without a
weight and 0.654 with one, in the same kernel (the weight only changes what is loaded per
row); with a weight and bias allocated between x and y, the benchmark's y lands 2 MiB later
than without them. Here x and y are views into one buffer, y starting ``x.nbytes + offset``
after x, so only the offset changes between the timings; with a weight and without. Kernel
time, fraction of copy, through cunorm.ops._row_norm.forward (the CuPy frontend's launch).

    python benchmarks/probe_output_offset.py [--json out.json]
"""
from __future__ import annotations

import numpy

F32 = numpy.dtype(numpy.float32)
OFFSETS_KIB = (0, 64, 256, 512, 1024, 2048, 3072, 4096, 16384)


def probe(log=print) -> list[dict]:
    import cupy

    from cunorm._bench import TOTAL_ELEMENTS, copy_gbps, queued_time_ms
    from cunorm._checks import BFLOAT16
    from cunorm.ops import _row_norm
    from cunorm.ops._row_norm_cupy import _Scratch, cupy_view

    copy = copy_gbps()
    log(f"copy {copy:.1f} GB/s")
    stream = cupy.cuda.get_current_stream().ptr
    rows = []
    for op, dtype, n in (("rms_norm", F32, 262144), ("layer_norm", F32, 262144), ("rms_norm", F32, 131072),
                         ("layer_norm", BFLOAT16, 65536)):
        m, rms = TOTAL_ELEMENTS // n, op == "rms_norm"
        nbytes = m * n * dtype.itemsize
        buf = cupy.empty(2 * nbytes + max(OFFSETS_KIB) * 1024, numpy.uint8)
        x = buf[:nbytes].view(dtype).reshape(m, n)
        x[...] = cupy.random.default_rng(0).standard_normal((m, n), dtype=numpy.float32).astype(dtype)
        w = cupy.ones(n, dtype)
        rstd = cupy.empty(m, F32)
        mean = cupy.empty(m, F32)
        for kib in OFFSETS_KIB:
            y_ptr = buf.data.ptr + nbytes + kib * 1024
            for name, weight in (("weight", w), ("none", None)):
                def fwd():
                    _row_norm.forward(cupy_view(x), None if weight is None else cupy_view(weight), None, y_ptr,
                                      0 if rms else mean.data.ptr, rstd.data.ptr, 1e-5, 1, rms, _Scratch(), stream,
                                      x.device.id)
                ms = queued_time_ms(fwd, stream)
                row = {"op": op, "dtype": dtype.name, "N": n, "offset_KiB": kib, "params": name,
                       "x_mod_2MiB": x.data.ptr % (2 << 20), "fwd_of_copy": round(2 * nbytes / ms / 1e6 / copy, 3)}
                log(f"{op:10s} {dtype.name:8s} N={n:<6d} y at x + {nbytes >> 20} MiB + {kib:5d} KiB {name:6s}: "
                    f"fwd {row['fwd_of_copy']:.3f} of copy")
                rows.append(row)
        del buf, x, w
        cupy.get_default_memory_pool().free_all_blocks()
    return rows


if __name__ == "__main__":
    from _sweep_cli import main  # benchmarks/ is the script's directory

    main(probe, __doc__)
