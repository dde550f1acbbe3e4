"""Ahead-of-time SWIFT search at `specc compile`: optimise the skip set on
calibration prompts with the same drafter and search the engine runs.

Each prompt is decoded greedily with SWIFT itself (adapting as at run time,
one candidate per round), then the rest of the per-prompt budget
(`max_tries_per_prompt`) is spent on the same window. The search state
carries from prompt to prompt, as it does within a run.
"""

from __future__ import annotations

import dataclasses
import logging

import torch

from specc.errors import UsageError
from specc.graph.serialize import graph_attributes
from specc.lower.backends import lower_eager
from specc.methods.swift_search import LayerSetSearch, describe_skip_set
from specc.methods.swift_segments import SkippingForward
from specc.program import ProgramGraph
from specc.runtime.cached_model import CachedModel
from specc.runtime.generate import generate
from specc.runtime.sampling import SamplingConfig

log = logging.getLogger("specc")


def calibrate(graph: ProgramGraph, config, tokenizer) -> LayerSetSearch:
    from specc.methods.swift import build_drafter

    prompts = calibration_prompts(config, tokenizer)
    max_seq_len = max(map(len, prompts)) + config.calib_max_new_tokens + config.context_window + 1
    dtype = next(t.dtype for t in graph_attributes(graph.module).values() if t.is_floating_point())
    target = CachedModel(graph.module, graph.architecture, max_seq_len, dtype)
    # `adapt` is the run-time switch; calibration always searches.
    drafter = build_drafter(target, SkippingForward(graph.module, lower_eager), dataclasses.replace(config, adapt=True))
    for index, ids in enumerate(prompts):
        result = generate(target, drafter, ids, config.calib_max_new_tokens, SamplingConfig(), max_seq_len)
        tokens = ids + result.token_ids
        with torch.inference_mode():
            while drafter.can_optimize(tokens):
                drafter.optimize_once(tokens)
        state = drafter.search.state
        log.info("swift calibration prompt %d/%d: matchness %s after %d tries (%s)", index + 1, len(prompts),
                 state.best_score, state.tries, describe_skip_set(state.best))
        if not drafter.search.active:
            break
    return drafter.search


def calibration_prompts(config, tokenizer) -> list[list[int]]:
    """Token ids of the calibration prompts: `calib_data` (JSONL or text, read
    like `specc bench --prompts FILE`) or built-in standard-library code."""
    from specc.bench.prompts import load_prompt_set

    prompt_set = load_prompt_set(config.calib_data or "code", limit=config.calib_prompts)
    prompts = [tokenizer(p.text, add_special_tokens=True)["input_ids"] for p in prompt_set.prompts]
    prompts = [ids for ids in prompts if ids]
    if not prompts:
        raise UsageError(f"calibration prompts from {prompt_set.source} are all empty after tokenization; "
                         f"pass another file with --set calib_data=FILE")
    return prompts
