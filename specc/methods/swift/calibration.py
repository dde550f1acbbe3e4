"""Ahead-of-time SWIFT search at `specc compile`: optimise the skip set on
calibration prompts with the same drafter and search the engine runs.

Each prompt is decoded greedily with SWIFT itself (adapting as at run time,
one candidate per round), then the rest of the per-prompt budget
(`max_tries_per_prompt`) is spent on the same window. The search state
carries from prompt to prompt, as it does within a run.

Compile-time budget: the search ends when its own rules say so (a score
above `max_score`, `max_tolerance` tries without improvement, `max_tries`)
or when every candidate skip set has been tried (a 4-layer model has 4),
and at compile time also after `COMPILE_TRIES_PER_SUBLAYER` tries per
skippable sublayer (8 layers: 12 sublayers, 96 tries). The budget counts
tries, not seconds, so the set found does not depend on how busy the
machine is; `search_seconds` adds a time limit for who wants one. A tqdm
bar shows the tries and the best matchness.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import time

import torch
from tqdm import tqdm

from specc.console.progress import progress_bar
from specc.contract.program import ProgramGraph
from specc.contract.sampling import SamplingConfig
from specc.errors import UsageError
from specc.graph.serialize import graph_attributes
from specc.graph.signature import read_signature
from specc.methods.swift.search import LayerSetSearch, describe_skip_set
from specc.methods.swift.segments import SkippingForward
from specc.runtime.cached_model import CachedModel
from specc.runtime.generate import generate

log = logging.getLogger("specc")

COMPILE_TRIES_PER_SUBLAYER = 8


def calibrate(graph: ProgramGraph, config, tokenizer) -> LayerSetSearch:
    from specc.methods.swift.drafter import SearchLimit, build_drafter

    prompts = calibration_prompts(config, tokenizer)
    max_seq_len = max(map(len, prompts)) + config.calib_max_new_tokens + config.context_window + 1
    dtype = next(t.dtype for t in graph_attributes(graph.module).values() if t.is_floating_point())
    target = CachedModel(graph.module, read_signature(graph.module), graph.architecture, max_seq_len, dtype)
    # `adapt` is the run-time switch; calibration always searches.
    drafter = build_drafter(target, SkippingForward(graph.module, lambda segment: segment), dataclasses.replace(config, adapt=True))
    search = drafter.search
    budget = min(config.max_tries, COMPILE_TRIES_PER_SUBLAYER * len(search.sublayers), search.space_size,
                 len(prompts) * max(config.max_tries_per_prompt, 1))
    deadline = time.monotonic() + config.search_seconds if config.search_seconds else None
    bar = progress_bar(total=budget, desc="swift skip-set search", unit="try", leave=False)

    def tick():
        bar.n = min(search.state.tries, budget)
        score = search.state.best_score
        bar.set_postfix_str(f"best matchness {score:.3f}" if score is not None else "scoring", refresh=False)
        bar.refresh()

    def out_of_budget() -> bool:
        return search.state.tries >= budget or (deadline is not None and time.monotonic() > deadline)

    drafter.limit_search(SearchLimit(allows=lambda: not out_of_budget(), after_step=tick))
    try:
        for index, ids in enumerate(prompts):
            result = generate(target, drafter, ids, config.calib_max_new_tokens, SamplingConfig(), max_seq_len)
            tokens = ids + result.token_ids
            with torch.inference_mode():
                while drafter.can_optimize(tokens):
                    drafter.optimize_once(tokens)
            state = search.state
            log.info("swift calibration prompt %d/%d: matchness %s after %d tries (%s)", index + 1, len(prompts),
                     state.best_score, state.tries, describe_skip_set(state.best))
            if not search.active or out_of_budget():
                break
    finally:
        bar.close()
    state = search.state
    if state.stop_reason is None:
        over_time = deadline is not None and time.monotonic() > deadline
        stop = (f"compile-time limit of {config.search_seconds:g}s" if over_time
                else f"compile-time budget of {budget} tries" if state.tries >= budget else "calibration prompts used up")
        state.stop_reason = stop
    score = "n/a" if state.best_score is None else f"{state.best_score:.3f}"
    tqdm.write(f"swift: skip set {describe_skip_set(state.best)}, matchness {score} after {state.tries} of "
               f"{search.space_size} candidate sets ({state.stop_reason})", file=sys.stderr)
    return drafter.search


def calibration_prompts(config, tokenizer) -> list[list[int]]:
    """Token ids of the calibration prompts: `calib_data` (JSONL or text, read
    like `specc bench --prompts FILE`) or built-in standard-library code."""
    from specc.data.prompts import load_prompt_set

    prompt_set = load_prompt_set(config.calib_data or "code", limit=config.calib_prompts)
    prompts = [tokenizer(p.text, add_special_tokens=True)["input_ids"] for p in prompt_set.prompts]
    prompts = [ids for ids in prompts if ids]
    if not prompts:
        raise UsageError(f"calibration prompts from {prompt_set.source} are all empty after tokenization; "
                         f"pass another file with --set calib_data=FILE")
    return prompts
