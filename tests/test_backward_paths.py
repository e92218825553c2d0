"""The backward's two full-row paths, for both ops, at the row count where the dispatcher
switches: few rows take the one-launch column kernel (dx blocks plus dW/dB column blocks),
more rows the persistent partial-row kernel and its reduction."""
from __future__ import annotations

import numpy
import pytest

from norm_cases import DTYPE_IDS, DTYPES, VIEWS, check, column_backward_edge

pytestmark = pytest.mark.gpu
OPS = ["layer_norm", "rms_norm"]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("n", [7, 1024, 4096])
def test_column_backward_edge(rng, op, dtype, n):
    column_backward_edge(op, rng, n, dtype)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("view", sorted(VIEWS))
def test_views_partial_row_backward(rng, op, view):
    # 1025 rows: past the column backward, the views through the partial-row path
    check(op, rng, (41, 25, 1536), numpy.float32, view=view)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", [d for d in DTYPES if numpy.dtype(d).itemsize == 2],
                         ids=[i for d, i in zip(DTYPES, DTYPE_IDS) if numpy.dtype(d).itemsize == 2])
@pytest.mark.parametrize("n", [520, 2048, 4096])
def test_staged_partial_row_backward_walks_many_rows(rng, op, dtype, n):
    """Half-precision rows staged through shared memory (next row copied during this one's
    reductions): enough rows that every persistent group walks many, including the last
    step's stage of rows past M. N = 520 (65 packs of 8) leaves the tile's last packs past the
    row: zero-filled copies."""
    from cunorm.ops import _row_norm

    assert _row_norm.STAGE_BACKWARD
    check(op, rng, (4099, n), dtype)  # H200: 528-1056 resident groups at these N
