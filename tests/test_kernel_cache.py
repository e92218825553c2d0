"""The kernel cache (issue 8): CuPy's on-disk cache that cannot be read or written falls
back to compiling in memory with one warning (CPU: the fallback's wiring with a stand-in
RawModule; GPU: real kernels in a fresh interpreter over a prepared CUPY_CACHE_DIR)."""
from __future__ import annotations

import os
import pathlib

import pytest

from cunorm import _compile
from fresh_interpreter import run_probe


class _Module:
    """Stands in for cupy.RawModule: raises ``error`` unless CuPy is told to cache in memory."""
    calls: list = []
    error: Exception | None = None

    def __init__(self, code, options, name_expressions):
        in_memory = os.environ.get("CUPY_CACHE_IN_MEMORY") == "1"
        _Module.calls.append(in_memory)
        if not in_memory and _Module.error is not None:
            raise _Module.error
        self.name = name_expressions[0]

    def get_function(self, name):
        return ("kernel", name)


@pytest.fixture
def fake_cupy(monkeypatch):
    cupy = pytest.importorskip("cupy", reason="CuPy is not installed")
    monkeypatch.setattr(cupy, "RawModule", _Module)
    monkeypatch.setattr(_compile, "_cache_unusable", [])
    monkeypatch.delenv("CUPY_CACHE_IN_MEMORY", raising=False)
    _Module.calls, _Module.error = [], None
    return _Module


@pytest.mark.parametrize("error", [PermissionError(13, "Permission denied"), OSError(30, "Read-only file system"),
                                   IsADirectoryError(21, "Is a directory")])
def test_unusable_cache_compiles_in_memory_after_one_warning(fake_cupy, error):
    fake_cupy.error = error
    with pytest.warns(RuntimeWarning, match="kernel cache is unusable"):
        assert _compile.compile_kernel("src", "k<1>") == ("kernel", "k<1>")
    assert fake_cupy.calls == [False, True]
    assert "CUPY_CACHE_IN_MEMORY" not in os.environ  # only around cunorm's own compile
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning; straight to memory
        assert _compile.compile_kernel("src", "k<2>") == ("kernel", "k<2>")
    assert fake_cupy.calls == [False, True, True]


def test_working_cache_is_used_and_the_callers_setting_kept(fake_cupy, monkeypatch):
    assert _compile.compile_kernel("src", "k<1>") == ("kernel", "k<1>")
    assert fake_cupy.calls == [False]
    monkeypatch.setattr(_compile, "_cache_unusable", ["earlier"])
    monkeypatch.setenv("CUPY_CACHE_IN_MEMORY", "0")
    _compile.compile_kernel("src", "k<2>")
    assert fake_cupy.calls == [False, True] and os.environ["CUPY_CACHE_IN_MEMORY"] == "0"


def test_other_errors_are_not_swallowed(fake_cupy):
    fake_cupy.error = ValueError("not a cache problem")
    with pytest.raises(ValueError, match="not a cache problem"):
        _compile.compile_kernel("src", "k<1>")
    assert not _compile._cache_unusable


# ---- GPU ----------------------------------------------------------------------------------

def _probe(cache_dir: pathlib.Path, *args: str, **extra_env: str) -> dict:
    return run_probe("_cache_probe.py", *args, env_drop=("CUPY_CACHE_IN_MEMORY",), CUPY_CACHE_DIR=str(cache_dir),
                     **extra_env)


@pytest.mark.gpu
def test_gpu_read_only_cache_dir(tmp_path):
    report = _probe(tmp_path / "cache", "read-only")
    assert report["max_error"] < 1e-4, report
    assert report["in_memory"] and len(report["warnings"]) == 1, report


@pytest.mark.gpu
def test_gpu_corrupted_cache_entries(tmp_path):
    from _cache_probe import MARKER

    cache = tmp_path / "cache"
    first = _probe(cache, CUPY_CACHE_SAVE_CUDA_SOURCE="1")  # fills the cache, each entry's source beside it
    assert first["max_error"] < 1e-4 and not first["in_memory"], first
    ours = sorted(p for p in cache.glob("*.cubin") if MARKER in p.with_name(p.name + ".cu").read_text())
    assert ours, "the first run cached none of cunorm's kernels"
    for i, p in enumerate(ours):
        if i % 2:  # wrong bytes: CuPy's hash check catches these and recompiles
            p.write_bytes(b"\0garbage" * 64)
        else:  # an entry that cannot be read as a file
            p.unlink()
            p.mkdir()
    report = _probe(cache)
    assert report["max_error"] < 1e-4, report
    assert report["in_memory"] and len(report["warnings"]) == 1, report
