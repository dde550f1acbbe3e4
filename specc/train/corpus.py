"""Token windows for compile-time training, from a user file or the built-in local corpus.

`calib_data` is read like `specc bench --prompts`: a JSONL file ("prompt",
"text" or "turns" fields), a text file (blank-line-separated blocks), or a
named set (gsm8k, spec_bench). Its token stream's tail is held out.
Without it, the built-in corpus is used: Python standard-library source and,
where `../shared/data` exists, English text (`specc.data.corpora`,
whose held-out documents give the held-out windows; a missing source is
skipped with a warning). Several sources joined by commas mix, `builtin`
naming the built-in corpus (`builtin,chat.jsonl`): their training windows
are shuffled together and their held-out windows alternate.

A JSONL file from `specc distill-data` says where each conversation's reply
starts (`prompt_tokens`): its records are read in file order, and each
window carries a mask of the positions whose next token is a reply token
(`TokenWindows.train_scored` / `heldout_scored`). Held-out figures are
then measured on replies only: the system prompt and chat markup every
conversation repeats are easy to predict and would flatter them.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import zip_longest
from pathlib import Path

import torch

from specc.data.calibration import calibration_sources
from specc.errors import UsageError

_CHARS_PER_TOKEN = 6      # generous: real tokenizers average about 4 characters of English or code per token


@dataclass(frozen=True)
class TokenWindows:
    train: list[torch.Tensor]     # each [seq_len] token ids
    heldout: list[torch.Tensor]
    source: str
    # Per window, bool [seq_len]: positions whose next token is a reply token; None: every position counts.
    train_scored: list[torch.Tensor] | None = None
    heldout_scored: list[torch.Tensor] | None = None


METHOD_REMEDY = "pass more text with --set calib_data=FILE or lower train_seq_len"


def token_windows(tokenizer, calib_data: str | None, seq_len: int, train_count: int,
                  heldout_count: int, seed: int, remedy: str = METHOD_REMEDY) -> TokenWindows:
    """Up to `train_count` training windows (fewer if the data is short: they are
    then reused in order) and up to `heldout_count` held-out ones, shuffled by `seed`.
    Too little data is an error ending in `remedy`, in the caller's own flags."""
    sources = calibration_sources(calib_data)
    if len(sources) > 1:
        return _mixed_windows([token_windows(tokenizer, source, seq_len, train_count, heldout_count, seed, remedy)
                               for source in sources], train_count, heldout_count, seed)
    calib_data = sources[0]
    scored = None
    conversations = _reply_records(calib_data) if calib_data is not None else None
    if conversations is not None:
        train, heldout, scored, source = _conversation_windows(tokenizer, conversations, calib_data, seq_len,
                                                               heldout_count)
    elif calib_data is not None:
        train, heldout, source = _file_windows(tokenizer, calib_data, seq_len, heldout_count)
    else:
        train, heldout, source = _builtin_windows(tokenizer, seq_len, train_count, heldout_count)
    if not train or not heldout:
        raise UsageError(
            f"the calibration data ({source}) gives {len(train)} training and {len(heldout)} held-out windows "
            f"of {seq_len} tokens; {remedy}"
        )
    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(seed)).tolist()
    def shuffled(items: list) -> list:
        return [items[i] for i in order][:max(train_count, 1)]

    if scored is None:
        return TokenWindows(shuffled(train), heldout[:heldout_count], source)
    train_scored, heldout_scored = scored
    return TokenWindows(shuffled(train), heldout[:heldout_count], source,
                        shuffled(train_scored), heldout_scored[:heldout_count])


def _mixed_windows(parts: list[TokenWindows], train_count: int, heldout_count: int, seed: int) -> TokenWindows:
    """Several sources' windows as one set: training windows shuffled together (at most
    `train_count`), held-out ones alternating between sources (at most `heldout_count`).
    Where some source scores only reply positions, the others' windows score every one."""
    def masks(windows: list[torch.Tensor], scored: list[torch.Tensor] | None) -> list[torch.Tensor]:
        return scored if scored is not None else [torch.ones(len(w), dtype=torch.bool) for w in windows]

    train = [pair for part in parts for pair in zip(part.train, masks(part.train, part.train_scored))]
    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(seed)).tolist()[:max(train_count, 1)]
    heldout = [pair for group in zip_longest(*(zip(part.heldout, masks(part.heldout, part.heldout_scored))
                                               for part in parts)) for pair in group if pair is not None]
    heldout = heldout[:heldout_count]
    source = " + ".join(part.source for part in parts)
    if all(part.train_scored is None for part in parts):
        return TokenWindows([train[i][0] for i in order], [w for w, _ in heldout], source)
    return TokenWindows([train[i][0] for i in order], [w for w, _ in heldout], source,
                        [train[i][1] for i in order], [m for _, m in heldout])


def _reply_records(calib_data: str) -> list[dict] | None:
    """The records of a `specc distill-data` file (every one has `text` and an integer
    `prompt_tokens`), or None for any other calibration data."""
    from specc.data.prompts import read_jsonl

    path = Path(calib_data)
    if path.suffix != ".jsonl" or not path.is_file():
        return None
    records = read_jsonl(path)
    if records and all(isinstance(r.get("text"), str) and isinstance(r.get("prompt_tokens"), int)
                       for r in records):
        return records
    return None


def _conversation_windows(tokenizer, records: list[dict], calib_data: str, seq_len: int, heldout_count: int):
    """Windows over the conversations in file order, with per-position reply masks."""
    stream: list[int] = []
    is_reply: list[bool] = []
    for record in records:
        ids = tokenizer(record["text"], add_special_tokens=False, verbose=False)["input_ids"]
        stream += ids
        is_reply += [i >= record["prompt_tokens"] for i in range(len(ids))]
    next_is_reply = is_reply[1:] + is_reply[-1:]   # position i predicts token i + 1
    windows = _windows(stream, seq_len)
    masks = [torch.tensor(next_is_reply[i:i + seq_len]) for i in range(0, len(windows) * seq_len, seq_len)]
    split = _training_share(len(windows), heldout_count)
    source = f"{calib_data} (conversations; held-out figures on reply positions)"
    return windows[:split], windows[split:], (masks[:split], masks[split:]), source


def _file_windows(tokenizer, calib_data: str, seq_len: int, heldout_count: int):
    from specc.data.prompts import load_prompt_set

    prompt_set = load_prompt_set(calib_data)
    stream = _stream(tokenizer, (p.text for p in prompt_set.prompts))
    windows = _windows(stream, seq_len)
    split = _training_share(len(windows), heldout_count)
    return windows[:split], windows[split:], prompt_set.source


def _training_share(count: int, heldout_count: int) -> int:
    """How many of a file's `count` windows train: its tail, at most half of it, is held out."""
    return count - min(heldout_count, count // 2)


def _builtin_windows(tokenizer, seq_len: int, train_count: int, heldout_count: int):
    from specc.data.corpora import load_corpus

    kinds = [load_corpus(kind) for kind in ("code", "text")]
    kinds = [corpus for corpus in kinds if corpus.train and corpus.heldout]
    if not kinds:
        raise UsageError("no built-in calibration text: the standard library sources and ../shared/data are "
                         "both missing; pass --set calib_data=FILE")
    train, heldout_by_kind = [], []
    for corpus in kinds:
        train_chars = (train_count // len(kinds) + 1) * seq_len * _CHARS_PER_TOKEN
        train += _windows(_stream(tokenizer, (d.text for d in corpus.capped_train(train_chars))), seq_len)
        heldout_chars = (heldout_count // len(kinds) + 1) * seq_len * _CHARS_PER_TOKEN
        heldout_by_kind.append(_windows(_stream(tokenizer, _first_chars(corpus.heldout, heldout_chars)), seq_len))
    # Alternate kinds so the first held-out windows cover code and text alike.
    heldout = [w for group in zip_longest(*heldout_by_kind) for w in group if w is not None]
    sources = " + ".join(f"built-in {c.kind} corpus ({len(c.train)} documents)" for c in kinds)
    return train, heldout, sources


def _first_chars(documents, max_chars: int) -> list[str]:
    texts, total = [], 0
    for doc in documents:
        if total >= max_chars:
            break
        texts.append(doc.text[:max_chars - total])
        total += len(texts[-1])
    return texts


def _stream(tokenizer, texts) -> list[int]:
    stream: list[int] = []
    for text in texts:
        stream += tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]
    return stream


def _windows(stream: list[int], seq_len: int) -> list[torch.Tensor]:
    return [torch.tensor(stream[i:i + seq_len]) for i in range(0, len(stream) - seq_len + 1, seq_len)]
