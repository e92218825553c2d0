"""Fifty-first session: the check's benchmark read bf16 NHWC (128, 64, 112, 112)'s forward at
0.568 of copy while sweep_bn_variants.py (the same _cupy_case, its own process) read 0.577-0.582
for the same sources. This times that case alone three times, then after the torch and
torch.compile cases of the same shape (as the benchmark runs them, in one process), then
alone again, as fractions of the copy measured here.

    python benchmarks/probe_bn_bench_vs_sweep.py
"""
from __future__ import annotations

from cunorm import _bench
from cunorm._bench_bn import _cupy_case, _torch_case
from cunorm._checks import BFLOAT16
from sweep_bn_config import _gbps  # benchmarks/ is the script's directory

SHAPE = (128, 64, 112, 112)


def cupy_rounds(label: str, copy: float, rounds: int = 3) -> None:
    for _ in range(rounds):
        f, b = _gbps(SHAPE, BFLOAT16, *_cupy_case(SHAPE, BFLOAT16, True)[:2])
        print(f"{label:24s} fwd {f / copy:.3f} bwd {b / copy:.3f}", flush=True)


def main() -> None:
    import torch

    copy = _bench.copy_gbps()
    print(f"copy {copy:.1f} GB/s")
    cupy_rounds("alone", copy)
    print("torch case (eager, compile):", _torch_case(SHAPE, torch.bfloat16, True), flush=True)
    cupy_rounds("after torch", copy)
    torch.cuda.empty_cache()
    cupy_rounds("after empty_cache", copy)


if __name__ == "__main__":
    main()
