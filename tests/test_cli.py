"""``python -m cunorm bench``: argument errors and the no-GPU message on any machine, the
table and plot from recorded rows, and a small real run on the GPU."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cunorm import _cli


def _bench(*args):
    return subprocess.run([sys.executable, "-m", "cunorm", "bench", *args], capture_output=True, text=True,
                          timeout=300)


def _gpu_present() -> bool:
    return _cli._no_gpu_reason() is None


def test_cli_without_gpu_says_so_in_one_line():
    if _gpu_present():
        pytest.skip("a CUDA GPU is present: the no-GPU message is not shown")
    done = _bench("--n", "1024")
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and "needs a CUDA GPU" in done.stderr


@pytest.mark.parametrize("args,message", [
    (("--op", "ln,gn"), "unknown op 'gn'"),
    (("--dtype", "int8"), "unknown dtype 'int8'"),
    (("--n", "0"), "positive integers"),
    (("--m", "a,b"), "comma-separated integers"),
    (("--compare", "liger"), "unknown system 'liger'"),
])
def test_cli_rejects_bad_arguments(args, message):
    done = _bench(*args)
    assert done.returncode == 2
    assert message in done.stderr


def test_cli_unknown_command():
    done = subprocess.run([sys.executable, "-m", "cunorm", "benchmark"], capture_output=True, text=True)
    assert done.returncode == 2 and "unknown command 'benchmark'" in done.stderr


def _recorded():
    rows = []
    for n in (1024, 4096):
        row = {"op": "layer_norm", "dtype": "bfloat16", "M": 2**26 // n, "N": n, "default_m": True,
               "fwd_ms": 0.04, "fwd_GBps": 3355.4, "bwd_ms": 0.08, "bwd_GBps": 2516.6}
        row["torch"] = {"fwd_ms": 0.08, "fwd_GBps": 1677.7, "fwd_speedup": 2.0,
                        "bwd_ms": 0.32, "bwd_GBps": 629.1, "bwd_speedup": 4.0}
        rows.append(row)
    return {"copy_GBps": 4200.0, "peers": ["torch"], "rows": rows}


def test_table_shows_fraction_of_copy_and_speedups():
    text = _cli.table(_recorded())
    lines = text.splitlines()
    assert lines[0].startswith("copy 4200.0 GB/s")
    assert "vs torch f/b" in lines[1]
    first = lines[2].split()
    assert first[:4] == ["layer_norm", "bfloat16", "65536", "1024"]
    assert "0.80" in first and "x2.00" in text and "x4.00" in text


def test_table_adds_batch_norm_rows():
    result = _recorded()
    result["batch_norm"] = [{"op": "batch_norm", "shape": [32, 256, 56, 56], "dtype": "bfloat16", "layout": "nhwc",
                             "fwd_of_copy": 0.55, "bwd_of_copy": 0.41, "fwd_speedup_vs_best": 1.3,
                             "bwd_speedup_vs_best": 1.6, "fused_relu_residual_vs_plain": 1.12,
                             "fused_relu_residual_bwd_vs_plain": 1.57, "host_us_fwd": 31.0, "host_us_bwd": 29.0}]
    text = _cli.table(result)
    line = next(x for x in text.splitlines() if "(32, 256, 56, 56)" in x)
    assert "nhwc" in line and "0.55" in line and "0.41" in line and "x1.30 / x1.60" in line
    assert "1.12 / 1.57" in line and "31 /   29" in line


def test_table_reads_batch_norm_rows_recorded_before_the_residual_backward_was_timed():
    result = _recorded()
    result["batch_norm"] = [{"op": "batch_norm", "shape": [32, 256, 56, 56], "dtype": "float32", "layout": "nchw",
                             "fwd_of_copy": 0.55, "bwd_of_copy": 0.41, "fused_relu_residual_vs_plain": 1.12,
                             "host_us_fwd": 31.0, "host_us_bwd": 29.0}]
    line = next(x for x in _cli.table(result).splitlines() if "(32, 256, 56, 56)" in x)
    assert "1.12 /    -" in line


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (pip install 'cunorm[plot]')")
    from cunorm import _plot

    path = tmp_path / "bench.png"
    _plot.plot(_recorded(), str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.gpu
def test_gpu_bench_small_run(tmp_path):
    if not _gpu_present():
        pytest.skip("needs a CUDA GPU")
    out = tmp_path / "bench.json"
    done = _bench("--op", "ln,rms", "--dtype", "bf16", "--n", "1024", "--m", "64", "--compare", "torch",
                  "--json", str(out))
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert len(result["rows"]) == 2 and result["copy_GBps"] > 0
    for row in result["rows"]:
        assert row["M"] == 64 and row["fwd_GBps"] > 0 and row["bwd_GBps"] > 0
        if "torch" in result["peers"]:
            assert row["torch"]["fwd_speedup"] > 0
    assert "speed-up" in done.stdout
