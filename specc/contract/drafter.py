"""What a method's runtime gives the loop: a target to verify with and a drafter."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from specc.contract.sampling import SamplingConfig
from specc.contract.side_channel import SideChannel
from specc.contract.tree import TreeTensors
from specc.contract.verification import Acceptance, Verification
from specc.errors import SpeccError


@dataclass
class Draft:
    tree: TreeTensors
    node_tokens: torch.Tensor            # [n]: the root's token, then each node's
    draft_probs: torch.Tensor | None = None  # [depth, vocab] q per depth, for a sampled chain
    # What the method's own verifier reads beside the tree (e.g. states the drafter already
    # computed for some nodes); the plain target ignores it.
    carries: SideChannel | None = None
    # [n]: the drafter's estimate that each node is accepted given its parent is (root 1.0), where
    # it has one; what a composed drafter ranks its branches' chains by (`ComposedDrafter`).
    node_scores: torch.Tensor | None = None

    @property
    def sampled_chain(self) -> bool:
        return self.draft_probs is not None


@dataclass(frozen=True)
class Capabilities:
    """What a target or drafter can do beyond its protocol, declared on its class
    (`capabilities = Capabilities(resumable=True)`) and read by the engine as declared."""

    # May `begin` from a forward over the prompt's last rows only, the rest reused from the
    # previous generation (`specc.runtime.prefix_reuse`); a resumable target also counts its
    # calls in `forward_passes`.
    resumable: bool = False
    # A drafter that reads each round from the draft it is shown, so it may share a tree with
    # other drafters (`specc.runtime.compose`; model drafters: `specc.runtime.draft_follower`).
    composable: bool = False
    # A drafter's cost per proposal, in model calls: composed drafters ask cheap ones first (0: a lookup).
    draft_cost: float = 1.0
    # Has `method_report()`: what the method says about the generations since it was last asked.
    reports: bool = False


@dataclass(frozen=True)
class DraftBudget:
    """How much a draft may hold this round, from max tokens and max length. `chain_only`:
    one node per depth, each in the slot after its parent (the loop keeps only the
    leading chain of any other draft, `exact_chain`), for engines whose verification is
    exact for such rows only (`Backend.exact_rows`). Only the target graph's own calls are
    exact then: a drafter may not hand over logits it computed otherwise as the target's
    (the same layers run segment by segment round their own way in bfloat16)."""

    max_depth: int
    max_nodes: int
    chain_only: bool = False


class Target(Protocol):
    """The model the loop prefills, steps and verifies with (`CachedModel`
    for a plain target graph; a method may compose its own)."""

    capabilities: Capabilities
    device: torch.device | str
    architecture: object      # ArchitectureSummary: eos tokens, sliding window
    max_seq_len: int

    def prefill(self, tokens: torch.Tensor, start: int) -> Verification:
        """Run a causal chunk of tokens after `start` committed ones."""

    def verify_tree(self, draft: Draft, prefix_len: int) -> Verification:
        """Score the draft's flattened tree, its root at slot `prefix_len`."""

    def commit(self, base: int, accepted_offsets: list[int]) -> None:
        """Keep the accepted tree rows (KV and any per-slot state) at base + 0, 1, …"""


class Drafter(Protocol):
    capabilities: Capabilities

    def begin(self, prompt: torch.Tensor, prefill: Verification) -> None:
        """Start a new sequence (reset any per-sequence state); `prefill` is the
        target's forward over the prompt. A drafter whose capabilities say `resumable`
        may be shown a forward over the prompt's last rows only (from `prefill.slots[0]`),
        the rest reused from the previous generation (`specc.runtime.prefix_reuse`)."""

    def propose(self, tokens: list[int], budget: DraftBudget, sampling: SamplingConfig,
                generator: torch.Generator | None) -> Draft | None:
        """Draft after `tokens` (whose last one is the root); None drafts nothing."""

    def observe(self, draft: Draft | None, acceptance: Acceptance | None, verification: Verification) -> None:
        """After every target forward: what was drafted (None for a plain step),
        what the target accepted, and everything the forward returned."""


@dataclass
class MethodRuntime:
    """A method's runtime: the target the loop verifies with, and its drafter
    (None decodes one token per target forward). `runs_segments` says whether
    generating calls torch segments between the backend's compiled calls, which
    decides the backend's generation scope (torch's threads); None: whenever
    the method requires run-time segments."""

    target: Target
    drafter: Drafter | None = None
    runs_segments: bool | None = None

    def __post_init__(self):
        for role, part in (("target", self.target), ("drafter", self.drafter)):
            if part is not None and not isinstance(declared_capabilities(part), Capabilities):
                raise SpeccError(f"the {role} {type(part).__name__} declares no capabilities: give its class "
                                 f"`capabilities = Capabilities(...)` (specc.contract.drafter; "
                                 f"`Capabilities()` claims none)")


def declared_capabilities(part) -> Capabilities | None:
    """`part.capabilities`, or None when its class declares none (which `MethodRuntime` refuses)."""
    try:
        return part.capabilities
    except AttributeError:
        return None
