"""`specc distill-draft`: a truncated, self-distilled draft checkpoint for `draft-model`."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from specc.cli.main import main
from specc.compiler import CompileRequest, compile_engine
from specc.engine.loaded import load_engine
from specc.testing.checkpoints import (WORD_CHAT_TEMPLATE, assert_matches_hf_greedy, build_tiny_checkpoint,
                           sample_calibration_text, tiny_chat_tokenizer, varied_prompts)
from specc.train.draft_distill import RECORD_FILE, DraftDistillRequest, distill_draft

SMALL = dict(train_windows=48, seq_len=32, eval_sequences=6, teacher_top_k=16)


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    """family -> (target with a chat template, calibration text the target sampled). qwen3's
    config has a per-layer list (`layer_types`) and its embeddings are tied here."""
    root = tmp_path_factory.mktemp("distill-draft")
    made = {}
    for family, tied in (("llama", False), ("qwen3", True)):
        target = build_tiny_checkpoint(family, root / family, tie_word_embeddings=tied)
        tiny_chat_tokenizer().save_pretrained(target)
        made[family] = (target, sample_calibration_text(target, root / f"{family}.txt", sequences=48))
    return made


def _distill(target, calib, output, **overrides):
    settings = {**SMALL, "layers": 2, "train_steps": 0, "seed": 0, **overrides}
    return distill_draft(DraftDistillRequest(model=str(target), output=output, calib_data=str(calib), **settings))


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_the_untrained_draft_is_the_targets_first_layers(targets, tmp_path, family):
    target_dir, calib = targets[family]
    report = _distill(target_dir, calib, tmp_path / "draft", layers=2)
    draft = AutoModelForCausalLM.from_pretrained(tmp_path / "draft").eval()
    target = AutoModelForCausalLM.from_pretrained(target_dir).eval()
    assert (report.layers, report.target_layers, draft.config.num_hidden_layers) == (2, 3, 2)
    assert len(draft.model.layers) == 2 and draft.config.vocab_size == target.config.vocab_size
    if family == "qwen3":
        assert draft.config.layer_types == target.config.layer_types[:2]
    tied = target.config.tie_word_embeddings
    assert draft.config.tie_word_embeddings == tied
    assert (draft.lm_head.weight is draft.model.embed_tokens.weight) == tied
    target_weights = target.state_dict()
    for name, tensor in draft.state_dict().items():
        assert torch.equal(tensor, target_weights[name]), name
    ids = torch.tensor([varied_prompts(1, 96, seed=3)[0] * 3])
    with torch.no_grad():
        hidden = target(ids, output_hidden_states=True).hidden_states[2]   # after the target's second layer
        early_exit = target.lm_head(target.model.norm(hidden))
        assert torch.allclose(draft(ids).logits, early_exit, atol=1e-5)
    copied = tmp_path / "draft"
    assert (copied / "chat_template.jinja").read_text() == WORD_CHAT_TEMPLATE
    assert (copied / "tokenizer.json").read_text() == (target_dir / "tokenizer.json").read_text()
    record = json.loads((copied / RECORD_FILE).read_text())
    assert (record["target"], record["layers"], record["settings"]["train_steps"]) == (str(target_dir), 2, 0)
    assert record["training"]["heldout"][0]["acceptance"] == pytest.approx(report.training.initial.acceptance, abs=1e-4)


def test_training_moves_only_the_layers_and_norm_and_brings_the_draft_closer(targets, tmp_path):
    target_dir, calib = targets["llama"]
    untrained = _distill(target_dir, calib, tmp_path / "untrained", layers=1, train_steps=0)
    trained = _distill(target_dir, calib, tmp_path / "trained", layers=1, train_steps=150)
    assert trained.training.initial == untrained.training.final   # same held-out windows, same start
    assert trained.training.final.loss < untrained.training.final.loss - 0.05
    before, after = load_file(tmp_path / "untrained" / "model.safetensors"), load_file(
        tmp_path / "trained" / "model.safetensors")
    moved = {name for name in before if not torch.equal(before[name], after[name])}
    assert moved and all(name.startswith(("model.layers.", "model.norm.")) for name in moved)
    assert {"model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"} <= set(before)
    assert "model.norm.weight" in moved
    again = _distill(target_dir, calib, tmp_path / "again", layers=1, train_steps=150)
    assert again.training.final == trained.training.final
    repeat = load_file(tmp_path / "again" / "model.safetensors")
    assert all(torch.equal(repeat[name], after[name]) for name in after), "not deterministic for a seed"


def test_draft_model_with_the_distilled_draft_is_lossless(checkpoints, tmp_path):
    target, _ = checkpoints("llama")   # its EOS is a token greedy decoding emits: both stopping rules occur
    calib = sample_calibration_text(target, tmp_path / "calib.txt", sequences=24)
    _distill(target, calib, tmp_path / "draft", layers=1, train_steps=40)
    compile_engine(CompileRequest(model=str(target), method="draft-model", output=tmp_path / "engine",
                                  max_seq_len=96, settings=[f"draft_model={tmp_path / 'draft'}",
                                                            "num_draft_tokens=3"]))
    engine = load_engine(tmp_path / "engine")
    results = assert_matches_hf_greedy(lambda ids: engine.generate_ids(ids, 16), target,
                                       varied_prompts(8, 96, seed=11), 16)
    assert sum(r.stats.drafted_tokens for r in results) > 0


def test_bad_input_exits_2_and_leaves_nothing(targets, tmp_path, capsys):
    target_dir, calib = targets["llama"]
    output = tmp_path / "draft"

    def run(*extra):
        code = main(["distill-draft", str(target_dir), "-o", str(output), "--calib-data", str(calib),
                     "--train-steps", "0", "--train-windows", "4", "--seq-len", "16", *extra])
        return code, capsys.readouterr().err

    for extra, message in ((["--layers", "0"], "--layers 0 must be at least 1"),
                           (["--layers", "3"], "--layers 3 must be below the target's 3 layers"),
                           (["--calib-data", str(tmp_path / "missing.jsonl")], "missing.jsonl: no such file"),
                           (["--learning-rate", "0"], "--learning-rate 0.0 must be positive"),
                           (["--layers", "1", "--seq-len", "100000"], "pass more text with --calib-data FILE or lower --seq-len")):
        code, err = run(*extra)
        assert code == 2 and message in err and err.count("\n") == 1, err
        assert list(tmp_path.iterdir()) == []
    output.mkdir()
    (output / "keep").write_text("x")
    code, err = run()
    assert code == 2 and "already exists; pass --force" in err
    assert [p.name for p in output.iterdir()] == ["keep"]
    code, _ = run("--force", "--layers", "1")
    assert code == 0 and (output / "model.safetensors").is_file() and not (output / "keep").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["draft"]   # no staging directory left beside it
