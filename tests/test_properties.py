"""Property tests (issue 8): hypothesis draws shapes (1, primes, odd and power-of-two row
lengths), layouts (row strides, reversed rows, transposed leading axes, a strided last axis,
a pointer misaligned by one element), dtypes and affine options, and each draw runs forward
and backward on the GPU against the float64 reference (norm_cases.check). A fixed budget of
examples runs in the GPU check; the seed is derandomized so a failure reproduces."""
from __future__ import annotations

import numpy
import pytest

hypothesis = pytest.importorskip("hypothesis", reason="hypothesis is not installed (pip install hypothesis)")
from hypothesis import given, settings, strategies as st  # noqa: E402

from cunorm._checks import BFLOAT16  # noqa: E402
from norm_cases import VIEWS, check  # noqa: E402

pytestmark = pytest.mark.gpu

LENGTHS = st.one_of(st.sampled_from([1, 7, 8, 499, 512, 1533, 2048, 2049, 4096, 8191, 65536, 65537]),
                    st.integers(1, 5000))
MAX_ELEMENTS = 1_000_000  # the float64 reference runs on the host, one draw after another


@st.composite
def shapes(draw):
    """(rows, length): rows from 1, primes and odd counts, at most MAX_ELEMENTS in all."""
    n = draw(LENGTHS)
    cap = max(1, MAX_ELEMENTS // n)
    m = draw(st.one_of(st.sampled_from([r for r in (1, 2, 7, 31, 127, 499, 2049) if r <= cap]),
                       st.integers(1, min(600, cap))))
    return m, n


DTYPES = st.sampled_from([numpy.dtype(numpy.float32), numpy.dtype(numpy.float16), BFLOAT16,
                          numpy.dtype(numpy.float64)])
# one test item runs its draws serially (xdist does not spread it): the budget bounds its time
BUDGET = settings(max_examples=50, deadline=None, derandomize=True, print_blob=True)


@BUDGET
@given(op=st.sampled_from(["layer_norm", "rms_norm"]), shape=shapes(), dtype=DTYPES,
       view=st.sampled_from(sorted(VIEWS)), weight=st.booleans(), bias=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_row_norms_match_the_reference(op, shape, dtype, view, weight, bias, seed):
    check(op, numpy.random.default_rng(seed), shape, dtype, weight=weight, bias=bias, view=view)
