"""GPU-side plumbing shared by the ops: row layouts, vector width, device facts, launches."""
from __future__ import annotations

import dataclasses
import functools
import math

import numpy

from . import _config

MAX_LEADING_AXES = 4  # what the kernels' RowMap addresses; more (after merging) costs a copy


# Tests set this to NaN-fill every buffer the ops allocate, so an element a kernel forgot to
# write shows up as NaN instead of as stale memory that happens to look right.
POISON_OUTPUTS = False


def empty(shape, dtype):
    """The default allocator of every op buffer: CuPy's pool. Frameworks pass their own
    allocator (same signature, returning a CuPy view of their memory) instead."""
    import cupy

    out = cupy.empty(shape, dtype)
    if POISON_OUTPUTS:
        out.fill(numpy.nan)
    return out


def contiguous(a, alloc=empty, dtype=None):
    """``a`` itself if C-contiguous (and of ``dtype``), else a C-contiguous copy in memory from
    ``alloc`` (CuPy's elementwise copy writes it; nothing else is allocated)."""
    dtype = a.dtype if dtype is None else numpy.dtype(dtype)
    if a.flags.c_contiguous and a.dtype == dtype:
        return a
    out = alloc(a.shape, dtype)
    out[...] = a
    return out


def ptr(a) -> numpy.uint64:
    """A kernel pointer argument: the array's first element, or null for None."""
    return numpy.uint64(0 if a is None else a.data.ptr)


@dataclasses.dataclass(frozen=True)
class Rows:
    """A (rows x N) view of an array whose last axes are contiguous: rows are addressed
    through up to four leading axes with any strides (in elements)."""

    array: object  # the array the pointer belongs to (the caller's, or a copy)
    rows: int
    n: int
    strides: tuple  # s0..s3, outermost first
    sizes: tuple  # n1..n3, the three inner leading axes

    def args(self) -> tuple:
        return (ptr(self.array), *map(numpy.int64, self.strides), *map(numpy.int64, self.sizes))


def _last_axes_contiguous(a, nd: int) -> bool:
    expected = 1
    for size, stride in zip(reversed(a.shape[a.ndim - nd:]), reversed(a.strides[a.ndim - nd:])):
        if size != 1 and stride != expected * a.itemsize:
            return False
        expected *= size
    return True


def _merged_leading(a, nd: int) -> list:
    """(size, element stride) of the leading axes, size-1 axes dropped, mergeable neighbours
    merged, outermost first."""
    dims = [(s, st // a.itemsize) for s, st in zip(a.shape[: a.ndim - nd], a.strides[: a.ndim - nd]) if s != 1]
    merged: list = []
    for size, stride in reversed(dims):
        if merged and stride == merged[-1][1] * merged[-1][0]:
            merged[-1] = (merged[-1][0] * size, merged[-1][1])
        else:
            merged.append((size, stride))
    return merged[::-1]


def rows_of(a, nd: int, alloc=empty) -> Rows:
    """The row view of ``a`` over its last ``nd`` axes. Copies once if those axes are not
    contiguous, or if the leading axes need more than four strides after merging."""
    if not _last_axes_contiguous(a, nd):
        a = contiguous(a, alloc)
    dims = _merged_leading(a, nd)
    if len(dims) > MAX_LEADING_AXES:
        a = contiguous(a, alloc)
        dims = _merged_leading(a, nd)
    n = math.prod(a.shape[a.ndim - nd:])
    if not dims:
        dims = [(1, n)]
    dims = dims + [(1, 0)] * (MAX_LEADING_AXES - len(dims))
    return Rows(a, math.prod(s for s, _ in dims), n, tuple(st for _, st in dims),
                tuple(s for s, _ in dims[1:]))


def pick_vec(itemsize: int, n: int, pointers: list, row_strides: list) -> int:
    """The widest pack the kernels may use: every (array, itemsize) pointer aligned to the
    pack's bytes (capped at 16), every row stride and the row length multiples of it.
    Views from DLPack or slicing may start anywhere, so the address is checked, not assumed."""
    for vec in sorted(_config.vec_choices(itemsize), reverse=True):
        if n % vec:
            continue
        if any(st % vec for st in row_strides):
            continue
        if any(a is not None and a.data.ptr % min(16, vec * size) for a, size in pointers):
            continue
        return vec
    return 1


@functools.lru_cache(maxsize=None)
def sm_count(device_id: int) -> int:
    import cupy

    return cupy.cuda.Device(device_id).attributes["MultiProcessorCount"]


def blocks_per_sm(kernel, block: int) -> int:
    """Resident blocks per SM for ``kernel`` at this block size (the driver's occupancy)."""
    from cupy_backends.cuda.api import driver

    return max(1, driver.occupancyMaxActiveBlocksPerMultiprocessor(kernel.kernel.ptr, block, 0))


def launch(kernel, grid, block, args) -> None:
    """Launch on CuPy's current stream (the caller's)."""
    kernel(grid if isinstance(grid, tuple) else (grid,), block if isinstance(block, tuple) else (block,), args)
