"""Method `swift`: training-free self-speculative decoding by skipping sublayers.

SWIFT (Xia et al., 2024) drafts with the target itself, skipping a set of
attention and MLP sublayers of layers 1..L-2, and optimises that set on the
fly. Here:

- A copy of the target graph gets skip branches (`insert_skip_branches`): it
  is split into sublayer segments (the `skipping` graph, which the engine
  keeps as its FX module and never lowers whole). Verification runs the
  plain `target` graph, the `none` engine's own, so a compiling backend
  fuses it as it fuses `none`'s (a segmented verifier rounded differently in
  bfloat16: benchmarks/NOTES.md, "The 1.5B in bfloat16 with q4 drafts"); the
  drafter runs only the non-skipped segments through
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
- Layer-set optimisation (`search`): once a prompt has `context_window`
  + 1 generated tokens, each round first scores one candidate skip set by
  matchness on that window; state carries across prompts. `specc compile`
  can run it ahead of time on calibration prompts and store the found set
  in the engine manifest (`method_state`); at run time it keeps adapting
  unless `adapt=false`.
- The settled set compiled (`draft_graph`): `specc compile` also cuts the
  stored set out of an unsegmented copy of the target (`skip_sublayers`),
  and the backend lowers that `draft` graph like any other. While the
  drafter drafts with the stored set it runs that one graph (same cache,
  same KV writes as the segments); segments remain for scoring candidates
  and for any other set the run-time search adopts. Its LM head is cut to
  the `draft_vocab_size` most frequent calibration tokens
  (`reduce_draft_vocabulary`): verification keeps the full head.
"""

from __future__ import annotations

from specc.contract.descriptor import TARGET, GraphRecipe, MethodDescriptor, TrainResult
from specc.contract.drafter import MethodRuntime
from specc.contract.infrastructure import infrastructure_passes
from specc.lower.backend import RUN_TIME_SEGMENTS
from specc.methods.swift.config import SKIP_SET_KEY, SwiftConfig
from specc.methods.swift.drafter import CompiledSkipSet, SwiftDrafter, build_drafter
from specc.methods.swift.insert_skip_branches import InsertSkipBranches, skip_branches
from specc.methods.swift.search import describe_skip_set, odd_layers
from specc.methods.swift.segments import SkippingForward
from specc.methods.swift.skip_sublayers import SkipSublayers, SkipSublayersConfig
from specc.passes.reduce_draft_vocabulary import reduced_head_passes
from specc.runtime.draft_logits import DRAFT_VOCABULARY_KEY, vocabulary_from_state
from specc.train.reduce_draft_head import reduce_draft_head

DRAFT_GRAPH = "draft"
SKIPPING_GRAPH = "skipping"   # the target with skip branches: its segments draft and score skip sets

__all__ = ["METHOD", "SKIP_SET_KEY", "SwiftConfig", "SwiftDrafter", "build_drafter"]


def _build_runtime(context, config: SwiftConfig) -> MethodRuntime:
    target = context.model("target")
    lower = context.lower_segment if config.compile_segments else _run_eager
    # An engine compiled before 2026-11-30 has no `skipping` graph: its `target` is the segmented one.
    forward = SkippingForward(context.modules.get(SKIPPING_GRAPH, context.modules["target"]), lower)
    stored = context.state.get(SKIP_SET_KEY)
    stored = frozenset(stored) if stored is not None else None
    compiled = None
    if DRAFT_GRAPH in context.graphs and stored is not None:
        compiled = CompiledSkipSet(context.model(DRAFT_GRAPH, cache=target.cache), stored,
                                   vocabulary_from_state(context.state, context.device))
    drafter = build_drafter(target, forward, config, stored, compiled)
    if config.compile_segments and context.compiles_lazily:
        drafter.warm_up()
    # Drafting only with the compiled draft graph runs no segment (use_skip_set can still
    # make it run some, then with the backend's generation scope).
    return MethodRuntime(target, drafter, runs_segments=config.adapt or compiled is None)


def _run_eager(segment):
    return segment


def _graphs(config: SwiftConfig) -> dict[str, GraphRecipe]:
    graphs = {"target": GraphRecipe(TARGET, lambda c: infrastructure_passes()),
              SKIPPING_GRAPH: GraphRecipe(TARGET, lambda c: infrastructure_passes() + [InsertSkipBranches()],
                                          lowered=False)}
    if config.draft_graph:   # the target without the skip set compile-time calibration stored
        graphs[DRAFT_GRAPH] = GraphRecipe(TARGET, lambda c: infrastructure_passes(), after_training=_draft_cut,
                                          drafts_only=True)
    return graphs


def _compile_state(context, config: SwiftConfig, tokenizer) -> TrainResult:
    """The skip set the engine starts from, for the manifest's `method_state`:
    the result of SWIFT's search on calibration prompts (it scores token
    agreement, not time, so it runs in eager whatever the engine's backend),
    or the odd-layer initial set with `calib_prompts=0`; with a `draft`
    graph, its head cut to the calibration text's most frequent tokens (the
    only weight added)."""
    graph = context.program.graphs[SKIPPING_GRAPH]
    if config.calib_prompts == 0:
        skip, calibration = odd_layers(tuple(skip_branches(graph.module))), "none (calib_prompts=0)"
    else:
        from specc.methods.swift.calibration import calibrate

        search = calibrate(graph, config, tokenizer)
        skip, calibration = search.best, {**search.state.to_json(), "skippable": len(search.sublayers)}
    state = {SKIP_SET_KEY: sorted(skip), "swift_skipped_layers": describe_skip_set(skip),
             "swift_calibration": calibration}
    head = (reduce_draft_head(context, config, DRAFT_GRAPH, tokenizer, "swift", state) if config.draft_graph
            else TrainResult())
    return TrainResult(weights=head.weights, state={**state, **head.state})


def _draft_cut(config: SwiftConfig, state: dict) -> list:
    """The `draft` graph's passes once the skip set is known: its sublayers cut out, then the
    head reduced to the calibrated vocabulary (when `draft_vocab_size` asks for it)."""
    return ([SkipSublayers(SkipSublayersConfig(tuple(sorted(state[SKIP_SET_KEY]))))]
            + reduced_head_passes(state.get(DRAFT_VOCABULARY_KEY)))


METHOD = MethodDescriptor(
    name="swift",
    summary="SWIFT: self-speculative decoding that skips target sublayers, chosen on the fly "
            "(confidence-aware drafting, dynamic verification tree)",
    config_class=SwiftConfig,
    graphs=_graphs,
    build_runtime=_build_runtime,
    requires=frozenset({RUN_TIME_SEGMENTS}),
    train=_compile_state,
    validate=lambda config, model_config: _validate(config, model_config),
    draft_depth=lambda config: config.max_draft_tokens,
)


def _validate(config: SwiftConfig, model_config) -> None:
    """Before any work: the calibration prompts must exist when calibration runs."""
    from specc.contract.validation import check_data_file

    if config.calib_prompts or (config.draft_graph and config.draft_vocab_size):
        check_data_file(config.calib_data)

