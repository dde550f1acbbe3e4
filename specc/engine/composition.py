"""Composition as an engine option: the lookup branches any composable drafter can share a tree with.

A method config that inherits `CompositionOptions` (`specc.contract.options`) takes
`lookup=true` (the n-gram continuation of the context, `specc.runtime.ngram`) and
`lookup_corpus` (continuations of text the target wrote, tokenized into the engine at
compile time: `specc.runtime.corpus_lookup`). The engine builds the method's runtime,
then puts its drafter first among those branches in a `ComposedDrafter`; the method
itself never names them.
"""

from __future__ import annotations

from dataclasses import replace

from specc.contract.config import MethodConfig, parse_assignments
from specc.contract.drafter import MethodRuntime
from specc.contract.options import CompositionOptions
from specc.errors import UsageError


def lookup_branches(config: MethodConfig, state: dict) -> dict:
    """The branches `config` asks for, by name ("lookup", "corpus"); empty for none."""
    if not isinstance(config, CompositionOptions):
        return {}
    from specc.runtime.corpus_lookup import corpus_branch
    from specc.runtime.ngram import NgramDrafter

    branches = {}
    if config.lookup:
        branches["lookup"] = NgramDrafter(config.lookup_max_ngram, 1, config.lookup_tokens, 1)
    corpus = corpus_branch(state, config.lookup_tokens)
    if corpus is not None:
        branches["corpus"] = corpus
    return branches


def with_lookup_branches(runtime: MethodRuntime, method: str, config: MethodConfig, state: dict) -> MethodRuntime:
    """`runtime` with its drafter composed with the branches `config` asks for (unchanged when it
    asks for none): the method's drafter is the primary branch, named after the method."""
    branches = lookup_branches(config, state)
    if not branches:
        return runtime
    if runtime.drafter is None:
        raise UsageError(f"method {method!r} has no drafter to share a tree with the lookup branches; "
                         f"compile it without lookup and lookup_corpus")
    from specc.runtime.compose import ComposedDrafter

    return replace(runtime, drafter=ComposedDrafter({method: runtime.drafter, **branches}))


def engine_runtime(method, context, config: MethodConfig) -> MethodRuntime:
    """What an engine of `method` (a `MethodDescriptor`) runs: its runtime, with the lookup
    branches `config` asks for."""
    return with_lookup_branches(method.build_runtime(context, config), method.name, config, context.state)


def with_load_time_settings(config: MethodConfig, method: str, assignments: list[str]) -> MethodConfig:
    """`config` with `assignments` (`key=value`) to fields its class marks `at_load` (the lookup
    branches', a drafter's depth or stopping rule): they change no graph or weight, so an engine
    takes them as it loads, without recompiling."""
    if not assignments:
        return config
    allowed = config.load_time_fields()
    if not allowed:
        raise UsageError(f"method {method!r} has no settings that can change when the engine loads; "
                         f"recompile with --set")
    fixed = sorted(set(parse_assignments(assignments)) - set(allowed))
    if fixed:
        raise UsageError(f"{', '.join(fixed)} cannot change when an engine loads (only "
                         f"{', '.join(allowed)} can); recompile with --set")
    return config.with_assignments(assignments)


def lookup_corpus_requested(config: MethodConfig) -> bool:
    return isinstance(config, CompositionOptions) and bool(config.lookup_corpus)


def lookup_corpus_state(config: MethodConfig, tokenizer) -> dict:
    """Method state holding the lookup corpus `config` names, tokenized (empty without one)."""
    if not lookup_corpus_requested(config):
        return {}
    from specc.data.token_corpus import corpus_state

    return corpus_state(tokenizer, config.lookup_corpus)


def check_composition(config: MethodConfig) -> None:
    """Before any weights load: the lookup corpus files exist and are not the built-in corpus."""
    if isinstance(config, CompositionOptions):
        from specc.contract.validation import check_lookup_corpus

        check_lookup_corpus(config.lookup_corpus)
