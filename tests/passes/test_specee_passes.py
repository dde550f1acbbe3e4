"""SpecEE's passes: exit predictors (logits unchanged, scores equal their eager twin,
segment placement), the EAGLE-style draft head, and the final-hidden output."""

from __future__ import annotations

import copy

import pytest
import torch

from specc.graph.signature import read_signature
from specc.methods.specee.attach_draft_head import AttachDraftHead
from specc.methods.specee.expose_final_hidden import ExposeFinalHidden
from specc.methods.specee.insert_exit_predictors import (ExitPredictorConfig, InsertExitPredictors, apply_predictor,
                                                 predictor_features, predictor_parameters, score_name)
from specc.passes.manager import run_passes
from specc.methods.specee.segment_by_layer import SegmentByLayer
from tests.passes.test_expose_layer_exit import cached_graph, decoding_inputs

FAMILIES = ["llama", "qwen3", "phi3"]   # plain, qk-norm, fused qkv


def outputs(result) -> tuple:
    return tuple(result) if isinstance(result, (tuple, list)) else (result,)


def candidates_for(model, length: int, k: int = 4) -> torch.Tensor:
    return torch.randint(0, model.config.vocab_size, (length, k), generator=torch.Generator().manual_seed(k))


@pytest.mark.parametrize("family", FAMILIES)
def test_exit_predictors_leave_the_logits_alone_and_score_like_their_eager_twin(checkpoints, family):
    model, gm = cached_graph(checkpoints, family)
    ids, inputs, caches = decoding_inputs(model, 6)
    reference = outputs(gm(*inputs, *copy.deepcopy(caches)))[0]
    layers = model.config.num_hidden_layers
    rewritten = InsertExitPredictors(ExitPredictorConfig(first_layer=1))(gm).graph_module
    candidates = candidates_for(model, 6)
    result = outputs(rewritten(*inputs, *copy.deepcopy(caches), candidates))
    torch.testing.assert_close(result[0], reference)
    names = read_signature(rewritten).output_names
    assert names == ["logits"] + [score_name(l) for l in range(1, layers - 1)]
    with torch.no_grad():
        hidden = model(ids, output_hidden_states=True).hidden_states   # [embeddings, layer 0, …]
        heads = [model.lm_head(model.model.norm(h))[0] for h in hidden[1:]]
    for index, layer in enumerate(range(1, layers - 1)):
        z, z_below = (heads[l].gather(-1, candidates) for l in (layer, layer - 1))
        expected = apply_predictor(predictor_parameters(rewritten, layer), predictor_features(z, z_below))
        torch.testing.assert_close(result[1 + index][0], expected, atol=1e-5, rtol=1e-4)


def test_exit_predictors_are_idempotent_and_skip_graphs_without_layers(checkpoints):
    model, gm = cached_graph(checkpoints, "llama")
    once = InsertExitPredictors()(gm).graph_module
    assert not InsertExitPredictors()(once).modified
    deep_only = copy.deepcopy(once)
    for node in deep_only.graph.nodes:
        node.meta.pop("nn_module_stack", None)
    assert not InsertExitPredictors()(deep_only).modified


def test_each_layer_segment_computes_its_own_score(checkpoints):
    model, gm = cached_graph(checkpoints, "llama")
    segmented, _ = run_passes("layerwise", gm, [InsertExitPredictors(ExitPredictorConfig(first_layer=1)),
                                                SegmentByLayer()])
    calls = {str(n.target): n for n in segmented.graph.nodes if n.op == "call_module"}
    output = [n for n in segmented.graph.nodes if n.op == "output"][0]
    for score in output.args[0][1:]:
        producer = score.args[0] if score.op == "call_function" else score
        assert str(producer.target).startswith("layer_")
    assert "epilogue" in calls


@pytest.mark.parametrize("family", FAMILIES)
def test_draft_head_is_one_block_with_its_own_cache_and_the_shared_head(checkpoints, family):
    model, gm = cached_graph(checkpoints, family)
    head = AttachDraftHead()(gm).graph_module
    signature = read_signature(head)
    assert signature.input_names[-3:] == ["k_cache_draft_head", "v_cache_draft_head", "draft_feature"]
    assert not [n for n in signature.input_names if n.startswith(("k_cache_0", "v_cache_0"))]
    parameters = dict(head.named_parameters())
    assert "draft_head.fc.weight" in parameters and any(n.startswith("draft_head.layer.mlp") for n in parameters)
    torch.testing.assert_close(parameters["draft_head.layer.self_attn.o_proj.weight"],
                               dict(model.named_parameters())[
                                   f"model.layers.{model.config.num_hidden_layers - 1}.self_attn.o_proj.weight"])
    _, inputs, _ = decoding_inputs(model, 5)
    feature = torch.randn(1, 5, model.config.hidden_size)
    cache = [torch.zeros(1, model.config.num_key_value_heads, 33, c.shape[-1])
             for c in decoding_inputs(model, 5)[2][:2]]
    (logits,) = outputs(head(*inputs, *cache, feature))
    assert logits.shape == (1, 5, model.config.vocab_size)
    assert cache[0].abs().sum() > 0, "the head writes its own cache"
    assert not AttachDraftHead()(head).modified


def test_the_untrained_draft_head_reads_the_feature_unchanged(checkpoints):
    """W_fc = [0 | I]: the token embedding does not matter until training."""
    model, gm = cached_graph(checkpoints, "llama")
    head = AttachDraftHead()(gm).graph_module
    _, inputs, caches = decoding_inputs(model, 4)
    feature = torch.randn(1, 4, model.config.hidden_size)
    other_tokens = (inputs[0] + 1) % model.config.vocab_size
    first = outputs(head(*inputs, *copy.deepcopy(caches[:2]), feature))[0]
    second = outputs(head(other_tokens, *inputs[1:], *copy.deepcopy(caches[:2]), feature))[0]
    torch.testing.assert_close(first, second)


@pytest.mark.parametrize("family", FAMILIES)
def test_final_hidden_is_what_the_head_reads(checkpoints, family):
    model, gm = cached_graph(checkpoints, family)
    ids, inputs, caches = decoding_inputs(model, 6)
    exposed = ExposeFinalHidden()(gm).graph_module
    logits, hidden = outputs(exposed(*inputs, *caches))
    with torch.no_grad():
        torch.testing.assert_close(model.lm_head(model.model.norm(hidden)), logits, atol=1e-5, rtol=1e-4)
    assert read_signature(exposed).output_names == ["logits", "final_hidden"]
    assert not ExposeFinalHidden()(exposed).modified
