"""Forward variants at the benchmark's shapes, in one run after the GPU check: rows held in
shared memory (v22, the default for half-precision 16-byte packs) against the register tile
(``_row_norm.HOLD_ROWS_IN_SMEM`` off); float32 N = 16384 in shared memory (v31, the default)
against half precision only (``_config.SMEM_FWD_FROM``); the split forward's apply pass
last to first (v33, the default) against in order (``-DCUNORM_SPLIT_L2_ORDER=0``); the mean
pass summing half-precision packs raw (v34, ``-DCUNORM_FWD_PACK_SUM=1``, off); v41-v43
(bf16 unpacked a 32-bit word at a time, full tiles without bounds tests, an output pass for
a given weight and bias) switched off one after the other;
the shared-memory rows centred by one subtraction of pivot + mu (v26, the default) against
two; on request (RUN_ORDER) the register tile's one-pass statistics (v11). With FUSED_CONTROL
the fused rows of the GPU check (``cunorm._bench_fused``: residual, FP8 out) ride along as a
control. Plus each variant's fp32 and bf16 LayerNorm error on rows with a large offset.

    python benchmarks/sweep_fwd_variant.py [--json out.json]
"""
from __future__ import annotations

import numpy

from cunorm import _bench, _bench_fused, _compile, _config, reference
from cunorm._checks import BFLOAT16
from cunorm.ops import _row_norm
from _sweep_cli import rebuild_row_norms, row_norm_cases  # benchmarks/ is the script's directory

SMEM_DEFAULT = dict(_config.SMEM_FWD_FROM)
SMEM_HALF_ONLY = {2: SMEM_DEFAULT[2]}
# name: (compile options, rows in shared memory, _config.SMEM_FWD_FROM)
VARIANTS = {"register_row": ((), False, SMEM_DEFAULT), "smem_row": ((), True, SMEM_DEFAULT),
            "smem_half_only": ((), True, SMEM_HALF_ONLY),
            "split_in_order": (("-DCUNORM_SPLIT_L2_ORDER=0",), True, SMEM_DEFAULT),
            "smem_pack_sum": (("-DCUNORM_FWD_PACK_SUM=1",), True, SMEM_DEFAULT),
            "one_pass": (("-DCUNORM_FWD_ONE_PASS=1",), False, SMEM_DEFAULT),
            "smem_two_subtractions": (("-DCUNORM_FWD_SHIFT_ONCE=0",), True, SMEM_DEFAULT),
            # v41-v43, each switch of kernels/common.cuh and layer_norm.cu off in turn
            "before_v41": (("-DCUNORM_BF16_WORDS=0", "-DCUNORM_FWD_FULL_TILES=0", "-DCUNORM_FWD_AFFINE_CASES=0"),
                           True, SMEM_DEFAULT),
            "v41_bf16_words": (("-DCUNORM_FWD_FULL_TILES=0", "-DCUNORM_FWD_AFFINE_CASES=0"), True, SMEM_DEFAULT),
            "v41_v42_full_tiles": (("-DCUNORM_FWD_AFFINE_CASES=0",), True, SMEM_DEFAULT),
            "v41_v43_no_full_tiles": (("-DCUNORM_FWD_FULL_TILES=0",), True, SMEM_DEFAULT)}
RUN_ORDER = ("smem_half_only", "smem_row")  # after the GPU check: the default last
ROW_LENGTHS = (512, 1024, 2048, 4096, 8192, 16384, 32768)
DTYPES = ("bfloat16", "float32")
FUSED_CONTROL = False


def _use(options, smem: bool, tiles: dict) -> None:
    _row_norm.HOLD_ROWS_IN_SMEM = smem
    _config.SMEM_FWD_FROM = tiles
    rebuild_row_norms(options)


def _max_error(offset: float, dtype=numpy.float32, n: int = 4096) -> float:
    import cupy

    import cunorm

    x = (numpy.random.default_rng(0).standard_normal((64, n)) + offset).astype(dtype)
    y = cunorm.layer_norm(cupy.asarray(x)).get().astype(numpy.float64)
    return float(numpy.abs(y - reference.layer_norm(x).astype(numpy.float64)).max())


def sweep(log=print) -> list[dict]:
    default, rows = (_compile.COMPILE_OPTIONS, _row_norm.HOLD_ROWS_IN_SMEM, _config.SMEM_FWD_FROM), []
    copy = _bench.copy_gbps()
    _bench.bench_row_norm("layer_norm", BFLOAT16, 4096)  # clocks up first
    for name in RUN_ORDER:
        _use(*VARIANTS[name])
        errors = {f"max_err_{numpy.dtype(d).name}_offset_{o:g}": _max_error(o, d)
                  for d in (numpy.float32, BFLOAT16) for o in (0.0, 1e2, 1e4)}
        log(f"{name}: LayerNorm max |error| vs the float64 reference of the same input, N = 4096: {errors}")
        for op, dtype, n in row_norm_cases(ROW_LENGTHS):
            if dtype.name not in DTYPES:
                continue
            r = _bench.bench_row_norm(op, dtype, n)
            row = {"variant": name, "op": op, "dtype": dtype.name, "N": n,
                   "fwd_of_copy": round(r["fwd_GBps"] / copy, 3), "bwd_of_copy": round(r["bwd_GBps"] / copy, 3),
                   **errors}
            log(f"{name:12s} {op:10s} {dtype.name:8s} N={n:<6d} fwd {row['fwd_of_copy']:.3f} "
                f"bwd {row['bwd_of_copy']:.3f} of copy")
            rows.append(row)
        if FUSED_CONTROL:
            rows += [dict(row, variant=name) for row in _bench_fused.run(copy, log)]
    _use(*default)
    return rows


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__)
