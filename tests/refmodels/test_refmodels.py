"""Fast tests of the reference-model trainer: corpus, tokenizer, a micro training run, cache, CLI."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from specc import refmodels
from specc.refmodels import (
    CorpusPlan,
    ModelShape,
    ReferenceSpec,
    TokenizerSpec,
    TrainingPlan,
    build_from_spec,
    heldout_prompts,
    read_reference,
)
from specc.data import corpora as corpus_module
from specc.refmodels.__main__ import main as cli_main
from specc.data.corpora import CorpusUnavailableError, load_corpus, select_corpus, train_prompts
from specc.refmodels.tokenizer import ENDOFTEXT, save_tokenizer, train_tokenizer

pytestmark = pytest.mark.shared_data   # reads ../shared/data when present (CI reruns it hidden)

MICRO = ReferenceSpec(
    name="micro",
    description="a few seconds of training, for tests",
    model=ModelShape(
        hidden_size=32,
        intermediate_size=64,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        max_position_embeddings=64,
    ),
    tokenizer=TokenizerSpec(vocab_size=320, code_bytes=100_000, text_bytes=100_000),
    corpus=CorpusPlan(code_bytes=150_000, text_bytes=100_000),
    training=TrainingPlan(
        steps=40, batch_size=4, seq_len=32, learning_rate=1e-2, warmup_steps=4, eval_windows=4
    ),
)

ROUND_TRIP_SAMPLES = [
    "def f(a , b):\n\treturn a+b  # tabs, double spaces\n",
    "    if x:\n        yield {'k': [1, 2.5e-3]}\n\n\n",
    "Ünïcödé, emoji 🎉 and CJK 漢字 survive byte-level BPE.",
    "",
]


def _has_shared_text() -> bool:
    return bool(load_corpus("text").train)


needs_shared_text = pytest.mark.skipif(
    not _has_shared_text(), reason="shared English text data is not present"
)


# The thread count is part of a CPU build's cache key (it shapes the trained weights), and the
# default follows the machine's load, which moves while tests run beside each other: fix it.
MICRO_THREADS = 1


@pytest.fixture(scope="module")
def micro_checkpoint(tmp_path_factory) -> Path:
    return build_from_spec(
        MICRO, tmp_path_factory.mktemp("cache"), progress=False, device="cpu", threads=MICRO_THREADS
    )


# --- tokenizer ---------------------------------------------------------------


def test_tokenizer_round_trips_text_through_auto_tokenizer(tmp_path):
    from transformers import AutoTokenizer

    sample = [doc.text for doc in load_corpus("code").train[:20]]
    save_tokenizer(train_tokenizer(sample, vocab_size=400), tmp_path, model_max_length=128)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)

    for text in ROUND_TRIP_SAMPLES:
        ids = tokenizer(text)["input_ids"]
        assert tokenizer.decode(ids) == text
    assert tokenizer.eos_token == tokenizer.bos_token == tokenizer.pad_token == ENDOFTEXT
    assert tokenizer("x = 1")["input_ids"][0] != tokenizer.eos_token_id  # no bos is added
    assert tokenizer.model_max_length == 128


def test_tokenizer_training_is_deterministic():
    sample = [doc.text for doc in load_corpus("code").train[:20]]
    assert train_tokenizer(sample, 400).to_str() == train_tokenizer(sample, 400).to_str()


# --- corpus ------------------------------------------------------------------


def test_code_split_is_deterministic_and_disjoint_by_file():
    first = load_corpus("code")
    corpus_module._load_code_corpus.cache_clear()
    second = load_corpus("code")

    assert first == second
    train_sources = {doc.source for doc in first.train}
    heldout_sources = {doc.source for doc in first.heldout}
    assert heldout_sources and train_sources
    assert not train_sources & heldout_sources
    assert all(source.endswith(".py") for source in train_sources | heldout_sources)


@needs_shared_text
def test_text_split_holds_out_the_tail_of_every_source():
    text = load_corpus("text")
    assert [doc.source for doc in text.train] == [doc.source for doc in text.heldout]
    for train_doc, heldout_doc in zip(text.train, text.heldout):
        assert heldout_doc.text and train_doc.text.endswith("\n")
        assert len(heldout_doc.text) < len(train_doc.text) / 10


def test_capped_training_documents_stay_under_the_cap():
    code = load_corpus("code")
    capped = code.capped_train(200_000)
    assert capped == code.capped_train(200_000)
    assert 150_000 < sum(len(doc.text.encode()) for doc in capped) <= 200_000


def test_heldout_code_prompts_are_deterministic_and_unseen_in_training():
    prompts = heldout_prompts("code", 12, 200)
    assert prompts == heldout_prompts("code", 12, 200)
    assert len(prompts) == 12
    assert all(0 < len(prompt) <= 200 and not prompt[-1].isspace() for prompt in prompts)
    assert all(prompt.lstrip().startswith(("def ", "class ", "async ")) for prompt in prompts)
    train_texts = [doc.text for doc in load_corpus("code").train]
    assert not any(prompt in text for prompt in prompts[:4] for text in train_texts)


def test_training_code_prompts_are_deterministic_spread_and_never_the_benchmarks():
    prompts = train_prompts("code", 40, 300)
    assert prompts == train_prompts("code", 40, 300)
    assert prompts[:10] == train_prompts("code", 10, 300)
    assert prompts != train_prompts("code", 40, 300, seed=1)
    assert len(set(prompts)) == 40
    assert all(0 < len(prompt) <= 300 and not prompt[-1].isspace() for prompt in prompts)
    heldout_texts = [doc.text for doc in load_corpus("code").heldout]
    assert not any(prompt in text for prompt in prompts for text in heldout_texts)
    # Spread over the split: many documents, not just the first ones in path order.
    train = load_corpus("code").train
    sources = {next(i for i, doc in enumerate(train) if prompt in doc.text) for prompt in prompts}
    assert len(sources) >= 30 and max(sources) > len(train) // 2


@needs_shared_text
def test_heldout_text_prompts_interleave_sources():
    prompts = heldout_prompts("text", 5, 160)
    assert len(set(prompts)) == 5
    assert all(0 < len(prompt) <= 160 and not prompt[-1].isspace() for prompt in prompts)


def test_a_zero_cap_leaves_a_corpus_out():
    selection = select_corpus(
        code_bytes=50_000, text_bytes=0, tokenizer_code_bytes=10_000, tokenizer_text_bytes=0
    )
    assert list(selection.train) == list(selection.heldout) == ["code"]
    assert all(doc.source.startswith("stdlib:") for doc in selection.tokenizer_sample)


def test_missing_shared_data_is_skipped_with_a_warning(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("SPECC_SHARED_DATA", str(tmp_path))
    caplog.set_level(logging.INFO, logger="specc.data.corpora")   # an info notice (shown with --verbose)

    selection = select_corpus(
        code_bytes=50_000, text_bytes=50_000, tokenizer_code_bytes=10_000, tokenizer_text_bytes=10_000
    )

    assert list(selection.train) == ["code"]
    assert "not found" in caplog.text
    with pytest.raises(CorpusUnavailableError):
        heldout_prompts("text", 3, 100)


# --- training ----------------------------------------------------------------


def test_micro_checkpoint_loads_with_auto_classes(micro_checkpoint):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(micro_checkpoint)
    tokenizer = AutoTokenizer.from_pretrained(micro_checkpoint)

    assert model.config.model_type == "llama"
    assert model.config.vocab_size == len(tokenizer)
    assert model.config.eos_token_id == tokenizer.eos_token_id
    prompt = tokenizer("def main():\n", return_tensors="pt")
    output = model.generate(**prompt, max_new_tokens=5, do_sample=False)
    assert output.shape == (1, prompt["input_ids"].shape[1] + 5)


def test_micro_training_lowers_the_loss_and_records_metrics(micro_checkpoint):
    reference = read_reference(micro_checkpoint)
    metrics = reference["metrics"]

    assert metrics["val_loss"] < metrics["initial_val_loss"] - 0.5
    assert metrics["loss_curve"][-1][1] < metrics["loss_curve"][0][1]
    assert metrics["tokens_seen"] == 40 * 4 * 32
    assert set(metrics["val_by_kind"]) <= {"code", "text"}
    for key in ("train_loss", "val_accuracy", "train_seconds"):
        assert key in metrics
    assert reference["spec"] == MICRO.as_dict()
    assert reference["versions"]["torch"] == torch.__version__


def test_same_seed_gives_identical_weights(micro_checkpoint, tmp_path):
    rebuilt = build_from_spec(MICRO, tmp_path, progress=False, device="cpu", threads=MICRO_THREADS)

    assert rebuilt.name == micro_checkpoint.name
    first = load_file(micro_checkpoint / "model.safetensors")
    second = load_file(rebuilt / "model.safetensors")
    assert first.keys() == second.keys()
    assert all(torch.equal(first[name], second[name]) for name in first)
    assert (micro_checkpoint / "tokenizer.json").read_text() == (rebuilt / "tokenizer.json").read_text()


def test_cached_checkpoint_is_reused_without_training(micro_checkpoint, monkeypatch):
    from specc.refmodels import train

    def fail(*args, **kwargs):
        raise AssertionError("the cached checkpoint should have been reused")

    monkeypatch.setattr(train, "train_reference_model", fail)
    reused = build_from_spec(MICRO, micro_checkpoint.parent, progress=False, threads=MICRO_THREADS)
    assert reused == micro_checkpoint


def test_a_different_spec_gets_a_different_cache_entry(micro_checkpoint, monkeypatch):
    from specc.refmodels import train

    calls = []
    monkeypatch.setattr(train, "train_reference_model", lambda *args, **kwargs: calls.append(args))
    changed = dataclasses.replace(MICRO, training=dataclasses.replace(MICRO.training, seed=7))

    rebuilt = build_from_spec(changed, micro_checkpoint.parent, progress=False, threads=MICRO_THREADS)
    assert rebuilt != micro_checkpoint
    assert len(calls) == 1


def test_a_corrupt_reference_file_triggers_a_rebuild(micro_checkpoint, monkeypatch, tmp_path):
    from specc.refmodels import train

    broken = tmp_path / micro_checkpoint.name
    broken.mkdir()
    (broken / "specc_reference.json").write_text("{not json")
    calls = []
    monkeypatch.setattr(train, "train_reference_model", lambda *args, **kwargs: calls.append(args))

    build_from_spec(MICRO, tmp_path, progress=False, threads=MICRO_THREADS)
    assert len(calls) == 1


def test_qwen2_family_builds_from_code_alone(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    monkeypatch.setenv("SPECC_SHARED_DATA", str(tmp_path / "no-shared-data"))
    spec = dataclasses.replace(
        MICRO,
        name="micro-qwen2",
        model=dataclasses.replace(MICRO.model, family="qwen2", tie_word_embeddings=True),
        training=dataclasses.replace(MICRO.training, steps=10),
    )

    checkpoint = build_from_spec(spec, tmp_path / "cache", progress=False, device="cpu")

    model = AutoModelForCausalLM.from_pretrained(checkpoint)
    assert model.config.model_type == "qwen2"
    assert model.config.tie_word_embeddings
    assert list(read_reference(checkpoint)["metrics"]["val_by_kind"]) == ["code"]
    assert not list(checkpoint.parent.glob(".*.tmp"))  # no staging directory left behind


# --- specs and CLI -----------------------------------------------------------


def test_builtin_specs_meet_their_contract():
    specs = refmodels.REFERENCE_MODELS
    assert {"tiny", "small", "small-qwen2", "medium"} <= set(specs)
    assert specs["small"].model.num_layers >= 8
    assert specs["small-qwen2"].model.family == "qwen2"
    assert len({spec.tokenizer for spec in specs.values()}) == 1  # any model can draft for another
    assert len({spec.fingerprint() for spec in specs.values()}) == len(specs)


def test_invalid_spec_is_rejected_with_a_reason():
    with pytest.raises(ValueError, match="multiple of num_heads"):
        dataclasses.replace(MICRO, model=dataclasses.replace(MICRO.model, hidden_size=33))


def test_cli_rejects_an_unknown_name_in_one_line(capsys):
    assert cli_main(["build", "no-such-model"]) == 2
    error = capsys.readouterr().err.strip()
    assert "\n" not in error
    assert "no-such-model" in error and "tiny" in error and "small-qwen2" in error


def test_cli_lists_every_spec(capsys):
    assert cli_main(["list"]) == 0
    listing = capsys.readouterr().out
    for name in refmodels.REFERENCE_MODELS:
        assert f"\n{name} " in listing


def test_cli_build_prints_path_and_metrics(micro_checkpoint, monkeypatch, capsys):
    monkeypatch.setitem(refmodels.REFERENCE_MODELS, "micro", MICRO)

    assert cli_main(["build", "micro", "--cache-dir", str(micro_checkpoint.parent), "--quiet"]) == 0

    captured = capsys.readouterr()
    assert captured.out.splitlines() == [str(micro_checkpoint)], "stdout holds only the path"
    assert any(line.split()[0] == "val_loss" for line in captured.err.splitlines() if line.strip())
    json.loads((micro_checkpoint / "config.json").read_text())
