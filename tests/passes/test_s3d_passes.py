"""S3D's draft passes: skip_middle_layers, insert_mask_tokens, attach_draft_lora.

Numerics are checked against the Hugging Face model itself: the draft graph
equals the HF model with the skipped layers deleted, the LoRA updates merged
into the kept projections and the mask rows' embeddings replaced."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.fx as fx

from specc.errors import SpeccError, UsageError
from specc.graph.nodes import layer_index, placeholder
from specc.graph.signature import read_signature
from specc.contract.infrastructure import infrastructure_passes
from specc.methods.s3d.attach_draft_lora import AttachDraftLora, DraftLoraConfig
from specc.passes.expose_position_ids import ExposePositionIds
from specc.passes.insert_attention_mask import InsertAttentionMask
from specc.methods.s3d.insert_mask_tokens import InsertMaskTokens
from specc.passes.manager import run_passes
from specc.methods.s3d.skip_middle_layers import SkipMiddleLayers, SkipMiddleLayersConfig, middle_block
from specc.testing.checkpoints import FAMILIES, PASS_TEST_MAX_LEN, captured_tiny, non_matching_graph

NO_SKIP = SkipMiddleLayersConfig(ratio=0.0)
_captures: dict[tuple, tuple] = {}


def captured(family: str, layers: int = 3):
    if (family, layers) not in _captures:
        _captures[family, layers] = captured_tiny(family, num_hidden_layers=layers)
    return _captures[family, layers]


def graph_copy(gm: fx.GraphModule) -> fx.GraphModule:
    return fx.GraphModule(gm, copy.deepcopy(gm.graph))


def draft_graph(family: str, skip: SkipMiddleLayersConfig = NO_SKIP, lora: DraftLoraConfig = DraftLoraConfig(),
                layers: int = 3):
    model, capture = captured(family, layers)
    passes = [*infrastructure_passes(), SkipMiddleLayers(skip), InsertMaskTokens(), AttachDraftLora(lora)]
    gm, _ = run_passes("draft", graph_copy(capture.graph_module), passes)
    return model, capture.architecture, gm


def run(gm, arch, ids: torch.Tensor, is_mask: torch.Tensor | None = None) -> torch.Tensor:
    """One causal chunk from an empty cache (the mask input, if the graph has one)."""
    length = ids.shape[1]
    positions = torch.arange(length)
    caches = [torch.zeros(1, arch.num_key_value_heads, PASS_TEST_MAX_LEN + 1, arch.head_dim)
              for _ in range(2 * arch.num_layers)]
    mask = (positions[None, :] <= positions[:, None])[None, None]
    extra = [] if is_mask is None else [is_mask]
    with torch.no_grad():
        return gm(ids, positions[None], mask, positions, *caches, *extra)[0]


def tokens(model, length: int = 7, seed: int = 1) -> torch.Tensor:
    return torch.randint(4, model.config.vocab_size, (1, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("family", FAMILIES)
def test_untrained_draft_without_skipping_or_masks_is_the_target(family):
    model, arch, draft = draft_graph(family, lora=DraftLoraConfig(mlp=True))
    target, _ = run_passes("target", graph_copy(captured(family)[1].graph_module), infrastructure_passes())
    ids = tokens(model)
    expected = run(target, arch, ids)
    torch.testing.assert_close(run(draft, arch, ids, torch.zeros_like(ids, dtype=torch.bool)), expected,
                               rtol=0, atol=0)
    with torch.no_grad():
        torch.testing.assert_close(expected, model(ids).logits, rtol=1e-5, atol=1e-5)


def merged_reference(model, draft: fx.GraphModule, skipped: range) -> torch.nn.Module:
    """The HF model with `skipped` layers deleted and every LoRA update of `draft` merged into its weight."""
    reference = copy.deepcopy(model)
    parameters = dict(draft.named_parameters())
    for name, a in parameters.items():
        if name.endswith(".lora_a"):
            path = name[len("draft_lora."): -len(".lora_a")]
            b = parameters[name[: -len("lora_a")] + "lora_b"]
            weight = reference.get_submodule(path).weight
            with torch.no_grad():
                weight += DraftLoraConfig().scale * (b @ a)
    reference.model.layers = torch.nn.ModuleList(
        [layer for i, layer in enumerate(reference.model.layers) if i not in skipped])
    return reference


@pytest.mark.parametrize("family", ["llama", "phi3"])
def test_draft_is_the_target_minus_the_block_plus_lora_and_mask_rows(family):
    model, arch, draft = draft_graph(family, skip=SkipMiddleLayersConfig(2, 3), layers=6,
                                     lora=DraftLoraConfig(mlp=True))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in draft.named_parameters():
            if name.startswith("draft_"):
                p.copy_(torch.randn(p.shape, generator=generator) * 0.1)
    ids = tokens(model)
    is_mask = torch.tensor([[False, False, False, False, True, True, True]])
    reference = merged_reference(model, draft, range(2, 4))
    with torch.no_grad():
        embeddings = reference.get_input_embeddings()(ids)
        embeddings[is_mask] = draft.get_parameter("draft_mask_token.weight")
        expected = reference(inputs_embeds=embeddings, use_cache=False).logits
    torch.testing.assert_close(run(draft, arch, ids, is_mask), expected, rtol=1e-4, atol=1e-4)


def test_skipped_layers_write_no_cache_and_every_cache_input_stays():
    _, _, draft = draft_graph("llama", skip=SkipMiddleLayersConfig(2, 3), layers=6)
    assert {layer_index(n) for n in draft.graph.nodes} - {None} == {0, 1, 4, 5}
    caches = read_signature(draft).inputs_with_role("kv_cache")
    assert [spec.name for spec in caches] == [f"{kv}_cache_{i}" for i in range(6) for kv in "kv"]
    written = {n.args[0].target for n in draft.graph.nodes if n.target is torch.ops.aten.index_put_.default}
    assert written == {f"{kv}_cache_{i}" for i in (0, 1, 4, 5) for kv in "kv"}
    assert read_signature(draft).input_names[-1] == "is_mask"
    assert read_signature(draft).inputs[-1].to_json() == {"name": "is_mask", "role": "mask_tokens", "dtype": "bool",
                                                          "shape": [1, "q"]}


def test_adapters_only_on_kept_layers_and_their_own_parameters():
    _, _, draft = draft_graph("qwen2", skip=SkipMiddleLayersConfig(1, 1), lora=DraftLoraConfig(rank=4))
    added = {name: p for name, p in draft.named_parameters() if name.startswith("draft_lora.")}
    projections = {f"model.layers.{i}.self_attn.{p}_proj" for i in (0, 2) for p in "qkvo"}
    assert set(added) == {f"draft_lora.{path}.lora_{ab}" for path in projections for ab in "ab"}
    assert all(p.shape[0] == 4 for name, p in added.items() if name.endswith("lora_a"))
    assert all(not p.any() for name, p in added.items() if name.endswith("lora_b")), "B starts at zero"
    assert not any(p.requires_grad for p in added.values())
    again = draft_graph("qwen2", skip=SkipMiddleLayersConfig(1, 1), lora=DraftLoraConfig(rank=4))[2]
    assert all(torch.equal(p, again.get_parameter(name)) for name, p in added.items()), "seeded initialisation"


def test_centred_block_keeps_first_and_last_layer():
    assert middle_block(30, 0.33) == (10, 19)
    assert middle_block(32, 0.5) == (8, 23)
    assert middle_block(3, 0.33) == (1, 1)
    assert middle_block(3, 0.9) == (1, 1)
    assert middle_block(4, 0.1) is None
    with pytest.raises(SpeccError, match="1 <= first <= last <= 1"):
        draft_graph("llama", skip=SkipMiddleLayersConfig(1, 2))
    with pytest.raises(UsageError):
        SkipMiddleLayersConfig(first=1)


@pytest.mark.parametrize("make_pass", [lambda: SkipMiddleLayers(SkipMiddleLayersConfig(1, 1)), InsertMaskTokens,
                                       AttachDraftLora])
def test_passes_are_idempotent_and_leave_other_graphs_alone(make_pass):
    _, _, draft = draft_graph("llama", skip=SkipMiddleLayersConfig(1, 1))
    code = draft.code
    again = make_pass()(draft)
    assert not again.modified and again.graph_module.code == code
    other = non_matching_graph()
    other_code = other.code
    untouched = make_pass()(other)
    assert not untouched.modified and untouched.graph_module.code == other_code


def test_mask_tokens_need_the_kv_cache_first():
    _, capture = captured("llama")
    gm, _ = run_passes("draft", graph_copy(capture.graph_module), [ExposePositionIds(), InsertAttentionMask()])
    with pytest.raises(SpeccError, match="run insert_kv_cache first"):
        InsertMaskTokens()(gm)
    assert placeholder(gm.graph, "is_mask") is None
