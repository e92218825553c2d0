"""Kernel sources and their compiled modules.

Each ``kernels/<op>.cu`` is compiled by NVRTC through ``cupy.RawModule``, one module per
template instantiation (so a first call compiles only what it launches), cached per device.
CuPy's on-disk cache keys on the source string, so ``common.cuh`` is inlined into the
source here: editing the header changes the key and no stale kernel runs. A cache CuPy
cannot read or write (read-only or corrupted ``CUPY_CACHE_DIR``) falls back to compiling in
memory with a warning.

``compile_check`` compiles instantiations with NVRTC directly for a named architecture, no
GPU needed; CI uses it to compile every instantiation for sm_80 and sm_90.
"""
from __future__ import annotations

import functools
import os
import pathlib
import re
import shutil
import subprocess
import tempfile
import threading
import warnings
import weakref

import numpy

# Extra NVRTC options on top of CuPy's own (CuPy adds -arch for the device and -ftz=true).
COMPILE_OPTIONS: tuple[str, ...] = ()

_INCLUDE = re.compile(r'^\s*#include\s+"([^"]+)"\s*$', re.M)

_C_TYPE = {"float16": "__half", "bfloat16": "__nv_bfloat16", "float32": "float", "float64": "double"}


def c_type(dtype) -> str:
    """The C++ type name of a supported float dtype (a dtype or its name)."""
    return _C_TYPE[dtype if isinstance(dtype, str) else numpy.dtype(dtype).name]


def kernel_dir() -> pathlib.Path:
    """kernels/ of a source checkout, or cunorm/kernels/ inside an installed wheel."""
    here = pathlib.Path(__file__).resolve().parent
    for candidate in (here / "kernels", here.parent / "kernels"):
        if (candidate / "common.cuh").is_file():
            return candidate
    raise FileNotFoundError("cunorm: kernel sources (kernels/*.cu) not found next to the package")


@functools.lru_cache(maxsize=None)
def kernel_source(filename: str) -> str:
    """The source of kernels/<filename> with its local includes inlined (each once)."""
    root = kernel_dir()
    seen: set[str] = set()

    def expand(name: str) -> str:
        if name in seen:
            return ""
        seen.add(name)
        text = (root / name).read_text()
        return _INCLUDE.sub(lambda m: expand(m.group(1)), text)

    return expand(filename)


_modules: dict = {}
_lock = threading.Lock()


def function_ptr(filename: str, name_expression: str, device: int) -> int:
    """The CUfunction of kernel ``name_expression`` of kernels/<filename> on ``device`` (which
    must be current), compiled on first use; CuPy keeps the module loaded."""
    key = (filename, name_expression, device)
    fn = _modules.get(key)
    if fn is None:
        with _lock:  # one compile per kernel, even when many threads ask at once
            fn = _modules.get(key)
            if fn is None:
                kernel = compile_kernel(kernel_source(filename), name_expression, device_options(device))
                fn = _modules[key] = (kernel, kernel.kernel.ptr)  # the RawKernel keeps the module alive
    return fn[1]


# What holds kernel pointers, or plans sized by a kernel's occupancy: the lru_caches
# (held_with_modules) and the per-signature plan dicts (KernelPlans, held weakly, as a JAX
# callback's dies with its function). A rebuild's kernels get new pointers; one kept
# launches the old build (CuPy keeps every module it loaded), timed or tested as the new.
# Before these, each rebuild listed the caches it cleared, and the BatchNorm tests' list had
# missed _staged_cl_kernel, whose key, a Plan, compares equal across plans made afresh.
_pointer_caches: list = []
_plan_dicts: dict = {}  # id -> weak reference of each live KernelPlans (its death removes it)


def held_with_modules(cache):
    """Registers ``cache`` (an lru_cache) for drop_modules to clear; returns it (a decorator)."""
    _pointer_caches.append(cache)
    return cache


class KernelPlans(dict):
    """A per-signature plan dict holding kernel pointers, emptied by drop_modules."""

    __slots__ = ("__weakref__",)

    def __init__(self):
        super().__init__()
        key = id(self)  # (a dict cannot be hashed; its id is free again only after the callback)
        _plan_dicts[key] = weakref.ref(self, lambda _ref, key=key: _plan_dicts.pop(key, None))


def drop_modules() -> None:
    """Forgets the loaded kernels (the sweeps and tests recompile under other options) and
    everything keyed by or holding their pointers, which a reloaded kernel may reuse."""
    from . import _launch

    _modules.clear()
    _launch._smem_allowed.clear()
    for cache in _pointer_caches:
        cache.cache_clear()
    for ref in list(_plan_dicts.values()):
        plans = ref()
        if plans is not None:
            plans.clear()


# Why CuPy's on-disk kernel cache was given up in this process (empty while it works).
_cache_unusable: list[str] = []


def device_options(device: int) -> tuple[str, ...]:
    """NVRTC options that describe the device a kernel is compiled for: the shared memory a
    block may opt in to (kernels/row_norm.cuh WeightSlotsFit)."""
    from ._launch import smem_limits

    return (f"-DCUNORM_SMEM_OPTIN={smem_limits(device)[0]}",)


def compile_kernel(code: str, name_expression: str, extra_options: tuple[str, ...] = ()):
    """The RawKernel ``name_expression`` of ``code`` for the current device, through CuPy's
    on-disk cache. CuPy raises OSError when that cache cannot be read or written (a
    read-only CUPY_CACHE_DIR, an entry that is not a readable file); then this and every
    later kernel of the process compile in memory, after one RuntimeWarning. (A cache file
    with wrong contents CuPy detects by its hash and recompiles itself.)"""
    if not _cache_unusable:
        try:
            return _raw_kernel(code, name_expression, extra_options)
        except OSError as err:
            _cache_unusable.append(f"{type(err).__name__}: {err}")
            warnings.warn(f"cunorm: CuPy's kernel cache is unusable ({_cache_unusable[0]}); compiling kernels in "
                          "memory for the rest of this process", RuntimeWarning, stacklevel=3)
    # CuPy reads this per compile; set only around ours (callers hold _lock)
    before = os.environ.get("CUPY_CACHE_IN_MEMORY")
    os.environ["CUPY_CACHE_IN_MEMORY"] = "1"
    try:
        return _raw_kernel(code, name_expression, extra_options)
    finally:
        if before is None:
            del os.environ["CUPY_CACHE_IN_MEMORY"]
        else:
            os.environ["CUPY_CACHE_IN_MEMORY"] = before


def _raw_kernel(code: str, name_expression: str, extra_options: tuple[str, ...] = ()):
    import cupy

    module = cupy.RawModule(code=code, options=(*COMPILE_OPTIONS, *extra_options), name_expressions=(name_expression,))
    return module.get_function(name_expression)


def _nvrtc_include_options() -> list[str]:
    from cuda.pathfinder import find_nvidia_header_directory

    headers = find_nvidia_header_directory("cudart")
    if headers is None:
        raise RuntimeError("CUDA runtime headers not found: pip install nvidia-cuda-runtime")
    return [f"-I{headers}"]


def nvrtc_options(arch: str) -> list[str]:
    """The options CuPy's RawModule gives NVRTC besides ours: C++17, flush-to-zero, and
    functions without an execution space (generic lambdas' call operators) on the device,
    which NVRTC 13.0 refuses to compile as host code where 13.5 does not ask."""
    return ["--std=c++17", f"-arch={arch}", "-ftz=true", "--device-as-default-execution-space",
            *_nvrtc_include_options()]


def compile_check(filename: str, name_expressions: list[str], arch: str,
                  extra_options: tuple[str, ...] = ()) -> None:
    """Compile instantiations of kernels/<filename> for ``arch`` (e.g. "sm_90") with NVRTC,
    as CuPy would (same source, options, -ftz=true), plus ``extra_options`` (the CPU tests
    pass NVRTC's fast-compile level here rather than touching COMPILE_OPTIONS, which the
    run-time compile reads). Raises RuntimeError with the log on a compile error or a name
    expression NVRTC cannot lower. Needs no GPU."""
    from cupy_backends.cuda.libs import nvrtc

    options = [*nvrtc_options(arch), *COMPILE_OPTIONS, *extra_options]
    prog = nvrtc.createProgram(kernel_source(filename), filename, [], [])
    try:
        for name in name_expressions:
            nvrtc.addNameExpression(prog, name)
        try:
            nvrtc.compileProgram(prog, options)
        except nvrtc.NVRTCError as err:
            raise RuntimeError(f"{filename} ({arch}): {err}\n{nvrtc.getProgramLog(prog)}") from None
        for name in name_expressions:
            nvrtc.getLoweredName(prog, name)
    finally:
        nvrtc.destroyProgram(prog)


def hip_compile_check(filename: str, name_expressions: list[str], arch: str = "gfx90a") -> None:
    """Compile instantiations of kernels/<filename> for an AMD GPU (``arch``, e.g. gfx90a)
    with hipcc, as HIP source: the same text, each instantiation forced by taking its
    address. Raises RuntimeError with hipcc's output on a compile error, FileNotFoundError
    without hipcc. Verifies the source is HIP; nothing here runs it on AMD hardware."""
    hipcc = shutil.which("hipcc")
    if hipcc is None:
        raise FileNotFoundError("hipcc not found (Debian: apt-get install hipcc)")
    forced = "\n".join(f"static const void* const cunorm_instance_{i} = reinterpret_cast<const void*>(&{name});"
                        for i, name in enumerate(name_expressions))
    with tempfile.TemporaryDirectory() as tmp:
        src = pathlib.Path(tmp) / (pathlib.Path(filename).stem + ".hip")
        src.write_text(kernel_source(filename) + "\n" + forced + "\n")
        env = dict(os.environ, HIP_PLATFORM="amd")  # hipcc would pick nvcc where CUDA is installed
        done = subprocess.run([hipcc, f"--offload-arch={arch}", "-std=c++17", "-O1", "-Wno-pragma-once-outside-header",
                               "-c", str(src), "-o", str(pathlib.Path(tmp) / "out.o")],
                              capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{filename} (hipcc, {arch}):\n{done.stdout}{done.stderr}")

