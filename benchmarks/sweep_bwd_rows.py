"""Where the one-launch column backward stops paying: backward kernel time under CUDA-graph
replay, both backward paths forced, over row counts.

    python benchmarks/sweep_bwd_rows.py [--json out.json]

For each dtype, row length N and row count M, times the LayerNorm backward (dx, dW, dB)
through the torch adapter with the column path forced (``_config.COLUMN_ROW_STEPS`` huge)
and with the partial-row path forced (0), and prints the faster one's row steps (M per
column-thread row lane), which is what ``_config.COLUMN_ROW_STEPS`` bounds.
"""
from __future__ import annotations

import torch

from cunorm import _config
from cunorm._bench_torch import _graph_us
from cunorm.ops import _row_norm
from cunorm.torch import _cuda, _forward_impl

ROWS = (1, 16, 64, 128, 256, 512, 1024, 2048, 4096)
ROW_LENGTHS = (1024, 4096, 8192)
DTYPES = (torch.bfloat16, torch.float32)


def _force(steps: int) -> None:
    _config.COLUMN_ROW_STEPS = steps
    _row_norm.backward_plan.cache_clear()
    _cuda._backward_plans.clear()


def sweep(log=print) -> list[dict]:
    default, rows = _config.COLUMN_ROW_STEPS, []
    for dtype in DTYPES:
        for n in ROW_LENGTHS:
            for m in ROWS:
                x = torch.randn(m, n, device="cuda").to(dtype)
                dy = torch.randn(m, n, device="cuda").to(dtype)
                w = (1 + 0.1 * torch.randn(n, device="cuda")).to(dtype)
                b = (0.1 * torch.randn(n, device="cuda")).to(dtype)
                _, stats = _forward_impl(x, 1, w, b, 1e-5, rms=False)
                row = {"dtype": str(dtype).split(".")[-1], "N": n, "M": m}
                for name, steps in (("column_us", 1 << 30), ("partial_us", 0)):
                    _force(steps)
                    row[name] = round(_graph_us(lambda: _cuda._cuda_backward(dy, x, w, stats, 1, False, True)), 2)
                plan = _row_norm.backward_plan((m, n), (n, 1), (n, 1), *(_cuda._NUMPY_DTYPE[dtype],) * 3, 1,
                                               False, 0, 0, 0)
                row["row_steps"] = -(-m // (plan.block // _config.COLUMN_LANES))
                log(f"{row['dtype']:8s} N={n:<5d} M={m:<5d} steps={row['row_steps']:<4d} column {row['column_us']:7.2f} us"
                    f"  partial rows {row['partial_us']:7.2f} us")
                rows.append(row)
    _force(default)
    return rows


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__)
