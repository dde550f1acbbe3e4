"""Method `prompt-lookup`: draft the continuation of the latest earlier
occurrence of the last n tokens (prompt lookup decoding, Saxena 2023).

A complete specc method that lives outside specc: a config, a recipe (the
target graph with the infrastructure passes only), and a runtime (the plain
target verifies; an n-gram drafter proposes). It is lossless for any
sampling: its drafts are deterministic, so the loop's point-mass
acceptance keeps the target's distribution. With `tree_width` > 1 each
depth also offers the other tokens that followed the same suffix earlier.
"""

from __future__ import annotations

from dataclasses import dataclass

from specc.extension import (TARGET, GraphRecipe, MethodConfig, MethodDescriptor, MethodRuntime, NgramDrafter,
                             UsageError, infrastructure_passes, option)


@dataclass(frozen=True)
class PromptLookupConfig(MethodConfig):
    max_ngram: int = option(3, "longest suffix looked up (tried first)")
    min_ngram: int = option(1, "shortest suffix looked up")
    num_draft_tokens: int = option(8, "most tokens drafted per round (the matched continuation's length)")
    tree_width: int = option(1, "candidates per depth: 1 drafts a chain; k > 1 adds up to k-1 other tokens "
                                "seen after the same suffix, most frequent first")

    def __post_init__(self):
        if not 1 <= self.min_ngram <= self.max_ngram <= 16:
            raise UsageError(f"need 1 <= min_ngram ({self.min_ngram}) <= max_ngram ({self.max_ngram}) <= 16")
        if not 1 <= self.num_draft_tokens <= 64:
            raise UsageError(f"num_draft_tokens={self.num_draft_tokens} must be between 1 and 64")
        if not 1 <= self.tree_width <= 16:
            raise UsageError(f"tree_width={self.tree_width} must be between 1 and 16")
        super().__post_init__()   # cooperative: option blocks, if any, check their own fields


def _build_runtime(context, config: PromptLookupConfig) -> MethodRuntime:
    drafter = NgramDrafter(config.max_ngram, config.min_ngram, config.num_draft_tokens, config.tree_width)
    return MethodRuntime(context.model("target"), drafter)


METHOD = MethodDescriptor(
    name="prompt-lookup",
    summary="drafts the continuation of the latest earlier occurrence of the last n tokens "
            "(no draft model, no training; chain or tree)",
    config_class=PromptLookupConfig,
    graphs=lambda config: {"target": GraphRecipe(TARGET, lambda c: infrastructure_passes())},
    build_runtime=_build_runtime,
    draft_depth=lambda config: config.num_draft_tokens,
)
