"""Text generation with streaming and stop strings, shared by `specc run`, `specc chat` and `specc serve`.

It consumes the speculative loop's round generator (`runtime.generate.stream`):
each round's accepted ids become a text piece (`TextDelta`); a stop
string ends generation at the round where it appears (the loop is told to
stop through ``send(True)``, so no further round runs) and the text is cut
before it. While streaming, text that could be the start of a stop string
is held back until it is known not to be.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from specc.runtime.stats import GenerationStats


@dataclass
class TextGeneration:
    text: str                 # generated text, cut before a stop string
    token_ids: list[int]      # every generated id (a stop string may end inside the last round)
    stats: GenerationStats
    finish_reason: str        # "stop": EOS or a stop string; "length": max_new_tokens reached


def generate_text(engine, prompt_ids: list[int], max_new_tokens: int, sampling, stop: Sequence[str] = (),
                  on_text: Callable[[str], None] | None = None,
                  should_abort: Callable[[], bool] | None = None, reuse_prefix: bool = False) -> TextGeneration:
    """Generate after `prompt_ids` with a `LoadedEngine`; `on_text(piece)` streams the text.
    `should_abort()` is asked after every round (e.g. a client that went away). `reuse_prefix`
    prefills only what the previous generation left uncached (`specc.runtime.prefix_reuse`)."""
    stops = [s for s in stop if s]
    rounds = engine.rounds(prompt_ids, max_new_tokens, sampling, reuse_prefix=reuse_prefix)
    delta = TextDelta(engine.tokenizer)
    text, sent, stopped, ask = "", 0, False, None
    while True:
        try:
            ids = rounds.send(ask)
        except StopIteration as done:
            result = done.value
            break
        text += delta.add(ids)
        cut = find_stop(text, stops, max(0, sent - max(map(len, stops), default=0)))
        if cut is not None:
            text, stopped = text[:cut], True
        ready = len(text) if stopped else len(text) - held_back(text, stops)
        if on_text is not None and ready > sent:
            on_text(text[sent:ready])
            sent = ready
        ask = stopped or bool(should_abort and should_abort())
    if on_text is not None and len(text) > sent:
        on_text(text[sent:])
    eos = set(engine.target.architecture.eos_token_ids)
    ended = stopped or (result.token_ids and result.token_ids[-1] in eos)
    return TextGeneration(text, result.token_ids, result.stats, "stop" if ended else "length")


class TextDelta:
    """Turns token ids arriving in pieces into text pieces: decodes everything so
    far and returns what is new, holding back an unfinished multi-byte character."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.sent = ""

    def add(self, ids: list[int]) -> str:
        self.ids += ids
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):
            return ""
        piece, self.sent = text[len(self.sent):], text
        return piece


def find_stop(text: str, stops: Sequence[str], start: int = 0) -> int | None:
    """Index of the earliest stop string in `text` (searching from `start`), or None."""
    found = [i for i in (text.find(s, start) for s in stops) if i >= 0]
    return min(found) if found else None


def held_back(text: str, stops: Sequence[str]) -> int:
    """Length of the longest end of `text` that is a proper start of some stop string."""
    longest = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), longest, -1):
            if text.endswith(s[:n]):
                longest = n
                break
    return longest
