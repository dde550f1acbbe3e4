"""Exactness in reduced precision, owned here: which rows a backend computes exactly, what
that gives a drafter, and what the loop does with a draft that is not a chain.

In bfloat16 the CPU kernels round a row by how many rows its call has, enough to flip
bfloat16's frequent near-ties between a verification row and the decode step it stands
for. A backend declares one fact, its `RowExactness`:

- `ANY_ROWS`: every row computes what a one-row call computes, whatever the call (float32
  kernels, or a backend that never runs reduced precision): no padding, no cap;
- `PADDED`: in bfloat16 every call of fewer than `EXACT_ROWS` rows runs padded to
  `EXACT_ROWS` (`specc.lower.row_padding`), so calls of up to that many rows compute
  their rows as decode steps do;
- `PADDED_UNLESS_ALIKE`: the same, except a graph that computes every row alike up to
  `EXACT_ROWS` by itself (every linear quantized, attention padded inside the graph:
  `specc.graph.nodes.rows_computed_alike`) runs as called, which a backend can promise
  when it runs those kernels as the graph calls them and computes the rest row by row
  (eager; aoti, whose packages keep the quantized kernels as calls).

Everything else follows from it and is derived here:
- `exact_rows`: the most rows a call may have and stay exact (None: any);
- `padded_rows`: the rows a lowered graph's calls are padded to (None: run as called),
  which `specc.lower.row_padding.exact_calls` applies to every graph an engine loads;
- `max_draft_nodes`: the most draft nodes, root included, a lossless engine verifies a round:
  the exact rows, divided by the rows a method's verifying call holds per node (k pseudo
  rows riding beside each node: 1 + k);
- `is_lossless`: whether an engine of a method can promise its target's tokens (under a cap,
  only if a drafted token still fits: two nodes);
- `draft_budget` and `verifiable`: what the loop allows a drafter per round under a cap (a
  chain only, within `EXACT_ROWS` nodes and one key block: `specc.runtime.masks`), and the
  part of any other draft it verifies (the leading chain: `specc.runtime.exact_chain`).
"""

from __future__ import annotations

from enum import Enum

import torch

from specc.contract.drafter import Draft, DraftBudget
from specc.runtime.exact_chain import exact_chain
from specc.runtime.masks import rows_in_key_block

EXACT_ROWS = 4   # rows of every reduced-precision call of fewer rows: a decode step verifies 3 drafted tokens for free


class RowExactness(Enum):
    ANY_ROWS = "any rows"
    PADDED = "padded"
    PADDED_UNLESS_ALIKE = "padded unless the graph computes rows alike"


def exact_rows(exactness: RowExactness, dtype: torch.dtype) -> int | None:
    """The most query rows a call may have while every row computes what a one-row call
    computes; None when any count does. Lossless engines cap their drafts at this many nodes."""
    if exactness is RowExactness.ANY_ROWS or dtype != torch.bfloat16:
        return None
    return EXACT_ROWS


def padded_rows(exactness: RowExactness, dtype: torch.dtype, rows_alike: int | None) -> int | None:
    """How many rows every call of fewer rows runs padded to (None: as called), for a graph in
    `dtype` that computes up to `rows_alike` rows alike by itself (`graph.nodes.rows_computed_alike`)."""
    rows = exact_rows(exactness, dtype)
    if rows is not None and exactness is RowExactness.PADDED_UNLESS_ALIKE and pads_itself(dtype, rows_alike):
        return None
    return rows


def pads_itself(dtype: torch.dtype, rows_alike: int | None) -> bool:
    """Whether a graph in `dtype` that computes up to `rows_alike` rows alike by itself covers
    the cap on its own, so that a `PADDED_UNLESS_ALIKE` backend runs its calls as they come."""
    return dtype == torch.bfloat16 and rows_alike == EXACT_ROWS


def call_rows_per_node(method, config) -> int:
    """Rows a verifying call of `method` holds per draft node (1 but for pseudo rows)."""
    return method.call_rows_per_node(config) if method.call_rows_per_node is not None else 1


def max_draft_nodes(method, config, exact_rows: int | None) -> int | None:
    """The most draft nodes, root included, whose verifying call stays within `exact_rows`
    rows (None: no cap)."""
    return None if exact_rows is None else exact_rows // call_rows_per_node(method, config)


def is_lossless(method, config, exact_rows: int | None = None) -> bool:
    """Whether an engine of `method` (a `MethodDescriptor`, with its `config`) gives its target's tokens, on a backend that computes calls
    of up to `exact_rows` rows exactly as a decode step (None: calls of any size): under a cap,
    only if a round can still verify a drafted token exactly."""
    lossless = method.lossless_when(config) if method.lossless_when is not None else method.lossless
    nodes = max_draft_nodes(method, config, exact_rows)
    return lossless and (nodes is None or nodes >= 2)


def exact_call_rows(prefix_len: int, max_seq_len: int, max_rows: int | None) -> int | None:
    """The most rows a call after `prefix_len` cached tokens may hold and compute each row as a
    decode step does, under a cap of `max_rows` (None: no cap): within the cap, and ending in the
    key block its first row ends in."""
    return None if max_rows is None else min(max_rows, rows_in_key_block(prefix_len, max_seq_len))


def draft_budget(remaining: int, prefix_len: int, max_seq_len: int, max_rows: int | None) -> DraftBudget:
    """What a drafter may propose after `prefix_len` committed tokens with `remaining` tokens
    left to generate: under a cap (`max_rows`, from `exact_rows`), a chain of at most that
    many nodes, root included, whose rows end in the key block the root's row ends in."""
    room = max_seq_len - prefix_len
    if max_rows is not None:
        room = min(room, exact_call_rows(prefix_len, max_seq_len, max_rows))
    return DraftBudget(max_depth=remaining - 1, max_nodes=room, chain_only=max_rows is not None)


def verifiable(draft: Draft, budget: DraftBudget) -> Draft:
    """The part of `draft` the loop verifies: under a chain-only budget its leading chain."""
    return exact_chain(draft) if budget.chain_only else draft
