"""What a model-backed drafter keeps in step with the committed tokens: `DraftFollower`.

A drafter that runs a model of its own (a smaller model, an adapter, a draft head)
keeps that model's KV cache valid for a prefix of the committed tokens, and may
read a feature per committed position that the target computed (a hidden state
returned beside the logits). Per round:

- catch-up: the drafter runs the positions its model has not seen, from `valid`
  up to the root, in one call, then says `caught_up`;
- `fed(token)`: a drafted chain token the drafter ran through its model, at the
  position after the root and the chain tokens fed before it;
- `observe`: the features of the rows the target kept are stored, and `valid`
  moves to the tokens the drafting model saw that the target committed: the
  catch-up's, then the fed chain tokens while they match the accepted ones.

The accepted tokens are read from the draft the follower is shown (a merged tree,
or another branch's chain, when drafters are composed: `specc.runtime.compose`),
never from indices into the drafter's own proposal, and a round the drafter was
not asked in moves nothing. `begin` keeps what a reused prefix left valid
(`specc.runtime.prefix_reuse`).
"""

from __future__ import annotations

import torch

from specc.contract.drafter import Draft
from specc.contract.verification import Acceptance, Verification


class DraftFollower:
    """`feature`: the name of the verification output to keep per committed position
    (`feature_size` wide, in `dtype`), or None to keep none."""

    def __init__(self, max_seq_len: int, device: torch.device | str, feature: str | None = None,
                 feature_size: int = 0, dtype: torch.dtype = torch.float32):
        self.feature = feature
        # Row p + 1 holds the feature of position p; row 0, before the first token, stays zeros.
        self.features = (torch.zeros(max_seq_len + 2, feature_size, dtype=dtype, device=device)
                         if feature is not None else None)
        self.valid = 0                   # positions whose drafting model's KV holds the committed token
        self._round_base: int | None = None   # the first position fed past the root this round
        self._fed: list[int] = []        # chain tokens fed at _round_base, _round_base + 1, ...

    def reset(self) -> None:
        """Nothing seen, nothing kept (after a throw-away warm-up round)."""
        self.valid = 0
        self._round_base, self._fed = None, []
        if self.features is not None:
            self.features.zero_()

    def begin(self, prompt: torch.Tensor, prefill: Verification) -> None:
        """A new sequence whose first `prefill.slots[0]` tokens are a reused prefix (0: none)."""
        start = int(prefill.slots[0])
        self.valid = min(self.valid, start)
        self._round_base, self._fed = None, []
        if self.features is not None:
            self.features[start + 1: prompt.numel() + 1] = prefill.outputs[self.feature]

    def caught_up(self, root: int) -> None:
        """The drafting model has now seen every position up to the root."""
        self.valid = root + 1
        self._round_base, self._fed = root + 1, []

    def fed(self, token: int) -> None:
        """A drafted chain token ran through the drafting model at the next position past the root."""
        self._fed.append(token)

    def feature_of(self, positions: torch.Tensor | int) -> torch.Tensor:
        """The target's feature of each position."""
        return self.features[positions + 1]

    def feature_before(self, positions: torch.Tensor | int) -> torch.Tensor:
        """The target's feature of each position's predecessor (zeros before the first)."""
        return self.features[positions]

    def set_feature(self, position: int, value: torch.Tensor) -> None:
        self.features[position + 1] = value

    def observe(self, draft: Draft | None, acceptance: Acceptance | None, verification: Verification) -> None:
        if self.features is not None:
            self._keep_features(draft, acceptance, verification)
        base, fed = self._round_base, self._fed
        self._round_base, self._fed = None, []
        if base is None:
            return
        if draft is None or acceptance is None:
            self.valid = min(self.valid, base)
            return
        accepted = accepted_tokens(draft, acceptance)
        matched = 0
        for token, kept in zip(fed, accepted):
            if token != kept:
                break
            matched += 1
        self.valid = base + matched

    def _keep_features(self, draft, acceptance, verification: Verification) -> None:
        rows = verification.outputs[self.feature]
        if draft is None:
            self.features[verification.slots + 1] = rows
            return
        base = int(verification.slots[0])
        path = torch.tensor(acceptance.path, device=rows.device)
        self.features[base + 1: base + 1 + len(acceptance.path)] = rows.index_select(0, path)


def accepted_tokens(draft: Draft, acceptance: Acceptance) -> list[int]:
    """The tokens of the accepted nodes below the root, in order."""
    if acceptance.accepted_tokens is not None:
        return list(acceptance.accepted_tokens)
    return draft.node_tokens[acceptance.path[1:]].tolist()


# Catch-ups of more rows than a decode-sized call are padded to a multiple of this many rows.
# Such calls run kernels (oneDNN's, on the CPU) that are set up once per row count and process,
# at several times the cost of a call, and a catch-up's row count is how many tokens lookup
# copied since the head last ran. Measurements: benchmarks/NOTES.md, the draft head with lookup on
# SmolLM2 (issue 34).
CATCH_UP_ROW_MULTIPLE = 8
DECODE_SIZED_ROWS = 4


def catch_up_rows(count: int) -> int:
    """Rows of a catch-up over `count` positions: `count` up to `DECODE_SIZED_ROWS`, else the
    next multiple of `CATCH_UP_ROW_MULTIPLE` (the last position's row repeated: it writes the
    same K/V again, and its outputs are that position's)."""
    if count <= DECODE_SIZED_ROWS:
        return count
    return -(-count // CATCH_UP_ROW_MULTIPLE) * CATCH_UP_ROW_MULTIPLE
