"""quantize_linear_weights and its schemes: every linear of the target becomes a quantized matmul
computing what the dequantized weight computes; segments get packed inputs; graphs of one program
share one packed copy; the pass is idempotent and leaves a method's own weights alone."""

from __future__ import annotations

import copy

import pytest
import torch

from specc.contract.infrastructure import infrastructure_passes
from specc.contract.program import graph_copy
from specc.errors import UsageError
from specc.methods.swift.insert_skip_branches import InsertSkipBranches
from specc.passes.manager import run_passes
from specc.passes.quantize_linear_weights import QuantizeLinearWeights
from specc.quantize.report import quantized_weights
from specc.quantize.schemes import INT8, SCHEMES, Scheme, head_bits_for, parse_scheme, scheme_for
from specc.testing.checkpoints import captured_tiny, empty_caches, run_cached_steps

aten = torch.ops.aten


def dequantized(scheme: Scheme, packed: dict, in_features: int) -> torch.Tensor:
    """The weight the packed tensors stand for, by running the scheme's own kernel on the identity."""
    return scheme.matmul(torch.eye(in_features), packed).T


@pytest.mark.parametrize("name", ["int8", "int4-g32", "int4"])
def test_a_packed_weight_computes_what_its_dequantized_weight_computes_and_is_close_to_the_original(name):
    scheme = parse_scheme(name)
    weight = torch.randn(64, 256, generator=torch.Generator().manual_seed(0))
    packed = scheme.pack(weight)
    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(scheme.matmul(x, packed), x @ dequantized(scheme, packed, 256).T,
                               rtol=1e-4, atol=1e-4)
    step = (weight.abs().amax() / 127) if scheme.bits == 8 else (weight.amax() - weight.amin()) / 15
    assert (dequantized(scheme, packed, 256) - weight).abs().max() <= step / 2 + 1e-5


def test_int4_takes_a_smaller_group_or_int8_where_its_kernel_cannot_take_the_shape():
    int4 = parse_scheme("int4-g32")
    assert scheme_for(int4, torch.zeros(64, 96)) == int4
    assert scheme_for(int4, torch.zeros(64, 48)) == INT8     # inputs not a multiple of any group
    assert scheme_for(int4, torch.zeros(40, 64)) == INT8     # outputs not a multiple of 16
    assert scheme_for(parse_scheme("int4-g128"), torch.zeros(64, 576)) == parse_scheme("int4-g64")  # SmolLM2's width
    assert scheme_for(parse_scheme("int4-g128"), torch.zeros(64, 1536)) == parse_scheme("int4-g128")
    assert scheme_for(parse_scheme("int4"), torch.zeros(64, 1536), logits=True) == INT8   # the LM head


def test_unknown_schemes_are_refused_with_the_choices():
    with pytest.raises(UsageError, match="int4-g32"):
        parse_scheme("int3")
    with pytest.raises(UsageError, match="choose from"):
        parse_scheme("int4-g48")
    assert {parse_scheme(name).name for name in SCHEMES} == {"q4", "q6", "q8", "int8", "int4-g32", "int4-g64", "int4-g128",
                                                            "int4-g256"}
    assert parse_scheme("int4") == parse_scheme("int4-g32")


def test_a_q4_head_takes_6_bits_only_where_its_gguf_stored_it_in_6_or_fewer():
    q4, head = parse_scheme("q4"), torch.zeros(64, 96)
    assert scheme_for(q4, head, logits=True).name == "q8"
    for stored in ("Q6_K", "Q4_K", "Q4_1", "Q5_0"):
        assert scheme_for(head_bits_for(q4, stored), head, logits=True).name == "q6"
        assert scheme_for(head_bits_for(q4, stored), head).name == "q4"     # only the head changes
    for stored in ("Q8_0", "F16", "BF16", "F32", None):   # None: not converted from a GGUF
        assert head_bits_for(q4, stored) == q4
    assert head_bits_for(parse_scheme("q8"), "Q4_K") == parse_scheme("q8")
    assert head_bits_for(parse_scheme("int4"), "Q4_K") == parse_scheme("int4")


@pytest.fixture(scope="module")
def decoding_graph():
    _, captured = captured_tiny("llama")
    gm, _ = run_passes("target", captured.graph_module, infrastructure_passes())
    return gm, captured.architecture


def linears(gm) -> int:
    return sum(1 for m in gm.modules() if isinstance(m, torch.fx.GraphModule)
               for n in m.graph.nodes if n.op == "call_function" and n.target == aten.linear.default)


def with_dequantized_weights(gm, scheme: Scheme):
    """A copy of `gm` whose linear weights are what `scheme` packs them to, in floating point."""
    copied = copy.deepcopy(gm)
    with torch.no_grad():
        for node in [n for n in copied.graph.nodes if n.target == aten.linear.default]:
            weight = copied.get_parameter(node.args[1].target)
            chosen = scheme_for(scheme, weight)
            weight.copy_(dequantized(chosen, chosen.pack(weight), weight.shape[1]))
    return copied


@pytest.mark.parametrize("name", ["int8", "int4-g32"])
def test_every_linear_becomes_a_quantized_matmul_computing_its_dequantized_weight(decoding_graph, name):
    full, arch = decoding_graph
    scheme = parse_scheme(name)
    quantized, records = run_passes("target", copy.deepcopy(full), [QuantizeLinearWeights(scheme)])
    assert linears(full) > 0 and linears(quantized) == 0
    assert records[0].modified and len(records[0].replaced) == linears(full)
    assert not any(name.endswith("proj.weight") for name, _ in quantized.named_parameters())
    ids = torch.randint(0, arch.vocab_size, (1, 9), generator=torch.Generator().manual_seed(0))
    want = run_cached_steps(with_dequantized_weights(full, scheme), ids, [(0, 6), (6, 9)], arch)
    torch.testing.assert_close(run_cached_steps(quantized, ids, [(0, 6), (6, 9)], arch), want,
                               rtol=1e-4, atol=1e-4)
    assert not QuantizeLinearWeights(scheme)(quantized).modified


def test_segments_take_packed_inputs_and_compute_what_the_unsegmented_graph_computes(decoding_graph):
    full, arch = decoding_graph
    scheme = parse_scheme("int4-g32")
    plain, _ = run_passes("target", copy.deepcopy(full), [QuantizeLinearWeights(scheme)])
    segmented, records = run_passes("target", copy.deepcopy(full),
                                    [InsertSkipBranches(), QuantizeLinearWeights(scheme)])
    assert linears(segmented) == 0
    assert any(name.startswith("prologue.") for name in records[-1].replaced)
    ids = torch.randint(0, arch.vocab_size, (1, 7), generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(run_cached_steps(segmented, ids, [(0, 7)], arch),
                               run_cached_steps(plain, ids, [(0, 7)], arch))


def test_graphs_of_one_program_share_one_packed_copy_and_only_the_chosen_weights_are_packed(decoding_graph):
    full, _ = decoding_graph
    store: dict = {}
    head = full.get_parameter("lm_head.weight")
    body_only = QuantizeLinearWeights(parse_scheme("int8"), quantizable=lambda t: t is not head, store=store)
    first, _ = run_passes("a", graph_copy(full), [body_only])
    second, _ = run_passes("b", graph_copy(full), [body_only])
    assert quantized_weights(first).keys() == quantized_weights(second).keys() != set()
    assert linears(first) == 1   # the LM head, left in its dtype


def test_a_reduced_draft_head_is_packed_like_the_weights_it_was_cut_from(decoding_graph):
    from specc.passes.reduce_draft_vocabulary import DraftVocabularyConfig, ReduceDraftVocabulary

    full, _ = decoding_graph
    frozen = {t.data_ptr() for t in full.parameters()}
    quantizer = QuantizeLinearWeights(parse_scheme("q4"), quantizable=lambda t: t.data_ptr() in frozen)
    reduced, records = run_passes("draft", graph_copy(full),
                                  [ReduceDraftVocabulary(DraftVocabularyConfig(tuple(range(32)))), quantizer])
    assert linears(reduced) == 0 and "draft_head.weight" not in dict(reduced.named_parameters())
    assert any(name.startswith("draft_head.") for name in records[-1].added_parameters)


def test_blocked_siblings_share_one_call_and_compute_the_bits_of_separate_ones(monkeypatch):
    _, captured = captured_tiny("llama", dtype="bfloat16")
    full, _ = run_passes("target", captured.graph_module, infrastructure_passes())
    arch = captured.architecture
    stacked, _ = run_passes("target", graph_copy(full), [QuantizeLinearWeights(parse_scheme("q4"))])
    calls = [n for n in stacked.graph.nodes if n.target == torch.ops.specc.blocked_matmul.default]
    assert len(calls) == 4 * arch.num_layers + 1   # q/k/v, o, gate/up, down per layer, and the head
    assert any(name.endswith("gate_proj_up_proj_weight_blocks") for name, _ in stacked.named_buffers())
    monkeypatch.setattr(QuantizeLinearWeights, "_sibling_groups", lambda self, module: [])
    separate, _ = run_passes("target", graph_copy(full), [QuantizeLinearWeights(parse_scheme("q4"))])
    ids = torch.randint(0, arch.vocab_size, (1, 9), generator=torch.Generator().manual_seed(4))

    def logits(gm):
        caches = [c.to(torch.bfloat16) for c in empty_caches(arch)]
        return run_cached_steps(gm, ids, [(0, 6), (6, 9)], arch, caches=caches)

    assert torch.equal(logits(stacked), logits(separate))
