"""Which scheme packs each graph of an engine: the verifying graphs take their source model's
(`--quantize`), the graphs that only draft take `--quantize-draft`'s where it is given.

A draft graph only proposes tokens, and the target's graphs verify every one, so a draft may
read its weights at fewer bits than the target without changing a committed token. A draft
graph built from the target's own weights then reads a packed copy of them, stored beside
the target's unquantized ones."""

from __future__ import annotations

from dataclasses import dataclass, field

from specc.contract.descriptor import TARGET, GraphRecipe
from specc.quantize.report import DRAFT_REPORT, TARGET_REPORT
from specc.quantize.schemes import Scheme


@dataclass(frozen=True)
class Quantization:
    """`by_source`: the scheme of every graph built from a source model (absent: unquantized);
    `drafts`: the scheme of the graphs that only draft, where it differs (`--quantize-draft`)."""

    by_source: dict[str, Scheme] = field(default_factory=dict)
    drafts: Scheme | None = None

    def for_graph(self, recipe: GraphRecipe) -> Scheme | None:
        if recipe.source == TARGET and recipe.drafts_only and self.drafts is not None:
            return self.drafts
        return self.by_source.get(recipe.source)

    def report_key(self, recipe: GraphRecipe) -> str:
        """The manifest entry that accounts for `recipe`'s packed weights."""
        own_draft_scheme = recipe.source != TARGET or (recipe.drafts_only and self.drafts is not None)
        return DRAFT_REPORT if own_draft_scheme else TARGET_REPORT


def reads_target_weights_to_draft(recipes: dict[str, GraphRecipe]) -> bool:
    """Whether a method drafts with graphs of its target's own weights (a self-speculative draft)."""
    return any(recipe.source == TARGET and recipe.drafts_only for recipe in recipes.values())
