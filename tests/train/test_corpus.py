"""token_windows: calibration text → training and held-out token windows."""

from __future__ import annotations

import pytest
import torch

from specc.errors import UsageError
from specc.train.corpus import token_windows


def byte_tokenizer(text: str, **options) -> dict:
    return {"input_ids": list(text.encode("utf-8"))}


def test_a_file_is_split_into_windows_with_its_tail_held_out(tmp_path):
    blocks = [f"block {i}: " + " ".join(str(i * 37 + k) for k in range(8)) for i in range(20)]
    path = tmp_path / "calib.txt"
    path.write_text("\n\n".join(blocks))
    windows = token_windows(byte_tokenizer, str(path), seq_len=16, train_count=100, heldout_count=3, seed=0)
    stream = [t for b in blocks for t in byte_tokenizer(b)["input_ids"]]
    assert all(w.shape == (16,) for w in windows.train + windows.heldout)
    assert len(windows.heldout) == 3
    assert torch.equal(windows.heldout[-1], torch.tensor(stream[len(stream) // 16 * 16 - 16:len(stream) // 16 * 16]))
    held = {tuple(w.tolist()) for w in windows.heldout}
    assert not held & {tuple(w.tolist()) for w in windows.train}
    assert len(windows.train) == len(stream) // 16 - 3
    assert windows.source == str(path)


def test_the_order_is_deterministic_for_a_seed(tmp_path):
    path = tmp_path / "calib.txt"
    path.write_text(" ".join(str(i) for i in range(2000)))
    first, again, other = (token_windows(byte_tokenizer, str(path), 8, 50, 2, seed) for seed in (1, 1, 2))
    assert all(torch.equal(a, b) for a, b in zip(first.train, again.train))
    assert not all(torch.equal(a, b) for a, b in zip(first.train, other.train))
    assert len(first.train) == 50


def test_too_little_text_is_a_usage_error(tmp_path):
    path = tmp_path / "calib.txt"
    path.write_text("short")
    with pytest.raises(UsageError, match="calib_data"):
        token_windows(byte_tokenizer, str(path), seq_len=64, train_count=10, heldout_count=2, seed=0)


@pytest.mark.shared_data
def test_builtin_corpus_without_shared_data_uses_the_standard_library(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECC_SHARED_DATA", str(tmp_path / "absent"))
    windows = token_windows(byte_tokenizer, None, seq_len=32, train_count=20, heldout_count=4, seed=0)
    assert len(windows.train) == 20 and len(windows.heldout) == 4
    assert "code" in windows.source and "text" not in windows.source


def test_distill_data_conversations_keep_file_order_and_mark_reply_positions(tmp_path):
    import json

    records = [{"text": "P" * 5 + "r" * 7, "prompt_tokens": 5, "category": "b"},
               {"text": "Q" * 3 + "s" * 9, "prompt_tokens": 3, "category": "a"}]
    path = tmp_path / "calib.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    windows = token_windows(byte_tokenizer, str(path), seq_len=6, train_count=10, heldout_count=1, seed=0)
    stream = "P" * 5 + "r" * 7 + "Q" * 3 + "s" * 9
    assert torch.equal(windows.heldout[0], torch.tensor(list(stream[18:24].encode())))
    # position i counts when token i + 1 is a reply token
    assert windows.heldout_scored[0].tolist() == [True] * 6
    by_window = {tuple(w.tolist()): m.tolist() for w, m in zip(windows.train, windows.train_scored)}
    assert by_window[tuple(stream[0:6].encode())] == [False, False, False, False, True, True]
    assert by_window[tuple(stream[12:18].encode())] == [False, False, True, True, True, True]
    assert "reply positions" in windows.source


def test_plain_jsonl_has_no_reply_marks(tmp_path):
    path = tmp_path / "calib.jsonl"
    path.write_text("".join(f'{{"text": "record {i} " }}\n'.replace("record", "r" * 40) for i in range(10)))
    windows = token_windows(byte_tokenizer, str(path), seq_len=16, train_count=10, heldout_count=1, seed=0)
    assert windows.train_scored is None and windows.heldout_scored is None


def test_comma_separated_sources_mix_with_held_out_windows_from_each(tmp_path):
    import json

    text = tmp_path / "text.txt"
    text.write_text(" ".join(f"t{i}" for i in range(400)))
    chat = tmp_path / "chat.jsonl"
    chat.write_text("".join(json.dumps({"text": "P" * 6 + f"reply {i} " * 4, "prompt_tokens": 6}) + "\n"
                            for i in range(20)))
    alone = {source: token_windows(byte_tokenizer, str(source), 16, 1000, 4, seed=0) for source in (text, chat)}
    mixed = token_windows(byte_tokenizer, f"{text},{chat}", 16, 1000, 4, seed=0)
    as_set = lambda windows: {tuple(w.tolist()) for w in windows}   # noqa: E731
    assert as_set(mixed.train) == as_set(alone[text].train) | as_set(alone[chat].train)
    assert [tuple(w.tolist()) for w in mixed.heldout] == [tuple(w.tolist()) for pair in zip(
        alone[text].heldout[:2], alone[chat].heldout[:2]) for w in pair]
    # the plain text's windows score every position, the conversations' their reply positions
    masks = {tuple(w.tolist()): m for w, m in zip(mixed.train, mixed.train_scored)}
    assert all(masks[tuple(w.tolist())].all() for w in alone[text].train)
    assert any(not masks[tuple(w.tolist())].all() for w in alone[chat].train)
    assert len(token_windows(byte_tokenizer, f"{text},{chat}", 16, 10, 4, seed=0).train) == 10
    assert str(text) in mixed.source and str(chat) in mixed.source


def test_builtin_names_the_default_corpus_among_sources(tmp_path):
    from specc.contract.validation import check_calibration_data
    from specc.data.calibration import calibration_sources

    path = tmp_path / "a.txt"
    path.write_text("x")
    assert calibration_sources(f"builtin,{path}") == [None, str(path)]
    assert calibration_sources(None) == [None]
    odd = tmp_path / "with,comma.txt"
    odd.write_text("x")
    assert calibration_sources(str(odd)) == [str(odd)]
    check_calibration_data(f"builtin,{path},gsm8k")
    with pytest.raises(UsageError, match="no such file"):
        check_calibration_data(f"builtin,{tmp_path / 'missing.jsonl'}")
    with pytest.raises(UsageError, match="empty source"):
        calibration_sources(f"{path},")
