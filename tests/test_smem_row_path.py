"""The full-row forward that holds its row in shared memory (v22: kernels/layer_norm.cu
norm_fwd_smem; half-precision 16-byte packs, up to 32 KiB a block): every tile shape that path
takes against the float64 reference (rows past M in a block of several row groups, strided
rows, parameters absent or float32, statistics skipped), the plan holding that kernel, and
the same bits as the register tiles (``_row_norm.HOLD_ROWS_IN_SMEM`` off)."""
from __future__ import annotations

import numpy
import pytest

import cunorm
from cunorm import _compile, _config
from cunorm._checks import BFLOAT16
from cunorm.ops import _row_norm
from norm_cases import bitwise_equal, check

FP16 = numpy.dtype(numpy.float16)
# bf16 N = 8 .. 16384: one pack a thread (8 rows a block), two and four packs a warp row,
# two 64-thread rows a block, then one block of 128 / 256 / 512 threads a row
ROW_LENGTHS = (8, 64, 512, 1024, 2048, 4096, 8192, 16384)


def _holds_in_smem(n: int, itemsize: int = 2) -> bool:
    cfg = _config.row_config(n, 16 // itemsize, _config.FWD)
    return cfg is not None and _row_norm.smem_row_tile(cfg, itemsize)


def test_cpu_every_case_here_takes_the_shared_memory_path():
    assert all(_holds_in_smem(n) for n in ROW_LENGTHS)
    assert not _holds_in_smem(32768)  # 1024 threads x 4 packs: 64 KiB, the register tile
    assert not _holds_in_smem(4096, 4)  # float32: the register tile
    assert not _row_norm.smem_row_tile(_config.row_config(4096, 4, _config.FWD), 2)  # 8-byte packs


def test_cpu_every_shared_memory_tile_is_compiled():
    names = set(_row_norm.instantiations())
    for n in ROW_LENGTHS:
        cfg = _config.row_config(n, 8, _config.FWD)
        for rms in (False, True):
            assert _row_norm._tile_name("norm_fwd_smem", "bfloat16", "float32", cfg, rms) in names


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
@pytest.mark.parametrize("dtype", [BFLOAT16, FP16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("n", ROW_LENGTHS)
def test_gpu_forward_row_in_shared_memory(rng, op, dtype, n):
    cfg = _config.row_config(n, 8, _config.FWD)
    plan = _row_norm.forward_plan((7, n), (n, 1), dtype, dtype, 1, op == "rms_norm", 1e-5, 0, 0, 0)
    want = _compile.function_ptr(_row_norm.KERNEL_FILE,
                                 _row_norm._tile_name("norm_fwd_smem", dtype.name, dtype.name, cfg, op == "rms_norm"),
                                 0)
    assert plan.kernels == (want,), "the shared-memory forward"
    check(op, rng, (7, n), dtype)  # 7 rows: the last block's later row groups are past M
    check(op, rng, (3, n), dtype, view="row_stride", param_dtype=numpy.float32)
    check(op, rng, (2, n), dtype, weight=False, bias=False)


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_gpu_forward_row_in_shared_memory_without_statistics(rng, op):
    import cupy

    x = cupy.asarray(rng.standard_normal((499, 4096)).astype(BFLOAT16))
    w = cupy.asarray((1 + 0.1 * rng.standard_normal(4096)).astype(BFLOAT16))
    f = getattr(cunorm, op)
    assert bitwise_equal(f(x, w), f(x, w, return_stats=True)[0])


def _with_flag(smem: bool, fn):
    """fn() with the host picking the shared-memory forward or not, caches cleared on the
    way in and out."""
    def clear():
        _row_norm._forward_kernels.cache_clear()
        _row_norm.forward_plan.cache_clear()

    hold = _row_norm.HOLD_ROWS_IN_SMEM
    try:
        _row_norm.HOLD_ROWS_IN_SMEM = smem
        clear()
        return fn()
    finally:
        _row_norm.HOLD_ROWS_IN_SMEM = hold
        clear()


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_gpu_shared_memory_rows_give_the_register_tiles_bits(rng, op):
    import cupy

    f = getattr(cunorm, op)
    cases = []
    for n in (64, 512, 4096, 16384):
        x = cupy.asarray(rng.standard_normal((37, n)).astype(BFLOAT16))
        for w in (cupy.asarray((1 + 0.1 * rng.standard_normal(n)).astype(numpy.float32)), None):
            cases.append(lambda x=x, w=w: f(x, w, return_stats=True))
    run = lambda: [tuple(c()) for c in cases]  # noqa: E731
    held, registers = _with_flag(True, run), _with_flag(False, run)
    for i, (a, b) in enumerate(zip(held, registers)):
        assert len(a) == len(b)
        for j, (u, v) in enumerate(zip(a, b)):
            assert bitwise_equal(u, v), f"case {i}, output {j}"
