"""The GPU check's record format (CPU): the source digest follows the specification the
result file is checked against, and the committed result names its fields."""
from __future__ import annotations

import hashlib
import json
import pathlib
import sys

import numpy
import pytest

from cunorm import gpucheck

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_source_digest_follows_the_specification(tmp_path):
    (tmp_path / "kernels").mkdir()
    (tmp_path / "cunorm" / "ops" / "__pycache__").mkdir(parents=True)
    files = {"kernels/b.cu": b"b", "kernels/a.cuh": b"a", "cunorm/x.py": b"x", "cunorm/ops/y.py": b"y"}
    for rel, data in files.items():
        (tmp_path / rel).write_bytes(data)
    (tmp_path / "kernels" / "notes.md").write_text("ignored")
    (tmp_path / "cunorm" / "ops" / "__pycache__" / "y.py").write_text("ignored")
    h = hashlib.sha256()
    for rel in sorted(files):  # sorted POSIX relative paths: path, NUL, bytes, NUL
        h.update(rel.encode() + b"\0" + files[rel] + b"\0")
    assert gpucheck.source_digest(tmp_path) == h.hexdigest()


def test_committed_result_has_the_required_fields():
    rec = json.loads((ROOT / "benchmarks" / "results" / "gpu-latest.json").read_text())
    for field in ("source_digest", "gpu", "cupy", "date", "tests", "copy_GBps", "bench"):
        assert field in rec, field
    assert {"passed", "failed", "skipped"} <= set(rec["tests"])
    assert rec["bench"] and all({"op", "dtype", "M", "N", "fwd_GBps", "bwd_GBps"} <= set(r) for r in rec["bench"])


def _fake_sanitizer(tmp_path, monkeypatch, body: str):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "compute-sanitizer"
    exe.write_text("#!/bin/sh\n" + body)
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))


def test_sanitizer_summary_is_read(tmp_path, monkeypatch):
    _fake_sanitizer(tmp_path, monkeypatch, 'echo "cunorm._sanitize: 40 calls done"\n'
                                           'echo "========= ERROR SUMMARY: 3 errors"\nexit 97\n')
    r = gpucheck.run_sanitizer("memcheck", tmp_path)
    assert r == {"tool": "memcheck", "ran": True, "exit_code": 97, "errors": 3, "reason": None}
    assert "ERROR SUMMARY" in (tmp_path / "sanitizer-memcheck.txt").read_text()


@pytest.mark.parametrize("summary, errors", [
    ("========= ERROR SUMMARY: 0 errors", 0),
    ("========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)", 0),  # the H200's racecheck
    ("========= RACECHECK SUMMARY: 5 hazards displayed (2 errors, 3 warnings)", 2),
    ("========= no summary", None),
])
def test_sanitizer_error_count_of_each_tool(summary, errors):
    assert gpucheck.sanitizer_errors("cunorm._sanitize: 62 calls done\n" + summary + "\n") == errors


@pytest.mark.parametrize("sanitizer, passed", [
    ([], True),
    ([{"tool": "memcheck", "ran": True, "errors": 0}], True),
    ([{"tool": "memcheck", "ran": True, "errors": 2}], False),
    ([{"tool": "racecheck", "ran": True, "errors": None}], False),  # ran, summary unreadable
    ([{"tool": "racecheck", "ran": False, "errors": None, "reason": "refused"}], True),
])
def test_check_fails_on_sanitizer_errors_or_an_unread_summary(sanitizer, passed):
    record = {"tests": {"passed": 3, "failed": 0, "skipped": 0}, "sanitizer": sanitizer}
    assert gpucheck.check_passed(record) is passed
    assert not gpucheck.check_passed(dict(record, tests={"passed": 2, "failed": 1, "skipped": 0}))


def test_sanitizer_refusing_the_device_is_recorded_not_counted(tmp_path, monkeypatch):
    _fake_sanitizer(tmp_path, monkeypatch, 'echo "========= Error: Device not supported" >&2\nexit 1\n')
    r = gpucheck.run_sanitizer("racecheck", tmp_path)
    assert not r["ran"] and "Device not supported" in r["reason"]


def test_sanitizer_timeout_ends_the_tools_whole_process_group(tmp_path, monkeypatch):
    """A tool past its time is recorded as not run, and the process it started ends with it
    (the thirty-third session's racecheck timeout left its Python on the GPU)."""
    import os
    import shutil
    import time

    pid_file, sleep = tmp_path / "child.pid", shutil.which("sleep")  # the fake's PATH is its own folder
    _fake_sanitizer(tmp_path, monkeypatch, f'{sleep} 30 &\necho $! > {pid_file}\nwait\n')
    start = time.monotonic()
    r = gpucheck.run_sanitizer("racecheck", tmp_path, timeout_s=1)
    assert r == {"tool": "racecheck", "ran": False, "reason": "timed out after 1 s"}
    assert time.monotonic() - start < 20, "the tool's pipes closed with its group"
    child = int(pid_file.read_text())
    time.sleep(0.2)
    stat = pathlib.Path(f"/proc/{child}/stat")
    # gone, or a zombie its new parent has not reaped yet (containers' PID 1 may never reap)
    assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z", "the tool's child still runs"
    if not pathlib.Path("/proc").is_dir():
        with pytest.raises(ProcessLookupError):
            os.kill(child, 0)


def test_sanitizer_timeout_names_the_case_it_was_in(tmp_path, monkeypatch):
    """cunorm._sanitize prints a "case ..." line as each case starts; a tool past its time
    names the last one (the fifty-fourth session's racecheck timed out with no clue where)."""
    import shutil

    sleep = shutil.which("sleep")
    _fake_sanitizer(tmp_path, monkeypatch, 'echo "case rows float32 7 x 96, weight float32"\n'
                                           'echo "case rows float32 40 x 150000, weight float32"\n'
                                           f'{sleep} 30\n')
    r = gpucheck.run_sanitizer("racecheck", tmp_path, timeout_s=1)
    assert r == {"tool": "racecheck", "ran": False,
                 "reason": "timed out after 1 s in rows float32 40 x 150000, weight float32"}


def test_sanitizers_run_beside_each_other(tmp_path, monkeypatch):
    """start_sanitizer returns at once (the tools then run beside the tests); two tools of 1.5 s
    each are done in well under their sum, each log read whole, each timeout counted from
    its own start."""
    import shutil
    import time

    sleep = shutil.which("sleep")
    _fake_sanitizer(tmp_path, monkeypatch, f'{sleep} 1.5\necho "cunorm._sanitize: 40 calls done"\n'
                                           'echo "========= ERROR SUMMARY: 0 errors"\n')
    start = time.monotonic()
    started = [gpucheck.start_sanitizer(t, tmp_path) for t in ("memcheck", "racecheck")]
    assert time.monotonic() - start < 1.0, "start_sanitizer waited for its tool"
    results = [gpucheck.finish_sanitizer(s, timeout_s=20) for s in started]
    assert time.monotonic() - start < 2.8, "the tools ran one after the other"
    assert [r["errors"] for r in results] == [0, 0] and all(r["ran"] for r in results)
    late = gpucheck.start_sanitizer("memcheck", tmp_path)
    time.sleep(1.0)
    assert gpucheck.finish_sanitizer(late, timeout_s=0.5) == {"tool": "memcheck", "ran": False,
                                                               "reason": "timed out after 0.5 s"}


def test_sanitizer_missing_is_recorded(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert gpucheck.run_sanitizer("memcheck", tmp_path) == {
        "tool": "memcheck", "ran": False, "reason": "compute-sanitizer is not on the PATH"}


def test_summary_prints_from_the_committed_record(capsys):
    rec = json.loads((ROOT / "benchmarks" / "results" / "gpu-latest.json").read_text())
    rec["sanitizer"] = [{"tool": "memcheck", "ran": True, "exit_code": 0, "errors": 0, "reason": None},
                        {"tool": "racecheck", "ran": False, "reason": "Device not supported"}]
    gpucheck.print_summary(rec)
    out = capsys.readouterr().out
    assert out.lstrip().startswith("=== cunorm GPU check ===")
    assert "fraction of copy" in out and "fused residual add" in out
    assert "compute-sanitizer memcheck: 0 errors" in out and "racecheck: not run (Device not supported)" in out


def test_summary_prints_float32_weight_rows(capsys):
    rec = json.loads((ROOT / "benchmarks" / "results" / "gpu-latest.json").read_text())
    rec["float32_weight"] = [{"op": "rms_norm", "dtype": "bfloat16", "w_dtype": "float32", "N": 24576, "M": 2730,
                              "fwd_of_copy": 0.86, "bwd_of_copy": 0.61, "fwd_vs_same_dtype": 0.99,
                              "bwd_vs_same_dtype": 0.92}]
    gpucheck.print_summary(rec)
    out = capsys.readouterr().out
    assert "float32 weight and bias" in out
    assert "rms_norm   N=24576   0.86 / 0.61 (x0.99 / x0.92)" in out


def test_split_check_adopts_tests_of_the_same_sources_only():
    """--tests-from: a check split over two device calls takes the first call's tests and
    sanitizer results, only from a record of the same sources."""
    earlier = {"source_digest": "d" * 64, "date": "2026-12-01T09:00:00+00:00",
               "tests": {"passed": 3, "failed": 0, "skipped": 1, "exit_code": 0},
               "sanitizer": [{"tool": "memcheck", "ran": True, "exit_code": 0, "errors": 0, "reason": None}]}
    record = {"source_digest": "d" * 64, "tests": None}
    gpucheck.adopt_tests(record, earlier)
    assert record["tests"] == earlier["tests"] and record["sanitizer"] == earlier["sanitizer"]
    assert record["tests_date"] == earlier["date"] and gpucheck.check_passed(record)
    with pytest.raises(SystemExit, match="other sources"):
        gpucheck.adopt_tests({"source_digest": "e" * 64, "tests": None}, earlier)


def test_a_check_cut_short_in_the_benchmark_leaves_its_tests_record(tmp_path, monkeypatch):
    """One device call for the whole check: main writes the tests' and sanitizers' part before
    the benchmark starts, so a call killed in the benchmark leaves a record that a second
    call's --tests-from adopts."""
    import types

    from cunorm import _bench  # imported with the real CuPy before the stand-in below

    tests = {"passed": 3, "failed": 0, "skipped": 1, "exit_code": 0}
    monkeypatch.setattr(gpucheck, "run_tests", lambda out, extra: tests)

    class Killed(Exception):
        pass

    def killed(*a, **k):
        raise Killed  # the device's time limit, in the benchmark's first step

    fake_cupy = types.SimpleNamespace(__version__="0", cuda=types.SimpleNamespace(
        runtime=types.SimpleNamespace(getDeviceProperties=lambda i: {"name": b"Fake GPU"})))
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy)  # main's device name, restored after
    monkeypatch.setattr(_bench, "copy_gbps", killed)
    with pytest.raises(Killed):
        gpucheck.main(["--out", str(tmp_path)])
    left = json.loads((tmp_path / "gpu-latest.json").read_text())
    assert left["tests"] == tests and left["bench"] == [] and left["copy_GBps"] is None
    record = {"source_digest": gpucheck.source_digest(), "tests": None}
    gpucheck.adopt_tests(record, left)
    assert record["tests"] == tests and gpucheck.check_passed(record)


def test_a_tool_run_alone_replaces_its_entry_of_the_same_sources_only():
    # benchmarks/merge_sanitizer_record.py: racecheck past its timeout beside the tests, then
    # alone in a second call; memcheck's entry stays, racecheck's comes with its date and note
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from merge_sanitizer_record import merged

    first = {"source_digest": "d", "date": "t1", "tests": {"passed": 3, "failed": 0},
             "sanitizer": [{"tool": "memcheck", "ran": True, "errors": 0},
                           {"tool": "racecheck", "ran": False, "reason": "timed out after 330 s"}]}
    second = {"source_digest": "d", "date": "t2", "sanitizer": [{"tool": "racecheck", "ran": True, "errors": 0}]}
    out = merged(first, second, "alone")
    assert out["sanitizer"] == [{"tool": "memcheck", "ran": True, "errors": 0},
                                {"tool": "racecheck", "ran": True, "errors": 0, "date": "t2", "note": "alone"}]
    assert out["tests"] == first["tests"] and out["date"] == "t1"
    assert gpucheck.check_passed(out)
    racy = {**second, "sanitizer": [{"tool": "racecheck", "ran": True, "errors": 1}]}
    assert not gpucheck.check_passed(merged(first, racy, "alone"))  # its errors count as the first's would
    with pytest.raises(SystemExit, match="other sources"):
        merged(first, {**second, "source_digest": "e"}, "alone")
    with pytest.raises(SystemExit, match="no sanitizer"):
        merged(first, {**second, "sanitizer": []}, "alone")


def test_racecheck_alone_walks_its_cluster_rows_in_two_clusters(tmp_path, monkeypatch):
    """racecheck runs cunorm._sanitize with --clusters 2 (its cluster-walk rows in two
    clusters: 403 s on an H100 with the whole grids, past its 380 s beside the tests);
    memcheck keeps the whole grids."""
    _fake_sanitizer(tmp_path, monkeypatch, 'echo "args: $*"\necho "========= ERROR SUMMARY: 0 errors"\n')
    for tool in ("memcheck", "racecheck"):
        gpucheck.run_sanitizer(tool, tmp_path)
    memcheck, racecheck = ((tmp_path / f"sanitizer-{t}.txt").read_text() for t in ("memcheck", "racecheck"))
    assert "cunorm._sanitize --clusters 2" in racecheck
    assert "--clusters" not in memcheck and memcheck.rstrip().split("\n")[0].endswith("cunorm._sanitize")


def test_sanitize_cluster_cap_holds_the_planners_count_and_restores_it(monkeypatch):
    from cunorm import _sanitize
    from cunorm.ops import _row_norm

    monkeypatch.setattr(_row_norm, "max_active_clusters", lambda *a, **k: 13)
    with _sanitize.clusters_at_most(2):
        assert _row_norm.max_active_clusters(0, 1024, 0, 10) == 2
    assert _row_norm.max_active_clusters(0, 1024, 0, 10) == 13
    with _sanitize.clusters_at_most(None):
        assert _row_norm.max_active_clusters(0, 1024, 0, 10) == 13
    monkeypatch.setattr(_row_norm, "max_active_clusters", lambda *a, **k: None)  # the driver's query failed
    with _sanitize.clusters_at_most(2):
        assert _row_norm.max_active_clusters(0, 1024, 0, 10) is None
    with pytest.raises(SystemExit):
        _sanitize.main(["--clusters", "0"])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("n", [150000, 100000])
def test_gpu_sanitize_cluster_walk_rows_in_two_clusters(rng, dtype, n):
    """Under racecheck's cap the cluster-walk rows' backward takes two clusters that each walk
    four rows or more (every slot of a ring of three turned over), with dx as the whole
    grid's bit for bit (each row's dx is one cluster's alone) and dW within float32 rounding."""
    import cupy
    import ml_dtypes

    import cunorm
    from cunorm import _sanitize
    from cunorm.ops import _row_norm

    if int(cupy.cuda.Device().compute_capability) < 90:
        pytest.skip("thread block clusters need sm_90")
    dt = numpy.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else numpy.dtype(dtype)
    m = 2 * _sanitize.ROWS_A_CAPPED_CLUSTER + 1
    x, dy = (cupy.asarray(rng.standard_normal((m, n)).astype(dt)) for _ in range(2))
    w = cupy.asarray(rng.standard_normal(n).astype(numpy.float32))
    _, mean, rstd = cunorm.layer_norm(x, w, w, return_stats=True)
    whole = cunorm.layer_norm_backward(dy, x, w, mean, rstd)
    with _sanitize.clusters_at_most(2):
        plan = _row_norm.backward_plan((m, n), (n, 1), (n, 1), dt, numpy.dtype(numpy.float32), dt, 1, False,
                                       cupy.cuda.Device().id, 0, 0)
        capped = cunorm.layer_norm_backward(dy, x, w, mean, rstd)
    if plan.grid_rows is not None or plan.split is not None or plan.column_blocks or plan.blocks <= plan.groups:
        pytest.skip("no cluster backward at this size on this device (the grid rows take it)")
    assert plan.groups == 2 and m // plan.groups >= _sanitize.ROWS_A_CAPPED_CLUSTER
    assert cupy.array_equal(whole[0].view(cupy.uint8), capped[0].view(cupy.uint8))
    for a, b in zip(whole[1:], capped[1:]):
        cupy.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-4)
