"""What one target forward returns to the loop and to the drafter, and what the loop accepted of it."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specc.contract.side_channel import SideChannel


@dataclass
class Acceptance:
    """The drafted nodes the target accepted (`specc.runtime.acceptance` decides), and the token after them."""

    path: list[int]        # accepted node indices, root (0) first
    next_token: int        # the bonus/corrected token after the path
    # the accepted nodes' tokens (path[1:]), when the acceptor already has them on the host
    accepted_tokens: list[int] | None = None


@dataclass
class Verification:
    """Logits `[q, vocab]` of the rows just run (None for a graph without a
    head), and the target's other outputs by name, a row each, with the batch
    dimension dropped (a layer's hidden states `[q, hidden]`: what a drafter
    following the target reads by name, `specc.runtime.draft_follower`)."""

    logits: torch.Tensor | None
    outputs: dict[str, torch.Tensor] = field(default_factory=dict)
    slots: torch.Tensor | None = None    # the cache slot of each row
    # A verifier whose rows are not read from one set of logits (a lossy tree verifier exiting
    # each path at its own layer) decides acceptance itself; the loop then uses this.
    acceptance: Acceptance | None = None
    # What the method's own drafter reads beside the rows (e.g. logits of rows that are not
    # the tree's); nothing else does.
    carries: SideChannel | None = None
