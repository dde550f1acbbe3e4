"""SWIFT's configuration: search, drafting and tree settings."""

from __future__ import annotations

from dataclasses import dataclass

from specc.errors import UsageError
from specc.contract.config import MethodConfig, option
from specc.contract.options import CalibrationOptions
from specc.methods.swift.search import SearchSettings

SKIP_SET_KEY = "swift_skip_set"


@dataclass(frozen=True)
class SwiftConfig(MethodConfig, CalibrationOptions):
    skip_ratio: float = option(0.45, "share of the 2(L-2) skippable sublayers a candidate skips (paper: 0.45; "
                                     "0.5 for 34B/70B models)", at_least=0, at_most=1)
    context_window: int = option(32, "gamma: generated tokens the matchness of a candidate is scored on", at_least=1)
    bayes_interval: int = option(25, "beta: every beta-th candidate comes from Bayesian optimisation "
                                     "(scikit-optimize GP), the others are random", at_least=1)
    bayes_kappa: float = option(2.5, "exploration weight of the GP's upper confidence bound")
    max_score: float = option(0.95, "stop searching once a skip set's matchness exceeds this", at_least=0, at_most=1)
    max_tolerance: int = option(300, "stop searching after this many candidates without improvement", at_least=1)
    max_tries: int = option(1000, "stop searching after this many candidates in all", at_least=1)
    max_tries_per_prompt: int = option(100, "at most this many matchness evaluations per prompt (specc's bound "
                                            "on search overhead; the paper has none)", at_least=0)
    adapt: bool = option(False, "keep optimising the skip set at run time (the paper's on-the-fly search); "
                                "false drafts with the set `specc compile` stored. Scoring candidates costs "
                                "draft time, and a set adopted at run time drafts with segments, not the "
                                "compiled draft graph (measured: docs/methods/swift.md)")
    search_seed: int = option(0, "seed of the random candidates and the GP")
    search_seconds: float = option(0.0, "compile: stop the skip-set search after this many seconds (0: no time "
                                        "limit; the try budget, 8 tries per skippable sublayer, ends it, so the "
                                        "set found does not depend on the machine's load)", at_least=0)
    confidence_threshold: float = option(0.8, "epsilon: stop drafting after a token whose top-1 probability "
                                              "is below this", at_least=0, at_most=1)
    max_draft_tokens: int = option(25, "most draft steps (tree depth) per round", at_least=1)
    tree_band_percent: tuple[int, ...] = option((95, 80, 50), "top-1 probability band edges in percent, "
                                                              "descending; depth fan width is chosen by band")
    tree_widths: tuple[int, ...] = option((1, 3, 5, 10), "candidates per depth for each band, above the first "
                                                         "edge first (paper: 1,3,5,10; the reference code uses "
                                                         "3,5,8,10 for greedy)")
    compile_segments: bool = option(False, "lower the drafter's sublayer segments with the engine backend's "
                                            "segment compiler (verification always uses the engine's "
                                            "backend); false runs them eager (on the 2-core CPU, 8-layer "
                                            "`small-qwen2` model a draft step took 6.3 ms with Inductor "
                                            "segments and 4.3 ms eager: per-call overhead outweighs fusion "
                                            "at this size)")
    draft_graph: bool = option(True, "compile: add a `draft` graph, the target with the stored skip set cut out "
                                     "(`skip_sublayers`), lowered by the engine's backend; the drafter runs it "
                                     "while it drafts with that set, and segments for any other set (run-time "
                                     "search); false drafts with segments only (measured: docs/methods/swift.md); "
                                     "the graph holds the kept layers' weights a second time")
    draft_vocab_size: int = option(8192, "rows of the draft graph's LM head: the most frequent tokens of the "
                                         "calibration text (verification and the segments keep the full head, "
                                         "so output is unchanged); 0, or at least the vocabulary size, keeps "
                                         "the full head", at_least=0)
    calib_prompts: int = option(8, "compile: optimise the skip set on this many calibration prompts first "
                                   "(0: the engine starts from the odd-layer set)", at_least=0)
    calib_max_new_tokens: int = option(64, "compile: tokens generated per calibration prompt", at_least=0)
    # CalibrationOptions, with SWIFT's help
    calib_data: str | None = option(None, "compile: calibration prompts, a JSONL or text file (default: "
                                          "built-in stdlib code prompts)")

    def __post_init__(self):
        super().__post_init__()   # every field's bounds
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



