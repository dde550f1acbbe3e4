"""A lookup corpus: the texts a `lookup_corpus` setting names, tokenized for an engine to keep."""

from __future__ import annotations

import logging

from specc.data.calibration import calibration_sources
from specc.errors import UsageError

log = logging.getLogger(__name__)

CORPUS_STATE_KEY = "lookup_corpus"   # method state: a lookup corpus's texts as token ids
MAX_CORPUS_TOKENS = 262_144   # kept in the engine's manifest, which every load parses
NOT_BUILTIN = ("lookup_corpus=builtin: the lookup corpus is text the target wrote; name `specc distill-data` "
                "files (or other JSONL/text files)")


def corpus_token_sequences(tokenizer, sources: str, max_tokens: int = MAX_CORPUS_TOKENS) -> list[list[int]]:
    """Each text of the comma-separated `sources` (files as `specc bench --prompts` reads them:
    a `specc distill-data` file gives whole conversations; or prompt-set names) as token ids,
    in order, until `max_tokens` in all (the rest is left out, with a warning)."""
    from specc.data.prompts import load_prompt_set

    sequences, total = [], 0
    for source in calibration_sources(sources):
        if source is None:
            raise UsageError(NOT_BUILTIN)
        for prompt in load_prompt_set(source).prompts:
            ids = tokenizer(prompt.text, add_special_tokens=False, verbose=False)["input_ids"]
            if total + len(ids) > max_tokens:
                log.warning("lookup_corpus %s holds more than %d tokens; the engine keeps the first %d",
                            sources, max_tokens, total)
                return sequences
            sequences.append(ids)
            total += len(ids)
    if not sequences:
        raise UsageError(f"lookup_corpus={sources} holds no text")
    return sequences


def corpus_state(tokenizer, sources: str) -> dict:
    """Method state (a `prepare` result) holding the corpus `sources` names, tokenized; empty
    without sources. `specc.runtime.corpus_lookup.corpus_branch` reads it back."""
    return {CORPUS_STATE_KEY: corpus_token_sequences(tokenizer, sources)} if sources else {}
