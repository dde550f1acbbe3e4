"""Method `swift`: training-free self-speculative decoding by skipping sublayers.

SWIFT (Xia et al., 2024) drafts with the target itself, skipping a set of
attention and MLP sublayers of layers 1..L-2, and optimises that set on the
fly. Here:

- The target graph gets skip branches (`insert_skip_branches`): it is split
  into sublayer segments. Verification runs the parent graph (every segment,
  the exact model); the drafter runs only the non-skipped segments through
  `SkippingForward`, writing into the *target's* KV cache. Draft rows beyond
  the committed prefix are overwritten by verification, which writes every
  tree slot before reading it, and skipped attention writes nothing, so no
  cache is copied and changing the skip set recompiles nothing.
- Confidence-aware drafting: draft top-1 tokens until the draft's top-1
  probability falls below `confidence_threshold` (that low-confidence token
  is still drafted) or `max_draft_tokens` are drafted.
- Dynamic verification tree: at each depth the draft's top-k candidates,
  with k chosen by the depth's top-1 probability band; one target forward
  verifies the caterpillar tree. Greedy acceptance follows the target's
  argmax; sampling treats the deterministic candidates as point masses
  (exact rejection per sibling, see `runtime.acceptance`), so both are
  lossless.
- Layer-set optimisation (`swift_search`): once a prompt has `context_window`
  + 1 generated tokens, each round first scores one candidate skip set by
  matchness on that window; state carries across prompts. `specc compile`
  can run it ahead of time on calibration prompts and store the found set
  in the engine manifest (`method_state`); at run time it keeps adapting
  unless `adapt=false`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specc.errors import UsageError
from specc.methods.config import MethodConfig, option
from specc.methods.descriptor import GraphRecipe, MethodDescriptor, register
from specc.methods.infrastructure import infrastructure_passes
from specc.methods.swift_search import LayerSetSearch, SearchSettings, describe_skip_set, odd_layers
from specc.methods.swift_segments import SkippingForward
from specc.passes.insert_skip_branches import InsertSkipBranches, skip_branches
from specc.runtime.acceptance import Acceptance
from specc.runtime.cached_model import CachedModel
from specc.runtime.drafter import Draft, DraftBudget
from specc.runtime.masks import causal_chunk_mask
from specc.runtime.sampling import SamplingConfig
from specc.runtime.tree import TreeSpec, tree_tensors

SKIP_SET_KEY = "swift_skip_set"
SEGMENT_BACKENDS = ("eager", "inductor")


@dataclass(frozen=True)
class SwiftConfig(MethodConfig):
    skip_ratio: float = option(0.45, "share of the 2(L-2) skippable sublayers a candidate skips (paper: 0.45; "
                                     "0.5 for 34B/70B models)")
    context_window: int = option(32, "gamma: generated tokens the matchness of a candidate is scored on")
    bayes_interval: int = option(25, "beta: every beta-th candidate comes from Bayesian optimisation "
                                     "(scikit-optimize GP), the others are random")
    bayes_kappa: float = option(2.5, "exploration weight of the GP's upper confidence bound")
    max_score: float = option(0.95, "stop searching once a skip set's matchness exceeds this")
    max_tolerance: int = option(300, "stop searching after this many candidates without improvement")
    max_tries: int = option(1000, "stop searching after this many candidates in all")
    max_tries_per_prompt: int = option(100, "at most this many matchness evaluations per prompt (specc's bound "
                                            "on search overhead; the paper has none)")
    adapt: bool = option(True, "keep optimising the skip set at run time; false drafts with the stored set")
    search_seed: int = option(0, "seed of the random candidates and the GP")
    confidence_threshold: float = option(0.8, "epsilon: stop drafting after a token whose top-1 probability "
                                              "is below this")
    max_draft_tokens: int = option(25, "most draft steps (tree depth) per round")
    tree_band_percent: tuple[int, ...] = option((95, 80, 50), "top-1 probability band edges in percent, "
                                                              "descending; depth fan width is chosen by band")
    tree_widths: tuple[int, ...] = option((1, 3, 5, 10), "candidates per depth for each band, above the first "
                                                         "edge first (paper: 1,3,5,10; the reference code uses "
                                                         "3,5,8,10 for greedy)")
    segment_backend: str = option("eager", "how the drafter's sublayer segments run when the engine's backend "
                                           "is inductor or aoti (verification always uses the engine's "
                                           "backend): eager, or inductor (on the 2-core CPU, 8-layer `small-qwen2` "
                                           "model a draft step took 6.3 ms with inductor segments and 4.3 ms "
                                           "eager: per-call overhead outweighs fusion at this size)")
    calib_prompts: int = option(8, "compile: optimise the skip set on this many calibration prompts first "
                                   "(0: the engine starts from the odd-layer set)")
    calib_data: str | None = option(None, "compile: calibration prompts, a JSONL or text file (default: "
                                          "built-in stdlib code prompts)")
    calib_max_new_tokens: int = option(64, "compile: tokens generated per calibration prompt")

    def __post_init__(self):
        _check_range("skip_ratio", self.skip_ratio, 0.0, 1.0)
        _check_range("max_score", self.max_score, 0.0, 1.0)
        _check_range("confidence_threshold", self.confidence_threshold, 0.0, 1.0)
        for name in ("context_window", "bayes_interval", "max_tolerance", "max_tries", "max_draft_tokens"):
            if getattr(self, name) < 1:
                raise UsageError(f"{name}={getattr(self, name)} must be at least 1")
        for name in ("max_tries_per_prompt", "calib_prompts", "calib_max_new_tokens"):
            if getattr(self, name) < 0:
                raise UsageError(f"{name}={getattr(self, name)} must be 0 or more")
        if self.segment_backend not in SEGMENT_BACKENDS:
            raise UsageError(f"segment_backend={self.segment_backend} must be one of {', '.join(SEGMENT_BACKENDS)}")
        bands = self.tree_band_percent
        if list(bands) != sorted(bands, reverse=True) or not all(0 <= b <= 100 for b in bands):
            raise UsageError(f"tree_band_percent={','.join(map(str, bands))} must be descending percentages")
        if len(self.tree_widths) != len(bands) + 1 or min(self.tree_widths) < 1:
            raise UsageError(f"tree_widths={','.join(map(str, self.tree_widths))} needs {len(bands) + 1} widths "
                             f">= 1, one per band of tree_band_percent")

    def search_settings(self) -> SearchSettings:
        return SearchSettings(skip_ratio=self.skip_ratio, bayes_interval=self.bayes_interval, kappa=self.bayes_kappa,
                              max_score=self.max_score, max_tolerance=self.max_tolerance, max_tries=self.max_tries,
                              seed=self.search_seed)

    def fan_width(self, confidence: float) -> int:
        """Candidates at a depth whose top-1 probability is `confidence`."""
        band = next((i for i, edge in enumerate(self.tree_band_percent) if confidence > edge / 100), None)
        return self.tree_widths[len(self.tree_band_percent) if band is None else band]


def _check_range(name: str, value: float, low: float, high: float) -> None:
    if not low <= value <= high:
        raise UsageError(f"{name}={value} must be between {low} and {high}")


class SwiftDrafter:
    """Drafts with the skipping target; scores candidate skip sets between rounds."""

    def __init__(self, draft: CachedModel, config: SwiftConfig, search: LayerSetSearch):
        self.draft = draft
        self.config = config
        self.search = search
        self.skippable = search.sublayers
        self._eos = set(draft.architecture.eos_token_ids)
        self._prompt_len = 0
        self._prompt_evaluations = 0
        self._rescored = False

    @property
    def skip_set(self) -> frozenset[str]:
        return self.search.best

    def use_skip_set(self, skip: frozenset[str]) -> None:
        """Draft with `skip` from now on (it becomes the search's incumbent)."""
        unknown = sorted(set(skip) - set(self.skippable))
        if unknown:
            raise UsageError(f"skip set names {', '.join(unknown)}; skippable sublayers are "
                             f"{', '.join(self.skippable)}")
        self.search.state.best = frozenset(skip)
        self.search.state.best_score = None
        self._rescored = False

    def begin(self, prompt: torch.Tensor) -> None:
        self._prompt_len = int(prompt.numel())
        self._prompt_evaluations = 0
        self._rescored = False

    def propose(self, tokens: list[int], budget: DraftBudget, sampling: SamplingConfig,
                generator: torch.Generator | None) -> Draft | None:
        if self.can_optimize(tokens):
            self.optimize_once(tokens)
        return self._draft(tokens, budget)

    def observe(self, draft: Draft, acceptance: Acceptance) -> None:
        """Nothing to learn per round: the draft shares the target's committed KV."""

    def can_optimize(self, tokens: list[int]) -> bool:
        window = self.config.context_window
        return (self.config.adapt and self.search.active
                and self._prompt_evaluations < self.config.max_tries_per_prompt
                and len(tokens) - self._prompt_len >= window + 1
                and len(tokens) - 1 + window <= self.draft.cache.max_seq_len)

    def optimize_once(self, tokens: list[int]) -> None:
        """One search step: re-score the incumbent on this prompt's window
        first, then score one candidate per call."""
        self._prompt_evaluations += 1
        if not self._rescored:
            self._rescored = True
            self.search.rescore(self.matchness(tokens, self._prompt_len, self.search.best))
            return
        candidate = self.search.suggest()
        self.search.report(candidate, self.matchness(tokens, self._prompt_len, candidate))

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
            logits = self._step(token, prefix_len + level, skip)
            confidence = float(torch.softmax(logits.float(), dim=-1).max())
            width = min(self.config.fan_width(confidence), budget.max_nodes - 1 - sum(widths), logits.numel())
            if width < 1:
                break
            candidates = logits.topk(width).indices.tolist()
            node_tokens += candidates
            widths.append(width)
            token = candidates[0]
            if confidence < self.config.confidence_threshold or token in self._eos:
                break
        if not widths:
            return None
        return Draft(tree=tree_tensors(TreeSpec(tuple(widths))),
                     node_tokens=torch.tensor(node_tokens, device=self.draft.device))

    def _step(self, token: int, slot: int, skip: frozenset[str]) -> torch.Tensor:
        """The skipping model's logits after `token` at `slot` (= its position)."""
        at = torch.tensor([slot], device=self.draft.device)
        outputs = self.draft.run_all(torch.tensor([token], device=self.draft.device), at, at,
                                     causal_chunk_mask(slot, 1, self.draft.device), skip)
        return outputs[0][0, -1]

    def warm_up(self) -> None:
        """Compile every segment for the drafting (q = 1) and scoring (q = window) shapes.

        Lowered segments treat every dimension as dynamic, and the compiler
        ties together dimensions that happen to be equal on the first call
        (duck sizing), so the warm-up uses cache lengths equal to no static
        size of the model: otherwise the first real call recompiles."""
        window = self.config.context_window
        taken = self.draft.forward_fn.static_sizes | set(self.draft.cache.tensors[0].shape) | {window}
        with torch.inference_mode():
            self._step(0, _untaken_size(taken, 2) - 1, frozenset())
            if self.config.adapt:
                free = _untaken_size(taken, 2 * window + 1) - window
                self.matchness([0] * (free + 1), 1, frozenset())


def _untaken_size(taken: set[int], at_least: int) -> int:
    return next(n for n in range(at_least, at_least + len(taken) + 1) if n not in taken)


def build_drafter(target: CachedModel, forward: SkippingForward, config: SwiftConfig,
                  initial: frozenset[str] | None = None) -> SwiftDrafter:
    """The SWIFT drafter over `forward`'s segments, sharing `target`'s KV cache."""
    draft = CachedModel(forward, target.architecture, target.cache.max_seq_len, target.cache.tensors[0].dtype,
                        target.device, cache=target.cache)
    return SwiftDrafter(draft, config, LayerSetSearch(forward.skippable, config.search_settings(), initial))


def _make_drafter(engine, config: SwiftConfig) -> SwiftDrafter:
    from specc.lower.backends import lower_eager, lower_inductor

    # AOTInductor packages the whole graph; the segments the drafter calls one by one run eager or through Inductor.
    lower = lower_inductor if engine.backend != "eager" and config.segment_backend == "inductor" else lower_eager
    forward = SkippingForward(engine.graph_modules["target"], lower)
    stored = engine.method_state.get(SKIP_SET_KEY)
    drafter = build_drafter(engine.cached_model("target"), forward, config,
                            frozenset(stored) if stored is not None else None)
    if lower is lower_inductor:
        drafter.warm_up()
    return drafter


def _graphs(config: SwiftConfig) -> dict[str, GraphRecipe]:
    return {"target": GraphRecipe("target", lambda c: infrastructure_passes() + [InsertSkipBranches()])}


def _compile_state(program, config: SwiftConfig, tokenizer) -> dict:
    """The skip set the engine starts from, for the manifest's `method_state`:
    the result of SWIFT's search on calibration prompts, or the odd-layer
    initial set with `calib_prompts=0`. No weights are added."""
    graph = program.graphs["target"]
    if config.calib_prompts == 0:
        skip, calibration = odd_layers(tuple(skip_branches(graph.module))), "none (calib_prompts=0)"
    else:
        from specc.methods.swift_calibration import calibrate

        search = calibrate(graph, config, tokenizer)
        skip, calibration = search.best, {**search.state.to_json(), "skippable": len(search.sublayers)}
    return {"method_state": {SKIP_SET_KEY: sorted(skip), "swift_skipped_layers": describe_skip_set(skip),
                             "swift_calibration": calibration}}


register(MethodDescriptor(
    name="swift",
    summary="SWIFT: self-speculative decoding that skips target sublayers, chosen on the fly "
            "(confidence-aware drafting, dynamic verification tree)",
    config_class=SwiftConfig,
    graphs=_graphs,
    make_drafter=_make_drafter,
    train=_compile_state,
))
