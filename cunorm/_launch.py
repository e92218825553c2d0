"""GPU-side plumbing shared by the ops, independent of the array library that called them.

Kernels see arrays as ``View`` (pointer, shape, element strides, dtype); the frontends (CuPy
in ``ops/``, PyTorch in ``torch/``) make views of their own arrays, allocate with their own
allocator and pass their stream. Launches go straight to ``cuLaunchKernel`` with packed
arguments: CuPy's generic kernel call costs tens of microseconds of Python per launch,
which small rows cannot hide.
"""
from __future__ import annotations

import ctypes
import dataclasses
import functools
import math
import threading
from typing import NamedTuple

import numpy

from . import _config
from ._compile import held_with_modules

MAX_LEADING_AXES = 4  # what the kernels' RowMap addresses; more (after merging) costs a copy


class View(NamedTuple):
    """An array as the kernels see it: strides in elements. (A tuple: made on every call.)"""

    ptr: int
    shape: tuple
    strides: tuple
    dtype: numpy.dtype

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize


def cupy_view(a) -> View | None:
    if a is None:
        return None
    return View(a.data.ptr, a.shape, tuple(s // a.itemsize for s in a.strides), a.dtype)


@dataclasses.dataclass(frozen=True)
class Rows:
    """A (rows x n) view over the last axes: rows addressed through up to four leading axes
    with any strides (the kernels' RowMap), outermost first."""

    rows: int
    n: int
    strides: tuple  # s0..s3
    sizes: tuple  # n1..n3, the three inner leading axes

    def args(self) -> tuple:
        return (*self.strides, *self.sizes)


def remember(plans: dict, key, value, limit: int):
    """``plans[key] = value``, emptying ``plans`` first when it holds ``limit`` entries (a
    per-signature plan cache must not grow without bound); returns ``value``."""
    if len(plans) >= limit:
        plans.clear()
    plans[key] = value
    return value


@functools.lru_cache(maxsize=1024)
def contiguous_strides(shape: tuple) -> tuple:
    """Element strides of a C-contiguous array of ``shape``."""
    out, step = [], 1
    for size in reversed(shape):
        out.append(step)
        step *= size
    return tuple(reversed(out))


def _last_axes_contiguous(shape, strides, nd: int) -> bool:
    expected = 1
    for size, stride in zip(reversed(shape[len(shape) - nd:]), reversed(strides[len(strides) - nd:])):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def _merged_leading(shape, strides, nd: int) -> list:
    """(size, stride) of the leading axes, size-1 axes dropped, mergeable neighbours merged,
    outermost first."""
    merged: list = []
    for size, stride in zip(reversed(shape[: len(shape) - nd]), reversed(strides[: len(strides) - nd])):
        if size == 1:
            continue
        if merged and stride == merged[-1][1] * merged[-1][0]:
            merged[-1] = (merged[-1][0] * size, merged[-1][1])
        else:
            merged.append((size, stride))
    return merged[::-1]


def rows_of(v: View, nd: int) -> Rows | None:
    """The row layout of ``v`` over its last ``nd`` axes, or None when the kernels cannot
    address it in place (normalized axes not contiguous, or more than four leading axes left
    after merging): the frontend then copies it once, C-contiguous."""
    return row_layout(v.shape, v.strides, nd)


@functools.lru_cache(maxsize=4096)  # the same few layouts recur call after call
def row_layout(shape: tuple, strides: tuple, nd: int) -> Rows | None:
    """``rows_of`` for a shape and element strides."""
    if not _last_axes_contiguous(shape, strides, nd):
        return None
    dims = _merged_leading(shape, strides, nd)
    if len(dims) > MAX_LEADING_AXES:
        return None
    n = math.prod(shape[len(shape) - nd:])
    if not dims:
        dims = [(1, n)]
    dims += [(1, 0)] * (MAX_LEADING_AXES - len(dims))
    return Rows(math.prod(s for s, _ in dims), n, tuple(st for _, st in dims), tuple(s for s, _ in dims[1:]))


def pick_vec(itemsize: int, n: int, pointers: list, row_strides) -> int:
    """The widest pack the kernels may use: every (pointer, itemsize) aligned to the pack's
    bytes (capped at 16), every row stride and the row length multiples of it. Views from
    DLPack or slicing may start anywhere, so the address is checked, not assumed.
    Pack sizes are powers of two, so one test on the OR of all values tests each of them."""
    lengths = n
    for st in row_strides:
        lengths |= st if st >= 0 else -st
    for vec in _config.vec_choices(itemsize)[::-1]:
        if lengths % vec:
            continue
        if any(p % (vec * size if vec * size < 16 else 16) for p, size in pointers if p):
            continue
        return vec
    return 1


@functools.lru_cache(maxsize=None)
def sm_count(device_id: int) -> int:
    from cupy_backends.cuda.api import runtime

    return runtime.deviceGetAttribute(runtime.cudaDevAttrMultiProcessorCount, device_id)


@functools.lru_cache(maxsize=None)
def smem_limits(device: int) -> tuple:
    """(shared memory a block may opt in to, shared memory of an SM), bytes."""
    from cupy_backends.cuda.api import runtime

    return (runtime.deviceGetAttribute(runtime.cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
            runtime.deviceGetAttribute(runtime.cudaDevAttrMaxSharedMemoryPerMultiprocessor, device))


@held_with_modules
@functools.lru_cache(maxsize=None)
def static_smem(function_ptr: int) -> int:
    """A kernel's static shared memory, bytes."""
    from cupy_backends.cuda.api import driver

    return driver.funcGetAttribute(driver.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, function_ptr)


def fits_smem(function_ptr: int, smem: int, device: int) -> bool:
    """Whether a block of this kernel with ``smem`` bytes of dynamic shared memory fits what
    the device lets a block opt in to (static and dynamic together)."""
    return static_smem(function_ptr) + smem <= smem_limits(device)[0]


@held_with_modules
@functools.lru_cache(maxsize=None)
def blocks_per_sm(function_ptr: int, block: int, smem: int = 0) -> int:
    """Resident blocks per SM for a kernel at this block size and dynamic shared memory
    (the driver's occupancy; ``smem`` past 48 KiB is allowed first, see allow_smem)."""
    from cupy_backends.cuda.api import driver

    allow_smem(function_ptr, smem)
    return max(1, driver.occupancyMaxActiveBlocksPerMultiprocessor(function_ptr, block, smem))


class _LaunchConfig(ctypes.Structure):  # CUlaunchConfig (cuda.h)
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared_bytes", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.c_void_p), ("num_attrs", ctypes.c_uint)]


@held_with_modules
@functools.lru_cache(maxsize=None)
def max_active_clusters(function_ptr: int, block: int, smem: int, cluster: int, at_launch: bool = False) -> int | None:
    """Clusters of a kernel that the GPU runs at once (cuOccupancyMaxActiveClusters: a cluster
    must fit within one GPC, so this can be fewer than the resident blocks over the cluster
    size), or None where the driver cannot say. The kernel's cluster dimensions are compiled
    in, or (``at_launch``) given as launch_cluster gives them. ``smem`` must be allowed first
    (allow_smem; blocks_per_sm does it)."""
    try:
        fn = ctypes.CDLL("libcuda.so.1").cuOccupancyMaxActiveClusters
    except (OSError, AttributeError):
        return None
    attr = _LaunchAttribute(_CLUSTER_DIMENSION)
    attr.value[0], attr.value[1], attr.value[2] = cluster, 1, 1
    config = _LaunchConfig((cluster, 1, 1), (block, 1, 1), smem, None, ctypes.addressof(attr) if at_launch else None,
                           1 if at_launch else 0)
    count = ctypes.c_int(0)
    if fn(ctypes.byref(count), ctypes.c_void_p(function_ptr), ctypes.byref(config)) != 0 or count.value < 1:
        return None
    return count.value


_NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14  # CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED


@held_with_modules
@functools.lru_cache(maxsize=None)
def allow_nonportable_clusters(function_ptr: int) -> bool:
    """Lets a kernel whose compile-time clusters pass the portable eight blocks launch (sm_90
    runs up to 16 where the GPU's partitions hold them); False where the driver refuses."""
    from cupy_backends.cuda.api import driver

    try:
        driver.funcSetAttribute(function_ptr, _NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)
    except driver.CUDADriverError:
        return False
    return True


# function pointer -> the most dynamic shared memory allowed so far (clear it with the
# compiled modules, as the sweeps do: a reloaded kernel may reuse a pointer)
_smem_allowed: dict = {}


def allow_smem(function_ptr: int, smem: int) -> None:
    """Lets a kernel launch with ``smem`` bytes of dynamic shared memory (once a kernel's
    static and dynamic shared memory pass 48 KiB together it must opt in; the opt-in names
    the dynamic bytes alone, so any nonzero request opts in). The allowance only rises: plans
    are cached, and a later plan of the same kernel with less shared memory must not lower
    it under an earlier cached plan's launch (CUDA_ERROR_INVALID_VALUE)."""
    if smem > _smem_allowed.get(function_ptr, 0):
        from cupy_backends.cuda.api import driver

        driver.funcSetAttribute(function_ptr, driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem)
        _smem_allowed[function_ptr] = smem


@functools.lru_cache(maxsize=256)
def scalar_bits(value: float, dtype) -> int:
    """A float kernel argument as the integer holding its bits (every argument slot is 8
    bytes; a float reads the low 4, little-endian)."""
    if numpy.dtype(dtype) == numpy.float64:
        return int(numpy.float64(value).view(numpy.int64))
    return int(numpy.float32(value).view(numpy.int32))


MAX_ARGS = 32


class _ArgBuffers(threading.local):
    """Per-thread argument slots and the pointer array cuLaunchKernel reads, made once: the
    driver copies the arguments during the call, so the next launch may overwrite them."""

    def __init__(self):
        self.slots = (ctypes.c_int64 * MAX_ARGS)()
        base = ctypes.addressof(self.slots)
        self.params = (ctypes.c_void_p * MAX_ARGS)(*[base + 8 * i for i in range(MAX_ARGS)])
        self.params_ptr = ctypes.addressof(self.params)


_args = _ArgBuffers()


try:  # imported once: an import statement per launch cost as much as packing the arguments
    from cupy_backends.cuda.api import driver as _driver
    from cupy_backends.cuda.api import runtime as _runtime
except ImportError:  # pragma: no cover - cupy is a declared dependency
    _driver = _runtime = None


def launch(function_ptr: int, grid, block, args, stream: int, smem: int = 0) -> None:
    """cuLaunchKernel with every argument in an 8-byte slot (pointers, int64, packed floats)
    and ``smem`` bytes of dynamic shared memory (allowed first where past 48 KiB: the plans
    call blocks_per_sm with it)."""
    buffers = _args
    buffers.slots[: len(args)] = args
    gx, gy = grid if isinstance(grid, tuple) else (grid, 1)
    bx, by = block if isinstance(block, tuple) else (block, 1)
    _driver.launchKernel(function_ptr, gx, gy, 1, bx, by, 1, smem, stream, buffers.params_ptr, 0)


class _LaunchAttribute(ctypes.Structure):  # CUlaunchAttribute (cuda.h): an id, then a 64-byte value
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_uint * 16)]


_CLUSTER_DIMENSION = 4  # CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION


@functools.lru_cache(maxsize=None)
def _launch_kernel_ex():
    fn = ctypes.CDLL("libcuda.so.1").cuLaunchKernelEx
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn


def launch_cluster(function_ptr: int, grid: int, block: int, args, stream: int, smem: int, cluster: int) -> None:
    """launch, with the grid's blocks in thread-block clusters of ``cluster`` along x chosen at
    launch time (cuLaunchKernelEx; sm_90): one kernel build serves every cluster size."""
    buffers = _args
    buffers.slots[: len(args)] = args
    attr = _LaunchAttribute(_CLUSTER_DIMENSION)
    attr.value[0], attr.value[1], attr.value[2] = cluster, 1, 1
    config = _LaunchConfig((grid, 1, 1), (block, 1, 1), smem, stream or None, ctypes.addressof(attr), 1)
    err = _launch_kernel_ex()(ctypes.addressof(config), function_ptr, buffers.params_ptr, None)
    if err:
        raise RuntimeError(f"cunorm: cuLaunchKernelEx failed with CUresult {err} (clusters of {cluster})")


_COOPERATIVE = 2  # CU_LAUNCH_ATTRIBUTE_COOPERATIVE
_COOPERATIVE_LAUNCH_TOO_LARGE = 720  # CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE


class CooperativeLaunchRefused(RuntimeError):
    """The driver would not run a cooperative grid: more blocks than can be resident at once."""


def launch_cooperative(function_ptr: int, grid: int, block: int, args, stream: int, smem: int) -> None:
    """launch, as a cooperative grid (cuLaunchKernelEx): the driver refuses it unless every
    block can be resident at once, which a kernel with grid-wide barriers needs (a block that
    waits for one never scheduled would wait forever)."""
    buffers = _args
    buffers.slots[: len(args)] = args
    attr = _LaunchAttribute(_COOPERATIVE)
    attr.value[0] = 1
    config = _LaunchConfig((grid, 1, 1), (block, 1, 1), smem, stream or None, ctypes.addressof(attr), 1)
    err = _launch_kernel_ex()(ctypes.addressof(config), function_ptr, buffers.params_ptr, None)
    if err == _COOPERATIVE_LAUNCH_TOO_LARGE:
        raise CooperativeLaunchRefused(f"cunorm: the driver refused a cooperative launch of {grid} blocks (a GPU "
                                       "shared with other processes may hold fewer blocks at once than it has "
                                       "SMs for)")
    if err:
        raise RuntimeError(f"cunorm: cooperative launch of {grid} blocks failed with CUresult {err}")


def zero_async(ptr: int, nbytes: int, stream: int) -> None:
    """Zeroes ``nbytes`` at ``ptr`` on ``stream`` (cudaMemsetAsync)."""
    _runtime.memsetAsync(ptr, 0, nbytes, stream)


ARENA_ALIGN = 256  # every scratch block starts 256-byte aligned, as allocators hand them out


def _block_bytes(shape, dtype) -> int:
    return -(-math.prod(shape) * numpy.dtype(dtype).itemsize // ARENA_ALIGN) * ARENA_ALIGN


def arena_bytes(blocks) -> int:
    """Bytes an Arena needs for these (shape, dtype) blocks, with room to align its start."""
    return ARENA_ALIGN + sum(_block_bytes(shape, dtype) for shape, dtype in blocks)


class Arena:
    """``alloc(shape, dtype) -> pointer`` over one buffer allocated beforehand: scratch for
    frontends that cannot allocate during the call (a JAX callback's extra output)."""

    def __init__(self, ptr: int, nbytes: int):
        self.ptr, self.end = -(-ptr // ARENA_ALIGN) * ARENA_ALIGN, ptr + nbytes

    def __call__(self, shape, dtype) -> int:
        ptr = self.ptr
        self.ptr += _block_bytes(shape, dtype)
        if self.ptr > self.end:
            raise RuntimeError("cunorm: scratch buffer too small for this launch plan (a bug: please report)")
        return ptr


def make_current(device: int) -> None:
    """Make ``device``'s primary context current in this thread. Launches go through the
    driver API, which needs a current context; a thread that only ever used the runtime
    (torch's autograd threads) may have none until a runtime call sets it. (0.2 us a call
    on the H200 host: cheaper to repeat than to track per thread.)"""
    _runtime.setDevice(device)
