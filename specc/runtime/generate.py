"""The speculative loop: prefill → draft → verify → accept → commit KV."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from specc.contract.drafter import Draft, Drafter, Target
from specc.contract.sampling import SamplingConfig
from specc.contract.verification import Acceptance
from specc.errors import UsageError
from specc.kernels.row_argmax import greedy_tokens
from specc.runtime.acceptance import accept_greedy, accept_sampled_chain, accept_sampled_tree
from specc.runtime.exactness import draft_budget, verifiable
from specc.runtime.sampling import probabilities, sample
from specc.runtime.stats import GenerationStats


@dataclass
class GenerationResult:
    token_ids: list[int]   # generated ids only
    stats: GenerationStats


def generate(target: Target, drafter: Drafter | None, prompt_ids: list[int], max_new_tokens: int,
             sampling: SamplingConfig, max_seq_len: int, on_tokens=None,
             max_rows: int | None = None, reused: int = 0) -> GenerationResult:
    """Decode after `prompt_ids`; `on_tokens(ids)`, if given, is called with each
    round's newly accepted tokens as soon as they are known. `max_rows` caps a
    draft's nodes, root included, and `reused` skips a cached prefix (see `stream`)."""
    rounds = stream(target, drafter, prompt_ids, max_new_tokens, sampling, max_seq_len, max_rows, reused)
    while True:
        try:
            emitted = next(rounds)
        except StopIteration as done:
            return done.value
        if on_tokens is not None:
            on_tokens(emitted)


def stream(target: Target, drafter: Drafter | None, prompt_ids: list[int], max_new_tokens: int,
           sampling: SamplingConfig, max_seq_len: int, max_rows: int | None = None, reused: int = 0):
    """A generator of each round's accepted token ids (the first: the prefill's
    token); its return value (StopIteration.value) is the `GenerationResult`.
    Inference mode is held only while the loop works, never across a yield.
    Sending a true value instead of calling `next` (``rounds.send(True)``,
    e.g. when a stop string appeared) ends generation there: the generator
    returns the result for the tokens so far.

    `max_rows`, when set, is the most rows a verification may have and still
    compute each row exactly as a one-row step does (`Backend.exact_rows`): what
    a drafter may propose under it, and what of its draft is verified, is
    `specc.runtime.exactness`'s (`draft_budget`, `verifiable`: a chain within one key block).

    `reused` > 0: the target's cache already holds the K/V of the first `reused` prompt
    tokens (`specc.runtime.prefix_reuse`), so only the rest is prefilled, and the
    drafter begins from that partial prefill."""
    check_lengths(len(prompt_ids), max_new_tokens, max_seq_len)
    if not 0 <= reused < len(prompt_ids):
        raise ValueError(f"reused={reused} must leave at least the last of the {len(prompt_ids)} prompt tokens")
    generator = torch.Generator().manual_seed(sampling.seed) if sampling.seed is not None else None
    stats = GenerationStats()
    eos = set(target.architecture.eos_token_ids)
    start = time.perf_counter()
    with torch.inference_mode():
        prompt = torch.tensor(prompt_ids, dtype=torch.long, device=target.device)
        prefill = target.prefill(prompt[reused:], reused)
        tokens = list(prompt_ids) + [_choose(prefill.logits[-1], sampling, generator)]
        stats.reused_prompt_tokens = reused
        stats.target_forward_passes += 1
        stats.prefill_seconds = time.perf_counter() - start
        if drafter is not None:
            drafter.begin(prompt, prefill)
    new = tokens[len(prompt_ids):]
    stop = yield list(new)
    while not stop and len(new) < max_new_tokens and new[-1] not in eos:
        with torch.inference_mode():
            if drafter is None:
                emitted = _decode_one(target, drafter, tokens, max_new_tokens - len(new), sampling, generator, stats)
            else:
                emitted = _speculate(target, drafter, tokens, max_new_tokens - len(new), sampling, generator, stats,
                                     max_rows)
        emitted = _truncate(emitted, eos, max_new_tokens - len(new))
        tokens += emitted
        new += emitted
        stop = yield list(emitted)
    stats.new_tokens = len(new)
    stats.wall_seconds = time.perf_counter() - start
    return GenerationResult(new, stats)


def check_lengths(prompt_len: int, max_new_tokens: int, max_seq_len: int) -> None:
    if prompt_len == 0:
        raise UsageError("the prompt is empty; pass some text with --prompt")
    if max_new_tokens < 1:
        raise UsageError(f"--max-new-tokens {max_new_tokens} must be at least 1")
    if prompt_len + max_new_tokens > max_seq_len:
        raise UsageError(
            f"prompt ({prompt_len} tokens) + --max-new-tokens {max_new_tokens} exceeds the engine's "
            f"max sequence length {max_seq_len}; shorten the prompt, lower --max-new-tokens, "
            f"or recompile with a larger --max-seq-len"
        )


def _decode_one(target, drafter, tokens, remaining, sampling, generator, stats) -> list[int]:
    start = time.perf_counter()
    verification = target.prefill(torch.tensor(tokens[-1:], device=target.device), len(tokens) - 1)
    stats.target_forward_passes += 1
    token = _choose(verification.logits[-1], sampling, generator)
    stats.verify_seconds += time.perf_counter() - start
    if drafter is not None:
        drafter.observe(None, None, verification)
    return [token]


def _speculate(target, drafter, tokens, remaining, sampling, generator, stats, max_rows=None) -> list[int]:
    prefix_len = len(tokens) - 1
    budget = draft_budget(remaining, prefix_len, target.max_seq_len, max_rows)
    start = time.perf_counter()
    asked = budget.max_depth > 0 and budget.max_nodes > 1
    draft = drafter.propose(tokens, budget, sampling, generator) if asked else None
    if draft is not None:
        draft = verifiable(draft, budget)
    stats.draft_seconds += time.perf_counter() - start
    if draft is None:
        return _decode_one(target, drafter, tokens, remaining, sampling, generator, stats)
    start = time.perf_counter()
    verification = target.verify_tree(draft, prefix_len)
    acceptance = verification.acceptance or _accept(draft, verification.logits, sampling, generator)
    target.commit(prefix_len, acceptance.path)
    stats.verify_seconds += time.perf_counter() - start
    stats.target_forward_passes += 1
    stats.drafted_tokens += draft.node_tokens.numel() - 1
    stats.drafted_per_round.append(draft.node_tokens.numel() - 1)
    stats.draft_steps_per_round.append(draft.tree.spec.depth)
    stats.accepted_tokens += len(acceptance.path) - 1
    stats.accepted_per_round.append(len(acceptance.path) - 1)
    drafter.observe(draft, acceptance, verification)
    accepted = acceptance.accepted_tokens
    if accepted is None:
        accepted = draft.node_tokens[acceptance.path[1:]].tolist()
    return accepted + [acceptance.next_token]


def _accept(draft: Draft, logits: torch.Tensor, sampling: SamplingConfig, generator) -> Acceptance:
    if sampling.greedy:
        return accept_greedy(draft.node_tokens, logits, draft.tree)
    target_probs = probabilities(logits, sampling)
    if draft.sampled_chain:
        return accept_sampled_chain(draft.node_tokens, draft.draft_probs, target_probs, generator)
    return accept_sampled_tree(draft.node_tokens, target_probs, draft.tree, generator)


def _choose(logits: torch.Tensor, sampling: SamplingConfig, generator) -> int:
    if sampling.greedy:
        return int(greedy_tokens(logits))
    return sample(probabilities(logits, sampling), generator)


def _truncate(emitted: list[int], eos: set[int], room: int) -> list[int]:
    emitted = emitted[:room]
    for i, token in enumerate(emitted):
        if token in eos:
            return emitted[: i + 1]
    return emitted

