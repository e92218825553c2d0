"""Warp stall reasons, executed instructions and throughput of the norms' kernels at the
shapes issues 4 and 5 still miss, in one device call (ncu, the GPU's clocks left alone):

    python benchmarks/profile_stalls.py --out $OUT/stalls [case ...]
    python benchmarks/profile_stalls.py --source --out $OUT/src layer_norm:bfloat16:8192:bwd rms_norm:bfloat16:8192:bwd
    python benchmarks/profile_stalls.py --source --define CUNORM_BWD_BULK=0 --tag cp-async --out $OUT/src CASE
    python benchmarks/profile_stalls.py --dram --out $OUT/dram batch_norm:bfloat16:32x256x56x56:nhwc:bwd

A case is op:dtype:N:pass (e.g. layer_norm:bfloat16:16384:bwd; pass fp8: the forward with FP8 out) or
batch_norm:dtype:NxCxHxW:layout:pass (batch_norm:bfloat16:64x1024x14x14:nhwc:fwd); without
any, CASES. Each case runs benchmarks/kernel_target.py (row norms at M = 64 Mi / N) under
ncu, profiles every kernel of the op it launches, and appends ncu's CSV to --out/ncu-raw.txt. The
table printed last has a row for a row-norm case's longest kernel, and for each of a
BatchNorm call's kernels: time, DRAM and SM throughput, registers, active warps, thread
instructions executed per element, and the stall reasons (cycles a warp waits an issued
instruction) of 0.5 and up, largest first. NOTES "Next" asks for these before levers (b),
(c) and (e), and issue 5's channels-last rows are the weakest BatchNorm ones.
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
         "layer_norm:bfloat16:262144:bwd", "rms_norm:float32:262144:bwd",  # these two: the grid rows (v79)
         "batch_norm:bfloat16:64x1024x14x14:nhwc:fwd", "batch_norm:bfloat16:64x1024x14x14:nhwc:bwd",
         "batch_norm:bfloat16:32x256x56x56:nhwc:fwd", "batch_norm:bfloat16:32x256x56x56:nhwc:bwd"]
CALLS = 4  # kernel_target's timed calls: a kernel launched fewer times belongs to its set-up
ELEMENTS = 1 << 26
METRICS = ["gpu__time_duration.sum", "dram__throughput.avg.pct_of_peak_sustained_elapsed",
           "sm__throughput.avg.pct_of_peak_sustained_elapsed", "smsp__inst_executed.sum",
           "launch__registers_per_thread", "sm__warps_active.avg.pct_of_peak_sustained_active",
           "regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio"]
STALL = ("smsp__average_warps_issue_stalled_", "_per_issue_active.ratio")
# --dram: the bytes each kernel moves to and from DRAM, with the L2 left as the kernel before
# it left it (ncu's --cache-control none): whether a second pass over x finds it in L2 (the
# BatchNorm passes walk their apply last to first for that), as multiples of one tensor's bytes
DRAM_METRICS = ["gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum",
                "lts__t_sector_hit_rate.pct"]


TARGET = [sys.executable, os.path.join(os.path.dirname(__file__), "kernel_target.py")]
TAG = ""  # --tag, for --source's file names


def _row_target(case: str) -> tuple[list[str], str]:
    """kernel_target.py's command for a row-norm case (M = ELEMENTS / N rows), and its pass."""
    op, dtype, n, direction = case.split(":")
    return [*TARGET, op, dtype, str(ELEMENTS // int(n)), n, direction], direction


# kernel_target.py's variant build (--define / --host), passed through its environment
VARIANT = {"CUNORM_TARGET_DEFINES": "", "CUNORM_TARGET_HOST": ""}


def _ncu(cmd: list[str], path: str, mode: str) -> subprocess.CompletedProcess:
    """Runs ncu, writing the command, its variant, its rc and its output to ``path`` (opened
    with ``mode``)."""
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **VARIANT})
    with open(path, mode) as f:
        variant = " ".join(f"{k}='{v}'" for k, v in VARIANT.items() if v)
        f.write(f"# {variant + ' ' if variant else ''}{' '.join(cmd)} (rc {done.returncode})\n")
        f.write(done.stdout)
        f.write(done.stderr)
    return done


def profile(case: str, out: str, dram: bool = False) -> list[dict]:
    fields = case.split(":")
    if fields[0] == "batch_norm":
        _, dtype, shape, layout, direction = fields
        elements = 1
        for v in shape.split("x"):
            elements *= int(v)
        target, kernel_regex = [*TARGET, "batch_norm", dtype, shape, layout, direction], "regex:^bn_"
    else:
        elements = ELEMENTS
        target, kernel_regex = _row_target(case)[0], "regex:^norm_"
    # a row norm's longest kernel is among its first eight launches (the set-up and at least
    # two calls of one to three); a BatchNorm call's kernels are counted over every call
    limit = ["--launch-count", "8"] if fields[0] != "batch_norm" else []
    caches = ["--cache-control", "none"] if dram else []
    cmd = ["ncu", "--clock-control", "none", *caches, "--csv", "--print-units", "base", "--print-kernel-base", "function",
           "-k", kernel_regex, *limit, "--metrics", ",".join(DRAM_METRICS if dram else METRICS), *target]
    # one file for every case: the device tool brings back a few files a call, not fifteen
    path = os.path.join(out, "ncu-raw.txt")
    done = _ncu(cmd, path, "a")
    rows = [r for r in csv.DictReader(io.StringIO("\n".join(
        line for line in done.stdout.splitlines() if line.startswith('"'))))]
    if not rows:
        print(f"{case}: ncu gave no rows (rc {done.returncode}; {path})", flush=True)
        return []
    launches: dict[str, dict] = {}
    for r in rows:
        launches.setdefault(r["ID"], {"name": r["Kernel Name"]})[r["Metric Name"]] = r["Metric Value"]
    if fields[0] == "batch_norm":  # each kernel of a timed call: its last launch
        ordered = [launches[i] for i in sorted(launches, key=int)]
        counts = {k["name"]: sum(d["name"] == k["name"] for d in ordered) for k in ordered}
        picked = list({k["name"]: k for k in ordered if counts[k["name"]] >= CALLS}.values())
    else:  # the pass's main kernel: the longest launch (a backward case's set-up forward moves
        # 2/3 of the backward's bytes; the column and partial reductions are short)
        picked = [max(launches.values(), key=lambda d: _num(d.get("gpu__time_duration.sum")))]
    if dram:
        tensor = elements * {"bfloat16": 2, "float16": 2, "float32": 4, "float64": 8}[fields[1]]
        return [_dram_summary(case, k, tensor) for k in picked]
    return [_summary(case, k, elements) for k in picked]


def _dram_summary(case: str, k: dict, tensor_bytes: int) -> dict:
    return {"case": case, "kernel": k["name"], "us": _num(k.get("gpu__time_duration.sum")) / 1e3,
            "read": _num(k.get("dram__bytes_read.sum")) / tensor_bytes,
            "write": _num(k.get("dram__bytes_write.sum")) / tensor_bytes,
            "l2_hit": _num(k.get("lts__t_sector_hit_rate.pct"))}


def source_counters(case: str, out: str) -> str:
    """ncu's per-instruction page (SASS, its executed counts and sampled stall reasons) of a
    row-norm case's main kernel, the second call's (the first after any set-up forward),
    written to out/source-CASE.csv; returns the path. First run in the twenty-fourth session
    (NOTES v84), 18 s for three cases."""
    target, direction = _row_target(case)
    kernel = {"fp8": "norm_fwd_fused"}.get(direction, f"norm_{direction}")
    cmd = ["ncu", "--clock-control", "none", "-k", f"regex:^{kernel}", "--launch-skip", "1",
           "--launch-count", "1", "--section", "SourceCounters", "--page", "source", "--print-source", "sass", "--csv",
           *target]
    path = os.path.join(out, "source-" + case.replace(":", "-") + TAG + ".csv")
    _ncu(cmd, path, "w")
    return path


def source_summary(path: str, elements: int = ELEMENTS, top: int = 16, hottest: int = 6) -> str:
    """The source page's totals: warp instructions executed, thread instructions an element,
    and for the opcodes that issue the most, their share of the instructions and of the
    sampled stalls; then the sampled stall reasons' shares (v84 read its lever off these);
    then the ``hottest`` single instructions by their share of the samples, with how often
    each ran (v90 found the cluster barrier's wait this way: one instruction, 17-23%)."""
    with open(path) as f:
        lines = [line for line in f if line.startswith('"')]
    rows = list(csv.reader(io.StringIO("".join(lines))))
    starts = [i for i, r in enumerate(rows) if r and r[0] == "Address"]
    if not starts:
        return f"{path}: no source rows"
    header = rows[starts[0]]
    data = [dict(zip(header, r)) for r in rows[starts[0] + 1:] if len(r) == len(header)]
    executed = sum(_num(d["Instructions Executed"]) for d in data)
    samples = sum(_num(d["Warp Stall Sampling (All Samples)"]) for d in data) or 1.0
    by_op: dict = {}
    for d in data:
        words = d["Source"].split()
        op = (words[1] if words and words[0].startswith("@") and len(words) > 1 else (words or ["?"])[0]).split(".")[0]
        e, smp = by_op.get(op, (0.0, 0.0))
        by_op[op] = (e + _num(d["Instructions Executed"]), smp + _num(d["Warp Stall Sampling (All Samples)"]))
    out = [f"{os.path.basename(path)}: {len(data)} instructions, {executed:.0f} warp instructions executed, "
           f"{32 * executed / elements:.1f} thread instructions an element"]
    for op, (e, smp) in sorted(by_op.items(), key=lambda kv: -kv[1][0])[:top]:
        out.append(f"  {op:10s} {100 * e / (executed or 1):5.1f}% of instructions {100 * smp / samples:5.1f}% of samples")
    reasons = {h[len("stall_"):]: sum(_num(d[h]) for d in data) for h in header
               if h.startswith("stall_") and "Not Issued" not in h}
    out.append("  stalls: " + ", ".join(f"{k} {100 * v / samples:.1f}%" for k, v in
                                         sorted(reasons.items(), key=lambda kv: -kv[1])[:8]))
    for d in sorted(data, key=lambda d: -_num(d["Warp Stall Sampling (All Samples)"]))[:hottest]:
        out.append(f"  {100 * _num(d['Warp Stall Sampling (All Samples)']) / samples:5.1f}% of samples: "
                   f"{' '.join(d['Source'].split())[:64]} (ran {_num(d['Instructions Executed']):.0f} times)")
    return "\n".join(out)


def _summary(case: str, k: dict, elements: int) -> dict:
    stalls = sorted(((name[len(STALL[0]):-len(STALL[1])], _num(v)) for name, v in k.items()
                     if name.startswith(STALL[0])), key=lambda s: -s[1])
    return {"case": case, "kernel": k["name"], "us": _num(k.get("gpu__time_duration.sum")) / 1e3,
            "dram": _num(k.get("dram__throughput.avg.pct_of_peak_sustained_elapsed")),
            "sm": _num(k.get("sm__throughput.avg.pct_of_peak_sustained_elapsed")),
            "regs": _num(k.get("launch__registers_per_thread")),
            "warps": _num(k.get("sm__warps_active.avg.pct_of_peak_sustained_active")),
            "inst_per_elem": 32 * _num(k.get("smsp__inst_executed.sum")) / elements,
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
    ap.add_argument("--source", action="store_true",
                    help="row-norm cases only: ncu's per-instruction source page instead of the table")
    ap.add_argument("--define", action="append", default=[], metavar="NAME=VALUE",
                    help="an NVRTC -D option for the profiled build (repeatable), e.g. CUNORM_BWD_BULK=0")
    ap.add_argument("--host", action="append", default=[], metavar="MODULE.ATTR=LITERAL",
                    help="a cunorm host setting for the profiled process (repeatable), e.g. "
                         "ops._row_norm.FWD_PREFETCH=False")
    ap.add_argument("--tag", default="", help="appended to --source's file names (one run a variant)")
    ap.add_argument("--dram", action="store_true",
                    help="DRAM bytes read and written by each kernel (in tensors' bytes) and its L2 hit "
                         "rate, caches left as the kernel before left them, instead of the stalls")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    global TAG
    TAG = f"-{args.tag}" if args.tag else ""
    VARIANT.update({"CUNORM_TARGET_DEFINES": " ".join(args.define), "CUNORM_TARGET_HOST": " ".join(args.host)})
    if args.source:
        for c in args.cases:
            if not c.startswith("batch_norm"):
                print(source_summary(source_counters(c, args.out)), flush=True)
        return
    if args.dram:
        results = [r for c in args.cases for r in profile(c, args.out, dram=True)]
        print("case | kernel | us | DRAM read (tensors) | DRAM written (tensors) | L2 hit %")
        for r in results:
            print(f"{r['case']} | {r['kernel']} | {r['us']:.1f} | {r['read']:.2f} | {r['write']:.2f} | {r['l2_hit']:.0f}")
        return
    results = [r for c in args.cases for r in profile(c, args.out)]
    # ncu's time is under replay (caches flushed, one kernel alone): read it against the
    # others here, not against the benchmark's
    print("case | kernel | us | DRAM % | SM % | regs | warps % | thread inst / element | stalls (cycles an issue)")
    for r in results:
        stalls = ", ".join(f"{s} {v:.2f}" for s, v in r["stalls"])
        print(f"{r['case']} | {r['kernel']} | {r['us']:.1f} | {r['dram']:.0f} | {r['sm']:.0f} | {r['regs']:.0f} | "
              f"{r['warps']:.0f} | {r['inst_per_elem']:.1f} | {stalls}")


if __name__ == "__main__":
    main()
