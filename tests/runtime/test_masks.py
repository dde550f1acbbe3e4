"""Key padding: every graph call attends over a whole number of key blocks."""

from __future__ import annotations

import torch

from specc.compiler import CompileRequest, compile_engine
from specc.engine.loaded import load_engine
from specc.runtime.masks import KEY_BLOCK, causal_chunk_mask, pad_keys


def test_pad_keys_appends_hidden_columns_up_to_a_block():
    mask = causal_chunk_mask(67, 3)
    padded = pad_keys(mask, 1024)
    assert padded.shape == (1, 1, 3, 2 * KEY_BLOCK) and padded.dtype == torch.bool
    assert torch.equal(padded[..., :70], mask) and not padded[..., 70:].any()


def test_pad_keys_hides_the_new_columns_of_an_additive_mask_too():
    additive = torch.zeros(1, 1, 2, 5)
    padded = pad_keys(additive, 1024)
    assert padded.shape[-1] == KEY_BLOCK and torch.isneginf(padded[..., 5:]).all() and not padded[..., :5].any()


def test_pad_keys_stops_at_the_cache_length_and_leaves_whole_blocks_alone():
    assert pad_keys(causal_chunk_mask(67, 3), 100).shape[-1] == 100
    whole = causal_chunk_mask(0, KEY_BLOCK)
    assert pad_keys(whole, 1024) is whole


def test_graph_calls_see_padded_masks_and_give_the_unpadded_logits(checkpoints, tmp_path):
    target, _ = checkpoints("llama")
    compile_engine(CompileRequest(model=str(target), method="none", output=tmp_path / "engine", max_seq_len=160))
    model = load_engine(tmp_path / "engine").context.model("target")
    seen, forward = [], model.forward_fn

    def recording(tokens, positions, mask, *rest):
        seen.append(mask.shape[-1])
        return forward(tokens, positions, mask, *rest)

    model.forward_fn = recording
    ids = torch.randint(model.architecture.vocab_size, (72,), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        model.prefill(ids[:60], 0)
        padded = model.run_chunk(ids[60:72], 60).logits
        model.prefill(ids[:60], 0)
        slots = torch.arange(60, 72)
        (unpadded,) = forward(ids[None, 60:72], slots[None], causal_chunk_mask(60, 12), slots, *model.cache.tensors,
                              torch.arange(12))[:1]
    assert seen == [KEY_BLOCK, 2 * KEY_BLOCK, KEY_BLOCK]   # 60 keys, 72 keys, 60 again
    torch.testing.assert_close(padded, unpadded[0])
