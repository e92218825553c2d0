"""Fresh-interpreter probe for tests/test_jax.py: cunorm.jax inside a jitted program that XLA
records into a command buffer (the caller sets XLA_FLAGS so that even a small program is
recorded). Prints one JSON line: the worst relative errors of y, dx and dweight against a
pure-jax.numpy LayerNorm over many distinct input buffers (XLA re-records when addresses
change), and how many Python callbacks each of REPLAYS calls on one input ran."""
from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy  # noqa: E402

import cunorm.jax as cj  # noqa: E402
from cunorm.jax import _callbacks  # noqa: E402

DISTINCT = 20
REPLAYS = 10


def _jnp_layer_norm(x, w, b, eps=1e-5):
    xf = x.astype(jnp.float32)
    mean = xf.mean(-1, keepdims=True)
    var = ((xf - mean) ** 2).mean(-1, keepdims=True)
    return (((xf - mean) * jax.lax.rsqrt(var + eps)) * w + b).astype(x.dtype)


def _rel(a, b) -> float:
    a, b = numpy.asarray(a, numpy.float64), numpy.asarray(b, numpy.float64)
    return float(numpy.linalg.norm(a - b) / numpy.linalg.norm(b))


def count_callbacks() -> list:
    """[number of callback runs so far], counted from now on: wraps _callbacks._executing,
    which every callback asks first."""
    calls = [0]
    inner = _callbacks._executing

    def counting(ctx):
        calls[0] += 1
        return inner(ctx)

    _callbacks._executing = counting
    return calls


def replay_report(distinct: int = DISTINCT, m: int = 7, n: int = 1533, dtype=jnp.float32) -> dict:
    """A jitted forward + backward of cunorm's LayerNorm against jax.numpy's over ``distinct``
    input buffers of (m, n) ``dtype``, visited forward then backward, and the callbacks a
    replay of one input runs (counted from the first call on)."""
    calls = count_callbacks()
    keys = jax.random.split(jax.random.key(0), distinct + 3)
    xs = [(jax.random.normal(k, (m, n)) * 2 + 0.5).astype(dtype) for k in keys[:distinct]]
    w = 1 + 0.1 * jax.random.normal(keys[-3], (n,))
    b = 0.1 * jax.random.normal(keys[-2], (n,))
    dy = jax.random.normal(keys[-1], (m, n)).astype(dtype)

    def program(norm):
        def step(x, w, b):
            y, vjp = jax.vjp(norm, x, w, b)
            return (y, *vjp(dy))
        return jax.jit(step)

    ours, theirs = program(cj.layer_norm), program(_jnp_layer_norm)
    worst = {"y": 0.0, "dx": 0.0, "dweight": 0.0, "dbias": 0.0}
    for order in (xs, xs[::-1]):
        for x in order:
            for name, got, want in zip(worst, ours(x, w, b), theirs(x, w, b)):
                worst[name] = max(worst[name], _rel(got, want))
    jax.block_until_ready([ours(xs[0], w, b) for _ in range(3)])
    per_replay = []
    for _ in range(REPLAYS):
        before = calls[0]
        jax.block_until_ready(ours(xs[0], w, b))
        per_replay.append(calls[0] - before)
    return {"distinct_inputs": distinct, "worst": worst, "callbacks_per_replay": per_replay,
            "platform": jax.devices()[0].platform}


def main():
    # argument "long-rows": bf16 rows of 262152, whose backward is a cooperative launch (the
    # grid rows, v79; past sixteen wide blocks, v115) recorded into the command buffer
    if sys.argv[1:] == ["long-rows"]:
        print(json.dumps(replay_report(distinct=4, m=2, n=262152, dtype=jnp.bfloat16)))
    else:
        print(json.dumps(replay_report()))


if __name__ == "__main__":
    main()
