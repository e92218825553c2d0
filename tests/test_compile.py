"""Every kernel instantiation the dispatcher can launch compiles with NVRTC for sm_80 and
sm_90, without a GPU. CI sets CUNORM_REQUIRE_NVRTC=1 so a missing NVRTC fails instead of
skipping; elsewhere these skip with the reason."""
from __future__ import annotations

import collections
import functools
import os
import re
import shutil

import pytest

from cunorm import _compile, _config
from cunorm.ops import _batch_norm, _fused, _row_norm

# CUNORM_COMPILE_ARCHS (comma-separated) narrows them: .ci/run compiles sm_80 with the newest
# NVRTC and sm_90 with NVRTC 13.0 (the H100 / H200 machine's), rather than each arch with both.
ARCHS = os.environ.get("CUNORM_COMPILE_ARCHS", "sm_80,sm_90").split(",")
CHUNKS = 6  # compile in slices so a failure names a smaller set

# CUNORM_COMPILE_OPT: "fast" (the default) compiles every instantiation with NVRTC's
# -Ofc=max: the front end, NVVM and ptxas all run, so template, arch and resource errors
# show, without the optimizations that take most of the time (28 fused names: 3.3 s against
# 58-82 s; the whole sm_80 set took 57 minutes of this 2-core machine in full). "full"
# compiles as CuPy does on the device: .ci/run does that for sm_90 with NVRTC 13.0, the
# device's. The register and shared-memory tests below always compile in full.
COMPILE_OPT = os.environ.get("CUNORM_COMPILE_OPT", "fast")
if COMPILE_OPT not in ("fast", "full"):
    raise ValueError(f"CUNORM_COMPILE_OPT must be 'fast' or 'full', not {COMPILE_OPT!r}")
sm90 = pytest.mark.skipif("sm_90" not in ARCHS, reason="CUNORM_COMPILE_ARCHS leaves out sm_90")


def _nvrtc_missing_reason():
    try:
        from cupy_backends.cuda.libs import nvrtc

        nvrtc.getVersion()
        _compile._nvrtc_include_options()
    except Exception as err:  # ImportError, missing libnvrtc or headers
        return f"NVRTC or CUDA headers unavailable ({type(err).__name__}: {err})"
    return None


@pytest.fixture(scope="module")
def nvrtc_ready():
    reason = _nvrtc_missing_reason()
    if reason is not None:
        if os.environ.get("CUNORM_REQUIRE_NVRTC") == "1":
            pytest.fail(reason)
        pytest.skip(reason)


@pytest.fixture
def every_instantiation(nvrtc_ready):
    """compile_check at CUNORM_COMPILE_OPT's level, for the tests that compile every
    instantiation."""
    extra = ("-Ofc=max",) if COMPILE_OPT == "fast" else ()
    return functools.partial(_compile.compile_check, extra_options=extra)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_all_row_norm_instantiations_compile(every_instantiation, arch, chunk):
    names = _row_norm.instantiations()
    every_instantiation(_row_norm.KERNEL_FILE, names[chunk::CHUNKS], arch)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_all_batch_norm_instantiations_compile(every_instantiation, arch, chunk):
    # chunked too: whole, the 1410 names were one worker's last 18 minutes in full
    names = _batch_norm.instantiations()
    every_instantiation(_batch_norm.KERNEL_FILE, names[chunk::CHUNKS], arch)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_all_fused_instantiations_compile(every_instantiation, arch, chunk):
    names = _fused.fused_instantiations()
    every_instantiation(_fused.FUSED_FILE, names[chunk::CHUNKS], arch)


@sm90
def test_all_cluster_instantiations_compile(every_instantiation):
    # thread-block clusters exist from sm_90 on: the dispatcher uses them only there
    every_instantiation(_row_norm.CLUSTER_FILE, _row_norm.cluster_instantiations(), "sm_90")


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("chunk", range(2))
def test_all_grid_row_instantiations_compile(every_instantiation, arch, chunk):
    # the grid-row kernels (cp.async, acquire loads: sm_80 on), each shape the plans may take
    from cunorm.ops import _grid_rows

    names = _grid_rows.instantiations(_row_norm.TYPE_PAIRS)
    every_instantiation(_grid_rows.GRID_FILE, names[chunk::2], arch)


def test_grid_row_instantiations_cover_their_shapes():
    # every row group grid_qpad can give has its kernels compiled
    from cunorm.ops import _grid_rows

    names = set(_grid_rows.instantiations(_row_norm.TYPE_PAIRS))
    for packs in (16384, 20000, 65536, 100000, 132 * 1024):
        qpad = _config.grid_qpad(packs, 132)
        for backward in (False, True):
            assert _grid_rows.grid_name(backward, "bfloat16", "float32", True, qpad) in names


@pytest.fixture(scope="module")
def hipcc_ready():
    if shutil.which("hipcc") is None:
        reason = "hipcc not installed (Debian: apt-get install hipcc)"
        if os.environ.get("CUNORM_REQUIRE_HIPCC") == "1":
            pytest.fail(reason)
        pytest.skip(reason)


def _family_sample(names: list[str]) -> list[str]:
    """First, middle and last instantiation of each kernel template for each element type and
    flag set (the text before the first comma, and the boolean arguments)."""
    groups = collections.defaultdict(list)
    for name in names:
        head, args = name.split("<", 1)
        parts = [a.strip() for a in args.rstrip(">").split(",")]
        groups[(head, parts[0], tuple(a for a in parts if a in ("true", "false")))].append(name)
    return [g[i] for g in groups.values() for i in sorted({0, len(g) // 2, len(g) - 1})]


@pytest.mark.parametrize("kernel_file,instantiations", [(_row_norm.KERNEL_FILE, _row_norm.instantiations),
                                                        (_batch_norm.KERNEL_FILE, _batch_norm.instantiations)],
                         ids=["row_norm", "batch_norm"])
def test_kernel_families_compile_for_amd(hipcc_ready, kernel_file, instantiations):
    """Every kernel family as HIP for gfx90a (each element type and flag set); the cluster
    kernels are NVIDIA-only (sm_90 PTX) and stay out. Compiles; running on AMD is unverified."""
    _compile.hip_compile_check(kernel_file, _family_sample(instantiations()), "gfx90a")


def test_hip_compile_error_is_reported(hipcc_ready):
    with pytest.raises(RuntimeError, match="hipcc"):
        _compile.hip_compile_check(_row_norm.KERNEL_FILE, ["norm_fwd<int, int, 3, 1, 1, false, 0>"], "gfx90a")


def test_compile_error_is_reported(nvrtc_ready):
    with pytest.raises(RuntimeError, match="norm_fwd"):
        _compile.compile_check(_row_norm.KERNEL_FILE, ["norm_fwd<int, int, 3, 1, 1, false, 0>"], "sm_90")


def test_compile_error_is_reported_at_the_chosen_level(every_instantiation):
    # the every-instantiation tests' compile (-Ofc=max where fast) still fails on bad code
    with pytest.raises(RuntimeError, match="norm_fwd"):
        every_instantiation(_row_norm.KERNEL_FILE, ["norm_fwd<int, int, 3, 1, 1, false, 0>"], ARCHS[0])


def test_header_is_inlined_into_the_source():
    src = _compile.kernel_source(_row_norm.KERNEL_FILE)
    assert '#include "common.cuh"' not in src and "struct RowMap" in src


@pytest.mark.parametrize("limits", [_config.FWD, _config.BWD, _config.BWD_HALF], ids=["fwd", "bwd", "bwd_half"])
@pytest.mark.parametrize("vec", [1, 2, 4, 8])
def test_row_configs_cover_every_length(vec, limits):
    configs = _config.all_tile_configs(vec, limits)
    n = 1
    while (cfg := _config.row_config(n, vec, limits)) is not None:
        assert cfg in configs
        assert cfg.tile >= n, "a full-row tile must hold the row"
        assert cfg.packs * cfg.vec <= max(limits.max_values, vec)
        assert cfg.tpr <= limits.max_tpr and cfg.block % 32 == 0
        n += 1
    assert n > 1024, "rows up to 1024 elements always fit one tile"


def test_instantiations_cover_dispatch():
    names = set(_row_norm.instantiations())
    for t, w in _row_norm.TYPE_PAIRS:
        for vec in _config.vec_choices(_row_norm._np_name(t).itemsize):
            for n in (1, 7, 499, 512, 1533, 3001, 4096, 8192, 16384):
                cfg = _config.row_config(n, vec, _config.FWD)
                if cfg is not None:
                    assert _row_norm._tile_name("norm_fwd", t, w, cfg, False, 0) in names
                for rms in (False, True):
                    cfg = _config.bwd_row_config(n, vec, _row_norm._np_name(t).itemsize, rms)
                    if cfg is not None:
                        assert _row_norm._tile_name("norm_bwd", t, w, cfg, rms, 0) in names
                    cfg = _config.row_config(n, vec, _config.COLUMN_BWD)
                    if cfg is not None:
                        assert _row_norm._tile_name("norm_bwd_columns", t, w, cfg, rms) in names


def test_column_lanes_agree_with_the_kernel():
    # the dispatcher sizes the column blocks' grid with the lane count the kernel uses
    src = _compile.kernel_source(_row_norm.KERNEL_FILE)
    assert re.search(r"constexpr int kColLanes = (\d+);", src).group(1) == str(_config.COLUMN_LANES)


def test_cl_cluster_max_agrees_with_the_kernel():
    # cl_stage_sums folds a stage's sums in rank order up to kClClusterMax blocks, so that a
    # clustered stage met in global memory (the cluster exchange's fallback) gives its bits;
    # past the largest cluster the planner can pick, the spread fold (v39)
    src = _compile.kernel_source(_batch_norm.KERNEL_FILE)
    assert int(re.search(r"constexpr int kClClusterMax = (\d+);", src).group(1)) == max(_batch_norm.STAGED_CL_CLUSTERS)


def test_stage_policy_matches_the_host(nvrtc_ready):
    """The staged backward kernels size their row buffers by StagePolicy (kernels/row_norm.cuh)
    and the host sizes their dynamic shared memory by _config.bwd_stage_depth: a kernel that
    staged more rows than the host allowed for would write past its shared memory. NVRTC
    checks the two agree for every staged tile the dispatcher can pick."""
    tiles = {c.tpr for rms in (False, True)
             for c in _config.all_tile_configs(8, lambda n, v, rms=rms: _config.bwd_row_config(n, v, 2, rms))}
    tiles.add(_config.CLUSTER_STAGED_BWD_TILE.tpr)
    checks = [f"static_assert(cunorm::StagePolicy<{tpr}, {str(rms).lower()}>::depth == "
              f"{_config.bwd_stage_depth(tpr, rms)}, \"tpr {tpr} rms {rms}\");"
              for tpr in sorted(tiles) for rms in (False, True)]
    _static_asserts_hold(checks, "StagePolicy and _config.bwd_stage_depth disagree")
    assert len(tiles) >= 5, "warp rows, block rows and the 1024-thread rows are all covered"


def _static_asserts_hold(checks: list[str], what: str, options: tuple = (), filename: str = "row_norm.cuh") -> None:
    """Compiles ``filename`` with ``checks`` (static_asserts of a kernel-side constant against
    the host's) appended, through NVRTC for sm_90; a failing one fails the test with ``what``."""
    from cupy_backends.cuda.libs import nvrtc

    prog = nvrtc.createProgram(_compile.kernel_source(filename) + "\n" + "\n".join(checks) + "\n", "checks.cu",
                               [], [])
    try:
        try:
            nvrtc.compileProgram(prog, [*_compile.nvrtc_options("sm_90"), *_compile.COMPILE_OPTIONS, *options])
        except nvrtc.NVRTCError as err:
            pytest.fail(f"{what}: {err}\n{nvrtc.getProgramLog(prog)}")
    finally:
        nvrtc.destroyProgram(prog)


# sm_86 / sm_89, sm_80, sm_90: what a block may opt in to (cudaDevAttrMaxSharedMemoryPerBlockOptin)
SMEM_OPTINS = (101376, 166912, 232448)


@pytest.mark.parametrize("optin", SMEM_OPTINS)
def test_wide_weight_slots_match_the_host(nvrtc_ready, optin):
    """v81: the wide backward keeps its weight in shared memory after the ring where
    WideWeightSlots (kernels/row_norm.cuh) says so, and the host sizes the dynamic shared
    memory by _config.wide_bwd_weight_bytes: were the kernel to use slots the host did not
    allocate, it would write past its shared memory. NVRTC checks the two agree for every
    wide tile (a single block's and a cluster block's, v99's float32 8192 columns and v109's
    half-precision 512-thread blocks, two an SM, among them) and ring depth, compiled with
    each GPU's opt-in."""
    checks = []
    for itemsize, ctype in ((2, "__nv_bfloat16"), (4, "float")):
        for w_itemsize, wtype in ((itemsize, ctype), (4, "float")):  # v101: half weights' own slots
            for rms in (False, True):
                tiles = [(t, False) for t in _config.wide_bwd_tiles(itemsize, rms)] + \
                    [(t, True) for t in _config.wide_cluster_bwd_tiles(itemsize, w_itemsize, rms)]
                for tile, cluster in tiles:
                    for depth in _config.WIDE_BWD_DEPTHS:
                        host = _config.wide_bwd_weight_bytes(tile, itemsize, depth, optin, rms, cluster, w_itemsize) > 0
                        flags = f"{wtype}, {str(rms).lower()}, {depth}, {tile.tile}, {str(cluster).lower()}, {tile.tpr}"
                        checks.append(f"static_assert(cunorm::WideWeightSlots<{ctype}, {flags}>::value == "
                                      f"{str(host).lower()}, \"{ctype} {flags}\");")
    _static_asserts_hold(checks, "WideWeightSlots and _config.wide_bwd_weight_bytes disagree",
                         (f"-DCUNORM_SMEM_OPTIN={optin}",))
    assert len(checks) >= 16


@pytest.mark.parametrize("optin", SMEM_OPTINS)
def test_cluster_forward_weight_slots_match_the_host(nvrtc_ready, optin):
    """v105: the cluster forward stages RMSNorm's weight after its rows where
    ClusterFwdParamSlots (kernels/layer_norm_cluster.cu) says so, and the host sizes the
    dynamic shared memory by _config.cluster_fwd_param_bytes; NVRTC checks the two agree for
    every cluster tile (v119's non-portable ones too), dtype pair and op, compiled with each
    GPU's opt-in."""
    checks = []
    for itemsize, ctype in ((2, "__nv_bfloat16"), (2, "__half"), (4, "float")):
        vec = 16 // itemsize
        for cfg in _config.all_cluster_configs(vec) + _config.all_nonportable_cluster_fwd_configs(vec, itemsize):
            for w_itemsize, wtype in ((itemsize, ctype), (4, "float")):
                for rms in (False, True):
                    host = _config.cluster_fwd_param_bytes(cfg, itemsize, w_itemsize, rms, optin) > 0
                    flags = f"{ctype}, {wtype}, {cfg.vec}, {cfg.packs}, {cfg.tpb}, {str(rms).lower()}, {cfg.cluster}"
                    checks.append(f"static_assert(ClusterFwdParamSlots<{flags}>::value == "
                                  f"{str(host).lower()}, \"{flags}\");")
    _static_asserts_hold(checks, "ClusterFwdParamSlots and _config.cluster_fwd_param_bytes disagree",
                         (f"-DCUNORM_SMEM_OPTIN={optin}",), "layer_norm_cluster.cu")
    assert any("true" in c.split("==")[1] for c in checks) and any("false" in c.split("==")[1] for c in checks)


def _ptxas_reports(filename: str, names: list[str], options: list[str], pattern: str) -> dict:
    """{name expression: int} from the first match of ``pattern`` (one group) in ptxas's
    report of each kernel, one NVRTC compile. ptxas reports an entry's spills, then its
    registers and shared memory: the report of a kernel runs from its "Compiling entry
    function" line to the "bytes smem" line."""
    from cupy_backends.cuda.libs import nvrtc

    prog = nvrtc.createProgram(_compile.kernel_source(filename), filename, [], [])
    try:
        for name in names:
            nvrtc.addNameExpression(prog, name)
        nvrtc.compileProgram(prog, [*options, "--ptxas-options=-v"])
        log, lowered = nvrtc.getProgramLog(prog), {nvrtc.getLoweredName(prog, n): n for n in names}
    finally:
        nvrtc.destroyProgram(prog)
    found, entry = {}, None
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '(\S+)'", line)
        if m:
            entry = lowered.get(m.group(1))
        m = re.search(pattern, line)
        if m and entry is not None and entry not in found:
            found[entry] = int(m.group(1))
        if "bytes smem" in line:
            entry = None
    assert set(found) == set(names), f"ptxas reported no {pattern!r} for {set(names) - set(found)}"
    return found


def _static_smem(filename: str, names: list[str], options: list[str]) -> dict:
    """{name expression: static shared memory bytes} from ptxas's report of one NVRTC compile."""
    return _ptxas_reports(filename, names, options, r"(\d+) bytes smem")


@sm90
def test_wide_cluster_backwards_past_eight_blocks_do_not_spill(nvrtc_ready):
    """v116: the wide cluster backward in non-portable clusters of 9-16 blocks (v100's float32
    narrow blocks, v115's half-precision and v117's float32 wide ones), at the ring depth the
    dispatcher gives each tile on sm_90, builds without spills: its push exchange collects the
    ranks' sums four at a time (whole, the sixteen loads spilled 30 of v115's 160, bf16
    LayerNorm up to 44 bytes). (v117's float32 wide blocks at depth 3, which no plan takes,
    spill 8-16 bytes.)"""
    itemsize = {"__nv_bfloat16": 2, "__half": 2, "float": 4}
    optin = SMEM_OPTINS[-1]
    names = []
    for n in _row_norm.cluster_instantiations():
        if not n.startswith("norm_bwd_wide_cluster<"):
            continue
        t, w, rms, depth, cols, cluster, _ = (a.strip() for a in n[n.index("<") + 1:-1].split(","))
        if int(cluster) <= 8:
            continue
        size, w_size, rms = itemsize[t], itemsize[w], rms == "true"
        tile = next(c for c in _config.wide_cluster_bwd_tiles(size, w_size, rms) if c.tile == int(cols))
        if int(depth) == _config.wide_bwd_depth(tile, rms, tile.tile, size, optin, True, w_size):
            names.append(n)
    assert len(names) >= 96
    options = [*_compile.nvrtc_options("sm_90"), *_compile.COMPILE_OPTIONS]
    spills = _ptxas_reports(_row_norm.CLUSTER_FILE, names, options, r"(\d+) bytes spill stores")
    spilled = {n: b for n, b in spills.items() if b}
    assert not spilled, f"{len(spilled)} of {len(names)} spill: {spilled}"


@sm90
def test_staged_cl_static_smem_matches_the_host(nvrtc_ready):
    """BatchNorm v21: the planner fits bn_fwd_staged_cl's and bn_bwd_staged_cl's stages beside
    the static shared memory _batch_norm.staged_cl_static_smem says they hold; ptxas agrees
    for every element size, clustered or not (a share sized past the opt-in would fail to
    launch)."""
    options = [*_compile.nvrtc_options("sm_90"), *_compile.COMPILE_OPTIONS]
    block = _batch_norm.STAGED_CL_BLOCK
    cases = {}
    for ctype, itemsize, acc in (("__nv_bfloat16", 2, 4), ("float", 4, 4), ("double", 8, 8)):
        for clustered in (False, True):
            host = _batch_norm.staged_cl_static_smem(itemsize, acc, clustered)
            flag = str(clustered).lower()
            cases[f"bn_fwd_staged_cl<{block}, {ctype}, {ctype}, {ctype}, 0, {flag}>"] = host
            cases[f"bn_bwd_staged_cl<{block}, {ctype}, {ctype}, 1, {flag}>"] = host
    static = _static_smem(_batch_norm.KERNEL_FILE, list(cases), options)
    assert static == cases


@sm90
def test_staged_span_static_smem_matches_the_host(nvrtc_ready):
    """BatchNorm v25: the planner fits bn_fwd_staged_span's and bn_bwd_staged_span's stages
    beside the static shared memory _batch_norm.staged_span_static_smem says they hold; ptxas
    agrees, clustered or not."""
    options = [*_compile.nvrtc_options("sm_90"), *_compile.COMPILE_OPTIONS]
    block = _batch_norm.STAGED_SPAN_BLOCK
    cases = {}
    for ctype in ("__nv_bfloat16", "float"):
        for clustered in (False, True):
            flag = str(clustered).lower()
            cases[f"bn_fwd_staged_span<{block}, {ctype}, {ctype}, {ctype}, 0, {flag}>"] = \
                _batch_norm.staged_span_static_smem(4, clustered)
            cases[f"bn_bwd_staged_span<{block}, {ctype}, {ctype}, 2, {flag}>"] = \
                _batch_norm.staged_span_static_smem(4, clustered, backward=True)
    static = _static_smem(_batch_norm.KERNEL_FILE, list(cases), options)
    assert static == cases


@sm90
def test_wide_cluster_shared_memory_fits_sm90(nvrtc_ready):
    """The wide cluster backward's static buffers (block sums, staged statistics, exchange
    slots) beside the ring and weight slots the host sizes (_config.wide_bwd_smem) fit an
    sm_90 block's share (its opt-in; half the SM for v109's 512-thread blocks,
    _config.wide_block_smem_budget) for every cluster, element size, parameter size and ring
    the host may pick (ring and slots leave the host's WIDE_BWD_STATIC_SMEM free): a kernel
    past it would fail to launch, or lose its second block an SM, where ring and slots fill
    the rest ((p8)'s exchange slots forced at four 1024-thread blocks: 2832 static bytes, 240
    to spare by this count, and the H200 refused the launch; WideClusterExchange keeps (p8)
    to clusters of 2048 threads)."""
    optin = SMEM_OPTINS[-1]
    options = [*_compile.nvrtc_options("sm_90"), *_compile.COMPILE_OPTIONS, f"-DCUNORM_SMEM_OPTIN={optin}"]
    cases = {}
    for t, w in (("bfloat16", "bfloat16"), ("bfloat16", "float32"), ("float32", "float32")):
        itemsize, w_itemsize = _row_norm._itemsize(t), _row_norm._itemsize(w)
        for rms in (False, True):
            for cfg in _config.wide_cluster_bwd_configs(itemsize, w_itemsize, rms):  # v109's: RMSNorm, float32 w
                tile = _config.TileConfig(cfg.vec, cfg.packs, cfg.tpb)
                budget = _config.wide_block_smem_budget(tile, optin)
                for depth in _config.WIDE_BWD_DEPTHS:
                    dynamic = _config.wide_bwd_smem(tile, itemsize, depth, optin, rms, True, w_itemsize)
                    if dynamic + _config.WIDE_BWD_STATIC_SMEM <= budget:
                        cases[_row_norm._wide_cluster_name(t, w, rms, depth, cfg)] = (dynamic, budget)
    static = _static_smem("layer_norm_cluster.cu", list(cases), options)
    assert len(cases) >= 24
    for name, (dynamic, budget) in cases.items():
        assert static[name] + dynamic <= budget, f"{name}: {static[name]} + {dynamic} bytes past {budget}"


@sm90
@pytest.mark.parametrize("optin", SMEM_OPTINS)
def test_staged_backward_shared_memory_fits_each_gpu(nvrtc_ready, optin):
    """v77: the staged backwards' weight slots (static) sit beside the ring the host sizes
    (dynamic, _row_norm.stage_bytes); compiled with a device's opt-in (CUNORM_SMEM_OPTIN, as
    _compile.function_ptr passes it), every 512- and 1024-thread bf16 tile, plain and fused
    (h in bf16 and float32), fits both in it, so its launch can opt in. On sm_90 the plain
    1024-thread tiles keep their slots (v71's measured gain)."""
    options = [*_compile.nvrtc_options("sm_90"), *_compile.COMPILE_OPTIONS, f"-DCUNORM_SMEM_OPTIN={optin}"]
    b = "__nv_bfloat16"
    for rms in (False, True):
        plain = {_row_norm._tile_name("norm_bwd", "bfloat16", w, cfg, rms, _row_norm.FULL_ROW): (cfg, 2)
                 for w in ("bfloat16", "float32")
                 for cfg in (_config.bwd_row_config(n, 8, 2, rms) for n in (4096, 8192))}
        fused = {f"norm_bwd_fused<{b}, {h}, {b}, {b}, 8, 1, {cfg.tpr}, {str(rms).lower()}>": (cfg, hsize)
                 for h, hsize in ((b, 2), ("float", 4))
                 for cfg in (_config.bwd_row_config(n, 8, 2, rms) for n in (4096, 8192))}
        for filename, tiles in ((_row_norm.KERNEL_FILE, plain), ("layer_norm_fused.cu", fused)):
            static = _static_smem(filename, list(tiles), options)
            for name, (cfg, hsize) in tiles.items():
                dynamic = _row_norm.stage_bytes(cfg, 2, hsize, rms)
                if dynamic + 2048 > optin:
                    continue  # the ring alone is too large for this GPU (the host's limit, not v77's)
                assert static[name] + dynamic <= optin, f"{name}: {static[name]} + {dynamic} bytes past {optin}"
            if optin == SMEM_OPTINS[-1] and tiles is plain:
                wide = [n for n, (cfg, _) in plain.items() if cfg.tpr == 1024]
                assert wide and all(static[n] >= 32768 for n in wide), "sm_90's 1024-thread rows keep their slots"
