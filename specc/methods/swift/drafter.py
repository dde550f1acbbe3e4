"""SWIFT's drafter: the target with a run-time skip set, sharing its KV cache."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from specc.contract.drafter import Capabilities, Draft, DraftBudget
from specc.contract.sampling import SamplingConfig
from specc.contract.tree import TreeSpec, tree_tensors
from specc.contract.verification import Acceptance, Verification
from specc.errors import UsageError
from specc.methods.swift.config import SwiftConfig
from specc.methods.swift.search import LayerSetSearch
from specc.methods.swift.segments import SkippingForward
from specc.runtime.cached_model import CachedModel
from specc.runtime.draft_logits import token_ids
from specc.runtime.masks import causal_chunk_mask
from specc.runtime.warm_up import untaken_size


@dataclass(frozen=True)
class CompiledSkipSet:
    """The `draft` graph: the target with `skip` cut out, lowered whole (one call
    per draft step instead of one per segment), sharing the target's cache."""

    model: CachedModel
    skip: frozenset[str]
    vocabulary: torch.Tensor | None = None   # token id of each row of a reduced head (None: the full head)


@dataclass(frozen=True)
class SearchLimit:
    """A bound on the skip-set search from outside the run (compile-time calibration's
    budget): the drafter asks `allows()` before each search step and calls `after_step()`
    after it."""

    allows: Callable[[], bool]
    after_step: Callable[[], None] = lambda: None


class SwiftDrafter:
    """Drafts with the skipping target; scores candidate skip sets between rounds."""

    capabilities = Capabilities(resumable=True)   # it reads the target's KV; begin needs the prompt's length

    def __init__(self, draft: CachedModel, config: SwiftConfig, search: LayerSetSearch,
                 compiled: CompiledSkipSet | None = None):
        self.draft = draft
        self.compiled = compiled
        self.config = config
        self.search = search
        self.limit: SearchLimit | None = None
        self.skippable = search.sublayers
        self._eos = set(draft.architecture.eos_token_ids)
        self._prompt_len = 0
        self._prompt_evaluations = 0
        self._rescored = False

    @property
    def skip_set(self) -> frozenset[str]:
        return self.search.best

    def limit_search(self, limit: SearchLimit) -> None:
        """Search only while `limit` allows it (drafting goes on with the incumbent set)."""
        self.limit = limit

    def use_skip_set(self, skip: frozenset[str]) -> None:
        """Draft with `skip` from now on (it becomes the search's incumbent)."""
        unknown = sorted(set(skip) - set(self.skippable))
        if unknown:
            raise UsageError(f"skip set names {', '.join(unknown)}; skippable sublayers are "
                             f"{', '.join(self.skippable)}")
        self.search.state.best = frozenset(skip)
        self.search.state.best_score = None
        self._rescored = False

    def begin(self, prompt: torch.Tensor, prefill: Verification) -> None:
        self._prompt_len = int(prompt.numel())
        self._prompt_evaluations = 0
        self._rescored = False

    def propose(self, tokens: list[int], budget: DraftBudget, sampling: SamplingConfig,
                generator: torch.Generator | None) -> Draft | None:
        if self.can_optimize(tokens):
            self.optimize_once(tokens)
        return self._draft(tokens, budget)

    def observe(self, draft: Draft | None, acceptance: Acceptance | None, verification: Verification) -> None:
        """Nothing to learn per round: the draft shares the target's committed KV."""

    def can_optimize(self, tokens: list[int]) -> bool:
        window = self.config.context_window
        return (self.config.adapt and self.search.active
                and self._prompt_evaluations < self.config.max_tries_per_prompt
                and len(tokens) - self._prompt_len >= window + 1
                and len(tokens) - 1 + window <= self.draft.cache.max_seq_len
                and (self.limit is None or self.limit.allows()))

    def optimize_once(self, tokens: list[int]) -> None:
        """One search step: re-score the incumbent on this prompt's window
        first, then score one candidate per call."""
        self._prompt_evaluations += 1
        if not self._rescored:
            self._rescored = True
            self.search.rescore(self.matchness(tokens, self._prompt_len, self.search.best))
        else:
            candidate = self.search.suggest()
            self.search.report(candidate, self.matchness(tokens, self._prompt_len, candidate))
        if self.limit is not None:
            self.limit.after_step()

    def matchness(self, tokens: list[int], prompt_len: int, skip: frozenset[str]) -> float:
        """Teacher-forced top-1 agreement of the skipping model with the
        generated tokens: the first `context_window` + 1 tokens after the
        prompt, g0..gW, are fed as one chunk and the draft's argmax after
        g0..g(W-1) is compared with g1..gW.

        The chunk attends to the target's KV of the prompt and to its own
        KV for the window, as the reference code does; its KV is written to
        free slots after the sequence (`len(tokens) - 1` on), never over
        committed rows, with a mask that hides the committed rows of the
        window itself. The next draft or verification overwrites them."""
        window = self.config.context_window
        fed = torch.tensor(tokens[prompt_len: prompt_len + window], device=self.draft.device)
        expected = torch.tensor(tokens[prompt_len + 1: prompt_len + window + 1], device=self.draft.device)
        free = len(tokens) - 1
        mask = torch.zeros(window, free + window, dtype=torch.bool, device=self.draft.device)
        mask[:, :prompt_len] = True
        mask[:, free:] = causal_chunk_mask(0, window, self.draft.device)[0, 0]
        positions = torch.arange(prompt_len, prompt_len + window, device=self.draft.device)
        slots = torch.arange(free, free + window, device=self.draft.device)
        logits = self.draft.run_all(fed, positions, slots, mask[None, None], skip)[0][0]
        return float((logits.argmax(dim=-1) == expected).float().mean())

    def _draft(self, tokens: list[int], budget: DraftBudget) -> Draft | None:
        """Top-1 chain with a confidence-sized fan of top-k siblings per depth."""
        prefix_len = len(tokens) - 1
        max_depth = min(self.config.max_draft_tokens, budget.max_depth)
        skip = self.search.best
        node_tokens, widths, token = [tokens[-1]], [], tokens[-1]
        for level in range(max_depth):
            logits, vocabulary = self._step(token, prefix_len + level, skip)
            confidence = float(torch.softmax(logits.float(), dim=-1).max())
            fan = 1 if budget.chain_only else self.config.fan_width(confidence)
            width = min(fan, budget.max_nodes - 1 - sum(widths), logits.numel())
            if width < 1:
                break
            candidates = token_ids(logits.topk(width).indices, vocabulary)
            node_tokens += candidates
            widths.append(width)
            token = candidates[0]
            if confidence < self.config.confidence_threshold or token in self._eos:
                break
        if not widths:
            return None
        return Draft(tree=tree_tensors(TreeSpec(tuple(widths))),
                     node_tokens=torch.tensor(node_tokens, device=self.draft.device))

    def _step(self, token: int, slot: int, skip: frozenset[str]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The skipping model's logits after `token` at `slot` (= its position), and the token
        id of each logit's row (None: the whole vocabulary): from the compiled draft graph
        when it was cut for `skip`, else from segments."""
        at = torch.tensor([slot], device=self.draft.device)
        inputs = (torch.tensor([token], device=self.draft.device), at, at,
                  causal_chunk_mask(slot, 1, self.draft.device))
        if self.compiled is not None and skip == self.compiled.skip:
            return self.compiled.model.run_all(*inputs)[0][0, -1], self.compiled.vocabulary
        return self.draft.run_all(*inputs, skip)[0][0, -1], None

    def warm_up(self) -> None:
        """Compile every segment for the drafting (q = 1) and scoring (q = window) shapes.

        Lowered segments treat every dimension as dynamic, and the compiler
        ties together dimensions that happen to be equal on the first call
        (duck sizing), so the warm-up uses cache lengths equal to no static
        size of the model: otherwise the first real call recompiles."""
        window = self.config.context_window
        taken = self.draft.forward_fn.static_sizes | set(self.draft.cache.tensors[0].shape) | {window}
        with torch.inference_mode():
            self._step(0, untaken_size(taken, 2) - 1, frozenset())
            if self.config.adapt:
                free = untaken_size(taken, 2 * window + 1) - window
                self.matchness([0] * (free + 1), 1, frozenset())


def build_drafter(target: CachedModel, forward: SkippingForward, config: SwiftConfig,
                  initial: frozenset[str] | None = None, compiled: CompiledSkipSet | None = None) -> SwiftDrafter:
    """The SWIFT drafter over `forward`'s segments (and `compiled`, the stored
    set's draft graph), sharing `target`'s KV cache."""
    draft = CachedModel(forward, target.signature, target.architecture, target.cache.max_seq_len,
                        target.cache.tensors[0].dtype, target.device, cache=target.cache)
    return SwiftDrafter(draft, config, LayerSetSearch(forward.skippable, config.search_settings(), initial),
                        compiled)


