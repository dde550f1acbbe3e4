"""expose_layer_exit: shallow and deep sides of a layer exit compose to the full model."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.fx as fx

from specc.capture.export import capture
from specc.capture.load import load_model
from specc.errors import UsageError
from specc.graph.nodes import layer_index
from specc.contract.infrastructure import infrastructure_passes
from specc.passes.expose_layer_exit import ExposeLayerExit, LayerExitConfig, default_exit_layer
from specc.passes.manager import run_passes
from specc.runtime.masks import causal_chunk_mask

FAMILIES = ["llama", "qwen3", "phi3"]   # plain, qk-norm, fused qkv
_graphs: dict[str, tuple] = {}


def cached_graph(checkpoints, family: str):
    """(HF model, a fresh copy of its capture after the infrastructure passes)."""
    if family not in _graphs:
        model = load_model(checkpoints(family)[0])
        gm, _ = run_passes("target", capture(model, 32).graph_module, infrastructure_passes())
        _graphs[family] = (model, gm)
    model, gm = _graphs[family]
    return model, copy.deepcopy(gm)


def run_cut(gm, layer, keep):
    return ExposeLayerExit(LayerExitConfig(layer, keep))(gm)


def decoding_inputs(model, length: int):
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    caches = [torch.zeros(1, config.num_key_value_heads, 33, head_dim) for _ in range(2 * config.num_hidden_layers)]
    ids = torch.randint(4, config.vocab_size, (1, length), generator=torch.Generator().manual_seed(length))
    positions = torch.arange(length)
    return ids, (ids, positions[None], causal_chunk_mask(0, length), positions), caches


def layers_of(gm) -> set[int]:
    return {i for i in map(layer_index, gm.graph.nodes) if i is not None}


def inputs_of(gm) -> list[str]:
    return [n.target for n in gm.graph.nodes if n.op == "placeholder"]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("layer", [1, 2])
def test_deep_after_shallow_is_the_full_model(checkpoints, family, layer):
    model, gm = cached_graph(checkpoints, family)
    shallow = run_cut(copy.deepcopy(gm), layer, "shallow").graph_module
    deep = run_cut(gm, layer, "deep").graph_module
    ids, inputs, caches = decoding_inputs(model, 7)
    with torch.no_grad():
        (exits,) = shallow(*inputs, *caches)
        (logits,) = deep(*inputs, *caches, exits)
        reference = model(ids).logits
        hidden = model(ids, output_hidden_states=True).hidden_states[layer]
    torch.testing.assert_close(exits, hidden, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits, reference, rtol=1e-5, atol=1e-5)


def test_each_side_keeps_only_its_layers_and_cache_writes(checkpoints):
    model, gm = cached_graph(checkpoints, "llama")
    shallow = run_cut(copy.deepcopy(gm), 1, "shallow")
    deep = run_cut(gm, 1, "deep")
    assert shallow.modified and deep.modified
    assert layers_of(shallow.graph_module) == {0}
    assert layers_of(deep.graph_module) == {1, 2}
    full_inputs = ["input_ids", "position_ids", "attn_mask", "cache_positions"] + [
        f"{kv}_cache_{i}" for i in range(3) for kv in "kv"]
    assert inputs_of(shallow.graph_module) == full_inputs
    assert inputs_of(deep.graph_module) == full_inputs + ["exit_hidden"]
    assert deep.added_inputs == ["exit_hidden"]
    for side, written in ((shallow, {"k_cache_0", "v_cache_0"}), (deep, {f"{kv}_cache_{i}" for i in (1, 2) for kv in "kv"})):
        writes = {n.args[0].target for n in side.graph_module.graph.nodes
                  if n.target is torch.ops.aten.index_put_.default}
        assert writes == written
    embeds = [n for n in deep.graph_module.graph.nodes if n.target is torch.ops.aten.embedding.default]
    assert not embeds, "the deep side must not embed tokens again"


def test_cache_writes_land_only_in_the_own_layers(checkpoints):
    model, gm = cached_graph(checkpoints, "llama")
    shallow = run_cut(gm, 1, "shallow").graph_module
    _, inputs, caches = decoding_inputs(model, 5)
    with torch.no_grad():
        shallow(*inputs, *caches)
    assert caches[0].abs().sum() > 0 and caches[1].abs().sum() > 0
    assert all(c.abs().sum() == 0 for c in caches[2:])


@pytest.mark.parametrize("keep", ["shallow", "deep"])
def test_idempotent(checkpoints, keep):
    _, gm = cached_graph(checkpoints, "llama")
    first = run_cut(gm, 1, keep).graph_module
    code = first.code
    again = run_cut(first, 1, keep)
    assert not again.modified and again.graph_module.code == code


@pytest.mark.parametrize("keep", ["shallow", "deep"])
def test_no_op_without_decoder_layers(keep):
    gm = fx.symbolic_trace(torch.nn.Linear(4, 4))
    code = gm.code
    result = run_cut(gm, 1, keep)
    assert not result.modified and result.graph_module.code == code


def test_default_exit_layer_scales_the_papers_2_of_32():
    assert [default_exit_layer(n) for n in (2, 3, 16, 24, 32, 40, 80)] == [1, 1, 1, 2, 2, 2, 5]


def test_exit_layer_out_of_range_is_a_usage_error(checkpoints):
    _, gm = cached_graph(checkpoints, "llama")
    with pytest.raises(UsageError, match="exit layer 3 .* 3-layer model"):
        run_cut(gm, 3, "shallow")
    with pytest.raises(UsageError, match="keep"):
        LayerExitConfig(1, "middle")
