"""attach_adapter_head: exit → input norm → one attention block + residual → final norm → LM head."""

from __future__ import annotations

import copy

import pytest
import torch

from specc.capture.export import capture
from specc.capture.load import load_model
from specc.graph.nodes import layer_index
from specc.contract.infrastructure import infrastructure_passes
from specc.passes.attach_adapter_head import AdapterHeadConfig, AttachAdapterHead
from specc.passes.expose_layer_exit import ExposeLayerExit, LayerExitConfig
from specc.passes.manager import run_passes
from specc.runtime.masks import causal_chunk_mask

FAMILIES = ["llama", "mistral", "qwen2", "qwen3", "phi3"]
EXIT = 1
_graphs: dict[str, tuple] = {}


def adapter_graph(checkpoints, family: str, with_mlp: bool = False):
    """(HF model, the adapter graph cut at layer EXIT, its pass result)."""
    if family not in _graphs:
        model = load_model(checkpoints(family)[0])
        passes = infrastructure_passes() + [ExposeLayerExit(LayerExitConfig(EXIT, "deep"))]
        gm, _ = run_passes("adapter", capture(model, 32).graph_module, passes)
        _graphs[family] = (model, gm)
    model, gm = _graphs[family]
    result = AttachAdapterHead(AdapterHeadConfig(with_mlp=with_mlp))(copy.deepcopy(gm))
    return model, result.graph_module, result


def run_adapter(model, gm, ids, exits, start=0, cache=None):
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    cache = cache or [torch.zeros(1, config.num_key_value_heads, 33, head_dim) for _ in range(2)]
    positions = torch.arange(start, start + ids.shape[1])
    with torch.no_grad():
        (logits,) = gm(ids, positions[None], causal_chunk_mask(start, ids.shape[1]), positions, *cache, exits)
    return logits, cache


def reference(model, ids, with_mlp: bool = False):
    """The same computation with the HF model's own modules (the adapter starts as copies)."""
    layer = model.model.layers[EXIT]
    with torch.no_grad():
        exits = model(ids, output_hidden_states=True).hidden_states[EXIT]
        cos_sin = model.model.rotary_emb(exits, torch.arange(ids.shape[1])[None])
        attended, _ = layer.self_attn(layer.input_layernorm(exits), cos_sin, None)
        hidden = exits + attended
        if with_mlp:
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        return exits, model.lm_head(model.model.norm(hidden))


@pytest.mark.parametrize("family", FAMILIES)
def test_adapter_is_layer_l_attention_then_final_norm_and_head(checkpoints, family):
    model, gm, _ = adapter_graph(checkpoints, family)
    ids = torch.randint(4, model.config.vocab_size, (1, 6), generator=torch.Generator().manual_seed(1))
    exits, expected = reference(model, ids)
    logits, _ = run_adapter(model, gm, ids, exits)
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_adapter_with_mlp_is_the_whole_layer_l(checkpoints, family):
    model, gm, result = adapter_graph(checkpoints, family, with_mlp=True)
    ids = torch.randint(4, model.config.vocab_size, (1, 6), generator=torch.Generator().manual_seed(3))
    exits, expected = reference(model, ids, with_mlp=True)
    logits, _ = run_adapter(model, gm, ids, exits)
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)
    assert {"adapter.post_attention_layernorm.weight", "adapter.mlp.down_proj.weight"} <= set(result.added_parameters)
    assert all(layer_index(n) is None for n in gm.graph.nodes), "no node may pass for a decoder layer"


def test_adapter_cache_and_positions_match_a_single_pass(checkpoints):
    model, gm, _ = adapter_graph(checkpoints, "llama")
    ids = torch.randint(4, model.config.vocab_size, (1, 7), generator=torch.Generator().manual_seed(2))
    exits, _ = reference(model, ids)
    whole, _ = run_adapter(model, gm, ids, exits)
    _, cache = run_adapter(model, gm, ids[:, :5], exits[:, :5])
    step, _ = run_adapter(model, gm, ids[:, 5:], exits[:, 5:], start=5, cache=cache)
    torch.testing.assert_close(step, whole[:, 5:], rtol=1e-5, atol=1e-5)


def test_structure_own_parameters_own_cache_shared_head(checkpoints):
    model, gm, result = adapter_graph(checkpoints, "qwen2")
    inputs = [n.target for n in gm.graph.nodes if n.op == "placeholder"]
    assert inputs == ["input_ids", "position_ids", "attn_mask", "cache_positions",
                      "k_cache_adapter", "v_cache_adapter", "exit_hidden"]
    assert result.added_inputs == ["k_cache_adapter", "v_cache_adapter"]
    params = dict(gm.named_parameters())
    adapter = {name for name in params if name.startswith("adapter.")}
    assert adapter == set(result.added_parameters) == {
        "adapter.input_layernorm.weight", "adapter.norm.weight",
        *(f"adapter.self_attn.{p}_proj.{kind}" for p in "qkv" for kind in ("weight", "bias")),
        "adapter.self_attn.o_proj.weight",
    }
    assert set(params) - adapter == {"lm_head.weight"}
    original = model.model.layers[EXIT].self_attn.q_proj.weight
    assert torch.equal(params["adapter.self_attn.q_proj.weight"], original)
    assert params["adapter.self_attn.q_proj.weight"].data_ptr() != original.data_ptr()
    assert not any(p.requires_grad for name, p in params.items() if name in adapter)
    assert all(layer_index(n) is None for n in gm.graph.nodes), "no node may pass for a decoder layer"
    attention = [n for n in gm.graph.nodes if n.target is torch.ops.aten.scaled_dot_product_attention.default]
    assert len(attention) == 1 and attention[0].meta["specc_role"] == "adapter"
    mlp = [n for n in gm.graph.nodes if n.target is torch.ops.aten.silu.default]
    assert not mlp, "the adapter has no MLP"


def test_idempotent_and_no_op_without_exit_input(checkpoints):
    _, gm, _ = adapter_graph(checkpoints, "llama")
    code = gm.code
    again = AttachAdapterHead()(gm)
    assert not again.modified and again.graph_module.code == code
    full, _ = run_passes("target", capture(load_model(checkpoints("llama")[0]), 32).graph_module,
                         infrastructure_passes())
    full_code = full.code
    untouched = AttachAdapterHead()(full)
    assert not untouched.modified and untouched.graph_module.code == full_code
