"""`window_sliding_layers`: a checkpoint that interleaves sliding-window and full layers gets each
sliding layer's window from the graph, step by step as Hugging Face computes it whole."""

from __future__ import annotations

import pytest
import torch

from specc.contract.infrastructure import infrastructure_passes
from specc.graph.nodes import WINDOWED_MASK, attention_nodes, placeholder
from specc.passes.window_sliding_layers import WindowSlidingLayers
from specc.testing.checkpoints import captured_tiny, non_matching_graph, quirky_config, run_cached_steps

IDS = torch.randint(4, 96, (1, 13), generator=torch.Generator().manual_seed(5))


def _cached(family: str, **overrides):
    model, captured = captured_tiny(family, **{**_quirks(family), **overrides})
    gm = captured.graph_module
    for graph_pass in infrastructure_passes():
        graph_pass(gm)
    return model, captured, gm


def _quirks(family: str) -> dict:
    return {key: value for key, value in quirky_config(family).to_dict().items()
            if key in ("sliding_window", "layer_types", "use_sliding_window", "max_window_layers", "head_dim",
                       "query_pre_attn_scalar", "num_key_value_heads")}


@pytest.mark.parametrize("family", ["gemma3_text", "qwen2_interleaved"])
def test_sliding_layers_read_the_windowed_mask_and_full_layers_the_mask(family):
    model, captured, gm = _cached(family)
    mask = placeholder(gm.graph, "attn_mask")
    windows = [model.config.sliding_window if kind == "sliding_attention" else None
               for kind in model.config.layer_types]
    read = [sdpa.args[3] for sdpa in attention_nodes(gm.graph)]
    assert [None if m is mask else m.meta[WINDOWED_MASK] for m in read] == windows
    assert len({m for m in read if m is not mask}) == 1, "one windowed mask for every sliding layer"
    assert not WindowSlidingLayers()(gm).modified


@pytest.mark.parametrize("family", ["gemma3_text", "qwen2_interleaved"])
def test_step_by_step_decoding_matches_the_model_whole(family):
    model, captured, gm = _cached(family)
    assert model.config.sliding_window < IDS.shape[1], "the window must hide keys for the test to mean anything"
    stepped = run_cached_steps(gm, IDS, [(0, 6), (6, 7), (7, 10), (10, 13)], captured.architecture)
    with torch.inference_mode():
        whole = model(IDS).logits
        unwindowed = _full_attention(model)(IDS).logits
    torch.testing.assert_close(stepped, whole, rtol=1e-4, atol=1e-5)
    assert not torch.allclose(whole[:, -1], unwindowed[:, -1], atol=1e-3)


def _full_attention(model):
    from transformers import AutoModelForCausalLM

    config = model.config.to_dict()
    config["layer_types"] = ["full_attention"] * model.config.num_hidden_layers
    full = AutoModelForCausalLM.from_config(type(model.config).from_dict(config)).eval()
    full.load_state_dict(model.state_dict())
    return full


def test_a_checkpoint_whose_layers_attend_alike_is_left_to_the_runtime_window():
    _, _, gm = _cached("mistral")
    mask = placeholder(gm.graph, "attn_mask")
    assert all(sdpa.args[3] is mask for sdpa in attention_nodes(gm.graph))


def test_the_pass_is_a_no_op_on_a_non_matching_graph():
    gm = non_matching_graph()
    before = gm.code
    assert not WindowSlidingLayers()(gm).modified and gm.code == before
