"""JAX adapter measurements for the GPU check: LayerNorm inside jax.jit at the benchmark's
shapes, next to the CuPy API's bandwidth and to XLA's own fused jax.numpy LayerNorm (the
peer a JAX user has). Same bytes model as _bench; time per call is wall time over a run of
asynchronously dispatched calls (the median of SAMPLES runs), which the GPU bounds at these
sizes when the host keeps up."""
from __future__ import annotations

import statistics
import time

CALLS = 20
SAMPLES = 5


def _wall_ms(fn, *args) -> float:
    for _ in range(3):
        out = fn(*args)
    _block(out)
    samples = []
    for _ in range(SAMPLES):
        t0 = time.perf_counter()
        for _ in range(CALLS):
            out = fn(*args)
        _block(out)
        samples.append((time.perf_counter() - t0) / CALLS * 1e3)
    return statistics.median(samples)


def _block(out):
    import jax

    jax.block_until_ready(out)


def _xla_layer_norm(x, w, b, eps=1e-5):
    import jax
    import jax.numpy as jnp

    xf = x.astype(jnp.float32)
    mean = xf.mean(-1, keepdims=True)
    var = ((xf - mean) ** 2).mean(-1, keepdims=True)
    return ((xf - mean) * jax.lax.rsqrt(var + eps) * w + b).astype(x.dtype)


def bandwidth(cupy_rows: list[dict], row_lengths=None, log=print) -> list[dict]:
    """Every row length of the CuPy benchmark unless told otherwise."""
    import jax
    import jax.numpy as jnp

    import cunorm.jax as cj

    from ._bench import ROW_LENGTHS, TOTAL_ELEMENTS, add_vs_cupy

    row_lengths = row_lengths or ROW_LENGTHS
    fwd_ours = jax.jit(lambda x, w, b: cj.layer_norm(x, w, b))
    bwd_ours = jax.jit(lambda dy, x, w, mean, rstd: cj._backward(dy, x, w, (mean, rstd), 1, False, True))
    fwd_xla = jax.jit(_xla_layer_norm)
    bwd_xla = jax.jit(lambda x, w, b, dy: jax.vjp(_xla_layer_norm, x, w, b)[1](dy))
    out = []
    for dtype, name in ((jnp.bfloat16, "bfloat16"), (jnp.float32, "float32")):
        for n in row_lengths:
            m = TOTAL_ELEMENTS // n
            k = jax.random.split(jax.random.key(0), 2)
            x = jax.random.normal(k[0], (m, n)).astype(dtype)
            dy = jax.random.normal(k[1], (m, n)).astype(dtype)
            w, b = jnp.ones(n, dtype), jnp.zeros(n, dtype)
            _, (mean, rstd) = jax.jit(lambda x, w, b: cj._forward(x, w, b, 1e-5, 1, False))(x, w, b)
            s = x.dtype.itemsize
            f_bytes, b_bytes = 2 * m * n * s, 3 * m * n * s
            row = {"op": "layer_norm", "dtype": name, "M": m, "N": n,
                   "fwd_GBps": round(f_bytes / _wall_ms(fwd_ours, x, w, b) / 1e6, 1),
                   "bwd_GBps": round(b_bytes / _wall_ms(bwd_ours, dy, x, w, mean, rstd) / 1e6, 1),
                   "xla_fwd_GBps": round(f_bytes / _wall_ms(fwd_xla, x, w, b) / 1e6, 1),
                   "xla_bwd_GBps": round(b_bytes / _wall_ms(bwd_xla, x, w, b, dy) / 1e6, 1)}
            add_vs_cupy(row, cupy_rows)
            row["fwd_vs_xla"] = round(row["fwd_GBps"] / row["xla_fwd_GBps"], 3)
            row["bwd_vs_xla"] = round(row["bwd_GBps"] / row["xla_bwd_GBps"], 3)
            log(f"jax {name} N={n}: fwd {row['fwd_GBps']} GB/s ({row.get('fwd_vs_cupy')} of CuPy API, "
                f"x{row['fwd_vs_xla']} XLA), bwd {row['bwd_GBps']} GB/s ({row.get('bwd_vs_cupy')}, "
                f"x{row['bwd_vs_xla']} XLA)")
            out.append(row)
    return out
