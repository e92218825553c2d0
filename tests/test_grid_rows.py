"""Rows past the cluster and wide tiles on the grid-row kernels (kernels/layer_norm_grid.cu,
v79): the whole grid on R rows a step, each block one slice of every row, one grid barrier a
step, x (and dy) read once. Row counts of 1 (most of a step's rows past M), and enough for
every block to walk its ring through several steps; N = 131080 and 150000 leave the blocks'
slices a pack apart in size. The dispatcher takes them for the backward only
(_config.GRID_SERVES); the GPU tests here turn on every pass and element size."""
from __future__ import annotations

import numpy
import pytest

from cunorm import _config
from norm_cases import DTYPE_IDS, DTYPES, check

OPS = ["layer_norm", "rms_norm"]
WIDE = [d for d in DTYPES if numpy.dtype(d).itemsize in (2, 4)]
WIDE_IDS = [i for d, i in zip(DTYPES, DTYPE_IDS) if numpy.dtype(d).itemsize in (2, 4)]


def _clear_plans():
    from cunorm.ops import _grid_rows, _row_norm

    for cache in (_grid_rows.grid_plan, _row_norm._forward_kernels, _row_norm.forward_plan, _row_norm.backward_plan):
        cache.cache_clear()


@pytest.fixture
def every_grid_pass(monkeypatch):
    """The grid rows for both passes and every element size, plans made afresh and dropped;
    clusters off, since on sm_90 they take forward rows up to 262144 before the grid rows."""
    from cunorm.ops import _row_norm

    _clear_plans()
    monkeypatch.setattr(_config, "GRID_SERVES", {False: (2, 4), True: (2, 4)})
    monkeypatch.setattr(_row_norm, "USE_CLUSTERS", False)
    yield
    monkeypatch.undo()
    _clear_plans()


def _grid_plans(op, dtype, n, rows, param_dtype=None):
    """The forward's and backward's plans, asserted to be the grid-row kernels'."""
    from cunorm.ops import _row_norm

    rms, pdt = op == "rms_norm", numpy.dtype(param_dtype or dtype)
    fwd = _row_norm.forward_plan((rows, n), (n, 1), dtype, pdt, 1, rms, 1e-5, 0, 0, 0)
    bwd = _row_norm.backward_plan((rows, n), (n, 1), (n, 1), dtype, pdt, pdt, 1, rms, 0, 0, 0)
    assert fwd.grid_rows is not None and bwd.grid_rows is not None, "the grid-row kernels"
    return fwd, bwd


@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", WIDE, ids=WIDE_IDS)
@pytest.mark.parametrize("n,rows", [(150000, 1), (150000, 37), (262144, 40), (1048576, 7)])
def test_grid_rows(rng, every_grid_pass, op, dtype, n, rows):
    if n == 1048576 and numpy.dtype(dtype).itemsize == 4:
        n = 524288  # float32 rows of 1M take two packs a thread past one block an SM: the split path
    _grid_plans(op, dtype, n, rows)
    check(op, rng, (rows, n), dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("param_dtype,weight,bias", [(numpy.float32, True, True), (None, False, False),
                                                     (None, True, False)])
def test_grid_rows_parameters(rng, every_grid_pass, op, param_dtype, weight, bias):
    from cunorm._checks import BFLOAT16

    _grid_plans(op, BFLOAT16, 131080, 19, param_dtype)
    check(op, rng, (19, 131080), BFLOAT16, weight=weight, bias=bias, param_dtype=param_dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("view", ["row_stride", "negative_row_stride", "transposed_leading"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_grid_rows_views(rng, every_grid_pass, op, view, dtype):
    # rows addressed through the leading axes' strides, read in place
    from cunorm._checks import BFLOAT16

    dtype = BFLOAT16 if dtype == "bfloat16" else numpy.dtype(dtype)
    _grid_plans(op, dtype, 131080, 9)
    shape = (3, 5, 131080) if view == "transposed_leading" else (9, 131080)
    check(op, rng, shape, dtype, view=view)


@pytest.mark.gpu
def test_grid_rows_far_from_zero(rng, every_grid_pass):
    # LayerNorm's statistics merge the blocks' (count, mean, M2) by Chan's formula: rows with
    # a large mean keep their variance
    from cunorm._checks import BFLOAT16

    for dtype in (BFLOAT16, numpy.float32):
        check("layer_norm", rng, (5, 262144), dtype, x_offset=300.0)


@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
def test_grid_rows_bits_repeat(rng, every_grid_pass, op):
    # every block folds the partials in block order: the same bits run after run
    import cupy

    import cunorm
    from cunorm._checks import BFLOAT16

    x = cupy.asarray(rng.standard_normal((21, 262144)).astype(BFLOAT16))
    dy = cupy.asarray(rng.standard_normal((21, 262144)).astype(BFLOAT16))
    w = cupy.asarray(1 + 0.1 * rng.standard_normal(262144).astype(numpy.float32))
    runs = []
    for _ in range(3):
        if op == "rms_norm":
            y, rstd = cunorm.rms_norm(x, w, return_stats=True)
            grads = cunorm.rms_norm_backward(dy, x, w, rstd)
            runs.append([a.view(numpy.uint8).get() for a in (y, rstd, *grads)])
        else:
            y, mean, rstd = cunorm.layer_norm(x, w, w, return_stats=True)
            grads = cunorm.layer_norm_backward(dy, x, w, mean, rstd)
            runs.append([a.view(numpy.uint8).get() for a in (y, mean, rstd, *grads)])
    for other in runs[1:]:
        assert all(numpy.array_equal(a, b) for a, b in zip(runs[0], other))


@pytest.fixture
def loaded_side_words(every_grid_pass):
    """The grid rows built with CUNORM_GRID_STAGE_SIDE=0 (before v79d: the rows' statistics
    and pivots loaded where they are used), the default build back afterwards."""
    from cunorm import _compile

    before = _compile.COMPILE_OPTIONS
    _compile.COMPILE_OPTIONS = (*before, "-DCUNORM_GRID_STAGE_SIDE=0")
    _compile.drop_modules()  # the plans with the modules
    yield
    _compile.COMPILE_OPTIONS = before
    _compile.drop_modules()


@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_grid_rows_loaded_side_words(rng, loaded_side_words, op, dtype):
    # the same rows as the default build's staged statistics and pivots: rows past M in the
    # last step (37 of 150000), and a mean of 300 that keeps its digits through the pivot
    from cunorm._checks import BFLOAT16

    dtype = BFLOAT16 if dtype == "bfloat16" else numpy.dtype(dtype)
    _grid_plans(op, dtype, 150000, 37)
    check(op, rng, (37, 150000), dtype)
    check(op, rng, (5, 262144), dtype, x_offset=300.0)


@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
def test_grid_rows_serve_the_backward_only(op):
    # the default dispatch: rows past the wide clusters take the grid rows backward, no
    # forward does, and float32 rows whose slice needs more than one block's threads a pack
    # (1M elements: 2048 packs a block on 128-160 SMs) stay split
    from cunorm._checks import BFLOAT16
    from cunorm.ops import _row_norm

    _clear_plans()
    rms = op == "rms_norm"
    f32 = numpy.dtype(numpy.float32)
    # (dtype, N, whether the backward takes the grid rows); rows up to 131072 take the wide
    # clusters on sm_90 (v93), 256 KiB and over or not: bf16 70000, float32 131072; half-
    # precision rows to 262144 too where the GPU runs clusters of 9-16 of them (v115), and
    # float32 rows to 262144 in clusters of v93's blocks (v117)
    # (the wide cluster plans are None where clusters do not serve)
    clusters = _row_norm._clusters_serve("float32", 0)
    half_past_eight = _row_norm._wide_cluster_plan("bfloat16", "bfloat16", 2, 262144, 8, rms, 0) is not None
    f32_past_eight = _row_norm._wide_cluster_plan("float32", "float32", 4, 262144, 4, rms, 0) is not None  # v117
    for dtype, n, grid in ((BFLOAT16, 262144, not half_past_eight), (f32, 262144, not f32_past_eight),
                           (BFLOAT16, 1 << 20, True), (f32, 1 << 20, False), (BFLOAT16, 70000, False),
                           (f32, 131072, not clusters), (BFLOAT16, 131080, not half_past_eight),
                           (BFLOAT16, 262152, True)):
        fwd = _row_norm.forward_plan((8, n), (n, 1), dtype, dtype, 1, rms, 1e-5, 0, 0, 0)
        bwd = _row_norm.backward_plan((8, n), (n, 1), (n, 1), dtype, dtype, dtype, 1, rms, 0, 0, 0)
        assert fwd.grid_rows is None, (dtype, n)
        assert (bwd.grid_rows is not None) == grid, (dtype, n)


def test_grid_rows_serve_rows_of_256_kib_and_up():
    # the shortest rows the sweeps measured; the forward nowhere
    assert _config.grid_serves(True, 2, 131072) and _config.grid_serves(True, 4, 65536)
    assert not _config.grid_serves(True, 2, 131071) and not _config.grid_serves(True, 4, 65535)
    assert not _config.grid_serves(True, 8, 1 << 20), "float64: 8-byte elements"
    assert not any(_config.grid_serves(False, size, 1 << 20) for size in (2, 4))


@pytest.mark.parametrize("packs", [16384, 16385, 18750, 32768, 37500, 65536, 100000])
@pytest.mark.parametrize("blocks", [108, 132, 160])
def test_grid_row_group_holds_the_slice(packs, blocks):
    # the smallest row group whose threads hold the widest block's slice, one pack a thread
    qpad = _config.grid_qpad(packs, blocks)
    widest = -(-packs // blocks)
    assert qpad in _config.GRID_QPADS and widest <= qpad
    assert qpad == min(_config.GRID_QPADS) or widest > qpad // 2


def test_grid_row_group_none_past_one_pack_a_thread():
    # rows whose slices would need two packs a thread, or blocks without a pack, take the split path
    assert _config.grid_qpad(132 * _config.GRID_THREADS + 1, 132) is None
    assert _config.grid_qpad(131, 132) is None


def test_grid_stage_bytes():
    # a step stages as many bytes a block in both passes (x; x and dy), every group a row at least
    for backward in (False, True):
        assert _config.grid_stage_bytes(backward) == _config.grid_stage_bytes(not backward)
        for qpad in _config.GRID_QPADS:
            assert _config.grid_stage_rows(qpad, backward) >= _config.GRID_THREADS // qpad
