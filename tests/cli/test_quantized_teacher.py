"""`specc compile --quantize … --teacher quantized`: the teacher's weights are the ones the
engine's kernels compute with (`Scheme.dequantize`, `round_linear_weights`), a tied head is
untied from the embedding the engine keeps, the refusal without `--quantize`, and a trained
method's manifest saying which teacher it learned from."""

from __future__ import annotations

import json

import pytest
import torch

from specc.capture.load import load_model
from specc.cli.main import main
from specc.kernels import blocked_matmul as blocked
from specc.quantize.schemes import parse_scheme, scheme_for
from specc.quantize.teacher import round_linear_weights
from specc.testing.checkpoints import build_tiny_checkpoint, sample_calibration_text

TRAIN = ["train_steps=4", "train_seq_len=32", "eval_sequences=2", "eval_every=4"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return build_tiny_checkpoint("llama", tmp_path_factory.mktemp("teacher") / "model")


def kernel_weight(name: str, weight: torch.Tensor) -> torch.Tensor:
    """The weight a scheme's kernel computes with: its product with the identity (the blocked
    kernels through their fp32 reference, whose int8 activations are exact on an identity)."""
    scheme = parse_scheme(name)
    packed = scheme.pack(weight)
    eye = torch.eye(weight.shape[1], dtype=weight.dtype)
    if name in ("q4", "q6", "q8"):
        return blocked.reference(eye, packed["blocks"], scheme.bits, weight.shape[0]).T
    return scheme.matmul(eye, packed).float().T


@pytest.mark.parametrize("name", ["int8", "int4", "int4-g64", "q4", "q6", "q8"])
def test_a_dequantized_weight_is_what_the_kernel_computes_with(name):
    weight = torch.randn(32, 128, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    dequantized = parse_scheme(name).dequantize(weight)
    assert dequantized.dtype == torch.bfloat16 and dequantized.shape == weight.shape
    torch.testing.assert_close(dequantized.float(), kernel_weight(name, weight), rtol=1e-2, atol=1e-2)
    assert not torch.equal(dequantized, weight)


def test_rounding_a_model_rounds_every_linear_and_unties_the_head(checkpoint):
    model = load_model(checkpoint, "float32")
    model.lm_head.weight = model.model.embed_tokens.weight   # tied, as SmolLM2's and Qwen2.5's are
    embedding = model.model.embed_tokens.weight.detach().clone()
    originals = {name: m.weight.detach().clone() for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    q4 = parse_scheme("q4")
    assert round_linear_weights(model, q4, torch.bfloat16) == len(originals)
    for name, module in model.named_modules():
        if name in originals:
            chosen = scheme_for(q4, originals[name], logits=module.out_features == model.config.vocab_size)
            expected = chosen.dequantize(originals[name].to(torch.bfloat16)).float()
            assert torch.equal(module.weight, expected), name
    assert torch.equal(model.model.embed_tokens.weight, embedding)
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()


def test_a_quantized_teacher_without_quantize_is_refused_before_any_work(checkpoint, tmp_path, capsys):
    code = main(["compile", str(checkpoint), "--method", "none", "--teacher", "quantized", "-o", str(tmp_path / "e")])
    assert code == 2 and "--teacher quantized distills from the model as --quantize packs it" in capsys.readouterr().err
    assert not (tmp_path / "e").exists()


def test_a_method_trained_on_the_quantized_teacher_records_it(checkpoint, tmp_path, capsys):
    calibration = sample_calibration_text(checkpoint, tmp_path / "calib.txt", sequences=8)
    settings = [arg for setting in [*TRAIN, f"calib_data={calibration}"] for arg in ("--set", setting)]
    engine = tmp_path / "e"
    code = main(["compile", str(checkpoint), "--method", "kangaroo", "--dtype", "bfloat16", "--quantize", "int8",
                 "--teacher", "quantized", "--max-seq-len", "64", *settings, "-o", str(engine)])
    assert code == 0, capsys.readouterr().err
    assert json.loads((engine / "manifest.json").read_text())["training"]["teacher"] == "int8 weights"
    assert main(["run", str(engine), "--prompt", "w5 w6 w7", "--max-new-tokens", "6", "--json"]) == 0
