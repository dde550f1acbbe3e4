"""Prompt-set loading: named sets, shared data present and absent, user files."""

from __future__ import annotations

import json

import pytest

from specc.data import prompts as prompt_sets
from specc.data.prompts import Prompt, interleave_categories, load_prompt_set
from specc.data.stdlib_prompts import code_prefix, stdlib_code_prompts
from specc.errors import UsageError

pytestmark = pytest.mark.shared_data   # reads ../shared/data when present (CI reruns it hidden)


@pytest.fixture
def shared(tmp_path, monkeypatch):
    monkeypatch.setenv(prompt_sets.SHARED_DATA_ENV, str(tmp_path))
    return tmp_path


def _write_jsonl(path, records):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_spec_bench_groups_by_category_and_interleaves(shared):
    _write_jsonl(shared / "spec_bench" / "question.jsonl", [
        {"question_id": 1, "category": "writing", "turns": ["write a", "then b"]},
        {"question_id": 2, "category": "writing", "turns": ["write c"]},
        {"question_id": 3, "category": "math", "turns": ["add 1 and 2"]},
    ])
    loaded = load_prompt_set("spec_bench")
    assert [(p.category, p.text) for p in loaded.prompts] == [
        ("writing", "write a"), ("math", "add 1 and 2"), ("writing", "write c")]
    assert loaded.categories == ["writing", "math"]
    assert [p.category for p in load_prompt_set("spec_bench", limit=2).prompts] == ["writing", "math"]


def test_gsm8k_uses_questions(shared):
    _write_jsonl(shared / "gsm8k" / "test.jsonl", [{"question": "How many?", "answer": "#### 3"}])
    loaded = load_prompt_set("gsm8k")
    assert loaded.prompts == [Prompt("How many?", "gsm8k")]


@pytest.mark.parametrize("name, missing", [("spec_bench", "question.jsonl"), ("gsm8k", "test.jsonl")])
def test_absent_shared_data_names_the_missing_file(shared, name, missing):
    with pytest.raises(UsageError, match=rf"{name}.*{missing}.*does not exist.*SPECC_SHARED_DATA"):
        load_prompt_set(name)


def test_shared_data_defaults_beside_the_checkout(monkeypatch):
    monkeypatch.delenv(prompt_sets.SHARED_DATA_ENV, raising=False)
    assert prompt_sets.shared_data_dir().parts[-2:] == ("shared", "data")


def test_user_jsonl_file(tmp_path):
    path = tmp_path / "mine.jsonl"
    _write_jsonl(path, [{"prompt": "p1", "category": "x"}, {"text": "p2"}, {"turns": ["p3", "p4"], "category": "x"}])
    loaded = load_prompt_set(str(path))
    assert [(p.text, p.category) for p in loaded.prompts] == [("p1", "x"), ("p2", "mine"), ("p3", "x")]


def test_user_jsonl_errors_name_the_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "ok"}\nnot json\n')
    with pytest.raises(UsageError, match=r"bad.jsonl:2 is not valid JSON"):
        load_prompt_set(str(path))
    path.write_text('{"question": "no usable field"}\n')
    with pytest.raises(UsageError, match="'prompt' / 'text' / 'turns'"):
        load_prompt_set(str(path))


def test_plain_text_file_splits_on_blank_lines(tmp_path):
    path = tmp_path / "blocks.txt"
    path.write_text("def f():\n    return 1\n\n\nsecond prompt\n\n")
    loaded = load_prompt_set(str(path))
    assert [p.text for p in loaded.prompts] == ["def f():\n    return 1", "second prompt"]


def test_unknown_set_is_a_usage_error():
    with pytest.raises(UsageError, match="neither a prompt set"):
        load_prompt_set("no-such-set")
    with pytest.raises(UsageError, match="at least 1"):
        load_prompt_set("code", limit=0)


def test_code_set_falls_back_to_the_stdlib_sampler(monkeypatch):
    monkeypatch.setattr(prompt_sets, "_heldout_prompts_function", lambda: None)
    first = load_prompt_set("code", limit=3)
    assert len(first.prompts) == 3 and {p.category for p in first.prompts} == {"code"}
    assert "stdlib" in first.source and first.notes
    assert [p.text for p in load_prompt_set("code", limit=3).prompts] == [p.text for p in first.prompts]
    with pytest.raises(UsageError, match="needs specc.data.corpora"):
        load_prompt_set("text")


def test_code_set_uses_heldout_prompts_when_present(monkeypatch):
    calls = []
    monkeypatch.setattr(prompt_sets, "_heldout_prompts_function",
                        lambda: lambda kind, n, chars: calls.append((kind, n, chars)) or ["a", "b"])
    loaded = load_prompt_set("code", limit=2)
    assert calls == [("code", 2, prompt_sets.CODE_PROMPT_CHARS)]
    assert [p.text for p in loaded.prompts] == ["a", "b"] and "heldout_prompts" in loaded.source


def test_stdlib_sampler_is_deterministic_and_cuts_at_line_ends():
    prompts = stdlib_code_prompts(4, 300)
    assert prompts == stdlib_code_prompts(4, 300) and len(set(prompts)) == 4
    assert all(p.endswith("\n") and 150 <= len(p) <= 300 for p in prompts)
    assert code_prefix("x = 1\n" * 30 + "def f():\n    pass\n" * 20, 40) == "def f():\n    pass\ndef f():\n    pass\n"
    assert code_prefix("x = 1\n" * 30, 40) is None


def test_interleave_keeps_order_within_categories():
    ps = [Prompt("a1", "a"), Prompt("a2", "a"), Prompt("a3", "a"), Prompt("b1", "b")]
    assert [p.text for p in interleave_categories(ps)] == ["a1", "b1", "a2", "a3"]
