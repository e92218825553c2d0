"""Row-norm bandwidth of two or more source trees in one device call: each git revision's
cunorm/ and kernels/ (or the working tree) timed in its own process, the trees alternating
ROUNDS times so drift shows as the spread within each. For an A/B of a change against the
sources before it, where a build option (the sweeps' way) cannot express the difference.

Here, before the device call (the device's copy has no .git; abtrees/ is git-ignored, so
name it in the device call's carry: ["abtrees"]):

    python benchmarks/ab_revisions.py export 4758c19 HEAD      # -> abtrees/4758c19, abtrees/HEAD

On the device (a tree is a directory holding cunorm/ and kernels/; "." is the working tree):

    python3 benchmarks/ab_revisions.py run abtrees/4758c19 abtrees/HEAD . \\
        --cases layer_norm:bf16:16384,rms_norm:fp32:65536

Each tree runs ``python3 -c`` with its directory first on sys.path (PYTHONPATH alone would
come after the current directory, where the working tree's cunorm/ would win). The last
table is the best of the rounds, fraction of copy (_sweep_cli.best_table: a line a case and
pass, a column a tree).
"""
from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys

from _sweep_cli import best_table  # benchmarks/ is the script's directory

ROUNDS = 2
DTYPES = {"bf16": "BFLOAT16", "fp16": "numpy.float16", "fp32": "numpy.float32"}
# one process's work: the copy, then each case; one JSON line a case
CHILD = """
import json, sys
sys.path.insert(0, {tree!r})
import numpy
from cunorm import _bench
from cunorm._checks import BFLOAT16
copy = _bench.copy_gbps()
for op, dt, n in {cases!r}:
    r = _bench.bench_row_norm(op, eval(dt), n)
    print(json.dumps({{"op": op, "dtype": numpy.dtype(eval(dt)).name, "N": n, "fwd_of_copy": r["fwd_GBps"] / copy,
                      "bwd_of_copy": r["bwd_GBps"] / copy}}), flush=True)
"""


def export(revs: list[str], root: pathlib.Path) -> None:
    for rev in revs:
        dest = root / rev.replace("/", "_")
        dest.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "archive", rev, "cunorm", "kernels"], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
        print(f"{rev} -> {dest}")


def _cases(spec: str) -> list[tuple]:
    out = []
    for item in spec.split(","):
        op, dt, n = item.split(":")
        if dt not in DTYPES:
            raise SystemExit(f"--cases: dtype {dt!r} is not one of {sorted(DTYPES)}")
        out.append((op, DTYPES[dt], int(n)))
    return out


def run(trees: list[str], cases: list[tuple], rounds: int) -> list[dict]:
    rows = []
    for round_ in range(rounds):
        for tree in trees:
            path = str(pathlib.Path(tree).resolve())
            proc = subprocess.run([sys.executable, "-c", CHILD.format(tree=path, cases=cases)],
                                  capture_output=True, text=True)
            if proc.returncode:
                print(f"{tree}: exit {proc.returncode}\n{proc.stderr[-2000:]}", flush=True)
                continue
            for line in proc.stdout.splitlines():
                r = dict(json.loads(line), variant=tree)
                print(f"round {round_ + 1} {tree:24s} {r['op']:10s} {r['dtype']:8s} N={r['N']:<7d} "
                      f"fwd {r['fwd_of_copy']:.3f} bwd {r['bwd_of_copy']:.3f}", flush=True)
                rows.append(r)
    print(best_table(rows, trees, ("fwd_of_copy", "bwd_of_copy")))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    ex = sub.add_parser("export", help="git revisions' cunorm/ and kernels/ into abtrees/<rev>")
    ex.add_argument("revs", nargs="+")
    ex.add_argument("--root", default="abtrees")
    rn = sub.add_parser("run", help="time each tree's row norms, alternating")
    rn.add_argument("trees", nargs="+")
    rn.add_argument("--cases", required=True, help="op:dtype:N,... (dtype bf16, fp16 or fp32)")
    rn.add_argument("--rounds", type=int, default=ROUNDS)
    args = ap.parse_args()
    if args.cmd == "export":
        export(args.revs, pathlib.Path(args.root))
    else:
        run(args.trees, _cases(args.cases), args.rounds)


if __name__ == "__main__":
    main()
