"""quantization_quality's unquantized reference: on a CPU without bfloat16 units its half-precision
linears multiply in float32 and round to their own dtype (what the emulated bfloat16 matmul computes,
without the emulation), and every model is left as it was found."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from specc.quantize import quality
from specc.quantize.schemes import parse_scheme
from specc.testing.checkpoints import tiny_config, tiny_tokenizer


def tiny_model(dtype: torch.dtype) -> torch.nn.Module:
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(tiny_config("llama")).eval().to(dtype)


def own_forwards(model: torch.nn.Module) -> list[str]:
    return [name for name, module in model.named_modules() if "forward" in vars(module)]


@pytest.fixture
def without_bfloat16_units(monkeypatch):
    monkeypatch.setattr(quality, "has_bfloat16_units", lambda: False)


def test_half_precision_linears_multiply_in_float32_and_round_to_their_dtype(without_bfloat16_units):
    model = tiny_model(torch.bfloat16)
    linear = model.model.layers[0].mlp.down_proj
    x = torch.randn(3, linear.in_features, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    with quality.float32_products(model):
        assert len(own_forwards(model)) == sum(isinstance(m, torch.nn.Linear) for m in model.modules())
        out = linear(x)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, torch.nn.functional.linear(x.float(), linear.weight.float()).to(torch.bfloat16))
    assert own_forwards(model) == []


def test_float32_models_and_cpus_with_bfloat16_units_keep_their_own_matmuls(monkeypatch, without_bfloat16_units):
    with quality.float32_products(model := tiny_model(torch.float32)):
        assert own_forwards(model) == []
    monkeypatch.setattr(quality, "has_bfloat16_units", lambda: True)
    with quality.float32_products(model := tiny_model(torch.bfloat16)):
        assert own_forwards(model) == []


def test_the_reference_is_the_model_in_float32_to_rounding_and_quality_leaves_the_model_as_it_was(
        without_bfloat16_units):
    model, tokenizer = tiny_model(torch.bfloat16), tiny_tokenizer()
    tokens = torch.tensor([quality.heldout_windows(tokenizer)[0]])
    with quality.float32_products(model):
        reference = model(tokens).logits.float()
    exact = tiny_model(torch.float32)(tokens).logits
    assert (reference.argmax(-1) == exact.argmax(-1)).float().mean() >= 0.9
    report = quality.quantization_quality(model, tokenizer, parse_scheme("q8"))
    assert report["tokens"] == sum(len(w) for w in quality.heldout_windows(tokenizer)) and report["windows"] >= 1
    assert report["top1_agreement"] >= 0.9 and own_forwards(model) == []
