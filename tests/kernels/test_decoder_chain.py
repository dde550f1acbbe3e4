"""specc.decoder_chain and specc.decoder_chain_into_cache, a decoder layer from its attention's output
to the next attention's operands in one call (and decoder_stack, several such layers in one call): they compute the chain's eager steps (to bfloat16
roundings), each row the same bits whatever the call's other rows or threads and whatever threads
its layer's weights were packed for, and the cache write is the eager rotary embedding of the
chain's own projection, bit for bit."""

from __future__ import annotations

import pytest
import torch

from specc.host.threads import torch_threads
from specc.kernels.blocked_matmul import pack_blocked
from specc.kernels.cpu.build import NATIVE, load_library
from specc.kernels.decoder_chain import (decoder_chain, decoder_chain_into_cache, decoder_layer, decoder_stack,
                                         layer_pack_bytes, pack_layer, reference, rotate, scalar_decoder_chain)
from specc.kernels.row_attention import row_attention

HIDDEN, INTERMEDIATE, HEADS, KV_HEADS, DIM, SLOTS = 128, 320, 4, 2, 32, 24
NEXT = (HEADS + 2 * KV_HEADS) * DIM


@pytest.fixture(scope="module", autouse=True)
def library():
    load_library(NATIVE)


def _separate(seed: int = 0) -> tuple:
    """The reference's operands: o, post_norm, gate_up, down, next_norm, next, their bits, eps."""
    g = torch.Generator().manual_seed(seed)

    def packed(out, inputs, bits):
        return pack_blocked(torch.randn(out, inputs, generator=g) * 0.1, bits)

    def norm():
        return (1 + 0.1 * torch.randn(HIDDEN, generator=g)).bfloat16()

    return (packed(HIDDEN, HIDDEN, 4), norm(), packed(2 * INTERMEDIATE, HIDDEN, 4), packed(HIDDEN, INTERMEDIATE, 6),
            norm(), packed(NEXT, HIDDEN, 8), 4, 4, 6, 8, 1e-5)


def _weights(seed: int = 0, threads: int = 2) -> tuple:
    """The operators' operands after the rows: the layer's pack, the norms, bits, sizes, threads, eps."""
    o, post_norm, gate_up, down, next_norm, next_weight, *bits, eps = _separate(seed)
    return (pack_layer(o, gate_up, down, next_weight, threads), post_norm, next_norm, *bits, INTERMEDIATE, NEXT,
            threads, eps)


def _rows(rows: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(rows, HIDDEN, generator=g).bfloat16() for _ in range(2))


def test_it_computes_the_chain():
    attention, residual = _rows(3)
    got = decoder_chain(attention, residual, *_weights())
    want = reference(attention, residual, *_separate())
    for g, w in zip(got, want):
        assert g.dtype == torch.bfloat16 and g.shape == w.shape
        torch.testing.assert_close(g.float(), w.float(), rtol=0.05, atol=0.05 * w.float().abs().amax().item())


def test_a_row_is_the_same_bits_in_calls_of_any_size_and_threads():
    weights = _weights()
    attention, residual = _rows(5)
    together = decoder_chain(attention, residual, *weights)
    for threads in (1, 2):
        with torch_threads(threads):
            for r in range(5):
                alone = decoder_chain(attention[r:r + 1], residual[r:r + 1], *weights)
                assert all(torch.equal(a, t[r:r + 1]) for a, t in zip(alone, together))


def test_the_portable_path_agrees():
    weights = _weights()
    attention, residual = _rows(2)
    for fast, portable in zip(decoder_chain(attention, residual, *weights),
                              scalar_decoder_chain(attention, residual, *weights)):
        torch.testing.assert_close(fast.float(), portable.float(), rtol=0.02, atol=0.02)


def test_the_threads_a_layer_was_packed_for_change_no_bit():
    attention, residual = _rows(3)
    packed_for_two = decoder_chain(attention, residual, *_weights(threads=2))
    for packed_threads in (1, 3, 5):
        for threads in (1, 2):
            with torch_threads(threads):
                got = decoder_chain(attention, residual, *_weights(threads=packed_threads))
            assert all(torch.equal(a, b) for a, b in zip(got, packed_for_two))


def test_a_pack_holds_each_threads_shares_together():
    o, _, gate_up, down, _, next_weight, *_ = _separate()
    pack = pack_layer(o, gate_up, down, next_weight, 2)
    half = gate_up.shape[0] // 2
    first_thread = [o[:4], gate_up[:10], gate_up[half:half + 10], down[:4], next_weight[:8]]
    assert torch.equal(pack[:sum(p.numel() for p in first_thread)], torch.cat([p.reshape(-1) for p in first_thread]))
    assert pack.numel() == layer_pack_bytes(HIDDEN, INTERMEDIATE, NEXT, (4, 4, 6, 8)) \
        == sum(w.numel() for w in (o, gate_up, down, next_weight))


def _rotary(rows: int, seed: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    angles = torch.rand(rows, DIM // 2, generator=g) * 6
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().bfloat16(), angles.sin().bfloat16()


def _caches() -> tuple[torch.Tensor, torch.Tensor]:
    return tuple(torch.zeros(1, KV_HEADS, SLOTS, DIM, dtype=torch.bfloat16) for _ in range(2))


@pytest.mark.parametrize("biased", [False, True], ids=["no bias", "bias"])
def test_into_the_cache_it_writes_the_eager_rotary_embedding_of_its_own_projection(biased):
    weights = _weights()
    attention, residual = _rows(3)
    cos, sin = _rotary(3)
    positions = torch.tensor([5, 6, 11])
    k_cache, v_cache = _caches()
    bias = torch.randn(NEXT, generator=torch.Generator().manual_seed(4)).bfloat16() if biased else None
    residual_out, query = decoder_chain_into_cache(attention, residual, *weights, cos, sin, positions, k_cache,
                                                   v_cache, HEADS, bias)
    plain_residual, projected = decoder_chain(attention, residual, *weights)
    assert torch.equal(residual_out, plain_residual)
    if biased:
        projected = projected + bias   # eager's bfloat16 add
    heads = projected.view(3, HEADS + 2 * KV_HEADS, DIM).transpose(0, 1)   # [heads, rows, dim]
    turned = rotate(heads, cos, sin)
    assert torch.equal(query, turned[:HEADS].transpose(0, 1).reshape(3, HEADS * DIM))
    assert torch.equal(k_cache[0][:, positions], turned[HEADS:HEADS + KV_HEADS])
    assert torch.equal(v_cache[0][:, positions], heads[HEADS + KV_HEADS:])
    untouched = [p for p in range(SLOTS) if p not in positions.tolist()]
    assert not k_cache[0][:, untouched].any() and not v_cache[0][:, untouched].any()


def test_into_the_cache_rows_are_the_same_bits_alone():
    weights = _weights()
    attention, residual = _rows(4)
    cos, sin = _rotary(4)
    positions = torch.arange(7, 11)
    together_caches, alone_caches = _caches(), _caches()
    together = decoder_chain_into_cache(attention, residual, *weights, cos, sin, positions, *together_caches, HEADS)
    for r in range(4):
        alone = decoder_chain_into_cache(attention[r:r + 1], residual[r:r + 1], *weights, cos[r:r + 1],
                                         sin[r:r + 1], positions[r:r + 1], *alone_caches, HEADS)
        assert all(torch.equal(a, t[r:r + 1]) for a, t in zip(alone, together))
    assert all(torch.equal(a, t) for a, t in zip(alone_caches, together_caches))


def test_a_layer_is_its_row_attention_then_the_chain_bit_for_bit():
    weights = _weights()
    _, residual = _rows(3)
    cos, sin = _rotary(3)
    g = torch.Generator().manual_seed(3)
    query = torch.randn(1, HEADS, 3, DIM, generator=g).bfloat16()
    keys, values = (torch.randn(1, KV_HEADS, SLOTS, DIM, generator=g).bfloat16()[:, :, :9] for _ in range(2))
    mask = torch.ones(1, 1, 3, 9, dtype=torch.bool).tril(diagonal=6)
    positions = torch.tensor([9, 10, 11])
    attended = row_attention(query, keys, values, mask, 0.2)            # [1, heads, rows, dim], laid out by rows
    chained_caches, layer_caches = _caches(), _caches()
    chained = decoder_chain_into_cache(attended.transpose(1, 2).reshape(3, HEADS * DIM), residual, *weights, cos, sin,
                                       positions, *chained_caches, HEADS)
    layered = decoder_layer(query, keys, values, mask, 0.2, residual, *weights, cos, sin, positions, *layer_caches,
                            HEADS)
    assert all(torch.equal(a, b) for a, b in zip(layered, chained))
    assert all(torch.equal(a, b) for a, b in zip(layer_caches, chained_caches))
    for r in range(3):   # and each row alone
        alone = decoder_layer(query[:, :, r:r + 1], keys, values, mask[:, :, r:r + 1], 0.2, residual[r:r + 1],
                              *weights, cos[r:r + 1], sin[r:r + 1], positions[r:r + 1], *_caches(), HEADS)
        assert all(torch.equal(a, b[r:r + 1]) for a, b in zip(alone, layered))


def _filled_caches(count: int, seed: int = 5) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [tuple(torch.randn(1, KV_HEADS, SLOTS, DIM, generator=g).bfloat16() for _ in range(2))
            for _ in range(count)]


def _layers_in_turn(query, mask, residual, layers, cos, sin, positions, caches, kv, biases):
    """decoder_layer for each layer in turn, each attending over the caches the one before wrote."""
    for i, weights in enumerate(layers):
        keys, values = (cache[:, :, :kv] for cache in caches[i])
        residual, rows = decoder_layer(query, keys, values, mask, 0.2, residual, *weights, cos, sin, positions,
                                       *caches[i + 1], HEADS, biases[i] if biases else None)
        query = rows.view(1, -1, HEADS, DIM).transpose(1, 2)
    return residual, rows


def _stacked(query, mask, residual, layers, cos, sin, positions, caches, kv, biases):
    weights, post_norms, next_norms = ([layer[i] for layer in layers] for i in range(3))
    bits = [b for layer in layers for b in layer[3:7]]
    return decoder_stack(query, mask, 0.2, residual, weights, post_norms, next_norms, bits, *layers[0][7:], cos, sin,
                         positions, kv, [k for k, _ in caches], [v for _, v in caches], HEADS, biases)


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("biased", [False, True], ids=["no bias", "bias"])
def test_a_stack_is_its_layers_in_turn_bit_for_bit(rows, biased):
    layers = [_weights(seed) for seed in range(3)]
    _, residual = _rows(rows)
    cos, sin = _rotary(rows)
    g = torch.Generator().manual_seed(3)
    query = torch.randn(1, HEADS, rows, DIM, generator=g).bfloat16()
    kv = 9 + rows
    mask = torch.ones(1, 1, rows, kv, dtype=torch.bool).tril(diagonal=9)
    positions = torch.arange(9, 9 + rows)
    biases = [torch.randn(NEXT, generator=g).bfloat16() for _ in layers] if biased else []
    in_turn_caches, stacked_caches = _filled_caches(4), _filled_caches(4)
    in_turn = _layers_in_turn(query, mask, residual, layers, cos, sin, positions, in_turn_caches, kv, biases)
    for threads in (1, 2):
        caches = [tuple(c.clone() for c in pair) for pair in stacked_caches]
        with torch_threads(threads):
            stacked = _stacked(query, mask, residual, layers, cos, sin, positions, caches, kv, biases)
        assert all(torch.equal(a, b) for a, b in zip(stacked, in_turn))
        assert all(torch.equal(a, b) for pair, want in zip(caches, in_turn_caches) for a, b in zip(pair, want))


def test_a_stack_refuses_caches_that_do_not_match_its_layers():
    layers = [_weights(seed) for seed in range(2)]
    _, residual = _rows(1)
    cos, sin = _rotary(1)
    query = torch.zeros(1, HEADS, 1, DIM, dtype=torch.bfloat16)
    mask = torch.ones(1, 1, 1, 4, dtype=torch.bool)
    with pytest.raises(ValueError, match="one more key and value cache than layers"):
        _stacked(query, mask, residual, layers, cos, sin, torch.tensor([3]), _filled_caches(2), 4, [])
    with pytest.raises(ValueError, match="holding 99 positions"):
        _stacked(query, mask, residual, layers, cos, sin, torch.tensor([3]), _filled_caches(3), 99, [])


def test_it_refuses_a_position_outside_the_cache_and_heads_that_do_not_fit():
    weights = _weights()
    attention, residual = _rows(1)
    cos, sin = _rotary(1)
    with pytest.raises(ValueError, match="outside the cache"):
        decoder_chain_into_cache(attention, residual, *weights, cos, sin, torch.tensor([SLOTS]), *_caches(), HEADS)
    with pytest.raises(ValueError, match="next_bias must be contiguous bfloat16"):
        decoder_chain_into_cache(attention, residual, *weights, cos, sin, torch.tensor([0]), *_caches(), HEADS,
                                 torch.zeros(NEXT - 1, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="no 3 \\+ 2 x 2 heads"):
        decoder_chain_into_cache(attention, residual, *weights, cos, sin, torch.tensor([0]), *_caches(), 3)
    with pytest.raises(ValueError, match="the layer's packed projections"):
        decoder_chain(attention, residual, weights[0][:-1], *weights[1:])
    with pytest.raises(ValueError, match="no layer of hidden 128"):
        decoder_chain(attention, residual, weights[0], *weights[1:3], 5, *weights[4:])
