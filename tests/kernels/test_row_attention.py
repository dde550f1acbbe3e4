"""specc.row_attention, the attention of quantized CPU engines: it computes PyTorch's masked
attention, and each row is the same bits whatever the call's other rows, hidden keys or threads."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from specc.host.threads import torch_threads
from specc.kernels import row_attention as kernel

HEADS, KV_HEADS, DIM, SLOTS = 6, 2, 40, 70   # a head_dim that is not a multiple of 16 takes the masked lanes


def _inputs(rows: int, keys: int, dtype=torch.float32, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    query = torch.randn(1, HEADS, rows, DIM, generator=g).to(dtype)
    cache_k, cache_v = (torch.randn(1, KV_HEADS, SLOTS, DIM, generator=g).to(dtype) for _ in range(2))
    mask = torch.rand(1, 1, rows, keys, generator=g) > 0.3
    return query, cache_k[:, :, :keys], cache_v[:, :, :keys], mask   # keys: views of a wider cache, as in engines


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
def test_it_computes_masked_attention(dtype, tolerance):
    query, key, value, mask = _inputs(5, 33, dtype)
    want = F.scaled_dot_product_attention(query.double(), key.double(), value.double(), attn_mask=mask,
                                          scale=0.3, enable_gqa=True)
    got = torch.ops.specc.row_attention(query, key, value, mask, 0.3)
    assert got.dtype == dtype and got.shape == query.shape
    torch.testing.assert_close(got.double(), want, rtol=tolerance, atol=tolerance)


def test_the_default_scale_is_one_over_the_root_of_head_dim():
    query, key, value, mask = _inputs(2, 9)
    torch.testing.assert_close(torch.ops.specc.row_attention(query, key, value, mask),
                               F.scaled_dot_product_attention(query, key, value, attn_mask=mask, enable_gqa=True))


def test_a_row_is_the_same_bits_in_calls_of_any_size_hidden_keys_and_threads():
    query, key, value, mask = _inputs(6, 40, torch.bfloat16)
    with torch_threads(2):
        together = torch.ops.specc.row_attention(query, key, value, mask, None)
    wider_key, wider_value = (t.as_strided((1, KV_HEADS, 64, DIM), t.stride()) for t in (key, value))
    hidden = torch.cat([mask, torch.zeros(1, 1, 6, 24, dtype=torch.bool)], dim=-1)
    with torch_threads(1):
        for r in range(6):
            alone = torch.ops.specc.row_attention(query[:, :, r:r + 1], key, value, mask[:, :, r:r + 1], None)
            assert torch.equal(alone, together[:, :, r:r + 1])
        assert torch.equal(torch.ops.specc.row_attention(query, wider_key, wider_value, hidden, None), together)


@pytest.mark.parametrize("dim", [40, 64])
def test_a_key_scores_the_same_bits_whichever_group_it_is_summed_in(dim):
    """Keys are scored 16, 4 or 1 at a time; 21 copies of one key take all three ways, and
    with one-hot values each copy's weight shows in the output: equal scores, equal outputs."""
    g = torch.Generator().manual_seed(3)
    keys, rows = 21, 32   # a differently grouped sum rounds differently for some of the rows' queries
    query = torch.randn(1, 1, rows, dim, generator=g) * 4
    key = torch.randn(1, 1, 1, dim, generator=g).expand(1, 1, keys, dim).contiguous()
    value = torch.eye(keys, dim)[None, None]
    mask = torch.ones(1, 1, rows, keys, dtype=torch.bool)
    out = torch.ops.specc.row_attention(query, key, value, mask, None)[0, 0, :, :keys]
    assert all(torch.unique(row).numel() == 1 for row in out)


def _long_inputs(rows: int, keys: int = 200, seed: int = 1, dim: int = DIM):
    """Keys over several of the kernel's 64-key chunks, some chunks wholly hidden from some rows."""
    g = torch.Generator().manual_seed(seed)
    query = torch.randn(1, HEADS, rows, dim, generator=g).bfloat16()
    key, value = (torch.randn(1, KV_HEADS, keys, dim, generator=g).bfloat16() for _ in range(2))
    mask = torch.rand(1, 1, rows, keys, generator=g) > 0.3
    mask[:, :, 0, 64:128] = False
    return query, key, value, mask


@pytest.mark.parametrize("dim", [40, 64])   # 64: whole 16-lane blocks, the sums held in registers
def test_keys_over_several_chunks_give_masked_attention(dim):
    query, key, value, mask = _long_inputs(5, dim=dim)
    want = F.scaled_dot_product_attention(query.double(), key.double(), value.double(), attn_mask=mask,
                                          enable_gqa=True)
    torch.testing.assert_close(torch.ops.specc.row_attention(query, key, value, mask, None).double(), want,
                               rtol=1e-2, atol=1e-2)


def test_a_row_is_the_same_bits_whether_the_threads_share_its_chunks_or_take_whole_rows():
    """A one-row call splits the row's chunks over the threads; a call of many rows gives each
    thread whole rows; the chunks' summaries combine in the same order either way."""
    query, key, value, mask = _long_inputs(12)
    with torch_threads(2):
        together = torch.ops.specc.row_attention(query, key, value, mask, None)
        for r in (0, 5, 11):
            alone = torch.ops.specc.row_attention(query[:, :, r:r + 1], key, value, mask[:, :, r:r + 1], None)
            assert torch.equal(alone, together[:, :, r:r + 1])


@pytest.mark.parametrize("dim, keys", [(40, 200), (64, 200), (128, 77)])
def test_heads_that_share_a_mask_compute_the_bits_of_heads_masked_one_by_one(dim, keys):
    """Query heads of one kv head read its keys together when their mask is one tensor; with a
    mask given per head (here the same values) each head is computed alone: the bits agree."""
    query, key, value, mask = _long_inputs(3, keys, dim=dim)
    per_head = mask.expand(1, HEADS, 3, mask.shape[-1]).contiguous()
    assert torch.equal(torch.ops.specc.row_attention(query, key, value, mask, None),
                       torch.ops.specc.row_attention(query, key, value, per_head, None))


def test_a_row_that_may_see_no_key_is_zeros():
    query, key, value, mask = _inputs(3, 8)
    mask[:, :, 1] = False
    out = torch.ops.specc.row_attention(query, key, value, mask, None)
    assert torch.equal(out[:, :, 1], torch.zeros_like(out[:, :, 1])) and out[:, :, 0].abs().sum() > 0


def test_the_output_is_laid_out_rows_then_heads_as_its_fake_says():
    query, key, value, mask = _inputs(3, 12, torch.bfloat16)
    out = torch.ops.specc.row_attention(query, key, value, mask, None)
    stand_in = kernel._run(query, key, value, mask, None)
    with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
        fake = torch.ops.specc.row_attention(*(mode.from_tensor(t) for t in (query, key, value, mask)), None)
    assert out.shape == fake.shape == stand_in.shape == (1, HEADS, 3, DIM)
    assert out.stride() == fake.stride() == stand_in.stride() == (3 * HEADS * DIM, DIM, HEADS * DIM, 1)
    merged = out.transpose(1, 2).reshape(1, 3, HEADS * DIM)   # what an attention's output projection reads
    assert merged.data_ptr() == out.data_ptr() and merged.is_contiguous()


def test_the_stand_in_before_the_library_loads_computes_the_same_bits():
    query, key, value, mask = _inputs(4, 20, torch.bfloat16)
    assert torch.equal(kernel._run(query, key, value, mask, None),
                       torch.ops.specc.row_attention(query, key, value, mask, None))


@pytest.mark.parametrize("change, words", [
    (lambda q, k, v, m: (q, k, v, m.float()), "boolean mask"),
    (lambda q, k, v, m: (q.half(), k.half(), v.half(), m), "float32 or bfloat16"),
    (lambda q, k, v, m: (q[:, :5], k, v, m), "do not serve"),
    (lambda q, k, v, m: (q[0], k, v, m), "4-d"),
])
def test_wrong_arguments_are_refused(change, words):
    with pytest.raises(ValueError, match=words):
        torch.ops.specc.row_attention(*change(*_inputs(2, 8)), None)
