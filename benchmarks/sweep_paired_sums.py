"""v84: the block and warp sums of two values (LayerNorm's backward c1 / c2, the one-pass
forward's statistics) as one butterfly whose halves carry one value each
(``CUNORM_PAIRED_SUM2``, kernels/common.cuh), against two butterflies (``=0``). The paired
sums add the same operands in the same order, so every output must equal the other build's
bit for bit (checked, as sweep_bwd_overhead's builds are). Row norms at the lengths whose
rows span a warp to a block of 1024 threads, the wide and cluster backward, the fused
residual backward, and the FP8-out LayerNorm forward (its one-pass statistics sum two
values). Builds alternate ROUNDS times in one process; the best rounds' tables come last.

    python benchmarks/sweep_paired_sums.py [--json out.json]
"""
from __future__ import annotations

import numpy

from cunorm import _bench, _bench_fused, _compile
from cunorm._checks import BFLOAT16
from _sweep_cli import adding_options, alternate, best_table, chosen  # benchmarks/ is the script's directory
from sweep_bwd_stage import bits_sweep

VARIANTS = {"two_butterflies": ("-DCUNORM_PAIRED_SUM2=0",), "paired": ()}
ROUNDS = 2
F32 = numpy.dtype(numpy.float32)
CASES = [("layer_norm", BFLOAT16, n) for n in (512, 1024, 2048, 4096, 8192, 16384, 65536)] + \
        [("rms_norm", BFLOAT16, n) for n in (1024, 8192)] + \
        [("layer_norm", F32, n) for n in (1024, 4096, 16384)]
FUSED_ROW_LENGTHS = (2048, 4096, 8192)


def _fp8_rows(variants: dict, use, log) -> list[dict]:
    """The FP8-out LayerNorm forward (bias, scale 4, amax) at FUSED_ROW_LENGTHS, each build,
    ROUNDS rounds: fraction of copy (bf16 x read, FP8 y written), y and amax checked bit for
    bit against the first build's."""
    import cupy
    import ml_dtypes

    import cunorm

    rows, reference = [], {}
    for round_, name, copy in alternate(variants, ROUNDS, use, (), log):
        for n in FUSED_ROW_LENGTHS:
            m, (x, *_), w, b = _bench_fused._inputs(n)

            def call():
                return cunorm.layer_norm(x, w, b, out_dtype=ml_dtypes.float8_e4m3fn, out_scale=4.0, return_amax=True)

            y, amax = call()
            got = (cupy.asnumpy(y.view(numpy.uint8)), cupy.asnumpy(amax))
            first = reference.setdefault(n, got)
            same = all(numpy.array_equal(a, c) for a, c in zip(got, first))
            ms = _bench.time_ms(call)
            row = {"variant": name, "round": round_, "op": "layer_norm_fp8", "dtype": "bfloat16", "N": n,
                   "fp8_fwd_of_copy": round(3 * m * n / ms / 1e6 / copy, 3), "same_bits": same}
            log(f"{name:18s} FP8 layer_norm N={n:<6d} fwd {row['fp8_fwd_of_copy']:.3f} of copy"
                + ("" if same else "  RESULTS DIFFER from the first variant"))
            rows.append(row)
    log(best_table(rows, variants, ("fp8_fwd_of_copy",)))
    return rows


def sweep(log=print, names=None) -> list[dict]:
    variants = chosen(VARIANTS, names)
    use = adding_options(_compile.COMPILE_OPTIONS)
    rows = bits_sweep(variants, ROUNDS, use, (), CASES, FUSED_ROW_LENGTHS,
                      ("fwd_of_copy", "bwd_of_copy", "fused_residual_bwd_of_copy"), log)
    return rows + _fp8_rows(variants, use, log)


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__, VARIANTS)
