"""JAX adapter measurements for the GPU check: LayerNorm inside jax.jit at the benchmark's
shapes, next to the CuPy API's bandwidth and to XLA's own fused jax.numpy LayerNorm (the
peer a JAX user has). Same bytes model as _bench; time per call is wall time over a run of
asynchronously dispatched calls (the median of SAMPLES runs), which the GPU bounds at these
sizes when the host keeps up. The CuPy API is timed here the same way (PROGRAM x CALLS calls a
run), not by the benchmark's kernel time: a run's wall time also holds its first dispatch
and its final synchronisation, which both sides then pay alike (NOTES v54)."""
from __future__ import annotations

import statistics
import time

import numpy

CALLS = 20
SAMPLES = 5
# Each shape's CuPy API and JAX numbers come from ROUNDS turns each, alternating, and keep
# their medians: with one turn each, the same sources read 0.92-1.06 of the CuPy API at
# one shape from one run to the next (benchmarks/NOTES.md v31, v40).
ROUNDS = 3


def _wall_ms(fn, *args, calls: int = CALLS, block=None) -> float:
    block = block or _block
    for _ in range(3):
        out = fn(*args)
    block(out)
    samples = []
    for _ in range(SAMPLES):
        t0 = time.perf_counter()
        for _ in range(calls):
            out = fn(*args)
        block(out)
        samples.append((time.perf_counter() - t0) / calls * 1e3)
    return statistics.median(samples)


def _block(out):
    import jax

    jax.block_until_ready(out)


def _cupy_block(out):
    import cupy

    cupy.cuda.get_current_stream().synchronize()


def _xla_layer_norm(x, w, b, eps=1e-5):
    import jax
    import jax.numpy as jnp

    xf = x.astype(jnp.float32)
    mean = xf.mean(-1, keepdims=True)
    var = ((xf - mean) ** 2).mean(-1, keepdims=True)
    return ((xf - mean) * jax.lax.rsqrt(var + eps) * w + b).astype(x.dtype)


# Norms one jitted program runs, each on its own input, for the in-program numbers: inside a
# model's jit, XLA runs each callback between other kernels without a dispatch of its own; a
# one-op jit charges a whole JAX dispatch (~40 us on the H200 host, benchmarks/NOTES.md v8)
# to every call. Independent inputs, not a chain: XLA ran 8 chained jax.numpy LayerNorms
# faster than 8 separate ones can move their bytes (our time / XLA's 0.28-0.56 where single
# calls read 0.8-1.2, the first try), so a chain does not measure one LayerNorm.
PROGRAM = 4


def _programs():
    """(ours per call fwd, bwd; ours PROGRAM-wide fwd, bwd; XLA PROGRAM-wide fwd, bwd),
    jitted; the wide ones take and return tuples."""
    import jax

    import cunorm.jax as cj

    def ours_bwd(dy, x, w, mean, rstd):
        return cj._backward(dy, x, w, (mean, rstd), 1, False, True)

    def wide_fwd(f):
        return jax.jit(lambda xs, w, b: tuple(f(x, w, b) for x in xs))

    def wide_ours_bwd(dys, xs, w, stats):
        return tuple(ours_bwd(dy, x, w, *st) for dy, x, st in zip(dys, xs, stats))

    def wide_xla_bwd(dys, xs, w, b):
        return tuple(jax.vjp(_xla_layer_norm, x, w, b)[1](dy) for dy, x in zip(dys, xs))

    def ours_fwd(x, w, b):
        return cj.layer_norm(x, w, b)

    return (jax.jit(ours_fwd), jax.jit(ours_bwd), wide_fwd(ours_fwd), jax.jit(wide_ours_bwd),
            wide_fwd(_xla_layer_norm), jax.jit(wide_xla_bwd))


def bandwidth(row_lengths=None, log=print) -> list[dict]:
    """LayerNorm inside jit at every row length of the CuPy benchmark (unless told otherwise):
    ``fwd_GBps``/``bwd_GBps`` with PROGRAM norms in one jitted program (against XLA's the same
    way), ``*_percall_GBps`` with one norm per jitted call; ``*_vs_cupy`` against the CuPy
    API's bandwidth at the same shape (``cupy_*_GBps``, timed as the JAX runs are), each the
    median of ROUNDS turns taken alternately with the JAX programs' (the GPU drifts: with one
    turn each, one shape read 0.92-1.06 of the CuPy API from one run to the next,
    benchmarks/NOTES.md v31, v40)."""
    import jax
    import jax.numpy as jnp

    import cunorm.jax as cj

    from ._bench import ROW_LENGTHS, TOTAL_ELEMENTS, add_vs_cupy, row_norm_calls
    from ._checks import BFLOAT16

    row_lengths = row_lengths or ROW_LENGTHS
    fwd_call, bwd_call, fwd_ours, bwd_ours, fwd_xla, bwd_xla = _programs()
    out = []
    for dtype, name in ((jnp.bfloat16, "bfloat16"), (jnp.float32, "float32")):
        for n in row_lengths:
            m = TOTAL_ELEMENTS // n
            keys = jax.random.split(jax.random.key(0), 2 * PROGRAM)
            xs = tuple(jax.random.normal(keys[i], (m, n)).astype(dtype) for i in range(PROGRAM))
            dys = tuple(jax.random.normal(keys[PROGRAM + i], (m, n)).astype(dtype) for i in range(PROGRAM))
            w, b = jnp.ones(n, dtype), jnp.zeros(n, dtype)
            stats_of = jax.jit(lambda x, w, b: cj._forward(x, w, b, 1e-5, 1, False)[1])
            stats = tuple(stats_of(x, w, b) for x in xs)
            x, dy, (mean, rstd) = xs[0], dys[0], stats[0]
            s = x.dtype.itemsize
            f_bytes, b_bytes = 2 * m * n * s, 3 * m * n * s
            timed = {"fwd_GBps": (PROGRAM * f_bytes, lambda: _wall_ms(fwd_ours, xs, w, b)),
                     "bwd_GBps": (PROGRAM * b_bytes, lambda: _wall_ms(bwd_ours, dys, xs, w, stats)),
                     "xla_fwd_GBps": (PROGRAM * f_bytes, lambda: _wall_ms(fwd_xla, xs, w, b)),
                     "xla_bwd_GBps": (PROGRAM * b_bytes, lambda: _wall_ms(bwd_xla, dys, xs, w, b)),
                     "fwd_percall_GBps": (f_bytes, lambda: _wall_ms(fwd_call, x, w, b)),
                     "bwd_percall_GBps": (b_bytes, lambda: _wall_ms(bwd_call, dy, x, w, mean, rstd))}
            cupy_fwd, cupy_bwd, _, _ = row_norm_calls("layer_norm", BFLOAT16 if name == "bfloat16" else numpy.float32, n)
            wide = PROGRAM * CALLS  # as many norms a run as the in-program JAX numbers
            timed["cupy_fwd_GBps"] = (f_bytes, lambda: _wall_ms(cupy_fwd, calls=wide, block=_cupy_block))
            timed["cupy_bwd_GBps"] = (b_bytes, lambda: _wall_ms(cupy_bwd, calls=wide, block=_cupy_block))
            samples = {key: [] for key in timed}
            for _ in range(ROUNDS):  # the CuPy API and the JAX programs take turns (the GPU drifts)
                for key, (nbytes, measure) in timed.items():
                    samples[key].append(nbytes / measure() / 1e6)
            row = {"op": "layer_norm", "dtype": name, "M": m, "N": n, "program": PROGRAM, "rounds": ROUNDS,
                   **{key: round(statistics.median(v), 1) for key, v in samples.items()}}
            del xs, dys, stats, cupy_fwd, cupy_bwd
            add_vs_cupy(row, [{"op": "layer_norm", "dtype": name, "N": n, "fwd_GBps": row["cupy_fwd_GBps"],
                               "bwd_GBps": row["cupy_bwd_GBps"]}])
            for kind in ("fwd", "bwd"):
                if f"{kind}_vs_cupy" in row:
                    row[f"{kind}_percall_vs_cupy"] = round(
                        row[f"{kind}_vs_cupy"] * row[f"{kind}_percall_GBps"] / row[f"{kind}_GBps"], 3)
            row["fwd_vs_xla"] = round(row["fwd_GBps"] / row["xla_fwd_GBps"], 3)
            row["bwd_vs_xla"] = round(row["bwd_GBps"] / row["xla_bwd_GBps"], 3)
            log(f"jax {name} N={n}: in a program fwd {row['fwd_GBps']} GB/s ({row.get('fwd_vs_cupy')} of CuPy API, "
                f"x{row['fwd_vs_xla']} XLA), bwd {row['bwd_GBps']} GB/s ({row.get('bwd_vs_cupy')}, "
                f"x{row['bwd_vs_xla']} XLA); one per call fwd {row['fwd_percall_GBps']}, "
                f"bwd {row['bwd_percall_GBps']} GB/s")
            out.append(row)
    return out
