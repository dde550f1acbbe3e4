"""`specc distill-data --prompts self-chat`: user turns the target samples itself."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from specc.cli.main import main
from specc.errors import UsageError
from specc.testing.checkpoints import build_tiny_checkpoint, hf_greedy, tiny_chat_tokenizer, tiny_tokenizer
from specc.train.self_prompts import self_chat_prompts, user_turn_bounds

OPENING, TURN_END, REPLY_OPENING = 10, 11, 12   # WORD_CHAT_TEMPLATE: "w10 {text} w11 " then "w12"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    directory = build_tiny_checkpoint("llama", tmp_path_factory.mktemp("self-chat") / "model")
    tiny_chat_tokenizer().save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def model(checkpoint):
    return AutoModelForCausalLM.from_pretrained(checkpoint).eval()


def test_the_user_turn_is_bounded_by_the_templates_own_tokens():
    assert user_turn_bounds(tiny_chat_tokenizer()) == ([OPENING], TURN_END)
    with pytest.raises(UsageError, match="needs a chat template"):
        user_turn_bounds(tiny_tokenizer())


def test_sampled_turns_are_finished_distinct_and_seeded(model):
    tokenizer = tiny_chat_tokenizer()
    before = torch.random.get_rng_state()
    turns = self_chat_prompts(model, tokenizer, count=6, seed=3, batch_size=4, max_tokens=96)
    assert torch.equal(torch.random.get_rng_state(), before)   # the caller's RNG is untouched
    texts = [t.text for t in turns]
    assert len(set(texts)) == 6 and all(t.chat and t.category == "self-chat" for t in turns)
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert ids and TURN_END not in ids and not set(ids) & set(tokenizer.all_special_ids)
    assert [t.text for t in self_chat_prompts(model, tokenizer, 6, 3, 4, 96)] == texts
    assert [t.text for t in self_chat_prompts(model, tokenizer, 6, 4, 4, 96)] != texts


def test_a_turn_the_model_never_finishes_is_an_error(model):
    with pytest.raises(UsageError, match="finished only 0 distinct user turns"):
        self_chat_prompts(model, tiny_chat_tokenizer(), count=2, seed=0, batch_size=4, max_tokens=1)


def test_distill_data_answers_the_models_own_turns(checkpoint, model, tmp_path, capsys):
    output = tmp_path / "self.jsonl"
    assert main(["distill-data", str(checkpoint), "--prompts", "self-chat", "--skip", "2", "--num-prompts", "3",
                 "--seed", "5", "--max-new-tokens", "4", "--batch-size", "4", "-o", str(output)]) == 0
    assert "3 conversations" in capsys.readouterr().out
    tokenizer = tiny_chat_tokenizer()
    turns = self_chat_prompts(model, tokenizer, count=5, seed=5, batch_size=4, max_tokens=128)[2:]
    records = [json.loads(line) for line in output.read_text().splitlines()]
    assert [r["category"] for r in records] == ["self-chat"] * 3
    for record, turn in zip(records, turns):
        prompt_ids = [OPENING, *tokenizer(turn.text, add_special_tokens=False)["input_ids"], TURN_END,
                      REPLY_OPENING]
        reply = hf_greedy(checkpoint, [prompt_ids], 4)[0]
        assert tokenizer(record["text"], add_special_tokens=False)["input_ids"] == prompt_ids + reply


def test_self_chat_without_a_chat_template_fails_before_writing(tmp_path, capsys):
    directory = build_tiny_checkpoint("llama", tmp_path / "plain")   # word tokenizer, no template
    output = tmp_path / "self.jsonl"
    assert main(["distill-data", str(directory), "--prompts", "self-chat", "-o", str(output)]) == 2
    assert "needs a chat template" in capsys.readouterr().err and not output.exists()
    assert main(["distill-data", str(directory), "--prompts", "self-chat", "--max-query-tokens", "0",
                 "-o", str(output)]) == 2
    assert "--max-query-tokens 0 must be at least 1" in capsys.readouterr().err
