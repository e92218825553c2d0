"""Warp stall reasons, executed instructions and throughput of the row norms' kernels at the
shapes issue 4 still misses, in one device call (ncu, the GPU's clocks left alone):

    python benchmarks/profile_stalls.py --out $OUT/stalls [case ...]

A case is op:dtype:N:pass (e.g. layer_norm:bfloat16:16384:bwd); without any, CASES. Each
case runs benchmarks/kernel_target.py at M = 64 Mi / N under ncu, profiles every row-norm
kernel it launches, and keeps ncu's CSV under --out. The table printed last has, for each case's
longest kernel: its time, DRAM and SM throughput, registers, warps executed instructions
per element, and the stall reasons (cycles a warp waits an issued instruction) above 0.5,
largest first. NOTES "Next" asks for these before levers (b), (c) and (e).
"""
from __future__ import annotations

import argparse
import csv
import io
import os
import subprocess
import sys

CASES = ["layer_norm:bfloat16:8192:bwd", "rms_norm:bfloat16:8192:bwd",
         "layer_norm:bfloat16:16384:bwd", "rms_norm:bfloat16:16384:bwd",
         "layer_norm:float32:16384:bwd", "rms_norm:float32:16384:bwd",
         "layer_norm:bfloat16:4096:fwd", "layer_norm:bfloat16:16384:fwd", "rms_norm:bfloat16:16384:fwd",
         "layer_norm:bfloat16:262144:bwd", "rms_norm:float32:262144:bwd"]  # the last two: the grid rows (v79)
ELEMENTS = 1 << 26
METRICS = ["gpu__time_duration.sum", "dram__throughput.avg.pct_of_peak_sustained_elapsed",
           "sm__throughput.avg.pct_of_peak_sustained_elapsed", "smsp__inst_executed.sum",
           "launch__registers_per_thread", "sm__warps_active.avg.pct_of_peak_sustained_active",
           "regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio"]
STALL = ("smsp__average_warps_issue_stalled_", "_per_issue_active.ratio")


def profile(case: str, out: str) -> dict | None:
    op, dtype, n, direction = case.split(":")
    m = ELEMENTS // int(n)
    target = [sys.executable, os.path.join(os.path.dirname(__file__), "kernel_target.py"), op, dtype, str(m), n,
              direction]
    cmd = ["ncu", "--csv", "--print-units", "base", "--print-kernel-base", "function", "-k", "regex:^norm_",
           "--metrics", ",".join(METRICS), *target]
    done = subprocess.run(cmd, capture_output=True, text=True)
    path = os.path.join(out, case.replace(":", "-") + ".csv")
    with open(path, "w") as f:
        f.write(done.stdout)
        f.write(done.stderr)
    rows = [r for r in csv.DictReader(io.StringIO("\n".join(
        line for line in done.stdout.splitlines() if line.startswith('"'))))]
    if not rows:
        print(f"{case}: ncu gave no rows (rc {done.returncode}; {path})", flush=True)
        return None
    kernels: dict[str, dict] = {}
    for r in rows:
        kernels.setdefault(r["ID"], {"name": r["Kernel Name"]})[r["Metric Name"]] = r["Metric Value"]
    # the pass's main kernel: the longest launch (a backward case's set-up forward moves 2/3
    # of the backward's bytes; the column and partial reductions are short)
    k = max(kernels.values(), key=lambda d: _num(d.get("gpu__time_duration.sum")))
    stalls = sorted(((name[len(STALL[0]):-len(STALL[1])], _num(v)) for name, v in k.items()
                     if name.startswith(STALL[0])), key=lambda s: -s[1])
    return {"case": case, "kernel": k["name"], "us": _num(k.get("gpu__time_duration.sum")) / 1e3,
            "dram": _num(k.get("dram__throughput.avg.pct_of_peak_sustained_elapsed")),
            "sm": _num(k.get("sm__throughput.avg.pct_of_peak_sustained_elapsed")),
            "regs": _num(k.get("launch__registers_per_thread")),
            "warps": _num(k.get("sm__warps_active.avg.pct_of_peak_sustained_active")),
            "inst_per_elem": 32 * _num(k.get("smsp__inst_executed.sum")) / ELEMENTS,
            "stalls": [(s, v) for s, v in stalls if v >= 0.5]}


def _num(v) -> float:
    try:
        return float(str(v).replace(",", ""))
    except (TypeError, ValueError):
        return 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cases", nargs="*", default=CASES)
    ap.add_argument("--out", default="profile-stalls")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    results = [r for r in (profile(c, args.out) for c in args.cases) if r]
    # ncu's time is under replay (caches flushed, one kernel alone): read it against the
    # others here, not against the benchmark's
    print("case | kernel | us | DRAM % | SM % | regs | warps % | thread inst / element | stalls (cycles an issue)")
    for r in results:
        stalls = ", ".join(f"{s} {v:.2f}" for s, v in r["stalls"])
        print(f"{r['case']} | {r['kernel']} | {r['us']:.1f} | {r['dram']:.0f} | {r['sm']:.0f} | {r['regs']:.0f} | "
              f"{r['warps']:.0f} | {r['inst_per_elem']:.1f} | {stalls}")


if __name__ == "__main__":
    main()
