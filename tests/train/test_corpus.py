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


def test_builtin_corpus_without_shared_data_uses_the_standard_library(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECC_SHARED_DATA", str(tmp_path / "absent"))
    windows = token_windows(byte_tokenizer, None, seq_len=32, train_count=20, heldout_count=4, seed=0)
    assert len(windows.train) == 20 and len(windows.heldout) == 4
    assert "code" in windows.source and "text" not in windows.source
