"""cunorm.jax with and without XLA's command buffers (issue 6, benchmarks/NOTES.md v40).

    XLA_PYTHON_CLIENT_PREALLOCATE=false python benchmarks/sweep_jax_cmd_buffer.py [--json out.json]
    XLA_FLAGS="--xla_gpu_graph_min_graph_size=1 --xla_gpu_enable_command_buffer=+CUSTOM_CALL" ...

(At its defaults XLA did not record the one-norm program here; the second form records
every program.)

Three parts, on the GPU JAX sees:
1. Whether a kernel module can be loaded while a stream is captured (CuPy's capture, thread-
   local mode as XLA records): if not, every kernel a recorded callback launches must be
   loaded before XLA records it.
2. LayerNorm inside jit (the GPU check's _bench_jax method, PROGRAM norms a program and one
   a call) with ``_callbacks.COMMAND_BUFFER`` off and on, alternating, and how many times
   the Python callbacks ran per jitted call with it on (0 after the first: replayed).
3. Correctness with it on: the GPU test's jitted forward + backward over DISTINCT_INPUTS
   input buffers (XLA records again for each new address set) against jax.numpy's.
"""
from __future__ import annotations

import os
import sys

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from _jax_command_buffer_probe import count_callbacks, replay_report  # noqa: E402  (the GPU test's)
from _sweep_cli import main  # noqa: E402

ROW_LENGTHS = (512, 1024, 4096, 32768)
ROUNDS = 1  # _bench_jax.bandwidth alternates with the CuPy API itself
DISTINCT_INPUTS = 40


def _capture_probe() -> dict:
    """Load (compile) a module no one loaded before while a stream is captured."""
    import time

    import cupy

    out = {}
    a = cupy.zeros(4, cupy.float32)
    s = cupy.cuda.Stream(non_blocking=True)
    src = 'extern "C" __global__ void probe_%d(float* a) { a[threadIdx.x] += 1.0f; }' % time.time_ns()
    name = src.split("void ")[1].split("(")[0]
    with s:
        s.begin_capture(mode=cupy.cuda.runtime.streamCaptureModeThreadLocal)
        try:
            kernel = cupy.RawKernel(src, name)
            kernel((1,), (4,), (a,))
            cupy.cuda.runtime.pointerGetAttributes(a.data.ptr)
            out["load_in_capture"] = "ok"
        except Exception as err:  # noqa: BLE001 - the probe reports what the driver said
            out["load_in_capture"] = f"{type(err).__name__}: {err}"
        try:
            graph = s.end_capture()
            if out["load_in_capture"] == "ok":
                graph.launch(s)
                s.synchronize()
                out["replayed"] = float(a[0].get()) == 1.0
        except Exception as err:  # noqa: BLE001
            out["end_capture"] = f"{type(err).__name__}: {err}"
    return out


def _callbacks_per_call(calls) -> float:
    import jax
    import jax.numpy as jnp

    import cunorm.jax as cj

    x = jax.random.normal(jax.random.key(1), (4096, 4096)).astype(jnp.bfloat16)
    w, b = jnp.ones(4096, jnp.bfloat16), jnp.zeros(4096, jnp.bfloat16)
    f = jax.jit(lambda x, w, b: cj.layer_norm(x, w, b))
    jax.block_until_ready([f(x, w, b) for _ in range(3)])
    before = calls[0]
    jax.block_until_ready([f(x, w, b) for _ in range(20)])
    return (calls[0] - before) / 20


def sweep() -> list[dict]:
    import jax

    from cunorm import _bench_jax
    from cunorm.jax import _callbacks

    print(f"jax {jax.__version__}, devices {jax.devices()}", flush=True)
    print("capture probe:", _capture_probe(), flush=True)
    calls = count_callbacks()
    rows = []
    for rnd in range(ROUNDS):
        for flag in (False, True):
            _callbacks.COMMAND_BUFFER = flag
            per_call = _callbacks_per_call(calls)
            print(f"round {rnd} command buffer {flag}: {per_call} Python callbacks a jitted call", flush=True)
            for r in _bench_jax.bandwidth(ROW_LENGTHS, log=lambda s: print(s, flush=True)):
                rows.append(dict(r, command_buffer=flag, round=rnd, callbacks_per_call=per_call))
    _callbacks.COMMAND_BUFFER = True
    print("correctness with command buffers:", replay_report(DISTINCT_INPUTS), flush=True)
    print("\n=== fwd / bwd of the CuPy API (in a program [one a call]) ===")
    print(f"{'dtype':9s} {'N':>6s} {'cmdbuf':>6s} {'rnd':>3s} {'fwd':>6s} {'bwd':>6s} {'fwd1':>6s} {'bwd1':>6s} "
          f"{'xla fwd':>7s} {'xla bwd':>7s}")
    for r in rows:
        print(f"{r['dtype']:9s} {r['N']:6d} {str(r['command_buffer']):>6s} {r['round']:3d} "
              f"{r.get('fwd_vs_cupy', 0):6.3f} {r.get('bwd_vs_cupy', 0):6.3f} {r.get('fwd_percall_vs_cupy', 0):6.3f} "
              f"{r.get('bwd_percall_vs_cupy', 0):6.3f} {r['fwd_vs_xla']:7.3f} {r['bwd_vs_xla']:7.3f}")
    return rows


if __name__ == "__main__":
    main(sweep, __doc__)
