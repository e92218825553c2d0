"""What the benchmark sweeps share: the row-norm cases they walk, and the command line (run,
print as it goes, optionally save JSON)."""
from __future__ import annotations

import argparse
import itertools
import json


NO_PARAMS = "none"  # a pass_sweep case's parameters' dtype: no weight, no bias


def row_norm_cases(row_lengths):
    """(op, dtype, N) for both row norms, bf16 and fp32, at each row length, in that order."""
    import numpy

    from cunorm._checks import BFLOAT16

    return itertools.product(("layer_norm", "rms_norm"), (BFLOAT16, numpy.dtype(numpy.float32)), row_lengths)


def chosen(variants: dict, names=None) -> dict:
    """The variants ``--variants`` names (``names``, main's list), in the sweep's order; all of
    them without it."""
    return {k: v for k, v in variants.items() if names is None or k in names}


def rebuild_row_norms(options) -> None:
    """Compile every kernel anew with these NVRTC options: drops the loaded modules and, with
    them, every cache that holds one of their kernel pointers or a plan sized by one
    (_compile.held_with_modules; a stale pointer would time the previous build, or crash)."""
    from cunorm import _compile

    _compile.COMPILE_OPTIONS = tuple(options)
    _compile.drop_modules()


rebuild_batch_norm = rebuild_row_norms  # one rebuild serves every op


def adding_options(base: tuple):
    """A sweep's ``use`` for builds that add their NVRTC options (a variant's value) to
    ``base`` (the defaults): ``()``, alternate's default for it, rebuilds ``base`` itself."""
    return lambda extra: rebuild_row_norms((*base, *extra))


def config_builds(base: tuple, *names: str):
    """A sweep's ``use`` for builds that add NVRTC options to ``base`` and set host switches:
    a variant is (options, then a value for each of ``names``, attributes of cunorm._config,
    in order); the row norms are rebuilt after the switches are set."""
    from cunorm import _config

    def use(variant):
        options, *values = variant
        for name, value in zip(names, values, strict=True):
            setattr(_config, name, value)
        rebuild_row_norms((*base, *options))

    return use


def alternate(variants: dict, rounds: int, use, default, log=print):
    """Yields (round, name, copy bandwidth in GB/s) after ``use(variant)`` has set that
    variant up, every variant once a round, so clock drift shows as the spread within a
    variant; ``use(default)`` once the loop ends or breaks. Measures the copy and warms the
    clocks first."""
    from cunorm import _bench
    from cunorm._checks import BFLOAT16

    copy = _bench.copy_gbps()
    _bench.bench_row_norm("layer_norm", BFLOAT16, 4096)  # clocks up first
    try:
        for round_ in range(rounds):
            for name, variant in variants.items():
                use(variant)
                log(f"-- {name} (round {round_ + 1})")
                yield round_ + 1, name, copy
    finally:
        use(default)


def alternate_builds(variants: dict, rounds: int, log=print):
    """``alternate`` over builds: each variant's NVRTC options, the row norms rebuilt with
    them, the default options back at the end."""
    from cunorm import _compile

    return alternate(variants, rounds, rebuild_row_norms, _compile.COMPILE_OPTIONS, log)


def forward_checks(checks, log=print, describe=lambda *case: ""):
    """A pass_sweep ``extra`` that, in each variant's first round, runs the GPU tests' check
    (tests/norm_cases.check: forward and backward against the float64 reference, the tests'
    per-dtype tolerances) on each of ``checks``, (op, dtype, rows, N, parameters' dtype), with
    rows at an offset of 40, and logs the outcome after ``describe(op, dtype, rows, n,
    w_dtype)``: a variant build that times fast but computes wrong shows here."""

    def extra(name: str, round_: int, copy: float, log=log) -> list[dict]:
        if round_ != 1:
            return []
        import os
        import sys

        import numpy

        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
        from norm_cases import check

        rng = numpy.random.default_rng(7)
        for op, dtype, rows, n, w_dtype in checks:
            detail = describe(op, dtype, rows, n, w_dtype)
            try:
                check(op, rng, (rows, n), dtype, param_dtype=w_dtype, x_offset=40.0)
                outcome = "ok"
            except AssertionError as e:
                outcome = f"FAILED {e}"
            log(f"check {name} {op} {numpy.dtype(dtype).name}/w:{numpy.dtype(w_dtype).name} ({rows}, {n})"
                f"{detail}: {outcome}")
        return []

    return extra


def backward_checks(checks, log=print):
    """forward_checks logged with the backward plan's block size."""

    def describe(op, dtype, rows, n, w_dtype):
        from cunorm.ops import _row_norm

        plan = _row_norm.backward_plan((rows, n), (n, 1), (n, 1), dtype, w_dtype, dtype, 1, op == "rms_norm", 0, 0,
                                       0)
        return f": block {plan.block}, blocks {plan.blocks}, groups {plan.groups}"

    return forward_checks(checks, log, describe)


def fused_rows(name: str, round_: int, copy: float, log=print) -> list[dict]:
    """The GPU check's fused rows (residual forward and backward, FP8 out) for one variant and
    round, each with ``fp8_of_copy`` for best_table."""
    from cunorm import _bench_fused

    return [dict(row, variant=name, round=round_, fp8_of_copy=row["fp8_fwd_of_copy"])
            for row in _bench_fused.run(copy, log)]


def backward_sweep(variants: dict, rounds: int, use, default, cases, log=print, runs=None) -> list[dict]:
    """``alternate`` over ``cases`` of (op, dtype, N), each timed by the benchmark; a row a
    case, variant and round with the backward's fraction of copy, and the table of the best
    rounds logged last. ``runs(name, op, dtype, n)`` (optional) skips the cases it refuses."""
    return pass_sweep(variants, rounds, use, default, cases, ("bwd",), log, runs)


def pass_sweep(variants: dict, rounds: int, use, default, cases, passes, log=print, runs=None, extra=None,
               extra_keys=()) -> list[dict]:
    """backward_sweep over the benchmark's ``passes`` ("fwd", "bwd"): a row's
    ``<pass>_of_copy`` for each; a case may name the parameters' dtype fourth (default x's;
    NO_PARAMS: neither weight nor bias).
    ``extra(name, round, copy, log)`` (optional) adds its rows each
    round (fused_rows), their ``extra_keys`` in the table."""
    from cunorm import _bench

    rows = []
    for round_, name, copy in alternate(variants, rounds, use, default, log):
        for op, dtype, n, *w_dtype in cases:  # (op, dtype, N) or (op, dtype, N, parameters' dtype)
            if runs is not None and not runs(name, op, dtype, n):
                continue
            w_dtype = w_dtype[0] if w_dtype else None
            params = not (isinstance(w_dtype, str) and w_dtype == NO_PARAMS)
            r = _bench.bench_row_norm(op, dtype, n, w_dtype=w_dtype if params else None, params=params)
            label = dtype.name if w_dtype is None else f"{dtype.name}/w:{w_dtype.name if params else w_dtype}"
            row = {"variant": name, "round": round_, "op": op, "dtype": label, "N": n}
            row.update({f"{p}_of_copy": round(r[f"{p}_GBps"] / copy, 3) for p in passes})
            log(f"{name:16s} {op:10s} {label:8s} N={n:<6d} "
                + " ".join(f"{p} {row[p + '_of_copy']:.3f}" for p in passes) + " of copy")
            rows.append(row)
        if extra is not None:
            rows += extra(name, round_, copy, log)
    log(best_table(rows, variants, tuple(f"{p}_of_copy" for p in passes) + tuple(extra_keys)))
    return rows


def best_table(rows: list[dict], variants, keys=("fwd_of_copy",), label: str | None = None) -> str:
    """Each (op, dtype, N) case's best of its rounds, fraction of copy, a column a variant;
    with several keys (passes: fwd_of_copy, bwd_of_copy, ...) a line a case and key; with
    ``label``, each cell also shows that field of the variant's row (e.g. its kernel path)."""
    best: dict = {}
    for r in rows:
        for k in keys:
            if k in r:
                case = (r["op"], r["dtype"], str(r["N"])) + ((k.replace("_of_copy", ""),) if len(keys) > 1 else ())
                cell = best.setdefault(case, {})
                old = cell.get(r["variant"], (0.0, ""))
                cell[r["variant"]] = (max(old[0], r[k]), f" ({r[label]})" if label else "")
    lines = ["op dtype N" + (" pass" if len(keys) > 1 else "") + " | " + " | ".join(variants)]
    for case, cell in best.items():
        lines.append(" ".join(case) + " | " + " | ".join(
            f"{cell[v][0]:.3f}{cell[v][1]}" if v in cell else "nan" for v in variants))
    return "\n".join(lines)


def main(sweep, doc: str, variants=None) -> None:
    """Runs ``sweep()``; with ``variants`` (the sweep's names) ``--variants a,b`` runs a subset,
    as ``sweep(names=[...])``."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="also write the rows here")
    if variants:
        ap.add_argument("--variants", help="comma-separated subset of: " + ", ".join(variants))
    args = ap.parse_args()
    names = getattr(args, "variants", None)
    if names:
        unknown = set(names.split(",")) - set(variants)
        if unknown:
            ap.error(f"--variants: unknown {sorted(unknown)}")
    rows = sweep(names=names.split(",")) if names else sweep()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
