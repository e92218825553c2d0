"""benchmarks/_sweep_cli.backward_checks and forward_checks, the reference checks a sweep runs
inside each variant build: on the CPU with NumPy arrays standing in for CuPy's (cunorm runs NumPy inputs on the
CPU) and the dispatcher's plan stubbed, it must report ok for right gradients, FAILED for a
wrong one, and check only in a variant's first round."""
from __future__ import annotations

import pathlib
import sys
import types

import numpy
import pytest

from cunorm._checks import BFLOAT16

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))


@pytest.fixture
def checks(monkeypatch):
    cupy = pytest.importorskip("cupy")
    import _sweep_cli
    from cunorm.ops import _row_norm

    monkeypatch.setattr(cupy, "asarray", numpy.asarray)
    monkeypatch.setattr(cupy, "asnumpy", numpy.asarray)
    monkeypatch.setattr(_row_norm, "backward_plan", lambda *a: types.SimpleNamespace(block=1024, blocks=2, groups=1))
    f32 = numpy.dtype(numpy.float32)
    cases = [("layer_norm", f32, 5, 64, f32), ("rms_norm", BFLOAT16, 3, 96, f32),
             ("layer_norm", BFLOAT16, 4, 33, BFLOAT16)]
    return lambda log: _sweep_cli.backward_checks(cases, log)


def test_backward_checks_pass_right_gradients(checks):
    lines = []
    assert checks(lines.append)("v", 1, 0.0) == []
    assert len(lines) == 3 and all(line.endswith(": ok") for line in lines), lines
    assert "block 1024, blocks 2, groups 1" in lines[0]


def test_backward_checks_report_a_wrong_gradient(checks, monkeypatch):
    import cunorm

    right = cunorm.layer_norm_backward
    monkeypatch.setattr(cunorm, "layer_norm_backward", lambda *a, **k: (lambda dx, dw, db: (dx * 1.1, dw, db))(
        *right(*a, **k)))
    lines = []
    checks(lines.append)("v", 1, 0.0)
    assert [("FAILED" in line) for line in lines] == [True, False, True], lines
    assert "dx:" in lines[0]


def test_backward_checks_run_in_the_first_round_only(checks):
    lines = []
    checks(lines.append)("v", 2, 0.0)
    assert lines == []


def test_forward_checks_pass_right_outputs_and_report_a_wrong_one(monkeypatch):
    cupy = pytest.importorskip("cupy")
    import _sweep_cli
    import cunorm

    monkeypatch.setattr(cupy, "asarray", numpy.asarray)
    f32 = numpy.dtype(numpy.float32)
    cases = [("layer_norm", BFLOAT16, 5, 64, f32), ("rms_norm", f32, 3, 96, f32)]
    lines = []
    _sweep_cli.forward_checks(cases, lines.append)("v", 1, 0.0)
    assert len(lines) == 2 and all(line.endswith(": ok") for line in lines), lines
    right = cunorm.rms_norm
    monkeypatch.setattr(cunorm, "rms_norm", lambda *a, **k: (lambda y, r: (y, r * 1.01))(*right(*a, **k)))
    lines = []
    _sweep_cli.forward_checks(cases, lines.append)("v", 1, 0.0)
    assert "ok" in lines[0] and "FAILED rstd" in lines[1], lines
    lines = []
    _sweep_cli.forward_checks(cases, lines.append)("v", 2, 0.0)
    assert lines == []
