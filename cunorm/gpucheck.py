"""The GPU check: the whole GPU test suite and the benchmark in one command.

    python -m cunorm.gpucheck --out DIR

Writes DIR/gpu-latest.json (commit it as benchmarks/results/gpu-latest.json), the pytest log
and JUnit XML, and prints a short table last. ``source_digest`` ties the numbers to the
exact kernels/ and cunorm/ sources they were measured with."""
from __future__ import annotations

import argparse
import os
import datetime
import hashlib
import json
import pathlib
import signal
import sys
from typing import NamedTuple

ROOT = pathlib.Path(__file__).resolve().parent.parent


def source_digest(root: pathlib.Path = ROOT) -> str:
    """sha256 over kernels/ and cunorm/ sources (.cu .cuh .h .py), sorted relative POSIX paths,
    feeding path, NUL, bytes, NUL for each."""
    files = sorted(p.relative_to(root) for d in ("kernels", "cunorm") if (root / d).is_dir()
                   for p in (root / d).rglob("*")
                   if p.is_file() and p.suffix in {".cu", ".cuh", ".h", ".py"} and "__pycache__" not in p.parts)
    h = hashlib.sha256()
    for rel in files:
        h.update(rel.as_posix().encode())
        h.update(b"\0")
        h.update((root / rel).read_bytes())
        h.update(b"\0")
    return h.hexdigest()


def environment_with_repo(**overrides: str) -> dict:
    """os.environ plus OVERRIDES, with this checkout first on PYTHONPATH, for child interpreters
    that must import this cunorm (and tests/) rather than an installed copy."""
    return dict(os.environ, **overrides,
                PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))


class _Counts:
    """pytest plugin: passed / failed / skipped, counting setup and teardown errors as failed."""

    def __init__(self):
        self.passed = self.failed = self.skipped = 0

    def pytest_runtest_logreport(self, report):
        if report.skipped:
            self.skipped += 1
        elif report.failed:
            self.failed += 1
        elif report.when == "call":
            self.passed += 1


# CI compiles every instantiation for sm_80/sm_90 without a GPU; repeating that here would
# spend minutes of device time on CPU work.
DEFAULT_PYTEST_ARGS = ["-k", "not instantiations_compile"]


def run_tests(out: pathlib.Path, extra: list[str]) -> dict:
    import importlib.util

    import pytest

    counts = _Counts()
    args = [str(ROOT / "tests"), "-q", "-rfEs", "-p", "no:cacheprovider", f"--junitxml={out / 'pytest.xml'}",
            "-o", "junit_family=xunit2", *DEFAULT_PYTEST_ARGS, *extra]
    if importlib.util.find_spec("xdist") is not None:
        args += ["-n", "8"]  # the float64 NumPy references are the slow part; spread them
    code = pytest.main(args, plugins=[counts])
    return {"passed": counts.passed, "failed": counts.failed, "skipped": counts.skipped, "exit_code": int(code)}


def _torch_bench():
    """cunorm._bench_torch where torch with CUDA is installed, else None."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    from . import _bench_torch

    return _bench_torch


def _torch_numbers(bench, cupy_rows, overhead) -> dict:
    """The PyTorch adapter's overhead (``overhead``: taken before the CuPy benchmark; again
    here, after it: the host reads slower there, benchmarks/NOTES.md v54) and bandwidth;
    ``bench`` is _torch_bench()'s module."""
    log = lambda s: print(s, flush=True)  # noqa: E731
    return {"overhead": overhead, "overhead_after_bench": bench.overhead(log),
            "bandwidth": bench.bandwidth(cupy_rows, log=log), "small_batch": bench.small_batches(log)}


def _jax_numbers() -> dict | None:
    """The JAX adapter's bandwidth inside jit next to the CuPy API's and XLA's, where JAX
    sees a GPU."""
    try:
        import jax
    except ImportError:
        return None
    try:
        if not jax.devices("gpu"):
            return None
    except RuntimeError:
        return None
    from . import _bench_jax

    return {"bandwidth": _bench_jax.bandwidth(log=lambda s: print(s, flush=True))}


# a tool past this (--sanitizer-timeout, from its start) is recorded as not run: the device
# runs a command for at most 10 minutes, and the rest of the check must still write its
# record. Racecheck alone took about 240 s on the H200 in the thirty-third session (memcheck
# and racecheck one after the other 262 s on a fresh machine). The tools run beside each other
# and beside the tests (which share the GPU without timing anything), never beside the
# benchmark: main() waits for them before it.
SANITIZER_TIMEOUT_S = 330


def run_sanitizer(tool: str, out: pathlib.Path, timeout_s: float = SANITIZER_TIMEOUT_S) -> dict:
    """``compute-sanitizer --tool TOOL`` over cunorm._sanitize (one call per kernel family and
    path): its exit code and error count, or why it did not run (not installed; some
    machines' runtimes refuse the device)."""
    return finish_sanitizer(start_sanitizer(tool, out), timeout_s)


class StartedSanitizer(NamedTuple):
    tool: str
    proc: object  # subprocess.Popen, in its own process group
    log: pathlib.Path
    started: float  # time.monotonic() at its start


# racecheck's run of cunorm._sanitize with its cluster-walk rows in two clusters (9 rows, not
# 40): its hazards are within a cluster, and the 40 rows took 312 of its 403 s on an H100 in
# the fifty-fifth session, past the 380 s it has beside the tests; memcheck keeps the whole
# grids (bounds of every cluster's partial row)
SANITIZE_ARGS = {"racecheck": ("--clusters", "2")}


def start_sanitizer(tool: str, out: pathlib.Path) -> StartedSanitizer | dict:
    """The tool started in the background (its output to ``out``/sanitizer-TOOL.txt), or the
    record of why it cannot start; finish_sanitizer waits for it."""
    import shutil
    import subprocess
    import time

    exe = shutil.which("compute-sanitizer")
    if exe is None:
        return {"tool": tool, "ran": False, "reason": "compute-sanitizer is not on the PATH"}
    cmd = [exe, "--tool", tool, "--error-exitcode", "97", "--print-limit", "50", sys.executable, "-m",
           "cunorm._sanitize", *SANITIZE_ARGS.get(tool, ())]
    log = out / f"sanitizer-{tool}.txt"
    with open(log, "w") as f:  # a file, not a pipe: nothing reads it while the tests run
        # its own process group, so a timeout ends the Python it runs too (killing
        # compute-sanitizer alone left that process on the GPU under the benchmark that followed)
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=environment_with_repo(),
                                start_new_session=True)
    return StartedSanitizer(tool, proc, log, time.monotonic())


def finish_sanitizer(started: StartedSanitizer | dict, timeout_s: float = SANITIZER_TIMEOUT_S) -> dict:
    """start_sanitizer's tool waited for until ``timeout_s`` after its start: its exit code and
    error count, or why it did not run."""
    import subprocess
    import time

    if isinstance(started, dict):
        return started
    tool, proc, log = started.tool, started.proc, started.log
    try:
        proc.wait(timeout=max(0.0, timeout_s - (time.monotonic() - started.started)))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        cases = [line[len("case "):] for line in log.read_text().splitlines() if line.startswith("case ")]
        return {"tool": tool, "ran": False,
                "reason": f"timed out after {timeout_s:g} s" + (f" in {cases[-1]}" if cases else "")}
    text = log.read_text()
    done = "cunorm._sanitize:" in text
    return {"tool": tool, "ran": done, "exit_code": proc.returncode, "errors": sanitizer_errors(text),
            "reason": None if done else (text.strip().splitlines() or ["no output"])[-1]}


def sanitizer_errors(text: str) -> int | None:
    """The error count of a compute-sanitizer log: memcheck ends "ERROR SUMMARY: N errors",
    racecheck "RACECHECK SUMMARY: H hazards displayed (N errors, W warnings)"."""
    import re

    found = re.search(r"ERROR SUMMARY: (\d+) error", text) or re.search(r"SUMMARY: [^\n]*\((\d+) error", text)
    return int(found.group(1)) if found else None


def print_summary(record: dict) -> None:
    """The short table the GPU check prints last, from its record."""
    print("\n=== cunorm GPU check ===")
    print(f"{record['gpu']}  cupy {record['cupy']}  digest {record['source_digest'][:12]}")
    if record["tests"]:
        t = record["tests"]
        print(f"tests: {t['passed']} passed, {t['failed']} failed, {t['skipped']} skipped")
    if record["bench"]:
        copy = record["copy_GBps"]
        print(f"copy {copy} GB/s; fraction of copy:")
        print(f"{'op':10s} {'dtype':8s} {'N':>7s} {'fwd':>6s} {'bwd':>6s}")
        for r in record["bench"]:
            print(f"{r['op']:10s} {r['dtype']:8s} {r['N']:7d} {r['fwd_GBps'] / copy:6.2f} {r['bwd_GBps'] / copy:6.2f}")
    if record.get("torch"):
        print("torch adapter, bf16 LayerNorm wall time per call (cunorm / torch), before the CuPy benchmark "
              "[after it]:")
        after = record["torch"].get("overhead_after_bench") or [{}] * len(record["torch"]["overhead"])
        for r, a in zip(record["torch"]["overhead"], after):
            print(f"  {tuple(r['shape'])}: fwd x{r['fwd_wall_ratio']} [x{a.get('fwd_wall_ratio')}], fwd+bwd "
                  f"x{r['fwdbwd_wall_ratio']} [x{a.get('fwdbwd_wall_ratio')}] (torch {r['torch_fwdbwd_wall_us']:.0f} "
                  f"[{a.get('torch_fwdbwd_wall_us', 0):.0f}] us), graph-replay kernel {r['cunorm_fwd_graph_us']} vs "
                  f"{r['torch_fwd_graph_us']} us")
        worst = min(min(r.get("fwd_vs_cupy", 1), r.get("bwd_vs_cupy", 1)) for r in record["torch"]["bandwidth"])
        print(f"  large shapes: torch path at >= {worst:.3f} of the CuPy API's bandwidth")
        small = record["torch"].get("small_batch") or []
        if small:
            fwd = max(small, key=lambda r: r["fwd_ratio"])
            both = max(small, key=lambda r: r["fwdbwd_ratio"])
            print("small batches, bf16, graph-replay kernel time cunorm / torch (worst row):")
            print(f"  fwd x{fwd['fwd_ratio']} ({fwd['op']} M={fwd['M']} N={fwd['N']}), "
                  f"fwd+bwd x{both['fwdbwd_ratio']} ({both['op']} M={both['M']} N={both['N']})")
    jax_rows = (record.get("jax") or {}).get("bandwidth")
    _section(jax_rows and f"jax adapter, LayerNorm inside jit ({jax_rows[0]['program']} a program): of the CuPy "
             "API / vs XLA's jax.numpy LayerNorm; [one a call: of the CuPy API]", jax_rows,
             lambda r: f"{r['dtype']:8s} N={r['N']:<6d} fwd {r.get('fwd_vs_cupy')} / x{r['fwd_vs_xla']} "
                       f"[{r.get('fwd_percall_vs_cupy')}], bwd {r.get('bwd_vs_cupy')} / x{r['bwd_vs_xla']} "
                       f"[{r.get('bwd_percall_vs_cupy')}]")
    _section("batch_norm, training, kernel time as a fraction of copy fwd / bwd; speed-up over the best of torch "
             "eager and torch.compile fwd / bwd; our host us a call fwd / bwd:", record.get("batch_norm"),
             lambda r: f"{r['dtype']:8s} {r['layout']} {tuple(r['shape'])}: {r['fwd_of_copy']} / "
                       f"{r['bwd_of_copy']}; x{r.get('fwd_speedup_vs_best')} / x{r.get('bwd_speedup_vs_best')}; "
                       f"{r.get('host_us_fwd')} / {r.get('host_us_bwd')}")
    _section("bf16 rows with float32 weight and bias (torch.autocast's parameters), fraction of copy fwd / bwd "
             "(x the same rows with bf16 parameters):", record.get("float32_weight"),
             lambda r: f"{r['op']:10s} N={r['N']:<7d} {r['fwd_of_copy']} / {r['bwd_of_copy']} "
                       f"(x{r.get('fwd_vs_same_dtype')} / x{r.get('bwd_vs_same_dtype')})")
    _section("fused residual add (bf16), fraction of copy fwd / bwd, x torch eager's h = x + r; norm(h) fwd / "
             "fwd+bwd; FP8 out fwd (host us a call):", record.get("fused"),
             lambda r: f"{r['op']:10s} N={r['N']:<5d} {r['residual_fwd_of_copy']} / {r['residual_bwd_of_copy']}, "
                       f"x{r.get('residual_fwd_speedup_vs_torch')} / x{r.get('residual_fwdbwd_speedup_vs_torch')}; "
                       f"FP8 {r['fp8_fwd_of_copy']} ({r.get('fp8_host_us')})")
    for r in record.get("sanitizer") or []:
        outcome = f"{r['errors']} errors" if r["ran"] else f"not run ({r['reason']})"
        print(f"compute-sanitizer {r['tool']}: " + outcome)


def _section(title: str, rows, line) -> None:
    """One block of the closing summary: its title, then ``line(row)`` for each row (nothing
    without rows)."""
    if rows:
        print(title)
        for r in rows:
            print("  " + line(r))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=pathlib.Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--no-tests", action="store_true", help="benchmark only")
    ap.add_argument("--no-bench", action="store_true", help="tests only")
    ap.add_argument("--pytest-args", default="", help="extra pytest arguments, space separated")
    ap.add_argument("--sanitizer", default="", help="compute-sanitizer tools to run over cunorm._sanitize, "
                    "comma separated (memcheck,racecheck)")
    ap.add_argument("--sanitizer-timeout", type=float, default=SANITIZER_TIMEOUT_S,
                    help=f"seconds a sanitizer tool may take before it is recorded as not run "
                         f"(default {SANITIZER_TIMEOUT_S})")
    ap.add_argument("--tests-from", type=pathlib.Path, help="take the test and sanitizer results from this "
                    "earlier record of the same sources (a check split over two device calls, each under "
                    "the device's 10-minute limit)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    # JAX would take 75% of the GPU at start; CuPy and torch run in this process too
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

    import cupy

    from . import _bench

    record = {
        "source_digest": source_digest(),
        "gpu": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(),
        "cupy": cupy.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "tests": None,
        "copy_GBps": None,
        "bench": [],
    }
    # the sanitizers beside each other and the tests (a device call's minutes), all done
    # before the benchmark times anything
    sanitizers = [start_sanitizer(t, args.out) for t in args.sanitizer.split(",") if t]
    if args.tests_from:
        adopt_tests(record, json.loads(args.tests_from.read_text()))
    elif not args.no_tests:
        record["tests"] = run_tests(args.out, args.pytest_args.split())
    if sanitizers:
        record["sanitizer"] = [finish_sanitizer(s, args.sanitizer_timeout) for s in sanitizers]
    if not args.no_bench and record["tests"] is not None and not args.tests_from:
        write_record(args.out, record)  # a call cut short in the benchmark keeps the tests' record
    if not args.no_bench:
        record["copy_GBps"] = round(_bench.copy_gbps(), 1)
        print(f"device-to-device copy: {record['copy_GBps']} GB/s", flush=True)
        torch_bench = _torch_bench()
        overhead = torch_bench and torch_bench.overhead(lambda s: print(s, flush=True))
        record["bench"] = _bench.run(log=lambda s: print(s, flush=True))
        record["float32_weight"] = _bench.run_float32_weight(record["copy_GBps"], record["bench"],
                                                             log=lambda s: print(s, flush=True))
        record["torch"] = torch_bench and _torch_numbers(torch_bench, record["bench"], overhead)
        record["jax"] = _jax_numbers()
        from . import _bench_bn

        record["batch_norm"] = _bench_bn.run(record["copy_GBps"], log=lambda s: print(s, flush=True))
        from . import _bench_fused

        record["fused"] = _bench_fused.run(record["copy_GBps"], log=lambda s: print(s, flush=True))
    write_record(args.out, record)

    print_summary(record)
    return 0 if check_passed(record) else 1


def write_record(out: pathlib.Path, record: dict) -> None:
    """out/gpu-latest.json: the whole record at the end, and in a check that runs both halves,
    first its tests' and sanitizers' part alone (no benchmark yet), so that a device call
    that runs out of time in the benchmark leaves what a second call's ``--tests-from``
    needs."""
    (out / "gpu-latest.json").write_text(json.dumps(record, indent=1) + "\n")


def adopt_tests(record: dict, earlier: dict) -> None:
    """The tests and sanitizer results of ``earlier``, a record of the same sources, into
    ``record`` (with the date they ran); a record of other sources is refused."""
    if earlier.get("source_digest") != record["source_digest"]:
        raise SystemExit(f"--tests-from: a record of other sources (digest {str(earlier.get('source_digest'))[:12]}, "
                         f"these are {record['source_digest'][:12]})")
    record["tests"], record["tests_date"] = earlier["tests"], earlier["date"]
    if earlier.get("sanitizer"):
        record["sanitizer"] = earlier["sanitizer"]


def check_passed(record: dict) -> bool:
    """No failed test, and every sanitizer tool that ran reported 0 errors (one whose
    summary could not be read counts as failing, not as clean)."""
    failed = record["tests"] and record["tests"]["failed"]
    return not failed and all(r["errors"] == 0 for r in record.get("sanitizer") or [] if r["ran"])


if __name__ == "__main__":
    sys.exit(main())
