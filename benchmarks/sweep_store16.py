"""Store instructions (v47, v48), builds alternated ROUNDS times in one process; every
build's forward, backward and FP8 outputs must equal the first build's bit for bit (only the
store instructions and the FP8 byte assembly differ):

- v46_base: the plain struct store, which NVVM split into 2- and 4-byte stores in the
  backwards and the cluster forward (``CUNORM_STORE16=0``), FP8 packs byte by byte
  (``CUNORM_FP8_WORDS=0``);
- v47_store16: store_pack_whole as one ``st.global.v4`` a 16-byte chunk, with a memory
  clobber;
- (run 2 also had v47_no_clobber, the same without the clobber: equal within 0.01, and gone;
  results/sweep-store16-h200.txt);
- v48_fp8_words: v47_store16 with FP8 packs assembled as 32-bit words (the default build).

    python benchmarks/sweep_store16.py [--json out.json]
"""
from __future__ import annotations

import numpy

from cunorm import _bench, _bench_fused
from cunorm._checks import BFLOAT16
from _sweep_cli import alternate_builds, best_table, row_norm_cases  # benchmarks/ is the script's directory
from sweep_bwd_stage import _same, fused_bwd_row, fwd_bwd_bits_row

VARIANTS = {"v46_base": ("-DCUNORM_STORE16=0", "-DCUNORM_FP8_WORDS=0"),
            "v47_store16": ("-DCUNORM_FP8_WORDS=0",),
            "v48_fp8_words": ()}
ROUNDS = 2
ROW_LENGTHS = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144)
FUSED_ROW_LENGTHS = (2048, 4096, 8192)


def _fp8(op: str, n: int, copy: float, m: int = 300):
    """FP8 e4m3 out: (y and amax bytes on fixed inputs, forward fraction of copy at M N = 64 Mi)."""
    import ml_dtypes

    import cunorm

    fp8 = ml_dtypes.float8_e4m3fn
    mm, (x, *_), w, b = _bench_fused._inputs(n)
    params = (w,) if op == "rms_norm" else (w, b)
    call = getattr(cunorm, op)
    got = [numpy.atleast_1d(a.get()) for a in call(x[:m], *params, out_dtype=fp8, out_scale=4.0, return_amax=True)]
    ms = _bench.time_ms(lambda: call(x, *params, out_dtype=fp8, out_scale=4.0, return_amax=True))
    return got, round(3 * mm * n / ms / 1e6 / copy, 3)


def sweep(log=print) -> list[dict]:
    rows, reference = [], {}
    for round_, name, copy in alternate_builds(VARIANTS, ROUNDS, log):
        for op, dtype, n in row_norm_cases(ROW_LENGTHS):
            rows.append(fwd_bwd_bits_row(name, round_, op, dtype, n, copy, reference, log))
        for op in ("layer_norm", "rms_norm"):
            for n in FUSED_ROW_LENGTHS:
                rows.append(fused_bwd_row(name, round_, op, n, copy, reference, log))
                got, frac = _fp8(op, n, copy)
                same = _same(got, reference.setdefault((op, "fp8", n), got))
                row = {"variant": name, "round": round_, "op": op, "dtype": "bfloat16", "N": n,
                       "fp8_fwd_of_copy": frac, "same_bits": same}
                log(f"{name:18s} {op:10s} FP8 out bf16 N={n:<5d} fwd {frac:.3f} of copy"
                    + ("" if same else "  RESULTS DIFFER"))
                rows.append(row)
    log(best_table(rows, VARIANTS, ("fwd_of_copy", "bwd_of_copy", "fused_residual_bwd_of_copy", "fp8_fwd_of_copy")))
    return rows


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__)
