"""Method `prompt-lookup`: draft the continuation of the latest earlier
occurrence of the last n tokens (prompt lookup decoding, Saxena 2023).

A complete specc method that lives outside specc: a config, a recipe (the
target graph with the infrastructure passes only), and a runtime (the plain
target verifies; an n-gram drafter proposes). It is lossless for any
sampling: its drafts are deterministic, so the loop's point-mass
acceptance keeps the target's distribution. With `tree_width` > 1 each
depth also offers the other tokens that followed the same suffix earlier.

`lookup_corpus` adds what the target wrote elsewhere (`specc distill-data`
files): tokenized into the engine at compile time (`prepare`), it drafts the
most frequent continuation of the context's longest suffix in that text
(`CorpusDrafter`), a second branch beside the context's
(`ComposedDrafter`), where the context holds nothing to copy.
"""

from __future__ import annotations

from dataclasses import dataclass

from specc.extension import (TARGET, ComposedDrafter, GraphRecipe, MethodConfig, MethodDescriptor, MethodRuntime,
                             NgramDrafter, UsageError, check_lookup_corpus, corpus_branch, corpus_state,
                             infrastructure_passes, option)


@dataclass(frozen=True)
class PromptLookupConfig(MethodConfig):
    max_ngram: int = option(3, "longest suffix looked up (tried first)", at_least=1, at_most=16)
    min_ngram: int = option(1, "shortest suffix looked up", at_least=1, at_most=16)
    num_draft_tokens: int = option(8, "most tokens drafted per round (the matched continuation's length)",
                                   at_least=1, at_most=64)
    tree_width: int = option(1, "candidates per depth: 1 drafts a chain; k > 1 adds up to k-1 other tokens "
                                "seen after the same suffix, most frequent first", at_least=1, at_most=16)
    lookup_corpus: str = option("", "comma-separated files of text the target wrote (`specc distill-data` output) "
                                    "whose continuations draft too, beside the context's; tokenized into the "
                                    "engine at compile time")

    def __post_init__(self):
        super().__post_init__()   # every field's bounds
        if self.min_ngram > self.max_ngram:
            raise UsageError(f"need min_ngram ({self.min_ngram}) <= max_ngram ({self.max_ngram})")


def _validate(config: PromptLookupConfig, model_config) -> None:
    check_lookup_corpus(config.lookup_corpus)


def _prepare(config: PromptLookupConfig, tokenizer) -> dict:
    return corpus_state(tokenizer, config.lookup_corpus)


def _build_runtime(context, config: PromptLookupConfig) -> MethodRuntime:
    drafter = NgramDrafter(config.max_ngram, config.min_ngram, config.num_draft_tokens, config.tree_width)
    corpus = corpus_branch(context.state, config.num_draft_tokens)
    if corpus is not None:
        drafter = ComposedDrafter({"lookup": drafter, "corpus": corpus})
    return MethodRuntime(context.model("target"), drafter)


METHOD = MethodDescriptor(
    name="prompt-lookup",
    summary="drafts the continuation of the latest earlier occurrence of the last n tokens, in the context "
            "or in text the target wrote (no draft model, no training; chain or tree)",
    config_class=PromptLookupConfig,
    graphs=lambda config: {"target": GraphRecipe(TARGET, lambda c: infrastructure_passes())},
    build_runtime=_build_runtime,
    validate=_validate,
    prepare=_prepare,
    draft_depth=lambda config: config.num_draft_tokens,
)
