"""`DraftFollower`: what a model-backed drafter's own KV holds moves with the tokens the
target commits, read from the draft the follower is shown."""

from __future__ import annotations

import torch

from specc.contract.drafter import Draft
from specc.contract.tree import tree_from_parents
from specc.contract.verification import Acceptance, Verification
from specc.runtime.draft_follower import DraftFollower, catch_up_rows

FEATURE = "feature"


def draft(tokens, parents) -> Draft:
    return Draft(tree=tree_from_parents(tuple(parents)), node_tokens=torch.tensor(tokens))


def verification(base: int, rows: int) -> Verification:
    features = torch.arange(rows, dtype=torch.float32)[:, None].expand(rows, 2) + 100 * base
    return Verification(None, {FEATURE: features.clone()}, torch.arange(base, base + rows))


def follower_after_round(fed: list[int]) -> DraftFollower:
    """Caught up to the root at position 9, with `fed` chain tokens run at 10, 11, ..."""
    follower = DraftFollower(32, "cpu")
    follower.caught_up(9)
    for token in fed:
        follower.fed(token)
    return follower


def test_fed_chain_tokens_stay_valid_while_they_match_the_accepted_ones():
    follower = follower_after_round([5, 6, 7])
    shown = draft([4, 5, 6, 8], [-1, 0, 1, 2])
    follower.observe(shown, Acceptance([0, 1, 2, 3], next_token=3), verification(9, 4))
    assert follower.valid == 12    # the root, 5 and 6; 8 was never run through the draft model


def test_the_draft_shown_decides_not_the_drafters_own_proposal():
    """A composed round verified another branch's tree: its accepted node indices mean other
    tokens, and the follower matches tokens."""
    follower = follower_after_round([5, 6])
    shown = draft([4, 9, 5, 6], [-1, 0, 0, 2])     # another branch's 9 first, then this drafter's chain
    follower.observe(shown, Acceptance([0, 2, 3], next_token=1), verification(9, 4))
    assert follower.valid == 12
    follower = follower_after_round([5, 6])
    follower.observe(shown, Acceptance([0, 1], next_token=1), verification(9, 4))
    assert follower.valid == 10


def test_a_round_the_drafter_was_not_asked_in_moves_nothing():
    follower = follower_after_round([5])
    follower.observe(draft([4, 5], [-1, 0]), Acceptance([0, 1], next_token=2), verification(9, 2))
    assert follower.valid == 11
    follower.observe(draft([2, 3, 4], [-1, 0, 1]), Acceptance([0, 1, 2], next_token=2), verification(11, 3))
    assert follower.valid == 11


def test_features_of_the_accepted_path_are_kept_by_position():
    follower = DraftFollower(32, "cpu", FEATURE, 2)
    prompt = torch.arange(4)
    follower.begin(prompt, verification(0, 4))
    assert follower.feature_of(torch.tensor([0, 3]))[:, 0].tolist() == [0.0, 3.0]
    assert follower.feature_before(torch.tensor([0, 1]))[:, 0].tolist() == [0.0, 0.0]
    follower.caught_up(3)
    follower.observe(draft([7, 8, 9], [-1, 0, 0]), Acceptance([0, 2], next_token=1), verification(3, 3))
    assert follower.feature_of(torch.tensor([3, 4]))[:, 0].tolist() == [300.0, 302.0]
    follower.observe(None, None, verification(5, 1))
    assert follower.feature_of(5)[0].item() == 500.0


def test_begin_keeps_only_what_a_reused_prefix_left_valid():
    follower = follower_after_round([])
    follower.observe(draft([4], [-1]), Acceptance([0], next_token=1), verification(9, 1))
    assert follower.valid == 10
    follower.begin(torch.arange(12), Verification(None, {}, torch.arange(6, 12)))
    assert follower.valid == 6
    follower.begin(torch.arange(12), Verification(None, {}, torch.arange(0, 12)))
    assert follower.valid == 0


def test_catch_ups_beyond_a_decode_step_are_padded_to_a_row_multiple():
    assert [catch_up_rows(n) for n in (1, 4, 5, 13, 16)] == [1, 4, 8, 16, 16]
