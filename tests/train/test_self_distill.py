"""`specc distill-data`: the target's own greedy replies as calibration text."""

from __future__ import annotations

import json

import pytest

from specc.cli.main import main
from specc.testing.checkpoints import build_tiny_checkpoint, hf_greedy, tiny_chat_tokenizer, tiny_tokenizer
from specc.train.corpus import token_windows

PROMPTS = ["w5 w6", "w7 w8 w9 w13 w14", "w20", "w21 w22 w23", "w30 w31 w32 w33 w34 w35 w36", "w40 w41"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("distill-data")
    directory = build_tiny_checkpoint("llama", root / "model")
    tiny_chat_tokenizer().save_pretrained(directory)
    return directory


def _prompt_file(tmp_path, prompts=PROMPTS):
    path = tmp_path / "questions.jsonl"
    path.write_text("".join(json.dumps({"turns": [p], "category": "c"}) + "\n" for p in prompts))
    return path


def _records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_records_are_the_chat_prompts_and_the_targets_greedy_replies(checkpoint, tmp_path, capsys):
    output = tmp_path / "calib.jsonl"
    assert main(["distill-data", str(checkpoint), "--prompts", str(_prompt_file(tmp_path)), "--skip", "1",
                 "--num-prompts", "4", "--max-new-tokens", "5", "--batch-size", "3", "-o", str(output)]) == 0
    assert "4 conversations" in capsys.readouterr().out
    records = _records(output)
    tokenizer = tiny_tokenizer()
    for record, prompt in zip(records, PROMPTS[1:5]):
        prompt_ids = [10, *tokenizer(prompt, add_special_tokens=False)["input_ids"], 11, 12]
        reply = hf_greedy(checkpoint, [prompt_ids], 5)[0]   # one at a time, no padding
        assert tokenizer(record["text"], add_special_tokens=False)["input_ids"] == prompt_ids + reply
        assert (record["prompt_tokens"], record["reply_tokens"]) == (len(prompt_ids), len(reply))


def test_the_file_is_calibration_text(checkpoint, tmp_path):
    output = tmp_path / "calib.jsonl"
    assert main(["distill-data", str(checkpoint), "--prompts", str(_prompt_file(tmp_path)),
                 "--max-new-tokens", "8", "-o", str(output)]) == 0
    windows = token_windows(tiny_tokenizer(), str(output), seq_len=8, train_count=4, heldout_count=1, seed=0)
    assert windows.train and windows.heldout and windows.source.startswith(str(output))
    marks = [m for masks in (windows.train_scored, windows.heldout_scored) for m in masks]
    assert len(marks) == len(windows.train) + len(windows.heldout) and any(m.any() for m in marks)


def test_an_existing_output_needs_force_and_bad_input_leaves_nothing(checkpoint, tmp_path, capsys):
    output = tmp_path / "calib.jsonl"
    output.write_text("keep\n")
    prompts = str(_prompt_file(tmp_path))
    assert main(["distill-data", str(checkpoint), "--prompts", prompts, "-o", str(output)]) == 2
    assert "exists; pass --force" in capsys.readouterr().err and output.read_text() == "keep\n"
    fresh = tmp_path / "fresh.jsonl"
    assert main(["distill-data", str(checkpoint), "--prompts", prompts, "--skip", "6", "-o", str(fresh)]) == 2
    assert "--skip 6 leaves no prompt" in capsys.readouterr().err
    assert main(["distill-data", str(checkpoint), "--prompts", prompts, "--batch-size", "0", "-o", str(fresh)]) == 2
    assert "--batch-size 0 must be at least 1" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["calib.jsonl", "questions.jsonl"]
    assert main(["distill-data", str(checkpoint), "--prompts", prompts, "--max-new-tokens", "3", "--force",
                 "-o", str(output)]) == 0
    assert len(_records(output)) == len(PROMPTS)


def test_a_generated_prompt_set_yields_every_prompt_asked_for(tmp_path):
    # Generated sets build only as many prompts as asked for: skip + num, not their default 16.
    from specc.train.self_distill import DistillDataRequest, selected_prompts

    request = DistillDataRequest(model="unused", prompts="code-train", output=tmp_path / "out.jsonl", skip=10,
                                 num_prompts=20)
    chosen, source = selected_prompts(request)
    assert len(chosen) == 20 and "prompts 10..29" in source
    assert all(p.category == "code" and not p.chat for p in chosen)
