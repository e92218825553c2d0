"""The backward's two full-row paths, for both ops, at the row count where the dispatcher
switches: few rows take the one-launch column kernel (dx blocks plus dW/dB column blocks),
more rows the persistent partial-row kernel and its reduction."""
from __future__ import annotations

import numpy
import pytest

from cunorm._checks import BFLOAT16
from norm_cases import DTYPE_IDS, DTYPES, VIEWS, check, column_backward_edge

pytestmark = pytest.mark.gpu
OPS = ["layer_norm", "rms_norm"]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("n", [7, 1024, 4096])
def test_column_backward_edge(rng, op, dtype, n):
    column_backward_edge(op, rng, n, dtype)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("view", sorted(VIEWS))
def test_views_partial_row_backward(rng, op, view):
    # 1025 rows: past the column backward, the views through the partial-row path
    check(op, rng, (41, 25, 1536), numpy.float32, view=view)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", [d for d in DTYPES if numpy.dtype(d).itemsize == 2],
                         ids=[i for d, i in zip(DTYPES, DTYPE_IDS) if numpy.dtype(d).itemsize == 2])
@pytest.mark.parametrize("n", [504, 520, 2048, 4096, 8184])
def test_staged_partial_row_backward_walks_many_rows(rng, op, dtype, n):
    """Half-precision rows staged through shared memory (the next rows copied during this
    one's reductions): enough rows that every persistent group walks many, including the last
    steps' stages of rows past M. Each staging of _config.bwd_stage_depth / StagePolicy: warp
    rows (N = 504, three buffers), 128-512-thread rows (two, v75) and 1024-thread rows
    (N = 8184, three buffers for LayerNorm), both with their statistics staged (v74). On
    sm_90 (v86) the 128-512-thread rows (N = 520-4096; RMSNorm from 256 threads, N = 2048)
    take each row as one bulk copy of x and one of dy on the buffer's mbarrier, rows past M
    never copied. N = 504 / 520 / 8184 leave
    the tile's last packs past the row: zero-filled copies (zeroed once a buffer under v86),
    and weight slots (v71) holding 1."""
    from cunorm import _config
    from cunorm.ops import _row_norm

    assert _row_norm.STAGE_BACKWARD
    plan = _row_norm.backward_plan((4099, n), (n, 1), (n, 1), dtype, dtype, dtype, 1, op == "rms_norm", 0, 0, 0)
    cfg = _config.bwd_row_config(n, 8, 2, op == "rms_norm")
    assert plan.smem == _row_norm.stage_bytes(cfg, 2, 2, op == "rms_norm") > 0, "a staged full-row plan"
    check(op, rng, (4099, n), dtype)  # H200: 132-1056 resident groups at these N


HALF = [d for d in DTYPES if numpy.dtype(d).itemsize == 2]
HALF_IDS = [i for d, i in zip(DTYPES, DTYPE_IDS) if numpy.dtype(d).itemsize == 2]


WIDE = HALF + [numpy.dtype(numpy.float32)]
WIDE_IDS = HALF_IDS + ["float32"]


def _check_wide(rng, op, dtype, n, rows, tile):
    """The plan is the wide backward's one-block ``tile`` with its ring in shared memory, and
    the values match the reference."""
    from cunorm import _config
    from cunorm.ops import _row_norm

    rms, itemsize = op == "rms_norm", numpy.dtype(dtype).itemsize
    plan = _row_norm.backward_plan((rows, n), (n, 1), (n, 1), dtype, dtype, dtype, 1, rms, 0, 0, 0)
    optin = _row_norm.smem_limits(0)[0]
    depth = _config.wide_bwd_depth(tile, rms, n, itemsize, optin, False, itemsize)
    assert plan.split is None and plan.block == 1024 and plan.groups == plan.blocks, "the wide backward"
    assert plan.smem == _config.wide_bwd_smem(tile, itemsize, depth, optin, rms, False, itemsize), \
        "its ring, and its weight where it fits"
    check(op, rng, (rows, n), dtype)


@pytest.fixture
def single_wide_block(monkeypatch):
    """The single wide block keeps every row it holds: v99's float32 clusters of two narrow
    blocks, which take rows from 12288 / 16384 on sm_90, and v102's half-precision RMSNorm
    clusters, from 20480, start past them (the single block still serves those rows where
    clusters do not exist)."""
    from cunorm import _config
    from cunorm.ops import _row_norm

    monkeypatch.setattr(_config, "WIDE_CLUSTER_BWD_FROM",
                        {**_config.WIDE_CLUSTER_BWD_FROM, (4, False): 16385, (4, True): 16385, (2, True): 32769})
    _row_norm.backward_plan.cache_clear()
    yield
    _row_norm.backward_plan.cache_clear()


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", WIDE, ids=WIDE_IDS)
@pytest.mark.parametrize("n", [8200, 12000, 16384])
@pytest.mark.parametrize("rows", [1, 3, 133, 1000])
def test_wide_backward(rng, single_wide_block, op, dtype, n, rows):
    """Rows of 8193-16384 elements: one 1024-thread block a row, two packs a thread (four
    for float32, v65), rows staged in shared memory (norm_bwd_wide, v63; float32 stages x
    alone). 1 and 3 rows leave most blocks
    without one; 133 is one block more than the H200's SMs (a block walks two rows, the rest
    one); 1000 walks every block through its ring several times. N = 8200 and 12000 leave
    the tile's last packs past the row (zero-filled copies)."""
    from cunorm import _config

    itemsize = numpy.dtype(dtype).itemsize
    _check_wide(rng, op, dtype, n, rows, _config.wide_bwd_tile(n, 16 // itemsize, itemsize, op == "rms_norm"))


@pytest.mark.parametrize("dtype", HALF, ids=HALF_IDS)
@pytest.mark.parametrize("n", [16392, 20000, 32768])
@pytest.mark.parametrize("rows", [1, 3, 133, 500])
def test_wide_backward_long_rms_rows(rng, single_wide_block, dtype, n, rows):
    """Half-precision RMSNorm rows of 16385-32768 elements (v66): four packs of 8 a thread,
    x staged, dy loaded in each pass. N = 16392 and 20000 leave most of the tile's last packs
    past the row; 500 rows walk every block through its ring several times."""
    from cunorm import _config

    _check_wide(rng, "rms_norm", dtype, n, rows, _config.WIDE_BWD_TILE_RMS_LONG)


# (op, N, its tile's name in _config, staged bytes a row and its message): the two-pack
# tile stages x and dy, v66's four-pack RMSNorm tile x alone
WIDE_VIEW_CASES = [("layer_norm", 16384, "WIDE_BWD_TILE", 2 * 16384 * 2, "the forced depth"),
                   ("rms_norm", 16384, "WIDE_BWD_TILE", 2 * 16384 * 2, "the forced depth"),
                   ("rms_norm", 24576, "WIDE_BWD_TILE_RMS_LONG", 32768 * 2, "the forced depth, x alone")]


@pytest.mark.parametrize("op,n,tile,row_bytes,what", WIDE_VIEW_CASES,
                         ids=[f"{o}-{n}" for o, n, _, _, _ in WIDE_VIEW_CASES])
@pytest.mark.parametrize("view", ["row_stride", "negative_row_stride"])
@pytest.mark.parametrize("depth", [2, 3])
def test_wide_backward_views_and_depths(rng, monkeypatch, single_wide_block, op, n, tile, row_bytes, what, view,
                                        depth):
    """Strided rows through the wide backward's copies, and each ring depth forced (v81: the
    weight's slots after a ring where both fit, as on the H200's depth-2 ring of 16384)."""
    from cunorm import _config
    from cunorm.ops import _row_norm

    monkeypatch.setattr(_row_norm, "WIDE_DEPTH", depth)
    _row_norm.backward_plan.cache_clear()
    try:
        plan = _row_norm.backward_plan((300, n), (n, 1), (n, 1), BFLOAT16, BFLOAT16, BFLOAT16, 1,
                                       op == "rms_norm", 0, 0, 0)
        weight = _config.wide_bwd_weight_bytes(getattr(_config, tile), 2, depth, _row_norm.smem_limits(0)[0],
                                                op == "rms_norm", False, 2)
        assert plan.smem == depth * row_bytes + weight, what
        check(op, rng, (300, n), BFLOAT16, view=view)
    finally:
        _row_norm.backward_plan.cache_clear()


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", HALF, ids=HALF_IDS)
@pytest.mark.parametrize("view", ["contiguous", "row_stride"])
def test_split_backward_walks_many_rows_in_one_wave(rng, monkeypatch, op, dtype, view):
    """Rows past the full-row backward tile take the split path (on sm_90, half-precision
    rows up to 65536 elements take staged clusters or the wide backward unless switched off, as here), whose
    persistent grid holds at most the resident blocks (v27): N = 16424 is four full
    4096-element tiles and one of 40, 300 rows make every row group walk several."""
    from cunorm._launch import blocks_per_sm, sm_count
    from cunorm.ops import _row_norm

    monkeypatch.setattr(_row_norm, "USE_STAGED_CLUSTER_BACKWARD", False)
    monkeypatch.setattr(_row_norm, "USE_WIDE_BACKWARD", False)  # RMSNorm's wide tile holds 16424 (v66)
    _row_norm.backward_plan.cache_clear()
    try:
        n, m = 16424, 300
        plan = _row_norm.backward_plan((m, n), (n, 1), (n, 1), dtype, dtype, dtype, 1, op == "rms_norm", 0, 0, 0)
        assert plan.split is not None, "the split backward"
        tiles = plan.split[2]
        assert plan.blocks * tiles <= sm_count(0) * blocks_per_sm(plan.main, plan.block), "one wave"
        assert m > 2 * plan.blocks, "every row group walks several rows"
        check(op, rng, (m, n), dtype, view=view)
    finally:
        _row_norm.backward_plan.cache_clear()  # no split plan outlives the switch


@pytest.mark.parametrize("groups", [1, 3, 17, 32, 33, 100])
def test_partial_reduction_lane_count_keeps_the_bits(rng, groups):
    """norm_reduce_partials folds G partial rows with R = min(32, next power of two of G)
    lanes (v30; before, always 32): lanes past G hold zeros, so the bits equal 32 lanes'."""
    import cupy

    from cunorm._compile import function_ptr
    from cunorm._launch import launch
    from cunorm.ops import _row_norm

    n = 4099
    part = cupy.asarray(rng.standard_normal((2, groups, n)).astype(numpy.float32))
    kernel = function_ptr(_row_norm.KERNEL_FILE, "norm_reduce_partials<float, float>", 0)
    stream = cupy.cuda.get_current_stream().ptr
    chosen = cupy.empty((2, n), numpy.float32)
    _row_norm.reduce_partial_rows(kernel, part[0].data.ptr, chosen[0].data.ptr, part[1].data.ptr,
                                  chosen[1].data.ptr, groups, n, stream)
    wide = cupy.empty((2, n), numpy.float32)
    launch(kernel, (-(-n // 32), 2), (32, 32), (part[0].data.ptr, wide[0].data.ptr, part[1].data.ptr,
                                               wide[1].data.ptr, groups, n), stream)
    assert bool((chosen.view(numpy.uint32) == wide.view(numpy.uint32)).all())
    assert numpy.allclose(chosen.get(), part.get().astype(numpy.float64).sum(axis=1), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("op", OPS)
def test_wide_backward_without_parameters(rng, op):
    check(op, rng, (150, 9000), BFLOAT16, weight=False, bias=False)
    if op == "rms_norm":
        check(op, rng, (150, 30000), BFLOAT16, weight=False, bias=False)  # v66's tile
