"""Reusing the target's KV cache across generations that share a prompt prefix.

After a generation the target's cache holds the keys and values of every token
the target was fed: the prompt and every generated token but the last, token i
at slot i. A next prompt that starts with those tokens (a chat's next turn,
re-encoded through its template with the reply just given; a server's requests
sharing a system prompt) needs only the rest prefilled. `specc chat` and
`specc serve` reuse so; the one-shot commands (`run`, `bench`) prefill every
prompt whole.

What a reply may then differ in: a reused token's K/V were computed by the call
that first fed it (a decode step, a verification, an earlier prefill), not by
one prefill over the new prompt, and kernels round a row differently for other
row counts. In float32 that is rounding noise; in bfloat16 it can flip a
near-tie, so a reply can differ from the same conversation prefilled whole. A
lossless method still matches its own `none` engine reusing the same way: its
verification rows are computed exactly as decode steps are (`Backend.exact_rows`),
so both leave the same cache behind.

Reuse needs a target whose KV cache is all of its per-token state and a
drafter that can begin from a prefill of the prompt's last rows only: both
say so in their capabilities, `Capabilities(resumable=True)` (a plain `CachedModel`, say, or
a verifier that resumes at an exit layer; drafters that keep nothing per token, or keep it
only up to where the reused prefix ends), and a resumable target counts its
calls in `forward_passes`. Without them every prompt is prefilled whole.
"""

from __future__ import annotations

from dataclasses import dataclass, field


def resumable(target, drafter) -> bool:
    """Whether a generation with this target and drafter can start after a reused prefix."""
    return target.capabilities.resumable and (drafter is None or drafter.capabilities.resumable)


@dataclass
class PrefixReuse:
    """The tokens whose K/V a target's cache holds (token i at slot i) after the last generation."""

    tokens: list[int] = field(default_factory=list)
    target_calls: int = -1    # the target's forward count when they were kept: any call since overwrote slots

    def usable(self, prompt_ids: list[int], target) -> int:
        """How many leading prompt tokens need no prefill: their common prefix with the kept
        tokens, at most all but the last prompt token (its logits choose the first new token)."""
        if target.forward_passes != self.target_calls:
            return 0
        limit = min(len(self.tokens), len(prompt_ids) - 1)
        shared = 0
        while shared < limit and self.tokens[shared] == prompt_ids[shared]:
            shared += 1
        return shared

    def keep(self, prompt_ids: list[int], new_ids: list[int], target) -> None:
        """After a finished generation: every token but the last was fed to the target."""
        self.tokens = (list(prompt_ids) + list(new_ids))[:-1]
        self.target_calls = target.forward_passes

    def forget(self) -> None:
        self.tokens, self.target_calls = [], -1
