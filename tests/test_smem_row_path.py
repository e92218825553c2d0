"""The full-row forwards that hold their row in shared memory (v22: kernels/row_norm.cuh
FwdInSmem; half-precision 16-byte packs, up to 32 KiB a block): every tile shape that path
takes against the float64 reference (rows past M in a block of several row groups, strided
rows, parameters absent or float32, statistics skipped), and the same bits as the register
tiles (``-DCUNORM_FWD_SMEM=0``, the host's mirror turned off with it) for the plain and the
fused forward. On the CPU: the host's shared-memory bytes of the fused forward."""
from __future__ import annotations

import ml_dtypes
import numpy
import pytest

import cunorm
from cunorm import _compile, _config
from cunorm._checks import BFLOAT16
from cunorm.ops import _fused, _row_norm
from norm_cases import bitwise_equal, check

FP16 = numpy.dtype(numpy.float16)
# bf16 N = 8 .. 16384: one pack a thread (8 rows a block), two and four packs a warp row,
# two 64-thread rows a block, then one block of 128 / 256 / 512 threads a row
ROW_LENGTHS = (8, 64, 512, 1024, 2048, 4096, 8192, 16384)


def _holds_in_smem(n: int, itemsize: int = 2) -> bool:
    cfg = _config.row_config(n, 16 // itemsize, _config.FWD)
    return cfg is not None and cfg.block * cfg.packs * 16 <= 32768


def test_cpu_every_case_here_takes_the_shared_memory_path():
    assert all(_holds_in_smem(n) for n in ROW_LENGTHS)
    assert not _holds_in_smem(32768)  # 1024 threads x 4 packs: 64 KiB, the register tile


def test_cpu_fused_forward_shared_memory_bytes():
    cfg = _config.row_config(4096, 8, _config.FWD)  # 128 threads x 4 packs of 16 bytes
    assert _fused.fwd_smem_bytes(cfg, 2, 2, 2, residual=False) == 8192
    assert _fused.fwd_smem_bytes(cfg, 2, 2, 4, residual=True) == 16384
    assert _fused.fwd_smem_bytes(cfg, 2, 4, 2, residual=True) == 0  # a float32 residual: registers
    assert _fused.fwd_smem_bytes(cfg, 2, 2, 1, residual=True) == 0  # FP8 out: registers
    assert _fused.fwd_smem_bytes(cfg, 4, 4, 4, residual=False) == 0  # float32 x: registers
    big = _config.row_config(16384, 8, _config.FWD)  # 32 KiB a set: two do not fit
    assert _fused.fwd_smem_bytes(big, 2, 2, 2, residual=False) == 0


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
@pytest.mark.parametrize("dtype", [BFLOAT16, FP16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("n", ROW_LENGTHS)
def test_gpu_forward_row_in_shared_memory(rng, op, dtype, n):
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
    """fn() with the kernels compiled with CUNORM_FWD_SMEM = smem (the host's mirror set to
    match), caches cleared on the way in and out."""
    def clear():
        _compile._modules.clear()
        for cache in (_row_norm._forward_kernels, _row_norm.forward_plan, _fused.fused_forward_plan):
            cache.cache_clear()

    options, hold = _compile.COMPILE_OPTIONS, _fused.HOLD_ROWS_IN_SMEM
    try:
        _compile.COMPILE_OPTIONS = (*options, f"-DCUNORM_FWD_SMEM={int(smem)}")
        _fused.HOLD_ROWS_IN_SMEM = smem
        clear()
        return fn()
    finally:
        _compile.COMPILE_OPTIONS, _fused.HOLD_ROWS_IN_SMEM = options, hold
        clear()


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_gpu_shared_memory_rows_give_the_register_tiles_bits(rng, op):
    import cupy

    f = getattr(cunorm, op)
    cases = []
    for n in (512, 4096):
        x, r = (cupy.asarray(rng.standard_normal((37, n)).astype(BFLOAT16)) for _ in range(2))
        w = cupy.asarray((1 + 0.1 * rng.standard_normal(n)).astype(numpy.float32))
        cases += [lambda x=x, w=w: f(x, w, return_stats=True),
                  lambda x=x, r=r, w=w: f(x, w, residual=r, residual_dtype=numpy.float32, weight_offset=1.0,
                                          return_stats=True),
                  lambda x=x, w=w: f(x, w, out_dtype=ml_dtypes.float8_e4m3fn, out_scale=8.0, return_amax=True)]
    run = lambda: [tuple(c()) for c in cases]  # noqa: E731
    held, registers = _with_flag(True, run), _with_flag(False, run)
    for i, (a, b) in enumerate(zip(held, registers)):
        assert len(a) == len(b)
        for j, (u, v) in enumerate(zip(a, b)):  # amax is 0-d: one element to compare as bytes
            assert bitwise_equal(cupy.atleast_1d(u), cupy.atleast_1d(v)), f"case {i}, output {j}"
