"""Self-distilled calibration text: the target's own greedy replies to prompts.

A drafter trained on text the target would never write (library source,
novels) learns to predict the target on the wrong states: Kangaroo's
adapter reached 0.25 held-out agreement on that corpus but only 0.16
acceptance on chat prompts. Medusa-2 and EAGLE train on conversations the
target answers itself; `specc distill-data` writes such a file, to pass as
`--set calib_data=FILE` to the training methods. Each record's `text` is a
whole conversation as the engine will see it: the prompt (through the chat
template where the prompt is conversational and the model has one) and the
target's reply, special tokens kept.

Replies are generated in batches (left-padded) by the Hugging Face model:
a batch of 16 costs little more per step than one sequence on a CPU, where
decoding is bound by reading the weights. Take prompts disjoint from the
ones you benchmark (`--skip`).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from specc.console.progress import progress_bar

from specc.host.device import resolve_device
from specc.errors import UsageError
from specc.train.self_prompts import SELF_CHAT, self_chat_prompts, user_turn_bounds


@dataclass(frozen=True)
class DistillDataRequest:
    model: str
    prompts: str
    output: Path
    skip: int = 0
    num_prompts: int = 128
    max_new_tokens: int = 128
    batch_size: int = 16
    max_prompt_tokens: int = 768
    chat_template: bool = True
    dtype: str = "float32"
    force: bool = False
    device: str = "auto"   # where the target generates
    seed: int = 0               # self-chat: the sampling seed of the user turns
    max_query_tokens: int = 128   # self-chat: longest user turn sampled


@dataclass(frozen=True)
class DistillDataReport:
    records: int
    skipped_long: int
    reply_tokens: int
    prompt_tokens: int
    seconds: float
    source: str

    def summary(self) -> str:
        return (f"{self.records} conversations ({self.prompt_tokens} prompt + {self.reply_tokens} reply tokens) "
                f"from {self.source} in {self.seconds:.1f}s"
                + (f"; {self.skipped_long} prompt(s) longer than the limit skipped" if self.skipped_long else ""))


def write_distill_data(request: DistillDataRequest) -> DistillDataReport:
    _check(request)
    resolve_device(request.device)
    from specc.capture.load import load_model, load_tokenizer, resolve_checkpoint

    checkpoint = resolve_checkpoint(request.model)
    tokenizer = load_tokenizer(checkpoint)
    prompts, source = None, None
    if request.prompts == SELF_CHAT:
        user_turn_bounds(tokenizer)   # a template with no user turn to open is reported before the model loads
    else:
        prompts, source = selected_prompts(request)
    model = load_model(checkpoint, request.dtype).to(resolve_device(request.device))
    start = time.perf_counter()
    if prompts is None:
        prompts, source = _self_chat_selection(model, tokenizer, request)
    encoded, skipped = _encode(tokenizer, prompts, request)
    if not encoded:
        raise UsageError(f"none of the {len(prompts)} prompts fits --max-prompt-tokens {request.max_prompt_tokens}")
    replies = generate_replies(model, tokenizer, [ids for _, ids in encoded], request.max_new_tokens,
                               request.batch_size)
    records = [{"text": tokenizer.decode(ids + reply, skip_special_tokens=False), "category": prompt.category,
                "prompt_tokens": len(ids), "reply_tokens": len(reply)}
               for (prompt, ids), reply in zip(encoded, replies)]
    _write_atomically(request.output, records)
    return DistillDataReport(len(records), skipped, sum(r["reply_tokens"] for r in records),
                             sum(r["prompt_tokens"] for r in records), time.perf_counter() - start, source)


def generate_replies(model, tokenizer, prompts: list[list[int]], max_new_tokens: int,
                     batch_size: int) -> list[list[int]]:
    """Greedy replies, each cut after its first end-of-sequence token. Prompts of
    similar length share a batch, so little of each batch is padding."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    stops = _stop_ids(model, tokenizer)
    pad = stops[0] if tokenizer.pad_token_id is None else tokenizer.pad_token_id
    replies: list[list[int]] = [[] for _ in prompts]
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    with progress_bar(total=len(prompts), desc="distill-data: target replies", unit="prompt") as bar:
        for batch in batches:
            for index, reply in zip(batch, _generate_batch(model, [prompts[i] for i in batch], pad, stops,
                                                           max_new_tokens)):
                replies[index] = reply
            bar.update(len(batch))
    return replies


def _generate_batch(model, prompts: list[list[int]], pad: int, stops: list[int],
                    max_new_tokens: int) -> list[list[int]]:
    width = max(len(p) for p in prompts)
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=model.device)
    attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=model.device)
    with torch.no_grad():
        out = model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=max_new_tokens,
                             do_sample=False, pad_token_id=pad, eos_token_id=stops)
    return [_until_stop(row[width:].tolist(), stops) for row in out]


def _until_stop(tokens: list[int], stops: list[int]) -> list[int]:
    for i, token in enumerate(tokens):
        if token in stops:
            return tokens[:i + 1]
    return tokens


def _stop_ids(model, tokenizer) -> list[int]:
    """The end-of-sequence ids the engine stops at (`summarize_architecture`), else the tokenizer's."""
    from specc.capture.families import summarize_architecture

    ids = list(summarize_architecture(model.config, model.generation_config).eos_token_ids)
    if not ids and tokenizer.eos_token_id is not None:
        ids = [int(tokenizer.eos_token_id)]
    if not ids:
        raise UsageError("the model declares no end-of-sequence token, so replies cannot be cut or padded")
    return ids


def selected_prompts(request: DistillDataRequest):
    """The prompts `request` answers, in `specc bench` order after its skip, and where they came from."""
    from specc.data.prompts import load_prompt_set

    # Generated sets (code, code-train, ...) build only as many prompts as asked for.
    prompt_set = load_prompt_set(request.prompts, request.skip + request.num_prompts)
    chosen = prompt_set.prompts[request.skip:request.skip + request.num_prompts]
    if not chosen:
        raise UsageError(f"--skip {request.skip} leaves no prompt of {request.prompts!r} "
                         f"({len(prompt_set.prompts)} prompts)")
    last = request.skip + len(chosen) - 1
    return chosen, f"{prompt_set.source} (prompts {request.skip}..{last} in benchmark order)"


def _self_chat_selection(model, tokenizer, request: DistillDataRequest):
    """The user turns the model writes itself (`specc.train.self_prompts`), after the skip."""
    total = request.skip + request.num_prompts
    turns = self_chat_prompts(model, tokenizer, total, request.seed, request.batch_size, request.max_query_tokens)
    return turns[request.skip:], (f"the model's own user turns (seed {request.seed}, temperature 1, "
                                  f"turns {request.skip}..{total - 1})")


def _encode(tokenizer, prompts, request: DistillDataRequest):
    """(prompt, ids) for the prompts that fit, encoded as `specc bench` encodes them."""
    from specc.data.chat import chat_prompt_ids, has_chat_template

    use_template = request.chat_template and has_chat_template(tokenizer)
    encoded, skipped = [], 0
    for prompt in prompts:
        ids = (chat_prompt_ids(tokenizer, prompt.text) if use_template and prompt.chat
               else tokenizer(prompt.text, add_special_tokens=True)["input_ids"])
        if len(ids) > request.max_prompt_tokens:
            skipped += 1
            continue
        encoded.append((prompt, list(ids)))
    return encoded, skipped


def _write_atomically(output: Path, records: list[dict]) -> None:
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = output.with_name(f".{output.name}.partial-{os.getpid()}")
    try:
        with staging.open("w", encoding="utf-8") as f:
            for record in records:
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
        os.replace(staging, output)
    finally:
        staging.unlink(missing_ok=True)


def _check(request: DistillDataRequest) -> None:
    if request.output.exists() and not request.force:
        raise UsageError(f"{request.output} exists; pass --force to replace it")
    if request.output.exists() and request.output.is_dir():
        raise UsageError(f"{request.output} is a directory; name the JSONL file to write")
    for name in ("num_prompts", "max_new_tokens", "batch_size", "max_prompt_tokens", "max_query_tokens"):
        if getattr(request, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} {getattr(request, name)} must be at least 1")
    if request.skip < 0:
        raise UsageError(f"--skip {request.skip} must be 0 or more")
