"""The full-row forward that holds its row in shared memory (v22: kernels/layer_norm.cu
norm_fwd_smem; half-precision 16-byte packs and float32 rows of 8193-16384, up to 64 KiB a
block): every tile shape that path takes against the float64 reference (rows past M in a
block of several row groups, strided rows, parameters absent or float32, statistics
skipped, float32 rows with a large offset), the plan holding that kernel, and agreement
with the register tiles (``_row_norm.HOLD_ROWS_IN_SMEM`` off)."""
from __future__ import annotations

import numpy
import pytest

import cunorm
from cunorm import _compile
from cunorm._checks import BFLOAT16
from cunorm.ops import _row_norm
from norm_cases import bitwise_equal, check, check_layer_norm_rows

FP16 = numpy.dtype(numpy.float16)
# bf16 N = 8 .. 32768: one pack a thread (8 rows a block), two and four packs a warp row,
# two 64-thread rows a block, then one block of 128 / 256 / 512 / 1024 threads a row (the
# last with 64 KiB of dynamic shared memory, v29)
ROW_LENGTHS = (8, 64, 512, 1024, 2048, 4096, 8192, 16384, 32768)


def _holds_in_smem(n: int, itemsize: int = 2) -> bool:
    return _row_norm.smem_row_config(n, 16 // itemsize, itemsize) is not None


def test_cpu_every_case_here_takes_the_shared_memory_path():
    assert all(_holds_in_smem(n) for n in ROW_LENGTHS)
    assert _row_norm.smem_row_bytes(_row_norm.smem_row_config(32768, 8, 2)) == 65536  # 1024 threads x 4 packs
    assert not _holds_in_smem(8192, 4)  # float32 up to 8192: the register tile
    assert _holds_in_smem(16384, 4) and not _holds_in_smem(32768, 4)  # 64 KiB, then past it
    assert _holds_in_smem(8196, 4) and _holds_in_smem(16380, 4)  # the same 1024-thread tile
    assert _row_norm.smem_row_config(4096, 4, 2) is None  # 8-byte packs
    assert not _holds_in_smem(65536)  # past ROW_SMEM_MAX


def test_cpu_shared_memory_allowance_only_rises(monkeypatch):
    # plans are cached per shape: a later plan of the same kernel asking for less dynamic
    # shared memory must not lower the allowance an earlier cached plan launches under
    driver = pytest.importorskip("cupy_backends.cuda.api.driver", reason="CuPy is not installed")
    from cunorm import _launch

    calls = []
    monkeypatch.setattr(driver, "funcSetAttribute", lambda fn, attr, value: calls.append((fn, value)))
    monkeypatch.setattr(_launch, "_smem_allowed", {})
    for fn, smem in ((1, 100_000), (1, 60_000), (2, 60_000), (1, 100_000), (1, 0), (1, 120_000)):
        _launch.allow_smem(fn, smem)
    assert calls == [(1, 100_000), (2, 60_000), (1, 120_000)]


def test_cpu_every_shared_memory_tile_is_compiled():
    names = set(_row_norm.instantiations())
    for n in ROW_LENGTHS:
        cfg = _row_norm.smem_row_config(n, 8, 2)
        for rms in (False, True):
            assert _row_norm._tile_name("norm_fwd_smem", "bfloat16", "float32", cfg, rms) in names


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
@pytest.mark.parametrize("dtype", [BFLOAT16, FP16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("n", ROW_LENGTHS)
def test_gpu_forward_row_in_shared_memory(rng, op, dtype, n):
    cfg = _row_norm.smem_row_config(n, 8, 2)
    plan = _row_norm.forward_plan((7, n), (n, 1), dtype, dtype, 1, op == "rms_norm", 1e-5, 0, 0, 0)
    want = _compile.function_ptr(_row_norm.KERNEL_FILE,
                                 _row_norm._tile_name("norm_fwd_smem", dtype.name, dtype.name, cfg, op == "rms_norm"),
                                 0)
    assert plan.kernels == (want,), "the shared-memory forward"
    check(op, rng, (7, n), dtype)  # 7 rows: the last block's later row groups are past M
    check(op, rng, (3, n), dtype, view="row_stride", param_dtype=numpy.float32)
    check(op, rng, (2, n), dtype, weight=False, bias=False)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [BFLOAT16, FP16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("n", ROW_LENGTHS[1:])
def test_gpu_forward_row_in_shared_memory_one_pass_falls_back(rng, dtype, n):
    """v98: half-precision LayerNorm rows take their statistics in one pass over x unless
    the row's mean lies far from zero (mean^2 > 64 var); then every row sharing the row's
    barriers (its warp, or its block) takes v26's two passes. Ordinary rows beside an outlier
    first element (one pass), a constant row and a +50 offset (two passes: a constant row's
    y is exactly its bias), a +7 offset (mean^2 / var = 49: one pass at the edge of its
    trust); 19 rows so that a block of several row groups holds rows of each kind, and a
    block of one row group some of each alone."""
    hx = rng.standard_normal((19, n)).astype(numpy.float32)
    hx[1, 0] = 1000.0 if dtype == BFLOAT16 else 600.0
    hx[6] = 3.0
    hx[9] += 50.0
    hx[12] += 7.0
    hx[17] = 1001.0  # constant, and its sums in fp16 round: the second pass centres it exactly
    check_layer_norm_rows(rng, hx.astype(dtype))


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
def test_gpu_shared_memory_rows_match_the_register_tiles(rng, op):
    """RMSNorm: the same arithmetic, the same bits. LayerNorm: the shared-memory rows take
    their statistics in one pass over x (v98) where the register tiles take two about the
    row's first element, so mean and rstd agree to a few float ulps of the row's spread, and
    y to one bf16 ulp where the two round on either side of a tie (plus what those ulps move
    a y near zero by)."""
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
        if op == "rms_norm":
            for j, (u, v) in enumerate(zip(a, b)):
                assert bitwise_equal(u, v), f"case {i}, output {j}"
            continue
        (y1, mean1, rstd1), (y2, mean2, rstd2) = a, b
        cupy.testing.assert_allclose(mean1, mean2, rtol=0, atol=1e-6, err_msg=f"case {i}: mean")  # std 1
        cupy.testing.assert_allclose(rstd1, rstd2, rtol=1e-6, atol=0, err_msg=f"case {i}: rstd")
        u, v = y1.astype(cupy.float32), y2.astype(cupy.float32)
        # one bf16 ulp (8 significant bits), and near zero the statistics' float differences:
        # y = (x - mean) * rstd * w, mean within 1e-6, rstd within 1e-6 of itself, |x̂| < 6
        one_ulp = 2.0**-7 * cupy.maximum(cupy.abs(u), cupy.abs(v)) + 5e-5
        assert bool((cupy.abs(u - v) <= one_ulp).all()), f"case {i}: y more than one bf16 ulp apart"


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_gpu_float32_rows_of_16384_in_shared_memory(rng, op):
    f32, n = numpy.dtype(numpy.float32), 16384
    cfg = _row_norm.smem_row_config(n, 4, 4)
    plan = _row_norm.forward_plan((7, n), (n, 1), f32, f32, 1, op == "rms_norm", 1e-5, 0, 0, 0)
    want = _compile.function_ptr(_row_norm.KERNEL_FILE,
                                 _row_norm._tile_name("norm_fwd_smem", "float32", "float32", cfg, op == "rms_norm"), 0)
    assert plan.kernels == (want,), "the shared-memory forward"
    check(op, rng, (7, n), f32)
    check(op, rng, (3, n), f32, view="row_stride")
    check(op, rng, (2, n), f32, weight=False, bias=False)
    # float32 keeps two subtractions when centring: one of pivot + mu rounded to float lost
    # ~4e-4 on rows offset by 1e4 (v31)
    check(op, rng, (4, n), f32, x_offset=1e4)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, value", [(BFLOAT16, 9984.0), (FP16, 1000.0)], ids=["bf16", "fp16"])
@pytest.mark.parametrize("n", [512, 4096])
def test_gpu_constant_rows_give_the_bias_exactly(rng, dtype, value, n):
    """A row of one repeated value has no variance: x - mean is exactly 0, so y is the bias to
    the bit, whatever rstd (1 / sqrt(eps)) is. (xhat as x * r - mean * r rounded the product
    to 0.117 there, NOTES v43.)"""
    import cupy

    x = cupy.asarray(numpy.full((5, n), value, dtype=dtype))
    w = cupy.asarray(rng.standard_normal(n).astype(dtype))
    b = cupy.asarray(rng.standard_normal(n).astype(dtype))
    y = cunorm.layer_norm(x, w, b)
    assert bitwise_equal(y, cupy.ascontiguousarray(cupy.broadcast_to(b, (5, n))))
