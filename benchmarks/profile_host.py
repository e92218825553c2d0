"""Host overhead of one small call, per layer: CuPy API, torch custom op, torch functional.
Prints wall microseconds per call and the top functions of a cProfile of the torch path.

    python benchmarks/profile_host.py
"""
from __future__ import annotations

import cProfile
import pstats

import cupy
import numpy
import torch

import cunorm
import cunorm.torch as ct
from cunorm._bench_torch import _wall_us as wall_us  # the GPU check's own wall-time method
from cunorm._checks import BFLOAT16


def main():
    n = 4096
    xt = torch.randn(64, n, device="cuda", dtype=torch.bfloat16)
    wt = torch.ones(n, device="cuda", dtype=torch.bfloat16)
    xc = cupy.asarray(numpy.random.standard_normal((64, n)).astype(BFLOAT16))
    wc = cupy.ones(n, BFLOAT16)
    xg = xt.clone().requires_grad_()
    dy = torch.randn_like(xt)
    from cupy_backends.cuda.api import runtime

    from cunorm import _launch
    from cunorm.ops import _row_norm

    ct.layer_norm(xt, (n,), wt, wt)
    plan = next(iter(_row_norm._calls.values()))
    out = torch.empty_like(xt)
    args = (xt.data_ptr(), *plan[3], out.data_ptr(), wt.data_ptr(), wt.data_ptr(), 0, 0, 0, 0, *plan[4])
    stream = torch.cuda.current_stream().cuda_stream
    cases = {
        "runtime.setDevice": lambda: runtime.setDevice(0),
        "torch current_device": lambda: torch.cuda.current_device(),
        "raw stream": lambda: ct._stream(xt.device),
        "launch (plan)": lambda: _launch.launch(plan[0], plan[1], plan[2], args, stream),
        "_row_norm.forward": lambda: _row_norm.forward(ct._view(xt), ct._view(wt), ct._view(wt), out.data_ptr(), 0, 0,
                                                       1e-5, 1, False, None, stream, 0),
        "_cuda_forward no stats": lambda: ct._cuda_forward(xt, 1, wt, wt, 1e-5, False, False),
        "cupy api": lambda: cunorm.layer_norm(xc, wc, wc),
        "torch.empty": lambda: torch.empty(64, n, device="cuda"),
        "views x3": lambda: [ct._view(xt) for _ in range(3)],
        "current_stream": lambda: torch.cuda.current_stream(xt.device).cuda_stream,
        "custom op fwd": lambda: torch.ops.cunorm.layer_norm_fwd(xt, 1, wt, wt, 1e-5),
        "_cuda_forward stats": lambda: ct._cuda_forward(xt, 1, wt, wt, 1e-5, False),
        "ct.layer_norm no-grad": lambda: ct.layer_norm(xt, (n,), wt, wt),
        "F.layer_norm no-grad": lambda: torch.nn.functional.layer_norm(xt, (n,), wt, wt),
        "ct.layer_norm fwd+bwd": lambda: ct.layer_norm(xg, (n,), wt, wt).backward(dy),
        "F.layer_norm fwd+bwd": lambda: torch.nn.functional.layer_norm(xg, (n,), wt, wt).backward(dy),
    }
    for name, fn in cases.items():
        print(f"{name:24s} {wall_us(fn):8.1f} us/call", flush=True)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(200):
        ct.layer_norm(xg, (n,), wt, wt).backward(dy)
    torch.cuda.synchronize()
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
