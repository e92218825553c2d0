"""The long-row forward through thread-block clusters (sm_90+, kernels/layer_norm_cluster.cu),
(on by default; the fixture also skips below sm_90): LayerNorm and RMSNorm against the float64 reference, rows past
the full-row tile in each cluster shape, with and without parameters, strided and offset
views, more rows than the grid holds; and the dispatch itself (which kernel a plan holds)."""
from __future__ import annotations

import numpy
import pytest

from cunorm import _config
from cunorm._checks import BFLOAT16
from cunorm.ops import _row_norm
from norm_cases import check


def _clear():
    _row_norm._forward_kernels.cache_clear()
    _row_norm.forward_plan.cache_clear()


@pytest.fixture
def clusters(monkeypatch):
    import cupy

    cc = cupy.cuda.Device().compute_capability
    if int(cc) < _config.CLUSTER_MIN_SM:
        pytest.skip(f"thread-block clusters need sm_90 or later; this GPU is sm_{cc}")
    monkeypatch.setattr(_row_norm, "USE_CLUSTERS", True)
    _clear()
    yield
    _clear()


# bf16 / fp16 rows past 32768 elements and fp32 past 16384 leave the full-row tile; each N
# picks another cluster shape (and 40000 / 20000 leave part of the last block's slice empty)
CASES = [(BFLOAT16, n) for n in (40000, 65536, 131072)] + \
        [(numpy.dtype(numpy.float16), 65536)] + \
        [(numpy.dtype(numpy.float32), n) for n in (20000, 40000, 65536, 131072)]


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
@pytest.mark.parametrize("dtype,n", CASES, ids=[f"{d.name}-{n}" for d, n in CASES])
def test_cluster_path(rng, clusters, op, dtype, n):
    rows = 3 if n <= 131072 else 2
    cfg = _config.cluster_config(n, 16 // dtype.itemsize)
    plan = _row_norm.forward_plan((rows, n), (n, 1), dtype, dtype, 1, op == "rms_norm", 1e-5, 0, 0, 0)
    assert plan.tiles == 1 and plan.block == cfg.tpb and plan.grid == rows * cfg.cluster, "the cluster kernel"
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


def test_cluster_configs():
    assert _config.cluster_config(65536, 8) == _config.ClusterConfig(8, 4, 256, 8)
    assert _config.cluster_config(65537, 8) == _config.ClusterConfig(8, 4, 512, 8)
    assert _config.cluster_config(16384, 4) == _config.ClusterConfig(4, 8, 256, 2)
    assert _config.cluster_config(131072, 8).capacity == 131072
    assert _config.cluster_config(131073, 8) is None, "past the largest cluster tile: the split path"
    assert _config.cluster_config(65536, 1) is None, "scalar packs: the split path"
    for vec in (4, 8):
        for cfg in _config.all_cluster_configs(vec):
            assert cfg.block <= 1024 and cfg.cluster <= 8, "portable cluster sizes only"
            assert _row_norm._cluster_name("float32" if vec == 4 else "bfloat16", "float32", cfg, False) in \
                _row_norm.cluster_instantiations()


def test_clusters_on_by_default():
    assert _row_norm.USE_CLUSTERS is True, "measured faster than the split path up to 131072 (NOTES v13)"
