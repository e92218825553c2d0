"""The dispatcher's pure-Python decisions (CPU): row layouts, pack widths, parameter dtypes,
the fast-path cache key's alignment class."""
from __future__ import annotations

import dataclasses

import numpy
import pytest

from cunorm import _config
from cunorm._checks import BFLOAT16
from cunorm._launch import View, pick_vec, rows_of
from cunorm.ops import _row_norm

F32 = numpy.dtype(numpy.float32)


def view(shape, strides, dtype=F32, ptr=1 << 20):
    return View(ptr, tuple(shape), tuple(strides), numpy.dtype(dtype))


def test_contiguous_rows_collapse_to_one_axis():
    r = rows_of(view((2, 3, 5, 7), (105, 35, 7, 1)), 1)
    assert (r.rows, r.n) == (30, 7)
    assert r.strides == (7, 0, 0, 0) and r.sizes == (1, 1, 1)


def test_two_normalized_axes():
    r = rows_of(view((4, 3, 5), (15, 5, 1)), 2)
    assert (r.rows, r.n) == (4, 15)


def test_row_stride_and_transposed_leading_axes_stay_in_place():
    sliced = rows_of(view((6, 64), (128, 1)), 1)  # x[::2]
    assert sliced.strides[0] == 128
    transposed = rows_of(view((6, 5, 64), (64, 384, 1)), 1)  # swapaxes(0, 1) of (5, 6, 64)
    assert transposed.rows == 30 and transposed.strides[:2] == (64, 384) and transposed.sizes[0] == 5


def test_negative_leading_stride_is_addressed():
    r = rows_of(view((6, 8), (-8, 1)), 1)
    assert r.strides[0] == -8


def test_size_one_axes_ignore_their_strides():
    r = rows_of(view((1, 4, 1, 8), (999, 8, 12345, 1)), 1)
    assert (r.rows, r.n) == (4, 8) and r.strides[0] == 8


@pytest.mark.parametrize("shape,strides,nd", [
    ((6, 64), (128, 2), 1),  # strided last axis
    ((4, 3, 5), (15, 1, 3), 2),  # normalized axes transposed
    ((2, 3, 2, 3, 2, 64), (1, 2, 6, 12, 36, 72), 1),  # five leading axes that do not merge
])
def test_layouts_the_kernels_cannot_address_need_a_copy(shape, strides, nd):
    assert rows_of(view(shape, strides), nd) is None


def test_pack_width_follows_alignment_and_lengths():
    assert pick_vec(2, 4096, [(1 << 20, 2)], (4096,)) == 8
    assert pick_vec(2, 4096, [(1 << 20 | 2, 2)], (4096,)) == 1, "misaligned pointer"
    assert pick_vec(2, 4098, [(1 << 20, 2)], (4098,)) == 1, "row length not a multiple"
    assert pick_vec(2, 4096, [(1 << 20, 2)], (4100,)) == 1, "row stride not a multiple"
    assert pick_vec(2, 4096, [(1 << 20, 2)], (-4096,)) == 8, "negative strides count by size"
    assert pick_vec(2, 4096, [(1 << 20, 2), (1 << 20 | 8, 4)], (4096,)) == 1, "fp32 weight 8-byte aligned"
    assert pick_vec(4, 4096, [(1 << 20, 4), (0, 4)], (4096,)) == 4, "absent parameters do not count"
    assert pick_vec(8, 64, [(1 << 20 | 8, 8)], (64,)) == 1


@pytest.mark.parametrize("itemsize", [2, 4])
def test_sixteen_byte_packs_start_every_row_on_sixteen_bytes(itemsize):
    """The staged backward's bulk copies (v86) need each row of x and dy to start on a
    16-byte boundary, and they trust the pack width for it: a 16-byte pack is chosen only
    when every pointer is 16-byte aligned and every row stride and the row length are
    multiples of the pack, so each row start (pointer + stride * index * itemsize) is."""
    packs = 16 // itemsize
    for offset in range(0, 48, itemsize):
        for stride in (packs * 64, packs * 64 + 1, packs * 64 + packs // 2, -packs * 64, packs):
            for n in (packs, packs * 64, packs * 64 + 2):
                vec = pick_vec(itemsize, n, [(1 << 20 | offset, itemsize), (1 << 21, itemsize)], (stride, stride * 3))
                if vec * itemsize == 16:
                    rows = [(1 << 20 | offset) + stride * i * itemsize for i in range(5)]
                    assert all(r % 16 == 0 for r in rows) and n % vec == 0, (offset, stride, n)


def test_parameter_dtype_pairs():
    f16, f64 = numpy.dtype(numpy.float16), numpy.dtype(numpy.float64)
    assert _row_norm.param_dtype(BFLOAT16, F32, F32) == F32
    assert _row_norm.param_dtype(BFLOAT16, BFLOAT16, None) == BFLOAT16
    assert _row_norm.param_dtype(f16, BFLOAT16, None) == F32, "uncompiled pair: cast"
    assert _row_norm.param_dtype(F32, F32, f16) == F32, "weight and bias disagree: cast"
    assert _row_norm.param_dtype(F32, f64, None) == F32
    assert _row_norm.param_dtype(f64, f64, f64) == f64
    assert _row_norm.param_dtype(f64, F32, f64) == f64, "float64 x keeps a mixed pair in float64"
    assert _row_norm.param_dtype(f16, None, None) == f16


@pytest.mark.parametrize("itemsize,n", [(2, 1), (2, 1024), (2, 16384), (4, 16384), (8, 8192), (2, 16385)])
def test_forward_row_configs_hold_the_row_or_split(itemsize, n):
    for vec in _config.vec_choices(itemsize):
        if n % vec:
            continue
        cfg = _config.row_config(n, vec, _config.FWD)
        if cfg is None:
            assert n > _config.FWD.max_tpr * _config.packs_cap(vec, _config.FWD.max_values) * vec
        else:
            assert cfg.tile >= n and cfg.block in (128, 256, 512, 1024)


def test_wide_backward_rows_and_depths():
    tile = _config.wide_bwd_tile
    # rows of 8193-16384 elements in 16-byte packs; half-precision RMSNorm to 32768 (v66)
    assert [tile(n, 8, 2, False) for n in (8192, 8200, 16384, 16392)] == [None, _config.WIDE_BWD_TILE,
                                                                          _config.WIDE_BWD_TILE, None]
    long_rms = _config.WIDE_BWD_TILE_RMS_LONG
    assert [tile(n, 8, 2, True) for n in (8200, 16384, 16392, 32768, 32776)] == [
        _config.WIDE_BWD_TILE, _config.WIDE_BWD_TILE, long_rms, long_rms, None]
    assert tile(12000, 4, 2, True) is None, "narrower packs: not staged"
    assert [tile(n, 4, 4, rms) for n in (8196, 16384, 16388) for rms in (False, True)] == [
        _config.WIDE_BWD_TILE_FP32] * 4 + [None] * 2, "float32 to 16384 for both ops"
    assert tile(12000, 2, 8, True) is None, "float64"
    row_bytes = _config.wide_bwd_row_bytes
    assert row_bytes(_config.WIDE_BWD_TILE, 2) == 65536, "half precision to 16384: x and dy"
    assert row_bytes(_config.WIDE_BWD_TILE_FP32, 4) == row_bytes(long_rms, 2) == 65536, "x alone"
    h200_optin, a100_optin = 232448, 166912
    t16 = _config.WIDE_BWD_TILE
    def depth(tile, rms, n, itemsize, optin, cluster=False, w_itemsize=None):
        return _config.wide_bwd_depth(tile, rms, n, itemsize, optin, cluster, w_itemsize or itemsize)

    assert [depth(t16, rms, 16384, 2, h200_optin) for rms in (False, True)] == [2, 3]
    assert [depth(t16, True, n, 2, h200_optin) for n in (9216, 12288, 12296)] == [2, 2, 3]
    assert depth(_config.WIDE_BWD_TILE_FP32, True, 16384, 4, h200_optin) == 2, "float32 (v65)"
    assert depth(t16, True, 16384, 2, a100_optin) == 2, "two 64 KiB rows where three do not fit"
    assert depth(t16, False, 16384, 2, 65536) is None, "a 64 KiB block: not even two rows"
    assert [depth(long_rms, True, 32768, 2, o) for o in (h200_optin, a100_optin)] == [3, 2]
    # v104: a float32 weight with half-precision RMSNorm rows: two rows and its float slots
    # where they fit beside them (single block and clusters); v66's long tile has no room
    assert [depth(t16, True, 16384, 2, h200_optin, c, 4) for c in (False, True)] == [2, 2]
    assert depth(long_rms, True, 32768, 2, h200_optin, False, 4) == 3, "no slots beside two rows either"
    assert depth(t16, True, 16384, 2, a100_optin, False, 4) == 2
    # v81: the weight's float slots after the ring where both fit: the H200's depth-2 rings of
    # 16384 columns, no depth-3 ring, nothing on the A100's 163 KiB; v83: not half-precision
    # LayerNorm's single block (its clusters keep them)
    def weight(tile, itemsize, depth, optin, rms=True, cluster=False, w_itemsize=4):
        return _config.wide_bwd_weight_bytes(tile, itemsize, depth, optin, rms, cluster, w_itemsize)

    assert weight(t16, 2, 2, h200_optin) == weight(_config.WIDE_BWD_TILE_FP32, 4, 2, h200_optin, False) == 65536
    assert weight(t16, 2, 2, h200_optin, False, True) == 65536, "half-precision LayerNorm's clusters"
    assert weight(t16, 2, 2, h200_optin, False) == 0, "half-precision LayerNorm's single block (v83)"
    assert weight(t16, 2, 3, h200_optin) == weight(long_rms, 2, 3, h200_optin) == weight(long_rms, 2, 2, h200_optin) == 0
    # v99: the float32 clusters' narrow blocks hold three rows and the weight on the H200
    narrow = _config.WIDE_CLUSTER_BWD_NARROW[4]
    assert narrow.tile == 8192 and row_bytes(narrow, 4) == 65536, "x and dy"
    assert [depth(narrow, rms, 8192, 4, h200_optin, True) for rms in (False, True)] == [3, 3]
    assert weight(narrow, 4, 3, h200_optin, False, True) == 32768
    assert _config.wide_bwd_smem(narrow, 4, 3, h200_optin, False, True, 4) + _config.WIDE_BWD_STATIC_SMEM <= h200_optin
    # v101: the half-precision clusters' half-precision weight in its own type, beside three rows
    assert [_config.wide_bwd_depth(t16, rms, 16384, 2, h200_optin, True, 2) for rms in (False, True)] == [3, 3]
    assert _config.wide_bwd_depth(t16, False, 16384, 2, h200_optin, True, 4) == 2, "a float32 weight: v68's two rows"
    assert weight(t16, 2, 3, h200_optin, False, True, 2) == weight(t16, 2, 3, h200_optin, True, True, 2) == 32768
    assert weight(t16, 2, 3, h200_optin, True, False, 2) == 0, "the single block's ring of three keeps none"
    assert _config.wide_bwd_smem(t16, 2, 3, h200_optin, False, True, 2) + _config.WIDE_BWD_STATIC_SMEM <= h200_optin
    assert weight(t16, 2, 2, a100_optin) == 0
    names = _row_norm.instantiations()
    for depth in _config.WIDE_BWD_DEPTHS:
        assert _row_norm._wide_name("bfloat16", "float32", True, depth, t16) in names
        assert _row_norm._wide_name("bfloat16", "float32", True, depth, long_rms) in names
        assert _row_norm._wide_name("bfloat16", "float32", False, depth, long_rms) not in names, "LayerNorm: 16384"
        assert _row_norm._wide_name("float32", "float32", True, depth, long_rms) not in names


def test_float32_layer_norm_forward_past_131072_takes_sixteen_blocks():
    """v119's tile: float32 LayerNorm rows of 131073-262144 (the portable 1024 x 8 tile's
    second half) in sixteen blocks of 512 threads, with w + b in slots after the 64 KiB row
    slice (float32 lost v120's fewer blocks for shorter rows); not scalar packs."""
    wide = _config.nonportable_cluster_fwd_config
    tile = _config.ClusterConfig(4, 8, 512, 16)
    assert [wide(n, 4, 4, False) for n in (131072, 131076, 147456, 262144, 262148)] == [None, tile, tile, tile, None]
    assert wide(200001, 1, 4, False) is None and wide(200000, 2, 8, False) is None, "scalar packs; float64"
    h200_optin = 232448
    assert _config.cluster_fwd_param_bytes(tile, 4, 4, False, h200_optin) == 2 * 16384 * 4, "w and b in float slots"
    assert _config.cluster_fwd_smem(tile, 4, 4, False, h200_optin) == 65536 + 131072
    portable = _config.cluster_config(262144, 4)
    assert portable.cluster == 8 and _config.cluster_fwd_param_bytes(portable, 4, 4, False, h200_optin) == 0


def test_half_and_float32_rms_forward_past_131072_take_sixteen_blocks():
    """v120's tiles: half-precision LayerNorm and RMSNorm rows of 131073-262144 in the fewest of
    the same blocks that hold them (9-16), v90's three staged rows (96 KiB) then w (+ b) in x's
    type or as floats; float32 RMSNorm in sixteen with its next row staged and its weight in
    slots."""
    wide = _config.nonportable_cluster_fwd_config
    half, f32 = _config.ClusterConfig(8, 4, 512, 16), _config.ClusterConfig(4, 8, 512, 16)
    for rms in (False, True):
        assert [wide(n, 8, 2, rms) for n in (131072, 131080, 196608, 262144, 262152)] == \
            [None, dataclasses.replace(half, cluster=9), dataclasses.replace(half, cluster=12), half, None]
    assert wide(200000, 4, 4, True) == f32 and wide(147456, 4, 4, True) == f32
    h200_optin, rows = 232448, 3 * 16384 * 2
    smem = _config.cluster_fwd_smem
    assert [smem(half, 2, w, rms, h200_optin) for w in (2, 4) for rms in (False, True)] == \
        [rows + 2 * 32768, rows + 32768, rows + 2 * 65536, rows + 65536]
    assert smem(f32, 4, 4, True, h200_optin) == 65536 + 65536, "its staged row, then the weight's slots"
    assert _config.cluster_fwd_param_bytes(_config.cluster_config(262144, 8), 2, 2, False, h200_optin) == 0, \
        "the portable tile's three rows leave no room"


def test_layer_norm_clusters_of_eight_keep_parameters_in_slots(monkeypatch):
    """v121: float32 LayerNorm's portable clusters of eight (32769-131072) and half-precision
    LayerNorm's 512-thread ones with float32 w + b keep w + b in slots; not clusters of four,
    not bf16 w + b, not the 1024-thread tile (no room), not RMSNorm's half-precision tiles."""
    optin = 232448
    slots = _config.cluster_fwd_param_bytes
    f32 = {n: _config.cluster_config(n, 4) for n in (32768, 65536, 131072, 262144)}
    assert [slots(f32[n], 4, 4, False, optin) for n in f32] == [0, 2 * 8192 * 4, 2 * 16384 * 4, 0]
    half = _config.cluster_config(131072, 8)
    assert half.tpb == 512 and slots(half, 2, 4, False, optin) == 2 * 16384 * 4 and slots(half, 2, 2, False, optin) == 0
    assert slots(half, 2, 4, True, optin) == 0, "RMSNorm's half-precision 512-thread tile keeps loading"
    monkeypatch.setattr(_config, "CLUSTER_FWD_EIGHT_PARAM_SLOTS", False)
    assert slots(f32[65536], 4, 4, False, optin) == 0 and slots(half, 2, 4, False, optin) == 0


def test_half_and_float32_rms_sixteen_block_tiles_off(monkeypatch):
    monkeypatch.setattr(_config, "CLUSTER_FWD_NONPORTABLE_HALF", False)
    monkeypatch.setattr(_config, "CLUSTER_FWD_NONPORTABLE_F32_RMS", False)
    wide = _config.nonportable_cluster_fwd_config
    assert wide(200000, 8, 2, False) is None and wide(200000, 8, 2, True) is None and wide(200000, 4, 4, True) is None
    assert wide(200000, 4, 4, False) is not None, "v119's float32 LayerNorm keeps its tile"
    monkeypatch.setattr(_config, "CLUSTER_FWD_NONPORTABLE_HALF", True)
    monkeypatch.setattr(_config, "CLUSTER_FWD_HALF_NONPORTABLE_SLOTS", False)
    tile = wide(200000, 8, 2, False)
    assert _config.cluster_fwd_param_bytes(tile, 2, 2, False, 232448) == 0, "the sweep's control: no slots"


def test_nonportable_forward_fit_and_rms_stage_off(monkeypatch):
    """The first sweep's forms: always sixteen blocks; float32 RMSNorm without a staged row."""
    monkeypatch.setattr(_config, "CLUSTER_FWD_NONPORTABLE_FIT", False)
    assert _config.nonportable_cluster_fwd_config(147456, 8, 2, False).cluster == 16
    monkeypatch.setattr(_config, "CLUSTER_FWD_F32_RMS_NONPORTABLE_STAGE", False)
    tile = _config.nonportable_cluster_fwd_config(200000, 4, 4, True)
    assert _config.cluster_fwd_smem(tile, 4, 4, True, 232448) == 65536, "the weight's slots alone"
    assert _config.cluster_fwd_stage_rows(tile, 4, False) == 1, "LayerNorm's row stays staged"


def test_float32_layer_norm_sixteen_block_tile_off(monkeypatch):
    monkeypatch.setattr(_config, "CLUSTER_FWD_NONPORTABLE", False)
    assert _config.nonportable_cluster_fwd_config(200000, 4, 4, False) is None
    monkeypatch.setattr(_config, "CLUSTER_FWD_NONPORTABLE", True)
    monkeypatch.setattr(_config, "CLUSTER_FWD_F32_NONPORTABLE_SLOTS", False)
    tile = _config.nonportable_cluster_fwd_config(200000, 4, 4, False)
    assert _config.cluster_fwd_param_bytes(tile, 4, 4, False, 232448) == 0, "the sweep's control: no slots"


def test_persistent_cluster_backward_takes_fewer_clusters_where_more_read_slower(monkeypatch):
    clusters = _config.persistent_bwd_clusters
    # v122: bf16 rows in wide clusters of four on 132 SMs: 0.67 x 132 = 88 blocks, 22 clusters
    assert clusters(30, 2, 4, 132) == 22, "the H100's 30 counted clusters of four, capped"
    assert clusters(10, 2, 4, 132) == 10, "a count under the cap stands"
    assert clusters(30, 2, 4, 4) == 1, "never fewer than one cluster"
    assert clusters(30, 4, 4, 132) == 30, "float32 clusters of four: not measured, the count"
    assert [clusters(7, 2, size, 132) for size in (2, 8, 9, 16)] == [7] * 4, "other sizes: the count"
    assert clusters(132, 2, 1, 132) == 132, "the single wide block: the count unless the table names it"
    monkeypatch.setattr(_config, "PERSISTENT_BWD_SM_SHARE", {(2, 1): 0.75})
    assert clusters(132, 2, 1, 132) == 99, "where it does: share x SMs blocks"
    monkeypatch.setattr(_config, "PERSISTENT_BWD_SM_SHARE", {})
    assert clusters(30, 2, 4, 132) == 30, "no table: the count everywhere"
