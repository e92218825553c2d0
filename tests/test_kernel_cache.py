"""The kernel cache (issue 8): CuPy's on-disk cache that cannot be read or written falls
back to compiling in memory with one warning (CPU: the fallback's wiring with a stand-in
RawModule; GPU: real kernels in a fresh interpreter over a prepared CUPY_CACHE_DIR)."""
from __future__ import annotations

import os
import pathlib
import re

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


def _cunorm_modules():
    """cunorm's modules that import here (the torch and JAX adapters where those are installed)."""
    import importlib
    import pkgutil

    import cunorm

    for info in pkgutil.walk_packages(cunorm.__path__, "cunorm."):
        if info.name.endswith("__main__"):
            continue
        try:
            yield importlib.import_module(info.name)
        except ImportError:  # torch or JAX absent: their adapters' caches are not loaded either
            continue


# what a cache's body calls when it keeps a kernel pointer or a plan sized by a kernel
_HOLDS_POINTERS = re.compile(r"\b(function_ptr|_\w*kernels?|\w*plans?|blocks_per_sm|max_active_clusters|fits_smem"
                             r"|_staged\w*|_passes)\(")


def test_drop_modules_clears_every_cache_of_kernel_pointers():
    # a rebuild (tests and sweeps under other NVRTC options) must not leave a pointer into an
    # unloaded module, which launched runs a dropped build or none: every lru_cache whose body
    # makes kernel pointers or plans is one drop_modules clears
    import functools
    import inspect

    modules = list(_cunorm_modules())  # imported first: importing registers a module's caches
    registered = {id(c) for c in _compile._pointer_caches}
    holding, missed = [], []
    for module in modules:
        for name, obj in vars(module).items():
            if isinstance(obj, functools._lru_cache_wrapper) and obj.__module__ == module.__name__:
                source = inspect.getsource(obj.__wrapped__)
                body = source[source.index("\n", source.index("def ")):]
                if _HOLDS_POINTERS.search(body):
                    holding.append(name)
                    if id(obj) not in registered:
                        missed.append(f"{module.__name__}.{name}")
    assert {"plan", "_staged_cl_kernel", "forward_plan", "grid_plan", "fused_backward_plan"} <= set(holding)
    assert not missed, f"lru_caches of kernel pointers or plans that drop_modules leaves: {missed}"


def test_drop_modules_empties_the_plan_dicts():
    # the plan dicts held weakly: emptied by drop_modules, and a dead one leaves nothing behind
    # (the JAX callbacks made one per eager call before they were made once per signature)
    import gc

    plans, dead = _compile.KernelPlans(), _compile.KernelPlans()
    plans["signature"] = dead["signature"] = ("plan", 0x7F00)
    dead_key = id(dead)
    assert _compile._plan_dicts[dead_key]() is dead
    del dead
    gc.collect()
    assert dead_key not in _compile._plan_dicts
    _compile.drop_modules()
    assert plans == {} and _compile._plan_dicts[id(plans)]() is plans
    gc.collect()
    before = len(_compile._plan_dicts)
    for _ in range(1000):
        _compile.KernelPlans()
    assert len(_compile._plan_dicts) == before


def test_device_stubs_do_not_outlive_a_cpu_test(pytester):
    # conftest's _forget_device_stubs: a kernel pointer a CPU test left in the host's caches (a
    # stub's 1) is gone before the next test. (The stub's pointer, launched by a later GPU test
    # of the same pytest worker, was the worker crash: NOTES "The pytest worker crash".)
    import pathlib

    pytester.makeconftest(pathlib.Path(__file__).with_name("conftest.py").read_text())
    pytester.makepyfile(test_order="""
        from cunorm import _compile

        KEY = ("stub.cu", "stub_kernel", 0)

        def test_cpu_test_plants_a_stub():
            _compile._modules[KEY] = (None, 1)

        def test_the_next_test_finds_none():
            assert KEY not in _compile._modules
    """)
    result = pytester.runpytest_subprocess("-p", "no:xdist", "-p", "no:cacheprovider", "test_order.py")
    result.assert_outcomes(passed=2)
