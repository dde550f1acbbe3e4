"""Training defaults shrink with a model larger than they were measured on, and never override
what the user sets."""

from __future__ import annotations

import logging

import pytest
from transformers import LlamaConfig, Qwen2Config

from specc.compiler import CompileRequest, validate
from specc.contract.descriptor import get_method
from specc.methods.kangaroo.config import KangarooConfig
from specc.train.model_size import REFERENCE_PARAMETERS, layer_parameters, scaled_to_model

QWEN_1_5B = Qwen2Config(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                        num_key_value_heads=2)
SMOLLM2_135M = LlamaConfig(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                           num_key_value_heads=3)


def test_layer_parameters_count_attention_and_a_gated_mlp():
    assert layer_parameters(QWEN_1_5B) == 28 * (2 * 1536 * 1536 + 2 * 1536 * 256 + 3 * 1536 * 8960)
    assert layer_parameters(SMOLLM2_135M) < REFERENCE_PARAMETERS


def test_defaults_shrink_in_proportion_above_the_reference_and_stop_at_the_floor():
    assert scaled_to_model(3000, SMOLLM2_135M, floor=300) == 3000
    assert scaled_to_model(3000, QWEN_1_5B, floor=300) == round(3000 * REFERENCE_PARAMETERS / layer_parameters(QWEN_1_5B))
    assert scaled_to_model(3000, QWEN_1_5B, floor=2000) == 2000


def test_kangaroo_trains_shorter_and_slower_on_a_large_model_only():
    sized = get_method("kangaroo").sized_defaults
    assert sized(SMOLLM2_135M) == {"train_windows": 768, "train_steps": 3000, "learning_rate": 3e-3}
    large = sized(QWEN_1_5B)
    assert 128 <= large["train_windows"] < 768 and 300 <= large["train_steps"] < 3000
    assert large["learning_rate"] == pytest.approx(3e-3 * 576 / 1536)


@pytest.fixture
def large_checkpoint(tmp_path):
    """A config.json of the 1.5B's shape: `validate` reads no weights."""
    directory = tmp_path / "large"
    QWEN_1_5B.save_pretrained(directory)
    return directory


@pytest.mark.parametrize("settings", [[], ["train_steps=50"], {"train_steps": 50}])
def test_compile_takes_the_sized_defaults_for_unset_fields_and_says_so(large_checkpoint, tmp_path, caplog, settings):
    request = CompileRequest(model=str(large_checkpoint), method="kangaroo", output=tmp_path / "e",
                             settings=settings, device="cpu")
    with caplog.at_level(logging.WARNING, logger="specc"):
        _, _, config, _ = validate(request)
    sized = get_method("kangaroo").sized_defaults(QWEN_1_5B)
    assert config.train_windows == sized["train_windows"] != KangarooConfig().train_windows
    assert config.train_steps == (sized["train_steps"] if not settings else 50)
    assert f"train_windows={sized['train_windows']}" in caplog.text
    assert ("train_steps=" in caplog.text) is not bool(settings)


def test_eagle_learns_at_a_rate_scaled_to_a_wider_model():
    sized = get_method("eagle").sized_defaults
    assert sized(SMOLLM2_135M)["learning_rate"] == 3e-3
    assert sized(QWEN_1_5B)["learning_rate"] == pytest.approx(3e-3 * 576 / 1536)
