"""v88 (twenty-sixth session): the half-precision backward's rows of a whole SM (1024 threads
a row, one block an SM: bf16 N = 4097-8192) on v86's bulk copies with a deeper ring. ncu
(results/stalls-bulk-vs-cp-async-h200.txt, LayerNorm N = 8192) put v86's bulk copies there
at 28.0 thread instructions an element against cp.async's 34.2, but waiting on the row's
mbarrier (long scoreboard 24.5% of stall samples, the wait loop's BRA 25.4% of samples)
where cp.async is issue-bound (not_selected first): one block an SM has only DEPTH - 1 rows
in flight, so the ring, not issue, may hold the bulk copies. Shared memory allows more rows
there without losing occupancy (a bf16 8192 row's x and dy: 32 KiB a buffer). Variants force
the bulk copies (``CUNORM_BWD_BULK=2``) and one ring depth (sweep_bwd_depth's build) against
main (cp.async, StagePolicy's depth); ``bulk`` keeps the policy's depths and also runs the
rows main already gives bulk copies. Builds alternate ROUNDS times in one process; outputs
must equal the first build's bit for bit.

    python benchmarks/sweep_bulk_sm_rows.py [--variants cp-async,bulk-d4,...] [--json out.json]
"""
from __future__ import annotations

from cunorm import _compile
from cunorm._checks import BFLOAT16
from _sweep_cli import chosen  # benchmarks/ is the script's directory
from sweep_bwd_depth import _use as use_depth
from sweep_bwd_stage import bits_sweep

# name: (CUNORM_BWD_BULK, ring depth; None: StagePolicy / _config.bwd_stage_depth)
VARIANTS = {"cp-async": (1, None), "bulk-d3": (2, 3), "bulk-d4": (2, 4), "bulk-d5": (2, 5), "cp-d4": (1, 4),
            "bulk": (2, None)}
ROUNDS = 2
CASES = [(op, BFLOAT16, 8192) for op in ("layer_norm", "rms_norm")]
# without a forced depth (--variants cp-async,bulk): also the rows main already gives bulk
# copies (128-512 threads) and RMSNorm's 128-thread row
POLICY_DEPTH_CASES = [(op, BFLOAT16, n) for op in ("layer_norm", "rms_norm") for n in (1024, 2048, 4096, 8192)]


def _use(variant, base=_compile.COMPILE_OPTIONS) -> None:
    bulk, depth = variant
    use_depth(depth, (*base, f"-DCUNORM_BWD_BULK={bulk}"))


def sweep(log=print, names=None) -> list[dict]:
    variants = chosen(VARIANTS, names)
    cases = CASES if any(depth for _, depth in variants.values()) else POLICY_DEPTH_CASES
    return bits_sweep(variants, ROUNDS, _use, VARIANTS["cp-async"], cases, (), ("bwd_of_copy",), log)


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__, VARIANTS)
