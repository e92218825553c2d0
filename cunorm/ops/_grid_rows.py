"""Host side of kernels/layer_norm_grid.cu (v79): rows past the cluster and wide tiles, the
whole grid on a few rows at a time, x (and dy) read once. Plans (the grid's shape from the
row's length and the GPU) and launches; ``_row_norm`` takes a plan where one serves.

A launch takes one scratch block: the grid barriers' arrival counters (zeroed), then the
steps' row partials (_config.grid_scratch_words). The grid is cooperative: every block
resident.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import numpy

from .. import _config
from .._compile import c_type, function_ptr, held_with_modules
from .._launch import allow_smem, fits_smem, launch_cooperative, sm_count, zero_async

GRID_FILE = "layer_norm_grid.cu"  # CUDA sm_80+ only
# The grid-row kernels in place of the split path past the forward's clusters and the
# backward's wide clusters, for the passes _config.GRID_SERVES names: benchmarks/NOTES.md, v79.
USE_GRID_ROWS = True
_COUNTER_BYTES = 256  # the counters' words, then the partials 256-byte aligned


class GridPlan(NamedTuple):
    kernel: int
    blocks: int
    block: int
    rows: int  # R, rows a step
    smem: int


def grid_name(backward: bool, t: str, w: str, rms: bool, qpad: int) -> str:
    kernel = "norm_bwd_grid" if backward else "norm_fwd_grid"
    return (f"{kernel}<{c_type(t)}, {c_type(w)}, {'true' if rms else 'false'}, {qpad}, "
            f"{_config.GRID_STEP_ROWS[backward]}, {_config.GRID_DEPTH}, {_config.GRID_LAG}>")


def instantiations(type_pairs) -> list[str]:
    """Every grid-row kernel the plans below may launch (16-byte packs: half precision and
    float32)."""
    return [grid_name(backward, t, w, rms, qpad) for t, w in type_pairs if t != "float64"
            for backward in (False, True) for rms in (False, True) for qpad in _config.GRID_QPADS]


@held_with_modules
@functools.lru_cache(maxsize=256)
def grid_plan(backward: bool, t: str, w: str, itemsize: int, n: int, vec: int, rms: bool,
              device: int) -> GridPlan | None:
    """The grid-row launch for rows of ``n`` elements of ``itemsize`` bytes in ``vec``-packs,
    or None where it does not serve (switched off, a pass, element size or row length
    _config.grid_serves leaves out, HIP, before sm_80, packs under 16 bytes, a slice past one
    block's threads, or a block that does not fit an SM)."""
    if not USE_GRID_ROWS or not _config.grid_serves(backward, itemsize, n) or vec * itemsize != 16 \
            or not _cuda_sm80(device):
        return None
    blocks = sm_count(device)
    qpad = _config.grid_qpad(n // vec, blocks)
    if qpad is None or blocks > _config.GRID_MAX_BLOCKS:
        return None
    kernel = function_ptr(GRID_FILE, grid_name(backward, t, w, rms, qpad), device)
    smem = _config.grid_stage_bytes(backward)
    if not fits_smem(kernel, smem, device):
        return None
    allow_smem(kernel, smem)  # one block an SM: __launch_bounds__ holds its registers to 64
    return GridPlan(kernel, blocks, _config.GRID_THREADS, _config.grid_stage_rows(qpad, backward), smem)


@functools.lru_cache(maxsize=None)
def _cuda_sm80(device: int) -> bool:
    import cupy

    from ._row_norm import _compute_capability  # (_row_norm imports this module)

    return not cupy.cuda.runtime.is_hip and _compute_capability(device) >= _config.GRID_MIN_SM


def scratch(plan: GridPlan) -> tuple:
    """The (shape, dtype) of the launch's scratch block."""
    counters, floats = _config.grid_scratch_words(plan.rows, plan.blocks)
    assert counters * 4 <= _COUNTER_BYTES
    return ((_COUNTER_BYTES // 4 + floats,), numpy.dtype(numpy.float32))


def run(plan: GridPlan, head: tuple, tail: tuple, alloc, stream: int) -> None:
    """Launches ``plan.kernel`` with arguments (*head, partials, counters, *tail) after zeroing
    the counters of a fresh scratch block."""
    block = alloc(*scratch(plan))
    zero_async(block, 4 * _config.grid_scratch_words(plan.rows, plan.blocks)[0], stream)
    launch_cooperative(plan.kernel, plan.blocks, plan.block, (*head, block + _COUNTER_BYTES, block, *tail), stream,
                       plan.smem)
