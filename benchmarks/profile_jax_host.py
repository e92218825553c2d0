"""Host cost of cunorm.jax's buffer callback, taken apart (issue 6: the bf16 forward inside
jit is host-bound at 0.58 of the CuPy API's bandwidth for N = 1024 / 4096).

    XLA_PYTHON_CLIENT_PREALLOCATE=false python benchmarks/profile_jax_host.py

Prints wall microseconds per call of each step the GPU forward callback takes (pointer
queries, device query, views, the plan lookup and launch), then jitted calls of cunorm's and
XLA's LayerNorm on a small and a large shape, and a cProfile of the callbacks as XLA runs
them. Runs on the GPU JAX sees (falls back to the CPU path, with a note, without one).
"""
from __future__ import annotations

import cProfile
import io
import pstats
import time

import jax
import jax.numpy as jnp

import cunorm.jax as cj
from cunorm.jax import _callbacks


def wall_us(fn, calls=200) -> float:
    out = None
    for _ in range(5):
        out = fn()
    jax.block_until_ready(out)
    t0 = time.perf_counter()
    for _ in range(calls):
        out = fn()
    jax.block_until_ready(out)
    return (time.perf_counter() - t0) / calls * 1e6


def xla_layer_norm(x, w, b):
    xf = x.astype(jnp.float32)
    mean = xf.mean(-1, keepdims=True)
    var = ((xf - mean) ** 2).mean(-1, keepdims=True)
    return ((xf - mean) * jax.lax.rsqrt(var + 1e-5) * w + b).astype(x.dtype)


def callback_steps(x):
    """The GPU forward callback's steps on a real device array (outside XLA: the same Python)."""
    from cunorm.jax._callbacks import _device_of, _view

    ptr = x.unsafe_buffer_pointer()
    cases = {
        "_device_of (cudaPointerGetAttributes)": lambda: _device_of(ptr),
        "_view": lambda: _view(ptr, x.shape, x.dtype),
        "ExecutionStage import": lambda: __import__("jax.experimental.buffer_callback", fromlist=["x"]),
    }
    for name, fn in cases.items():
        t0 = time.perf_counter()
        for _ in range(1000):
            fn()
        print(f"{name:40s} {(time.perf_counter() - t0) * 1e3:8.2f} us/call")


def main():
    try:
        device = jax.devices("gpu")[0]
    except RuntimeError:
        device = jax.devices("cpu")[0]
        print("note: JAX sees no GPU; timing the CPU path on the small shape")
    with jax.default_device(device):
        shapes = ((64, 1024), (65536, 1024)) if device.platform == "gpu" else ((64, 1024),)
        for m, n in shapes:
            x = jax.random.normal(jax.random.key(0), (m, n)).astype(jnp.bfloat16)
            w, b = jnp.ones(n, jnp.bfloat16), jnp.zeros(n, jnp.bfloat16)
            ours = jax.jit(lambda x, w, b: cj.layer_norm(x, w, b))
            xla = jax.jit(xla_layer_norm)
            print(f"--- ({m}, {n}) bf16: jit cunorm {wall_us(lambda: ours(x, w, b)):8.1f} us/call, "
                  f"jit XLA {wall_us(lambda: xla(x, w, b)):8.1f} us/call")
        if device.platform == "gpu":
            callback_steps(x)
        prof = cProfile.Profile()
        forward = _callbacks.forward

        def profiled(*args):
            body = forward(*args)

            def callback(*a):
                prof.enable()
                try:
                    return body(*a)
                finally:
                    prof.disable()
            return callback

        _callbacks.forward = profiled
        try:
            f = jax.jit(lambda x, w, b: cj.layer_norm(x, w, b) * 1)  # a new trace picks up the wrapper
            wall_us(lambda: f(x, w, b), calls=100)
        finally:
            _callbacks.forward = forward
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(15)
        print(s.getvalue())


if __name__ == "__main__":
    main()
