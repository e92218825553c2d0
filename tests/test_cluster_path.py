"""Long rows through thread-block clusters (sm_90+, kernels/layer_norm_cluster.cu; on by
default, the fixtures skip below sm_90), forward and backward: LayerNorm and RMSNorm against
the float64 reference, rows past the full-row tiles in each cluster shape, with and without
parameters, strided and offset views, more rows than the grid holds; the register-held
cluster backward (off by default) and the staged one (on); and the dispatch itself (which
kernel a plan holds)."""
from __future__ import annotations

import numpy
import pytest

from cunorm import _config
from cunorm._checks import BFLOAT16
from cunorm.ops import _row_norm
from norm_cases import check, check_layer_norm_rows

F32, F16 = numpy.dtype(numpy.float32), numpy.dtype(numpy.float16)


def _clear():
    _row_norm._forward_kernels.cache_clear()
    _row_norm.forward_plan.cache_clear()
    _row_norm.backward_plan.cache_clear()


def _skip_before_sm90():
    import cupy

    cc = cupy.cuda.Device().compute_capability
    if int(cc) < _config.CLUSTER_MIN_SM:
        pytest.skip(f"thread-block clusters need sm_90 or later; this GPU is sm_{cc}")


def _forward_tile(n: int, dtype, rms: bool) -> _config.ClusterConfig | None:
    """The cluster tile a forward of rows of n should take: v119's / v120's sixteen 512-thread
    blocks past 131072 where they serve and the driver runs them, else the portable tile."""
    dtype = numpy.dtype(dtype)
    vec = 16 // dtype.itemsize
    wide = _config.nonportable_cluster_fwd_config(n, vec, dtype.itemsize, rms)
    if wide is not None and _row_norm._nonportable_forward_runs(dtype.name, dtype.name, wide, rms, 0):
        return wide
    return _config.cluster_config(n, vec)


@pytest.fixture
def clusters(monkeypatch):
    _skip_before_sm90()
    monkeypatch.setattr(_row_norm, "USE_CLUSTERS", True)
    monkeypatch.setattr(_row_norm, "USE_CLUSTER_BACKWARD", True)  # off by default (slower), kept correct
    monkeypatch.setattr(_row_norm, "USE_STAGED_CLUSTER_BACKWARD", False)  # its own tests below
    monkeypatch.setattr(_row_norm, "USE_WIDE_BACKWARD", False)  # N = 16384: test_backward_paths
    _clear()
    yield
    _clear()


# bf16 / fp16 rows past 32768 elements and fp32 past 16384 leave the full-row tile; each N
# picks another cluster shape (and 40000 / 20000 leave part of the last block's slice empty)
CASES = [(BFLOAT16, n) for n in (16384, 40000, 65536, 131072, 150000, 262144)] + \
        [(numpy.dtype(numpy.float16), n) for n in (65536, 262144)] + \
        [(numpy.dtype(numpy.float32), n) for n in (9000, 20000, 40000, 65536, 131072, 200000, 262144)]


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
@pytest.mark.parametrize("dtype,n", CASES, ids=[f"{d.name}-{n}" for d, n in CASES])
def test_cluster_path(rng, clusters, op, dtype, n):
    """Forward and backward against the reference; each plan asserted to hold the cluster
    kernel where the row is past the full-row tile and within a cluster tile."""
    rows, vec, rms = 3, 16 // dtype.itemsize, op == "rms_norm"
    cfg = _forward_tile(n, dtype, rms)
    if _config.row_config(n, vec, _config.FWD) is None and cfg is not None:
        plan = _row_norm.forward_plan((rows, n), (n, 1), dtype, dtype, 1, rms, 1e-5, 0, 0, 0)
        assert plan.tiles == 1 and plan.block == cfg.tpb and plan.grid == rows * cfg.cluster, "the cluster forward"
    bcfg = _config.cluster_bwd_config(n, vec)
    if bcfg is not None:
        plan = _row_norm.backward_plan((rows, n), (n, 1), (n, 1), dtype, dtype, dtype, 1, rms, 0, 0, 0)
        assert plan.split is None and plan.block == bcfg.tpb and plan.blocks == plan.groups * bcfg.cluster, \
            "the cluster backward"
    check(op, rng, (rows, n), dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("view", ["row_stride", "offset", "negative_row_stride"])
def test_cluster_path_views(rng, clusters, view):
    # offset: a misaligned pointer takes scalar packs, which the cluster tiles refuse (split path)
    check("layer_norm", rng, (5, 65536), BFLOAT16, view=view)


@pytest.mark.gpu
@pytest.mark.parametrize("weight,bias", [(False, False), (True, False), (False, True)])
def test_cluster_path_affine_variants(rng, clusters, weight, bias):
    check("layer_norm", rng, (4, 65536), numpy.float32, weight=weight, bias=bias)


@pytest.mark.gpu
def test_cluster_path_rows_with_offsets(rng, clusters):
    # the pivot keeps a large common offset's digits, as on the other paths
    check("layer_norm", rng, (3, 131072), numpy.float32, x_offset=1e4)


@pytest.mark.gpu
def test_cluster_path_many_rows(rng, clusters, monkeypatch):
    # more rows than the grid: clusters loop over rows, alternating their exchange slots
    monkeypatch.setattr(_config, "MAX_GRID", 64)
    _clear()
    check("rms_norm", rng, (37, 40000), BFLOAT16)


# v49: the next row's slice staged in shared memory, clusters persistent; 300 rows make every
# cluster walk several rows (its slots refilled each row)
STAGED_FWD_CASES = [(BFLOAT16, n) for n in (40000, 65536, 131072, 262144)] + \
                   [(numpy.dtype(numpy.float32), n) for n in (20000, 131072, 262144)]


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
@pytest.mark.parametrize("dtype,n", STAGED_FWD_CASES, ids=[f"{d.name}-{n}" for d, n in STAGED_FWD_CASES])
def test_cluster_forward_staged_rows(rng, clusters, op, dtype, n):
    rows = 300
    cfg = _forward_tile(n, dtype, op == "rms_norm")
    plan = _row_norm.forward_plan((rows, n), (n, 1), dtype, dtype, 1, op == "rms_norm", 1e-5, 0, 0, 0)
    assert plan.tiles == 1 and plan.block == cfg.tpb, "the cluster forward"
    assert plan.smem == _config.cluster_fwd_smem(cfg, dtype.itemsize, dtype.itemsize, op == "rms_norm",
                                                 _row_norm.smem_limits(0)[0])
    if plan.smem:
        assert plan.grid < rows * cfg.cluster and plan.grid % cfg.cluster == 0, "persistent clusters"
    else:
        assert plan.grid == rows * cfg.cluster, "a cluster a row"
    check(op, rng, (rows, n), dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [BFLOAT16, numpy.dtype(numpy.float16)], ids=["bf16", "fp16"])
def test_cluster_forward_one_pass_falls_back(rng, clusters, dtype):
    """Half-precision LayerNorm cluster rows take their statistics in one pass over x (v97;
    about the row's first element before, v50) unless the row's mean lies far from zero
    (mean^2 > 64 var): an outlier first element (one pass), constant rows and a +50 offset
    (two passes, about the row's first element), a +7 offset (mean^2 / var = 49: one pass at
    the edge of its trust), and an ordinary row, in one batch, against the float64
    reference."""
    n = 65536
    hx = rng.standard_normal((6, n)).astype(numpy.float32)
    hx[0, 0] = 1000.0 if dtype == BFLOAT16 else 600.0  # ~1e3 sigma from the mean
    hx[1] = 3.0  # constant: var 0
    hx[2] += 50.0
    hx[3] += 7.0
    hx[5] = 1001.0  # constant, with fp16's 11 bits its sum over 65536 rounds: two passes about x[0]
    check_layer_norm_rows(rng, hx.astype(dtype))


# v112: float32 LayerNorm cluster rows in one pass within two standard deviations of zero
# (kOnePassTrustF32), in tiles of 512 threads or more (v112b): at 131072 (512-thread blocks, a
# cluster a row) and 262144 (1024-thread blocks, rows staged), rows at +0.5 (one pass, mean^2 /
# var = 0.25), +1.98 (one pass at the edge), +2.5 and +7 (two passes about the row's first
# element), +1e4 (two passes, the pivot keeping the offset's digits), constant (var 0: two
# passes), an outlier first element (one pass: mean 0.01, var 6.5) and an ordinary row; 150
# rows of 131072 make clusters walk rows of both kinds; y, mean and rstd to float32's
# tolerance against float64. (65536's 256-thread tiles keep the two passes: the same rows but
# the outlier, which the two passes about the first element hold to 2.4e-5, not 2e-5.)
@pytest.mark.gpu
@pytest.mark.parametrize("n", [65536, 131072, 262144])
def test_cluster_forward_float32_one_pass_falls_back(rng, clusters, n):
    rows = {65536: 64, 131072: 150, 262144: 8}[n]
    hx = rng.standard_normal((rows, n)).astype(numpy.float32)
    hx[0::8] += 0.5
    hx[1::8] += 1.98
    hx[2::8] += 2.5
    hx[3::8] += 7.0
    hx[4::8] += 1e4
    hx[5::8] = 3.0
    if n > 65536:  # (the two passes about an outlier first element: NOTES "v112 outcome")
        hx[6::8, 0] = 600.0
    f32 = numpy.dtype(numpy.float32)
    plan = _row_norm.forward_plan((rows, n), (n, 1), f32, f32, 1, False, 1e-5, 0, 0, 0)
    cfg = _forward_tile(n, f32, False)
    assert plan.tiles == 1 and plan.block == cfg.tpb, "the cluster forward"
    check_layer_norm_rows(rng, hx)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [BFLOAT16, numpy.dtype(numpy.float16)], ids=["bf16", "fp16"])
@pytest.mark.parametrize("rows,n", [(1, 65536), (7, 65536), (257, 65536), (7, 200000), (40, 200000)])
def test_cluster_forward_pipelined_walk_falls_back_mid_walk(rng, clusters, dtype, rows, n):
    """v90: each half-precision cluster publishes its next row's sums before it collects the
    current row's, so a row that needs the two-pass statistics runs its extra exchange
    between the two; 257 rows of 65536 make every cluster walk several rows with such rows
    among them (every other one at +50, every eleventh constant; every fifth has an outlier
    first element, two passes before v97), and 1 / 7 rows leave most clusters without a row
    or with one; rows of 200000 walk v120's clusters of sixteen with w + b in slots."""
    import cupy

    import cunorm
    from cunorm import reference
    from tolerances import assert_close, tol

    cfg = _forward_tile(n, dtype, False)
    plan = _row_norm.forward_plan((rows, n), (n, 1), dtype, dtype, 1, False, 1e-5, 0, 0, 0)
    assert plan.block == cfg.tpb and _config.cluster_fwd_stage_bytes(cfg, dtype.itemsize, False) == \
        3 * cfg.block_columns * dtype.itemsize, "v90's ring: written, summed, staged"
    assert plan.smem == _config.cluster_fwd_smem(cfg, dtype.itemsize, dtype.itemsize, False,
                                                 _row_norm.smem_limits(0)[0])
    hx = rng.standard_normal((rows, n)).astype(numpy.float32)
    hx[::5, 0] = 1000.0 if dtype == BFLOAT16 else 600.0
    hx[3::11] = 3.0
    hx[1::2] += 50.0
    hx = hx.astype(dtype)
    hw = check_layer_norm_rows(rng, hx)
    ys = cunorm.rms_norm(cupy.asarray(hx), cupy.asarray(hw))
    assert_close("rms y", ys, reference.rms_norm(hx, hw), *tol(dtype))


# v105: RMSNorm's weight staged once a block (float32 rows in 256- and 512-thread blocks, half
# precision in 256-thread blocks with a weight in x's dtype; v107: float32 1024-thread blocks,
# 200000); 300 rows make each persistent cluster read its slots for several rows, 1 and 7
# leave most clusters without a row; 40000, 100000 and 200000 leave part of the last block's
# slots past the row
PARAM_SLOT_CASES = [(numpy.dtype(numpy.float32), n) for n in (20000, 32768, 65536, 100000, 200000)] + \
                   [(BFLOAT16, n) for n in (40000, 65536)] + [(numpy.dtype(numpy.float16), 65536)]


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 7, 300])
@pytest.mark.parametrize("dtype,n", PARAM_SLOT_CASES, ids=[f"{d.name}-{n}" for d, n in PARAM_SLOT_CASES])
def test_cluster_forward_weight_slots(rng, clusters, dtype, n, rows):
    cfg = _forward_tile(n, dtype, True)
    optin = _row_norm.smem_limits(0)[0]
    slots = _config.cluster_fwd_param_bytes(cfg, dtype.itemsize, dtype.itemsize, True, optin)
    assert slots == cfg.block_columns * dtype.itemsize, "the weight's slots, in its own type"
    plan = _row_norm.forward_plan((rows, n), (n, 1), dtype, dtype, 1, True, 1e-5, 0, 0, 0)
    assert plan.smem == _config.cluster_fwd_stage_bytes(cfg, dtype.itemsize, True) + slots
    assert plan.grid % cfg.cluster == 0 and plan.grid <= rows * cfg.cluster, "persistent clusters"
    check("rms_norm", rng, (rows, n), dtype)
    if rows == 7:
        check("rms_norm", rng, (rows, n), dtype, weight=False)  # slots of ones


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,n", [(BFLOAT16, 65536), (numpy.dtype(numpy.float32), 32768)], ids=["bf16", "fp32"])
def test_cluster_forward_without_weight_slots(rng, clusters, dtype, n):
    """The tiles v105 leaves loading their parameters: LayerNorm's (float32 in clusters of
    four since v121), and half-precision RMSNorm's with a float32 weight."""
    cfg = _config.cluster_config(n, 16 // dtype.itemsize)
    plan = _row_norm.forward_plan((300, n), (n, 1), dtype, dtype, 1, False, 1e-5, 0, 0, 0)
    assert plan.smem == _config.cluster_fwd_stage_bytes(cfg, dtype.itemsize, False)
    check("layer_norm", rng, (300, n), dtype)
    if dtype.itemsize == 2:
        plan = _row_norm.forward_plan((300, n), (n, 1), dtype, numpy.dtype(numpy.float32), 1, True, 1e-5, 0, 0, 0)
        assert plan.smem == _config.cluster_fwd_stage_bytes(cfg, dtype.itemsize, True)
        check("rms_norm", rng, (300, n), dtype, param_dtype=numpy.float32)


# v121: LayerNorm's portable clusters of eight keep w + b in slots, float32 (256-thread blocks
# holding no staged row at 40000 and 65536, 512-thread blocks after their staged row at 100000
# and 131072) and bf16 rows with float32 w + b in 512-thread blocks; 40000 and 100000 leave
# part of the last block's slots past the row, 300 rows make each persistent cluster walk
# several
EIGHT_SLOT_CASES = [(F32, F32, n) for n in (40000, 65536, 100000, 131072)] + [(BFLOAT16, F32, 100000)]


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 7, 300])
@pytest.mark.parametrize("dtype,param_dtype,n", EIGHT_SLOT_CASES,
                         ids=[f"{d.name}-{p.name}-{n}" for d, p, n in EIGHT_SLOT_CASES])
def test_cluster_forward_layer_norm_eight_blocks_with_slots(rng, clusters, dtype, param_dtype, n, rows):
    cfg = _config.cluster_config(n, 16 // dtype.itemsize)
    assert cfg.cluster == 8
    plan = _row_norm.forward_plan((rows, n), (n, 1), dtype, param_dtype, 1, False, 1e-5, 0, 0, 0)
    assert plan.block == cfg.tpb and plan.grid % 8 == 0 and plan.grid <= rows * 8, "persistent clusters"
    assert plan.smem == _config.cluster_fwd_stage_bytes(cfg, dtype.itemsize, False) + 2 * cfg.block_columns * 4
    check("layer_norm", rng, (rows, n), dtype, param_dtype=param_dtype)
    if rows == 7 and param_dtype == dtype:
        check("layer_norm", rng, (rows, n), dtype, weight=False)  # slots of ones
        check("layer_norm", rng, (rows, n), dtype, bias=False)  # slots of zeros


# v119, v120: rows of 131073-262144 in non-portable clusters of sixteen 512-thread blocks with
# their parameters in slots where the driver runs them (float32 LayerNorm: w + b after its
# staged row; half precision: w (+ b) after v90's three rows, in x's type or as floats;
# float32 RMSNorm: its weight after its staged row); half precision in the fewest blocks that
# hold the row (v120: 9 at 131080, whose last block holds 8 columns, 13 at 200000, part of the
# last block's slots past the row), float32 in sixteen; 300 rows make each persistent cluster
# walk several
SIXTEEN_CASES = [(F32, "layer_norm", F32), (F32, "rms_norm", F32), (BFLOAT16, "layer_norm", BFLOAT16),
                 (BFLOAT16, "rms_norm", BFLOAT16), (BFLOAT16, "layer_norm", F32), (F16, "layer_norm", F16),
                 (F16, "rms_norm", F32)]
SIXTEEN_SHAPES = [(7, 131080), (1, 200000), (300, 200000), (7, 262144)]


@pytest.mark.gpu
@pytest.mark.parametrize("rows,n", SIXTEEN_SHAPES, ids=[f"{m}x{n}" for m, n in SIXTEEN_SHAPES])
@pytest.mark.parametrize("dtype,op,param_dtype", SIXTEEN_CASES,
                         ids=[f"{d.name}-{op}-{p.name}" for d, op, p in SIXTEEN_CASES])
def test_cluster_forward_sixteen_blocks_with_slots(rng, clusters, dtype, op, param_dtype, rows, n):
    rms = op == "rms_norm"
    tile = _config.nonportable_cluster_fwd_config(n, 16 // dtype.itemsize, dtype.itemsize, rms)
    main = _row_norm.function_ptr(_row_norm.CLUSTER_FILE, _row_norm._cluster_name(
        "norm_fwd_cluster", dtype.name, param_dtype.name, tile, rms), 0)
    if not _row_norm._nonportable_forward_runs(dtype.name, param_dtype.name, tile, rms, 0):
        pytest.skip("the driver runs no cluster of sixteen of these blocks here")
    plan = _row_norm.forward_plan((rows, n), (n, 1), dtype, param_dtype, 1, rms, 1e-5, 0, 0, 0)
    assert plan.kernels == (main,) and plan.block == 512 and plan.grid % tile.cluster == 0
    assert tile.cluster == (-(-n // 16384) if dtype.itemsize == 2 else 16)
    staged = {4: 16384 * 4, 2: 3 * 16384 * 2}[dtype.itemsize]
    slots = (1 if rms else 2) * 16384 * param_dtype.itemsize
    assert plan.smem == staged + slots, "the staged rows, then the parameters' slots"
    check(op, rng, (rows, n), dtype, param_dtype=param_dtype)
    if rows == 7 and param_dtype == dtype:
        check(op, rng, (rows, n), dtype, weight=False)  # slots of ones
        if not rms:
            check(op, rng, (rows, n), dtype, bias=False)  # slots of zeros
        check(op, rng, (rows, n), dtype, view="row_stride")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [F32, BFLOAT16], ids=["fp32", "bf16"])
def test_cluster_forward_without_nonportable_clusters(rng, clusters, monkeypatch, dtype):
    """Where the driver refuses clusters past eight blocks, the portable 1024 x 8 tile (v119's
    and v120's fallback) serves the same rows."""
    monkeypatch.setattr(_row_norm, "allow_nonportable_clusters", lambda ptr: False)
    plan = _row_norm.forward_plan((40, 200000), (200000, 1), dtype, dtype, 1, False, 1e-5, 0, 0, 0)
    assert plan.block == 1024 and plan.grid % 8 == 0
    check("layer_norm", rng, (40, 200000), dtype)


# v106: half-precision rows of 16385 and up with float32 parameters take the cluster forward
# (not the shared-memory one), LayerNorm's 256-thread tiles with w + b in float slots; 16392
# is the first length past the change-over in 16-byte packs (16385 takes scalar packs, which
# the clusters refuse), 20000 leaves part of the last block's slots past the row
WIDE_PARAM_CASES = [(BFLOAT16, n) for n in (16392, 20000, 32768)] + [(numpy.dtype(numpy.float16), 32768)]


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
@pytest.mark.parametrize("rows", [1, 300])
@pytest.mark.parametrize("dtype,n", WIDE_PARAM_CASES, ids=[f"{d.name}-{n}" for d, n in WIDE_PARAM_CASES])
def test_cluster_forward_half_rows_float32_parameters(rng, clusters, op, dtype, n, rows):
    f32, rms = numpy.dtype(numpy.float32), op == "rms_norm"
    cfg = _config.cluster_config(n, 8)
    plan = _row_norm.forward_plan((rows, n), (n, 1), dtype, f32, 1, rms, 1e-5, 0, 0, 0)
    assert plan.block == cfg.tpb == 256 and plan.grid % cfg.cluster == 0, "the cluster forward"
    slots = 0 if rms else 2 * cfg.block_columns * 4
    assert plan.smem == _config.cluster_fwd_stage_bytes(cfg, 2, rms) + slots
    check(op, rng, (rows, n), dtype, param_dtype=f32)
    if rows == 1 and not rms:
        # one parameter: slots of ones (no weight) or of zeros (no bias). Forward only: without
        # a weight the backward gives dbias in x's dtype (its documented rule), not the bias's
        import cupy

        import cunorm
        from cunorm import reference
        from tolerances import assert_close, tol

        hx = rng.standard_normal((rows, n)).astype(dtype)
        hp = (1 + 0.1 * rng.standard_normal(n)).astype(f32)
        for hw, hb in ((None, hp), (hp, None)):
            y = cunorm.layer_norm(cupy.asarray(hx), *(None if p is None else cupy.asarray(p) for p in (hw, hb)))
            assert_close("y", y, reference.layer_norm(hx, hw, hb), *tol(dtype))


@pytest.mark.gpu
def test_cluster_forward_staged_views(rng, clusters):
    # row strides and a reversed row order through the staged copies
    check("layer_norm", rng, (200, 65536), BFLOAT16, view="row_stride")
    check("rms_norm", rng, (200, 40000), numpy.float32, view="negative_row_stride")


@pytest.fixture
def staged_clusters(monkeypatch):
    _skip_before_sm90()
    monkeypatch.setattr(_row_norm, "USE_STAGED_CLUSTER_BACKWARD", True)
    monkeypatch.setattr(_row_norm, "USE_WIDE_BACKWARD", False)  # it serves N = 8193-16384 first
    _row_norm.backward_plan.cache_clear()
    yield
    _row_norm.backward_plan.cache_clear()


# half-precision rows past the 8192-column full-row backward tile, each cluster size (2, 4, 8
# tiles), rows that leave the last block's slice partly (9000, 20000, 40000) or wholly (8200
# in a cluster of 2 uses 8 columns of its second block) empty
STAGED_CASES = [(BFLOAT16, n) for n in (8200, 16384, 20000, 40000, 65536)] + \
               [(numpy.dtype(numpy.float16), n) for n in (9000, 65536)]


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
@pytest.mark.parametrize("dtype,n", STAGED_CASES, ids=[f"{d.name}-{n}" for d, n in STAGED_CASES])
# 1 and 3: most clusters walk no row; 70: some one row, some two; 300: every persistent
# cluster walks several rows
@pytest.mark.parametrize("rows", [1, 3, 70, 300])
def test_staged_cluster_backward(rng, staged_clusters, op, dtype, n, rows):
    cfg = _config.cluster_staged_bwd_config(n, 8, 2)
    plan = _row_norm.backward_plan((rows, n), (n, 1), (n, 1), dtype, dtype, dtype, 1, op == "rms_norm", 0, 0, 0)
    assert plan.split is None and plan.block == 1024 and plan.blocks == plan.groups * cfg.cluster, \
        "the staged cluster backward"
    assert plan.smem == _config.bwd_stage_depth(1024, op == "rms_norm") * 1024 * 2 * 16, "x and dy packs a buffer"
    check(op, rng, (rows, n), dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("view", ["row_stride", "negative_row_stride"])
def test_staged_cluster_backward_views(rng, staged_clusters, view):
    check("layer_norm", rng, (300, 20000), BFLOAT16, view=view)


@pytest.fixture
def wide_clusters(monkeypatch):
    _skip_before_sm90()
    assert _row_norm.USE_WIDE_CLUSTER_BACKWARD and _row_norm.USE_WIDE_BACKWARD, "on by default"
    _row_norm.backward_plan.cache_clear()
    yield
    _row_norm.backward_plan.cache_clear()


# Rows past one wide block (v68): half precision and float32 of 16385-65536 elements in
# clusters of 2-4 blocks of 16384 columns (half-precision RMSNorm on one block to 32768,
# v66, and to 20479 since v102), float32 in 2-8 blocks of 8192 (v99: LayerNorm from 12288, RMSNorm from 16384). 20000 /
# 40000 / 50000 leave most of the last block's columns empty; 49152 fills three; float32
# 12292's second block holds half a tile and one pack, 16392's third block two packs.
WIDE_CLUSTER_CASES = [("layer_norm", BFLOAT16, n) for n in (16392, 20000, 32768, 40000, 49152, 50000, 65536)] + \
                     [("layer_norm", numpy.dtype(numpy.float16), 40000)] + \
                     [(op, numpy.dtype(numpy.float32), n) for op in ("layer_norm", "rms_norm")
                      for n in (20000, 65536)] + \
                     [("layer_norm", numpy.dtype(numpy.float32), n) for n in (12288, 12292, 16392, 40000, 57344)] + \
                     [("rms_norm", numpy.dtype(numpy.float32), 16384)] + \
                     [("rms_norm", BFLOAT16, n) for n in (20480, 32768, 40000, 65536)] + \
                     [("rms_norm", numpy.dtype(numpy.float16), 24000)]


@pytest.mark.gpu
@pytest.mark.parametrize("op,dtype,n", WIDE_CLUSTER_CASES, ids=[f"{o}-{d.name}-{n}" for o, d, n in WIDE_CLUSTER_CASES])
@pytest.mark.parametrize("rows", [1, 3, 70, 300])  # as the staged cluster's cases
def test_wide_cluster_backward(rng, wide_clusters, op, dtype, n, rows):
    _assert_wide_cluster_plan(op, dtype, n, rows)
    check(op, rng, (rows, n), dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
@pytest.mark.parametrize("n", [50000, 65536])
def test_wide_cluster_backward_of_four_blocks_takes_the_capped_grid(rng, wide_clusters, op, n):
    """v122: bf16 rows in wide clusters of four take PERSISTENT_BWD_SM_SHARE's share of the
    SMs, not every cluster the GPU runs at once; dx, dW, dB as the reference at 300 rows
    (each cluster walking several)."""
    cfg = _assert_wide_cluster_plan(op, BFLOAT16, n, 300)
    assert cfg.cluster == 4
    plan = _row_norm.backward_plan((300, n), (n, 1), (n, 1), BFLOAT16, BFLOAT16, BFLOAT16, 1, op == "rms_norm",
                                   0, 0, 0)
    counted = _row_norm.max_active_clusters(plan.main, plan.block, plan.smem, 4)
    assert plan.groups == _config.persistent_bwd_clusters(counted, 2, 4, _row_norm.sm_count(0)) <= counted
    check(op, rng, (300, n), BFLOAT16)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [16384, 24576, 65536])
@pytest.mark.parametrize("rows", [3, 300])
def test_wide_backward_half_rows_float32_weight(rng, wide_clusters, n, rows):
    """v104: half-precision RMSNorm rows with a float32 weight (torch autocast's parameters)
    keep two rows in the wide ring and the weight's float slots beside them, in the single
    block (16384) and the clusters (24576: v109's 512-thread blocks, two an SM; 65536: v93's
    1024-thread blocks)."""
    f32 = numpy.dtype(numpy.float32)
    plan = _row_norm.backward_plan((rows, n), (n, 1), (n, 1), BFLOAT16, f32, BFLOAT16, 1, True, 0, 0, 0)
    v109 = _config.WIDE_BWD_TILE.tile < n <= _config.WIDE_CLUSTER_BWD_HALF_FLOAT_PARAMS_TO
    tile = _config.WIDE_CLUSTER_BWD_HALF_FLOAT_PARAMS if v109 else _config.WIDE_BWD_TILE
    cluster = n > _config.WIDE_BWD_TILE.tile
    optin = _row_norm.smem_limits(0)[0]
    slots = _config.wide_bwd_weight_bytes(tile, 2, 2, optin, True, cluster, 4)
    assert plan.block == tile.tpr and slots == tile.tile * 4 and \
        plan.smem == 2 * _config.wide_bwd_row_bytes(tile, 2) + slots, "two rows and the float32 weight's slots"
    check("rms_norm", rng, (rows, n), BFLOAT16, param_dtype=f32)


def _assert_wide_cluster_plan(op, dtype, n, rows):
    """The backward plan of rows x n is the wide cluster's; returns its cluster config."""
    rms, itemsize = op == "rms_norm", dtype.itemsize
    t = dtype.name
    cfg, tile, depth = _row_norm._wide_cluster_plan(t, t, itemsize, n, 16 // itemsize, rms, 0)
    assert cfg in (_config.wide_cluster_bwd_config(n, 16 // itemsize, itemsize, rms, nonportable)
                   for nonportable in (False, True))
    plan = _row_norm.backward_plan((rows, n), (n, 1), (n, 1), dtype, dtype, dtype, 1, rms, 0, 0, 0)
    assert plan.split is None and plan.grid_rows is None and plan.block == cfg.block and \
        plan.blocks == plan.groups * cfg.cluster, "the wide cluster backward"
    optin = _row_norm.smem_limits(0)[0]
    assert depth == _config.wide_bwd_depth(tile, rms, tile.tile, itemsize, optin, True, itemsize)
    assert plan.smem == _config.wide_bwd_smem(tile, itemsize, depth, optin, rms, True, itemsize), \
        "each block's ring, and its weight where it fits"
    return cfg


# v93: rows of 65537-131072 in clusters of 5-8 wide blocks (65544: the fifth block holds one
# pack of the row; 100000: seven blocks, the last part empty); 150 rows walk every cluster
# (16 of 8 blocks run at once on the H200) through several rows
WIDE_CLUSTER_8_CASES = [("layer_norm", BFLOAT16, n) for n in (65544, 100000, 131072)] + \
                       [("rms_norm", BFLOAT16, 131072), ("rms_norm", numpy.dtype(numpy.float16), 90000)] + \
                       [("layer_norm", numpy.dtype(numpy.float32), 81920), ("rms_norm", numpy.dtype(numpy.float32), 131072)]


@pytest.mark.gpu
@pytest.mark.parametrize("op,dtype,n", WIDE_CLUSTER_8_CASES,
                         ids=[f"{o}-{d.name}-{n}" for o, d, n in WIDE_CLUSTER_8_CASES])
@pytest.mark.parametrize("rows", [3, 150])
def test_wide_cluster_backward_past_four_blocks(rng, wide_clusters, op, dtype, n, rows):
    assert _assert_wide_cluster_plan(op, dtype, n, rows).cluster > 4
    check(op, rng, (rows, n), dtype)


# v100: float32 rows of 65537-131072 in non-portable clusters of 9-16 narrow blocks where the
# driver runs them (73728: nine full blocks; 100000: thirteen, the last part empty)
NONPORTABLE_CASES = [("layer_norm", numpy.dtype(numpy.float32), n) for n in (73728, 100000, 131072)] + \
                    [("rms_norm", numpy.dtype(numpy.float32), 131072)]


@pytest.mark.gpu
@pytest.mark.parametrize("op,dtype,n", NONPORTABLE_CASES, ids=[f"{o}-{d.name}-{n}" for o, d, n in NONPORTABLE_CASES])
@pytest.mark.parametrize("rows", [3, 150])
def test_wide_cluster_backward_past_eight_blocks(rng, wide_clusters, op, dtype, n, rows):
    cfg = _assert_wide_cluster_plan(op, dtype, n, rows)
    if cfg.cluster <= 8:
        pytest.skip("this GPU or driver runs no cluster of more than eight blocks of this kernel")
    assert cfg.block_columns == 8192
    check(op, rng, (rows, n), dtype)


# v115: half-precision rows of 131073-262144 in non-portable clusters of 9-16 wide blocks of
# 16384 columns where the driver runs them (131080: the ninth block holds one pack; 200000:
# thirteen blocks, the last part empty); 40 rows walk each cluster through several (an H100
# runs eight clusters of sixteen). v117: float32 rows of 131073-262144 in the same clusters of
# v93's 16384-column float32 blocks (131076: the ninth block holds one pack).
WIDE_NONPORTABLE_CASES = [("layer_norm", BFLOAT16, n) for n in (131080, 200000, 262144)] + \
                         [("rms_norm", BFLOAT16, 262144), ("rms_norm", numpy.dtype(numpy.float16), 150000)] + \
                         [("layer_norm", numpy.dtype(numpy.float32), n) for n in (131076, 200000)] + \
                         [("rms_norm", numpy.dtype(numpy.float32), 262144)]


@pytest.mark.gpu
@pytest.mark.parametrize("op,dtype,n", WIDE_NONPORTABLE_CASES,
                         ids=[f"{o}-{d.name}-{n}" for o, d, n in WIDE_NONPORTABLE_CASES])
@pytest.mark.parametrize("rows", [3, 40])
def test_wide_cluster_backward_wide_blocks_past_eight(rng, wide_clusters, op, dtype, n, rows):
    plan = _row_norm.backward_plan((rows, n), (n, 1), (n, 1), dtype, dtype, dtype, 1, op == "rms_norm", 0, 0, 0)
    if plan.grid_rows is not None:
        pytest.skip("this GPU or driver runs no cluster of more than eight blocks of this kernel (grid rows)")
    cfg = _assert_wide_cluster_plan(op, dtype, n, rows)
    assert cfg.cluster > 8 and cfg.block_columns == 16384
    check(op, rng, (rows, n), dtype)


@pytest.mark.gpu
def test_half_rows_with_float32_parameters_past_eight_wide_blocks(rng, wide_clusters):
    """v115 with torch.autocast's parameters (the float32 weight's slots where they fit)."""
    check("layer_norm", rng, (20, 200000), BFLOAT16, param_dtype=numpy.float32)
    check("rms_norm", rng, (20, 262144), BFLOAT16, param_dtype=numpy.float32)


@pytest.mark.gpu
def test_wide_cluster_backward_without_nonportable_clusters(rng, wide_clusters, monkeypatch):
    # where the driver refuses clusters past eight blocks, v93's blocks of 16384 columns serve
    # float32 rows, and half-precision rows past eight of them take the grid rows (v115)
    monkeypatch.setattr(_row_norm, "allow_nonportable_clusters", lambda ptr: False)
    cfg = _assert_wide_cluster_plan("layer_norm", numpy.dtype(numpy.float32), 100000, 150)
    assert cfg == _config.ClusterConfig(4, 4, 1024, 7)
    check("layer_norm", rng, (150, 100000), numpy.float32)
    plan = _row_norm.backward_plan((40, 200000), (200000, 1), (200000, 1), BFLOAT16, BFLOAT16, BFLOAT16, 1, False,
                                   0, 0, 0)
    assert plan.grid_rows is not None
    check("layer_norm", rng, (40, 200000), BFLOAT16)


@pytest.mark.gpu
@pytest.mark.parametrize("view", ["row_stride", "negative_row_stride"])
@pytest.mark.parametrize("depth", [2, 3])
def test_wide_cluster_backward_views_and_depths(rng, wide_clusters, monkeypatch, view, depth):
    monkeypatch.setattr(_row_norm, "WIDE_DEPTH", depth)
    check("layer_norm", rng, (300, 40000), BFLOAT16, view=view)
    check("rms_norm", rng, (140, 40000), numpy.float32, view=view)


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
@pytest.mark.parametrize("dtype", [BFLOAT16, numpy.dtype(numpy.float16)], ids=["bf16", "fp16"])
@pytest.mark.parametrize("n", [16384, 40000, 65536])
def test_wide_backward_rows_far_from_zero(rng, wide_clusters, op, dtype, n):
    """Rows at +50 and +1000, constant rows, and a row of 1000s with one element off, among
    plain rows, through the wide backward (the single block at 16384, clusters of three and
    four blocks past it): LayerNorm with a weight in x's type (v94's window), RMSNorm with a
    float32 weight (v104's window, whose dx v108 takes as rstd * w * dy + x * a)."""
    import cupy

    import cunorm
    from cunorm import reference
    from tolerances import assert_close, reduction_tol, tol

    rows, rms, f32 = 40, op == "rms_norm", numpy.dtype(numpy.float32)
    pdt = f32 if rms else dtype
    plan = _row_norm.backward_plan((rows, n), (n, 1), (n, 1), dtype, pdt, dtype, 1, rms, 0, 0, 0)
    block = 1024 if n <= 16384 else _config.wide_cluster_bwd_config(n, 8, 2, rms, False, pdt.itemsize).block
    assert plan.split is None and plan.grid_rows is None and plan.block == block, "the wide backward"
    assert (plan.blocks > plan.groups) == (n > 16384), "clusters past the single block"
    hx = rng.standard_normal((rows, n)).astype(numpy.float32)
    hx[1::4] += 50.0
    hx[2::4] += 1000.0
    hx[3::11] = 3.0
    hx[7] = 1000.0
    hx[7, 5] = 1008.0
    hx = hx.astype(dtype)
    hdy = rng.standard_normal((rows, n)).astype(dtype)
    x, dy = cupy.asarray(hx), cupy.asarray(hdy)
    if rms:
        hw = (1 + 0.1 * rng.standard_normal(n)).astype(f32)
        w = cupy.asarray(hw)
        y, rstd = cunorm.rms_norm(x, w, return_stats=True)
        ry, rrstd = reference.rms_norm(hx, hw, return_stats=True)
        assert_close("y", y, ry, *tol(dtype))
        dx, dw = cunorm.rms_norm_backward(dy, x, w, rstd)
        rdx, rdw = reference.rms_norm_backward(hdy, hx, hw, rstd.get())
        db = rdb = None
    else:
        hw = check_layer_norm_rows(rng, hx)
        hb = (0.1 * rng.standard_normal(n)).astype(dtype)
        w = cupy.asarray(hw)
        _, mean, rstd = cunorm.layer_norm(x, w, cupy.asarray(hb), return_stats=True)
        dx, dw, db = cunorm.layer_norm_backward(dy, x, w, mean, rstd, has_bias=True)
        rdx, rdw, rdb = reference.layer_norm_backward(hdy, hx, hw, mean.get(), rstd.get(), has_bias=True)
    rtol, atol = tol(dtype)
    assert_close("dx", dx, rdx, rtol, atol * max(1.0, float(rstd.max())))
    # dW in the weight's dtype, its sum in float32 (norm_cases.check's rule)
    assert_close("dweight", dw, rdw, *reduction_tol(dtype if pdt == dtype else f32, rows))
    if db is not None:
        assert_close("dbias", db, rdb, *reduction_tol(dtype, rows))


@pytest.mark.gpu
def test_wide_cluster_backward_without_parameters(rng, wide_clusters):
    check("layer_norm", rng, (150, 30000), BFLOAT16, weight=False, bias=False)
    check("rms_norm", rng, (150, 60000), BFLOAT16, weight=False)


@pytest.mark.gpu
def test_half_rms_past_the_wide_clusters_takes_the_grid_rows(rng, wide_clusters):
    # past sixteen wide blocks (262144; eight, 131072, before v115); v68's blocks of 32768
    # columns had lost to the split path at 131072 (NOTES v68)
    plan = _row_norm.backward_plan((40, 262152), (262152, 1), (262152, 1), BFLOAT16, BFLOAT16, BFLOAT16, 1, True,
                                   0, 0, 0)
    assert plan.grid_rows is not None
    check("rms_norm", rng, (40, 262152), BFLOAT16)


def test_wide_cluster_configs():
    cfg = _config.wide_cluster_bwd_config
    assert cfg(16384, 8, 2) is None, "one block holds it"
    assert cfg(16392, 8, 2) == _config.ClusterConfig(8, 2, 1024, 2)
    assert [cfg(n, 8, 2).cluster for n in (32768, 32776, 49152, 49160, 65536)] == [2, 3, 3, 4, 4]
    assert [cfg(n, 8, 2).cluster for n in (65544, 81920, 81928, 131072)] == [5, 5, 6, 8]
    # v109: half-precision RMSNorm rows with float32 parameters to 32768 in blocks of 512
    # threads and 8192 columns, two an SM; longer rows, LayerNorm and half-precision weights
    # keep v93's blocks
    half, v93 = _config.TileConfig(8, 2, 512), _config.WIDE_BWD_TILE
    assert _config.WIDE_CLUSTER_BWD_HALF_FLOAT_PARAMS == half
    assert _config.WIDE_CLUSTER_BWD_HALF_FLOAT_PARAMS_TO == 32768
    assert [cfg(n, 8, 2, True, False, 4) for n in (20479, 20480)] == [None, _config.ClusterConfig(8, 2, 512, 3)]
    assert [cfg(n, 8, 2, True, nonportable, 4).cluster for n in (24576, 32768)
            for nonportable in (False, True)] == [3, 3, 4, 4]
    assert [cfg(n, 8, 2, True, True, 4) for n in (32776, 131072)] == \
        [_config.ClusterConfig(8, 2, 1024, 3), _config.ClusterConfig(8, 2, 1024, 8)], "v93's blocks past 32768"
    assert cfg(32768, 8, 2, False, True, 4) == _config.ClusterConfig(8, 2, 1024, 2), "LayerNorm: v93's blocks"
    assert cfg(24576, 8, 2, True, False, 2) == cfg(24576, 8, 2, True), "a half-precision weight: v93's blocks"
    assert _config.wide_cluster_bwd_tiles(2, 4, True) == (half, v93) and _config.wide_cluster_bwd_tiles(2, 4) == (v93,)
    assert cfg(131080, 8, 2) is None, "past eight blocks: the grid rows"
    # v115: half-precision rows past eight wide blocks in non-portable clusters of them
    assert cfg(131080, 8, 2, False, True) == _config.ClusterConfig(8, 2, 1024, 9)
    assert cfg(262144, 8, 2, True, True) == cfg(262144, 8, 2, False, True, 4) == _config.ClusterConfig(8, 2, 1024, 16)
    assert cfg(262152, 8, 2, False, True) is None, "past sixteen: the grid rows"
    for n in range(131073, 262145, 1999):
        c = cfg(n - n % 8, 8, 2, False, True)
        assert c.block_columns == 16384 and (c.cluster - 1) * 16384 < n - n % 8 <= c.capacity
    assert cfg(131072, 4, 4) == _config.ClusterConfig(4, 4, 1024, 8)
    assert cfg(65537, 4, 4) == _config.ClusterConfig(4, 4, 1024, 5), "past the narrow float32 blocks"
    # v100: non-portable clusters of narrow float32 blocks, where the host finds they run
    assert cfg(65537, 4, 4, False, True) == _config.ClusterConfig(4, 2, 1024, 9)
    assert cfg(131072, 4, 4, True, True) == _config.ClusterConfig(4, 2, 1024, 16)
    assert cfg(65537, 8, 2, False, True).block_columns == 16384
    # v117: float32 rows past them in non-portable clusters of v93's 16384-column blocks
    assert cfg(131073, 4, 4, False, True) == cfg(131073, 4, 4, True, True) == _config.ClusterConfig(4, 4, 1024, 9)
    assert cfg(262144, 4, 4, False, True).cluster == 16 and cfg(262148, 4, 4, False, True) is None
    assert cfg(131073, 4, 4) is None, "portable sizes only: the grid rows"
    # v99: float32 rows to 65536 in blocks of 8192 columns, from 12288 (LayerNorm) / 16384
    # (RMSNorm) on; shorter rows take the single wide block
    assert cfg(12287, 4, 4) is None and cfg(16383, 4, 4, True) is None, "the single wide block"
    assert cfg(12288, 4, 4) == cfg(16384, 4, 4, True) == _config.ClusterConfig(4, 2, 1024, 2)
    assert [cfg(n, 4, 4).cluster for n in (16385, 40000, 65536)] == [3, 5, 8]
    assert cfg(16384, 8, 2) is None and cfg(20479, 8, 2, True) is None, "half precision's single wide block"
    # v102: half-precision RMSNorm from 20480 (v66's single block of 32768 before)
    assert [cfg(n, 8, 2, True).cluster for n in (20480, 32768, 32776)] == [2, 2, 3]
    assert cfg(40000, 4, 4) == _config.ClusterConfig(4, 2, 1024, 5)
    assert cfg(40000, 4, 2) is None, "narrower packs"
    assert cfg(40000, 2, 8) is None, "float64"
    for n in range(16385, 131073, 397):  # every block holds part of the row (the kernel relies on it)
        for vec, itemsize in ((8, 2), (4, 4)):
            c = cfg(n, vec, itemsize)
            assert (c.cluster - 1) * c.block_columns < n <= c.capacity
    names = _row_norm.cluster_instantiations()
    for itemsize, t in ((2, "bfloat16"), (4, "float32")):
        for rms in (False, True):
            for c in _config.wide_cluster_bwd_configs(itemsize):
                assert c.cluster <= 8 or c.block_columns in {4: (8192, 16384), 2: (16384,)}[itemsize], \
                    "non-portable sizes: v100's narrow float32 blocks, v115's / v117's wide ones"
                for depth in _config.WIDE_BWD_DEPTHS:
                    assert _row_norm._wide_cluster_name(t, t, rms, depth, c) in names


def test_staged_cluster_configs():
    assert _config.cluster_staged_bwd_config(8193, 8, 2) == _config.ClusterConfig(8, 1, 1024, 2)
    assert _config.cluster_staged_bwd_config(65536, 8, 2).capacity == 65536
    assert _config.cluster_staged_bwd_config(65537, 8, 2) is None, "past 8 tiles: the split path"
    assert _config.cluster_staged_bwd_config(16384, 4, 4) is None, "float32 rows are not staged"
    assert _config.bwd_row_config(8192, 8, 2, False).tpr == _config.CLUSTER_STAGED_BWD_TILE.tpr
    for cfg in _config.all_cluster_staged_bwd_configs(8, 2):
        assert cfg.cluster <= 8, "portable cluster sizes only"
        assert _row_norm._staged_cluster_name("bfloat16", "float32", cfg, True) in _row_norm.cluster_instantiations()


def test_cluster_fwd_stage_bytes(monkeypatch):
    # a block's slice of each staged row (threads x packs x 16 bytes), by the v49 policy;
    # half precision (v90) also the row being written and the row being summed
    half, f32_256, f32_512 = _config.ClusterConfig(8, 4, 256, 8), _config.ClusterConfig(4, 8, 256, 8), \
        _config.ClusterConfig(4, 8, 512, 8)
    assert _config.cluster_fwd_stage_bytes(half, 2, rms=True) == 3 * 16384
    assert _config.cluster_fwd_stage_bytes(half, 2, rms=False) == 3 * 16384
    assert _config.cluster_fwd_stage_bytes(f32_512, 4, rms=False) == 65536
    assert _config.cluster_fwd_stage_bytes(f32_512, 4, rms=True) == 0, "float32 RMSNorm: v48's kernel"
    assert _config.cluster_fwd_stage_bytes(f32_256, 4, rms=False) == 0
    monkeypatch.setattr(_config, "CLUSTER_FWD_PIPE", False)
    assert _config.cluster_fwd_stage_bytes(half, 2, rms=True) == 16384, "v50's loop: the staged row alone"


def test_cluster_fwd_param_bytes(monkeypatch):
    # v105: RMSNorm's weight slots, a block's slice in the weight's own type, on the tiles the
    # sweep chose (sm_90's opt-in)
    optin = 232448
    f32 = {tpb: _config.ClusterConfig(4, 8, tpb, 8) for tpb in (256, 512, 1024)}
    half = {tpb: _config.ClusterConfig(8, 4, tpb, 8) for tpb in (256, 512)}
    slots = _config.cluster_fwd_param_bytes
    assert slots(f32[256], 4, 4, True, optin) == 8192 * 4
    assert slots(f32[512], 4, 4, True, optin) == 16384 * 4
    assert slots(f32[1024], 4, 4, True, optin) == 32768 * 4, "v107: rows past 131072 stage no rows"
    assert slots(half[256], 2, 2, True, optin) == 8192 * 2
    assert slots(half[256], 2, 4, True, optin) == 0, "a float32 weight: half the blocks an SM"
    assert slots(half[256], 2, 4, False, optin) == 2 * 8192 * 4, "v106: LayerNorm's float32 w + b"
    assert slots(half[512], 2, 4, False, optin) == 2 * 16384 * 4, "v121: LayerNorm's float32 w + b"
    assert slots(half[512], 2, 2, True, optin) == 0, "512-thread blocks: one an SM"
    assert all(slots(c, 2, 2, False, optin) == 0 for c in half.values())
    assert [slots(f32[t], 4, 4, False, optin) for t in (256, 512, 1024)] == [2 * 8192 * 4, 2 * 16384 * 4, 0], \
        "v121: float32 LayerNorm's clusters of eight where w + b fit"
    assert _config.fwd_cluster_for_wide_params(2, 4, 16385) and not _config.fwd_cluster_for_wide_params(2, 4, 16384)
    assert not _config.fwd_cluster_for_wide_params(2, 2, 32768) and not _config.fwd_cluster_for_wide_params(4, 4, 32768)
    assert _config.cluster_fwd_smem(half[256], 2, 2, True, optin) == 3 * 16384 + 16384
    monkeypatch.setattr(_config, "CLUSTER_FWD_PARAM_SLOTS_SERVE_ALL", True)
    assert slots(half[256], 2, 2, False, optin) == 2 * 16384, "the sweep's build: weight and bias"
    assert slots(half[512], 2, 4, False, optin) == 2 * 65536, "96 KiB of rows, 128 KiB of slots: 226 KiB fit"
    assert slots(f32[1024], 4, 4, False, optin) == 0, "128 KiB of rows and 256 KiB of slots do not"
    monkeypatch.setattr(_config, "CLUSTER_FWD_PARAM_SLOTS", False)
    assert slots(f32[256], 4, 4, True, optin) == 0


def test_cluster_fwd_stage_forced(monkeypatch):
    monkeypatch.setattr(_config, "CLUSTER_FWD_STAGE_ROWS", 2)
    assert _config.cluster_fwd_stage_bytes(_config.ClusterConfig(4, 8, 256, 8), 4, rms=True) == 65536


def test_cluster_configs():
    assert _config.cluster_config(65536, 8) == _config.ClusterConfig(8, 4, 256, 8)
    assert _config.cluster_config(65537, 8) == _config.ClusterConfig(8, 4, 512, 8)
    assert _config.cluster_config(16384, 4) == _config.ClusterConfig(4, 8, 256, 2)
    assert _config.cluster_config(131072, 8).capacity == 131072
    assert _config.cluster_config(131073, 8) == _config.ClusterConfig(8, 4, 1024, 8)
    assert _config.cluster_config(262144, 4) == _config.ClusterConfig(4, 8, 1024, 8)
    assert _config.cluster_config(262145, 8) is None, "past the largest cluster tile: the split path"
    assert _config.cluster_config(65536, 1) is None, "scalar packs: the split path"
    assert _config.cluster_bwd_config(8193, 8) == _config.ClusterConfig(8, 2, 256, 4)
    assert _config.cluster_bwd_config(65536, 4) == _config.ClusterConfig(4, 4, 512, 8)
    assert _config.cluster_bwd_config(65537, 4) is None, "past the largest backward cluster tile"
    for vec in (4, 8):
        assert _config.bwd_row_config(8192, vec, 16 // vec, False) is not None, "clusters start past the row tile"
        for kernel, configs in (("norm_fwd_cluster", _config.all_cluster_configs(vec)),
                                ("norm_bwd_cluster", _config.all_cluster_bwd_configs(vec))):
            for cfg in configs:
                assert cfg.block <= 1024 and cfg.cluster <= 8, "portable cluster sizes only"
                assert _row_norm._cluster_name(kernel, "float32" if vec == 4 else "bfloat16", "float32", cfg,
                                               False) in _row_norm.cluster_instantiations()


def test_staged_cluster_backward_on_by_default():
    assert _row_norm.USE_STAGED_CLUSTER_BACKWARD is True, "measured faster than the split path (NOTES v46)"


def test_clusters_on_by_default():
    assert _row_norm.USE_CLUSTERS is True, "measured faster than the split path (NOTES v13, v16)"
