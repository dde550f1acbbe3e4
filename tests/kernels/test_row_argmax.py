"""specc.row_argmax, the greedy choice the decoding loop makes: torch.argmax's answer (first
index among equals, first NaN), from specc's C++ kernel once the CPU library is loaded and from
torch before, without building anything."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from specc.kernels.blocked_matmul import vectorized
from specc.kernels.row_argmax import greedy_tokens


@pytest.fixture(scope="module")
def loaded():
    vectorized()   # loads specc's CPU library, which registers the C++ implementation


def _rows(rows: int, n: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    scores = torch.randn(rows, n, generator=torch.Generator().manual_seed(seed)).to(dtype)
    scores[:, n // 2] = scores.max()   # a tie with an earlier maximum, or the maximum itself
    return scores


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [1, 15, 16, 17, 1000, 49152])
def test_it_is_torch_argmax_over_rows_and_single_rows(loaded, dtype, n):
    scores = _rows(3, n, dtype, seed=n)
    assert torch.equal(greedy_tokens(scores), scores.argmax(-1))
    assert greedy_tokens(scores[1]).shape == () and int(greedy_tokens(scores[1])) == int(scores[1].argmax())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_nans_infinities_and_strided_rows_follow_torch(loaded, dtype):
    scores = torch.randn(3, 100).to(dtype)
    scores[0, 37] = scores[0, 80] = float("nan")
    scores[1, 99] = float("inf")
    scores[2] = float("-inf")
    assert torch.equal(greedy_tokens(scores), scores.argmax(-1))
    strided = torch.randn(4, 128).to(dtype)[:, ::2]
    assert torch.equal(greedy_tokens(strided), strided.argmax(-1))


def test_other_dtypes_and_ranks_go_to_torch(loaded):
    for scores in (torch.randn(3, 70).half(), torch.randn(3, 70).double(), torch.randn(2, 3, 70)):
        assert torch.equal(greedy_tokens(scores), scores.argmax(-1))


def test_before_the_library_loads_torch_answers_and_nothing_is_built():
    script = ("import torch, specc.kernels.cpu.build as b\n"
              "from specc.kernels.row_argmax import greedy_tokens\n"
              "s = torch.tensor([[1., 3., 3.], [2., 0., 5.]]).bfloat16()\n"
              "assert greedy_tokens(s).tolist() == [1, 2]\n"
              "assert b.load_library.cache_info().currsize == 0\n")
    subprocess.run([sys.executable, "-c", script], check=True)
