"""The GPU check's record format (CPU): the source digest follows the specification the
result file is checked against, and the committed result names its fields."""
from __future__ import annotations

import hashlib
import json
import pathlib

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
