"""Chat formatting: `specc.data.chat`, `specc run --chat`, and how `specc bench`
formats conversational (Spec-Bench `turns`) prompts."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from specc.bench import command as bench_command
from specc.data import prompts as prompt_sets
from specc.bench.harness import encode_fitting
from specc.data.prompts import Prompt, PromptSet, load_prompt_set
from specc.data.chat import chat_prompt_ids, has_chat_template
from specc.cli.main import build_parser, main
from specc.errors import UsageError
from specc.testing.checkpoints import build_tiny_checkpoint, hf_greedy, tiny_chat_tokenizer, tiny_tokenizer



@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    """(checkpoint with a chat template, its engine, an engine without a template)."""
    root = tmp_path_factory.mktemp("chat")
    plain = build_tiny_checkpoint("llama", root / "plain")
    chatty = build_tiny_checkpoint("llama", root / "chatty")
    tiny_chat_tokenizer().save_pretrained(chatty)
    for checkpoint in (plain, chatty):
        assert main(["compile", str(checkpoint), "--method", "none", "-o", str(root / f"{checkpoint.name}-engine"),
                     "--max-seq-len", "48"]) == 0
    return chatty, root / "chatty-engine", root / "plain-engine"


def test_chat_prompt_ids_apply_the_template_with_a_generation_prompt():
    tokenizer = tiny_chat_tokenizer()
    assert has_chat_template(tokenizer)
    assert chat_prompt_ids(tokenizer, "w5 w6") == [10, 5, 6, 11, 12]


def test_a_tokenizer_without_a_template_is_a_usage_error():
    tokenizer = tiny_tokenizer()
    assert not has_chat_template(tokenizer)
    with pytest.raises(UsageError, match="tokenizer has no chat template.*drop --chat"):
        chat_prompt_ids(tokenizer, "w5")
    with pytest.raises(UsageError, match="prompt is empty"):
        chat_prompt_ids(tiny_chat_tokenizer(), "")


def test_run_chat_generates_from_the_templated_prompt(engines, capsys):
    checkpoint, engine, _ = engines
    assert main(["run", str(engine), "--chat", "--prompt", "w5 w6", "--max-new-tokens", "6", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["token_ids"] and data["token_ids"] == hf_greedy(checkpoint, [[10, 5, 6, 11, 12]], 6)[0]
    assert main(["run", str(engine), "--chat", "--prompt", "w5 w6", "--max-new-tokens", "6"]) == 0
    out = capsys.readouterr().out
    assert not out.startswith("w5 w6") and out.strip() == data["text"].strip()   # the reply, not the prompt


def test_run_chat_without_a_template_exits_2(engines, capsys):
    _, _, plain_engine = engines
    assert main(["run", str(plain_engine), "--chat", "--prompt", "w5 w6", "--max-new-tokens", "2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specc: error: the model's tokenizer has no chat template") and "Traceback" not in err


@pytest.mark.shared_data
def test_turns_are_conversational_prompts(tmp_path, monkeypatch):
    monkeypatch.setenv(prompt_sets.SHARED_DATA_ENV, str(tmp_path))
    (tmp_path / "spec_bench").mkdir()
    (tmp_path / "spec_bench" / "question.jsonl").write_text(json.dumps({"category": "qa", "turns": ["q?"]}) + "\n")
    (tmp_path / "gsm8k").mkdir()
    (tmp_path / "gsm8k" / "test.jsonl").write_text(json.dumps({"question": "How many?"}) + "\n")
    assert load_prompt_set("spec_bench").prompts == [Prompt("q?", "qa", chat=True)]
    assert load_prompt_set("gsm8k").prompts == [Prompt("How many?", "gsm8k", chat=False)]
    mine = tmp_path / "mine.jsonl"
    mine.write_text(json.dumps({"turns": ["t1"]}) + "\n" + json.dumps({"prompt": "p1"}) + "\n")
    assert [(p.text, p.chat) for p in load_prompt_set(str(mine)).prompts] == [("t1", True), ("p1", False)]


def _fake_engine(tokenizer):
    return SimpleNamespace(tokenizer=tokenizer, max_seq_len=48,
                           encode=lambda text: tokenizer(text, add_special_tokens=True)["input_ids"])


PROMPTS = PromptSet("mixed", [Prompt("w5 w6", "qa", chat=True), Prompt("w7 w8", "code")], "test")


def test_bench_formats_conversational_prompts_with_the_template():
    prompts, ids, notes = encode_fitting(_fake_engine(tiny_chat_tokenizer()), PROMPTS, 8)
    assert ids == [[10, 5, 6, 11, 12], [7, 8]]
    assert [p["chat_template"] for p in prompts] == [True, False]
    assert any("1 conversational prompt(s) formatted with the model's chat template" in n for n in notes)


def test_bench_no_chat_template_encodes_plain_text():
    prompts, ids, notes = encode_fitting(_fake_engine(tiny_chat_tokenizer()), PROMPTS, 8, chat_template=False)
    assert ids == [[5, 6], [7, 8]] and not any(p["chat_template"] for p in prompts) and notes == []


def test_bench_without_a_template_says_so():
    _, ids, notes = encode_fitting(_fake_engine(tiny_tokenizer()), PROMPTS, 8)
    assert ids == [[5, 6], [7, 8]]
    assert any("encoded as plain text: the model's tokenizer has no chat template" in n for n in notes)


@pytest.mark.parametrize("flag, expected", [([], True), (["--no-chat-template"], False)])
def test_bench_flag_reaches_the_harness(flag, expected, monkeypatch):
    seen = {}

    def fake_benchmark(options):
        seen["chat_template"] = options.chat_template
        raise UsageError("stop here")

    monkeypatch.setattr(bench_command, "benchmark", fake_benchmark)
    args = build_parser().parse_args(["bench", "engine-dir", *flag])
    with pytest.raises(UsageError):
        bench_command.run_bench(args)
    assert seen == {"chat_template": expected}
