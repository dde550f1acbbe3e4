"""Which triton/numpy pairs the interpreter refuses, and how."""

from __future__ import annotations

import pytest

from specc.errors import SpeccError
from specc.kernels import dispatch


def releases(triton: tuple[int, int], numpy: tuple[int, int]):
    return lambda distribution: {"triton": triton, "numpy": numpy}[distribution]


@pytest.mark.parametrize("triton, numpy, refused", [((3, 6), (2, 4), True), ((3, 6), (2, 3), False),
                                                    ((3, 7), (2, 4), False)])
def test_only_triton_3_6_with_numpy_2_4_is_refused(monkeypatch, triton, numpy, refused):
    monkeypatch.setattr(dispatch, "_release", releases(triton, numpy))
    assert (dispatch.interpreter_incompatibility() is not None) == refused


def test_the_refusal_names_its_fix(monkeypatch, triton_kernels):
    monkeypatch.setattr(dispatch, "_release", releases((3, 6), (2, 4)))
    with pytest.raises(SpeccError, match=r"pip install 'numpy<2.4'"):
        triton_kernels("tree_attention")
