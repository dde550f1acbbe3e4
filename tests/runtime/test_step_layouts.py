"""specc.runtime.step_layouts: a one-row step's layout as views is `chunk_layout`'s, value for value."""

from __future__ import annotations

import pytest
import torch

from specc.runtime.cached_model import chunk_layout
from specc.runtime.step_layouts import OneRowLayouts


@pytest.mark.parametrize("max_seq_len", [1, 5, 64, 65, 130, 300])
def test_every_position_has_chunk_layouts_positions_slots_and_padded_mask(max_seq_len):
    layouts = OneRowLayouts(max_seq_len, "cpu")
    for start in range(max_seq_len):
        made = layouts.layout(start)
        expected = chunk_layout(start, 1, "cpu", max_seq_len)
        for got, want in zip(made, expected):
            assert got.shape == want.shape and got.dtype == want.dtype and torch.equal(got, want)
        assert made[2].is_contiguous()


def test_each_grad_mode_gets_views_of_its_own_kind_of_tensor():
    layouts = OneRowLayouts(8, "cpu")
    with torch.inference_mode():
        inside = layouts.layout(3)
        assert all(t.is_inference() for t in inside)   # as chunk_layout's there: compiled graphs' guards compare them
    outside = layouts.layout(3)
    assert not any(t.is_inference() for t in outside)
    assert all(torch.equal(a, b) for a, b in zip(inside, outside))


def test_a_row_past_the_cache_is_refused():
    with pytest.raises(ValueError, match="does not fit 8 cache slots"):
        OneRowLayouts(8, "cpu").layout(8)
