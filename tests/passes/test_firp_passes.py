"""FIRP's pass: insert_pseudo_hidden_projections.

Numerics are checked against the Hugging Face model itself: with no pseudo
rows the graph is the target; a pseudo row equals an HF forward over the
same tokens whose extra last row's state is replaced by W h + b at the exit
of layer t (a forward hook), which is exactly what the pseudo row computes
from t on, whatever it carried below t."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.fx as fx

from specc.errors import SpeccError, UsageError
from specc.graph.nodes import layer_index, placeholder
from specc.graph.signature import read_signature
from specc.contract.infrastructure import infrastructure_passes
from specc.passes.expose_position_ids import ExposePositionIds
from specc.passes.insert_attention_mask import InsertAttentionMask
from specc.methods.firp.insert_pseudo_hidden_projections import (
    InsertPseudoHiddenProjections, PseudoHiddenConfig, default_pseudo_layers)
from specc.passes.manager import run_passes
from specc.testing.checkpoints import FAMILIES, PASS_TEST_MAX_LEN, captured_tiny, non_matching_graph

_captures: dict[tuple, tuple] = {}


def captured(family: str, layers: int = 3):
    if (family, layers) not in _captures:
        _captures[family, layers] = captured_tiny(family, num_hidden_layers=layers)
    return _captures[family, layers]


def firp_graph(family: str, config: PseudoHiddenConfig = PseudoHiddenConfig(), layers: int = 3):
    model, capture = captured(family, layers)
    gm = fx.GraphModule(capture.graph_module, copy.deepcopy(capture.graph_module.graph))
    gm, _ = run_passes("target", gm, [*infrastructure_passes(), InsertPseudoHiddenProjections(config)])
    return model, capture.architecture, gm


def run(gm, arch, ids, positions, mask, source=None, step=None) -> torch.Tensor:
    """Logits [q, vocab] of one forward from an empty cache: rows at slots 0..q-1."""
    q = ids.shape[1]
    caches = [torch.zeros(1, arch.num_key_value_heads, PASS_TEST_MAX_LEN + 1, arch.head_dim)
              for _ in range(2 * arch.num_layers)]
    extra = [] if source is None else [source, step]
    with torch.no_grad():
        return gm(ids, positions[None], mask[None, None], torch.arange(q), *caches, *extra)[0][0]


def tokens(model, length: int = 7, seed: int = 1) -> torch.Tensor:
    return torch.randint(4, model.config.vocab_size, (1, length), generator=torch.Generator().manual_seed(seed))


def causal(q: int) -> torch.Tensor:
    return torch.ones(q, q, dtype=torch.bool).tril()


@pytest.mark.parametrize("family", FAMILIES)
def test_without_pseudo_rows_the_graph_is_the_target(family):
    model, arch, gm = firp_graph(family)
    target, _ = run_passes("target", fx.GraphModule(captured(family)[1].graph_module,
                                                    copy.deepcopy(captured(family)[1].graph_module.graph)),
                           infrastructure_passes())
    with torch.no_grad():
        for name, p in gm.named_parameters():
            if name.startswith("firp_proj."):
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(2)))   # must not matter
    ids = tokens(model)
    positions = torch.arange(7)
    expected = run(target, arch, ids, positions, causal(7))
    rows = torch.arange(7)[None]
    got = run(gm, arch, ids, positions, causal(7), rows, torch.zeros_like(rows))
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    with torch.no_grad():
        torch.testing.assert_close(expected, model(ids).logits[0], rtol=1e-5, atol=1e-5)


def hf_with_pseudo_row(model, ids: torch.Tensor, anchor: int, layer: int, weight, bias) -> torch.Tensor:
    """HF logits of `ids` plus one row (the anchor's token, position anchor + 1) whose state
    leaving decoder layer `layer - 1` is replaced by weight @ h[anchor] + bias."""
    extended = torch.cat([ids[:, : anchor + 1], ids[:, anchor: anchor + 1]], dim=1)
    positions = torch.arange(anchor + 2)[None]

    def replace(module, args, output):
        hidden = output[0] if isinstance(output, tuple) else output
        hidden = hidden.clone()
        hidden[0, -1] = torch.nn.functional.linear(hidden[0, anchor], weight, bias)
        return (hidden, *output[1:]) if isinstance(output, tuple) else hidden

    handle = model.model.layers[layer - 1].register_forward_hook(replace)
    try:
        with torch.no_grad():
            return model(extended, position_ids=positions, use_cache=False).logits[0, -1]
    finally:
        handle.remove()


@pytest.mark.parametrize("family", FAMILIES)
def test_a_pseudo_row_is_the_projected_state_run_through_the_upper_layers(family):
    model, arch, gm = firp_graph(family, PseudoHiddenConfig(layers=(1, 2)), layers=4)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in gm.named_parameters():
            if name.startswith("firp_proj."):
                p.add_(torch.randn(p.shape, generator=generator) * 0.1)
    ids = tokens(model)
    anchor = 4
    # rows: 0..6 real, then step 1 of the anchor (position anchor + 1), seeing 0..anchor and itself
    mask = torch.zeros(8, 8, dtype=torch.bool)
    mask[:7, :7] = causal(7)
    mask[7, : anchor + 1] = True
    mask[7, 7] = True
    positions = torch.cat([torch.arange(7), torch.tensor([anchor + 1])])
    source = torch.cat([torch.arange(7), torch.tensor([anchor])])[None]
    step = torch.tensor([[0] * 7 + [1]])
    logits = run(gm, arch, torch.cat([ids, ids[:, anchor: anchor + 1]], dim=1), positions, mask, source, step)
    with torch.no_grad():
        torch.testing.assert_close(logits[:7], model(ids).logits[0], rtol=1e-5, atol=1e-5)
    expected = hf_with_pseudo_row(model, ids, anchor, 1, gm.get_parameter("firp_proj.1.weight"),
                                  gm.get_parameter("firp_proj.1.bias"))
    torch.testing.assert_close(logits[7], expected, rtol=1e-4, atol=1e-4)


def test_inputs_parameters_and_where_projections_enter():
    _, _, gm = firp_graph("llama", layers=6)
    signature = read_signature(gm)
    assert signature.input_names[-2:] == ["pseudo_source", "pseudo_step"]
    assert [s.to_json() for s in signature.inputs[-2:]] == [
        {"name": "pseudo_source", "role": "pseudo_source", "dtype": "int64", "shape": [1, "q"]},
        {"name": "pseudo_step", "role": "pseudo_step", "dtype": "int64", "shape": [1, "q"]}]
    added = dict((name, p) for name, p in gm.named_parameters() if name.startswith("firp_proj."))
    assert sorted(added) == [f"firp_proj.{i}.{kind}" for i in (1, 2, 3) for kind in ("bias", "weight")]
    assert all(torch.equal(added[f"firp_proj.{i}.weight"], torch.eye(64)) for i in (1, 2, 3))
    assert all(not added[f"firp_proj.{i}.bias"].any() for i in (1, 2, 3))
    assert not any(p.requires_grad for p in added.values())
    wheres = [n for n in gm.graph.nodes if n.target is torch.ops.aten.where.self
              and n.meta.get("specc_role") == "pseudo_projection"]
    assert [layer_index(n) for n in wheres] == [t - 1 for t in default_pseudo_layers(6)] == [2, 3, 4]


def test_default_layers_scale_the_papers_and_bad_layers_are_refused():
    assert default_pseudo_layers(32) == (15, 20, 25)
    assert default_pseudo_layers(30) == (14, 19, 23)
    assert default_pseudo_layers(3) == (1, 2, 2)
    assert default_pseudo_layers(2) == (1, 1, 1)
    assert default_pseudo_layers(30, steps=4) == (14, 19, 23, 28)
    with pytest.raises(SpeccError, match="1 <= t_1 <= ... <= t_k <= 2"):
        firp_graph("llama", PseudoHiddenConfig(layers=(1, 3)))
    with pytest.raises(UsageError, match="non-decreasing"):
        PseudoHiddenConfig(layers=(2, 1))


@pytest.mark.parametrize("make_pass", [InsertPseudoHiddenProjections])
def test_pass_is_idempotent_and_leaves_other_graphs_alone(make_pass):
    _, _, gm = firp_graph("llama")
    code = gm.code
    again = make_pass()(gm)
    assert not again.modified and again.graph_module.code == code
    other = non_matching_graph()
    other_code = other.code
    untouched = make_pass()(other)
    assert not untouched.modified and untouched.graph_module.code == other_code


def test_pseudo_projections_need_the_kv_cache_first():
    _, capture = captured("llama")
    gm = fx.GraphModule(capture.graph_module, copy.deepcopy(capture.graph_module.graph))
    gm, _ = run_passes("target", gm, [ExposePositionIds(), InsertAttentionMask()])
    with pytest.raises(SpeccError, match="run insert_kv_cache first"):
        InsertPseudoHiddenProjections()(gm)
    assert placeholder(gm.graph, "pseudo_step") is None
