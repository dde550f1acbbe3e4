"""Everything a method or backend living outside specc needs, in one place.

    from specc.extension import MethodDescriptor, GraphRecipe, MethodConfig, option, ...

A method is a `MethodDescriptor` registered under the `specc.methods` entry point: its
config (`MethodConfig` with `option` fields and a `VERSION`, inheriting the shared option
blocks `DistillationOptions`, `OptimizerOptions` and `CalibrationOptions` where it trains
or calibrates, and `CompositionOptions` where its drafter composes with the lookup branches), per-graph recipes (`GraphRecipe`: a source checkpoint and passes, starting
from `infrastructure_passes()`), and `build_runtime`, which turns a `MethodContext` into a
`MethodRuntime` (a target and a drafter proposing `Draft`s within a `DraftBudget`, which may carry
a `SideChannel` record to the method's own verifier; one running a model of its own keeps its
progress in a `DraftFollower`); drafters
that keep the composition contract share one tree through `ComposedDrafter`, among them the
n-gram drafters `NgramDrafter` (the context) and `CorpusDrafter` (a corpus a method's `prepare`
keeps with `corpus_state`, checked by `check_lookup_corpus`, read back by `corpus_branch`). A pass
is a `GraphPass` returning a `PassResult`, and finds what it rewrites through
`specc.graph.patterns`. A backend is a `Backend` registered under `specc.backends`.
`examples/prompt_lookup` is a complete method written against this module alone;
docs/extending.md explains the contract.
"""

from __future__ import annotations

from specc.contract.config import ConfigVersionError, MethodConfig, OptionBlock, option
from specc.contract.descriptor import (TARGET, ExtraSource, GraphRecipe, MethodDescriptor, TrainingContext,
                                       TrainResult)
from specc.contract.drafter import Capabilities, Draft, DraftBudget, Drafter, MethodRuntime, Target
from specc.contract.infrastructure import infrastructure_passes
from specc.contract.options import CalibrationOptions, CompositionOptions, DistillationOptions, OptimizerOptions
from specc.contract.side_channel import SideChannel, carried
from specc.contract.tree import TreeSpec, TreeTensors, tree_from_parents, tree_tensors
from specc.contract.validation import check_lookup_corpus
from specc.contract.verification import Acceptance, Verification
from specc.data.token_corpus import corpus_state, corpus_token_sequences
from specc.errors import SpeccError, UsageError
from specc.lower.backend import EXTRA_INPUTS, EXTRA_OUTPUTS, RUN_TIME_SEGMENTS, Backend, LoweringTarget
from specc.passes.base import GraphPass, PassResult, new_nodes
from specc.runtime.cached_model import CachedModel
from specc.runtime.compose import ComposedDrafter
from specc.runtime.context import MethodContext
from specc.runtime.corpus_lookup import CorpusDrafter, corpus_branch
from specc.runtime.draft_follower import DraftFollower
from specc.runtime.ngram import NgramDrafter

__all__ = [
    "Acceptance", "Backend", "CachedModel", "CalibrationOptions", "Capabilities", "ComposedDrafter", "CompositionOptions",
    "ConfigVersionError", "CorpusDrafter", "DistillationOptions",
    "Draft", "DraftFollower", "DraftBudget", "Drafter", "EXTRA_INPUTS", "EXTRA_OUTPUTS", "ExtraSource", "GraphPass", "GraphRecipe",
    "LoweringTarget", "MethodConfig", "MethodContext", "MethodDescriptor", "MethodRuntime", "NgramDrafter",
    "OptimizerOptions", "OptionBlock", "PassResult", "RUN_TIME_SEGMENTS", "SideChannel", "SpeccError", "TARGET", "Target",
    "TrainingContext", "TrainResult", "TreeSpec", "TreeTensors", "UsageError", "Verification",
    "carried", "check_lookup_corpus", "corpus_branch", "corpus_state", "corpus_token_sequences", "infrastructure_passes",
    "new_nodes", "option",
    "tree_from_parents", "tree_tensors",
]
