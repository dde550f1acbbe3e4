"""A composed drafter merges its branches' drafts as a trie, picks one chain where only
chains are verified, credits each branch with its accepted tokens, and stays lossless."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from specc.capture.load import load_model
from specc.compiler import build_program
from specc.contract.descriptor import get_method
from specc.contract.drafter import Capabilities, Draft, DraftBudget
from specc.contract.sampling import SamplingConfig
from specc.contract.side_channel import SideChannel, carried
from specc.contract.tree import tree_from_parents
from specc.contract.verification import Acceptance, Verification
from specc.errors import SpeccError, UsageError
from specc.runtime.acceptance import accept_greedy
from specc.runtime.compose import ComposedDrafter, DepthAcceptance, expected_accepted_length
from specc.runtime.context import MethodContext
from specc.runtime.generate import generate
from specc.runtime.ngram import NgramDrafter
from specc.testing.checkpoints import TINY_VOCAB, varied_prompts

ROOT = 4
BUDGET = DraftBudget(max_depth=8, max_nodes=32)
CHAINS = DraftBudget(max_depth=8, max_nodes=32, chain_only=True)
GREEDY = SamplingConfig()
VOCAB = 16


@dataclass(frozen=True)
class States(SideChannel):
    values: torch.Tensor


class FixedDrafter:
    """Drafts the same tree after any tokens; records what it is shown."""

    capabilities = Capabilities(composable=True)

    def __init__(self, parents=None, tokens=(), scores=None, carries=None, draft_probs=None):
        self.parents, self.tokens, self.scores = parents, list(tokens), scores
        self.carries, self.draft_probs = carries, draft_probs
        self.seen: list[tuple] = []

    def begin(self, prompt, prefill) -> None:
        self.seen.clear()

    def propose(self, tokens, budget, sampling, generator) -> Draft | None:
        if self.parents is None:
            return None
        scores = None if self.scores is None else torch.tensor([1.0, *self.scores])
        return Draft(tree=tree_from_parents(tuple(self.parents)), node_tokens=torch.tensor([tokens[-1], *self.tokens]),
                     draft_probs=self.draft_probs, carries=self.carries, node_scores=scores)

    def observe(self, draft, acceptance, verification) -> None:
        self.seen.append((draft, acceptance, verification))


def chain(*tokens, scores=None) -> FixedDrafter:
    return FixedDrafter((-1, *range(len(tokens))), tokens, scores)


def propose(drafter, budget=BUDGET) -> Draft | None:
    return drafter.propose([1, 2, ROOT], budget, GREEDY, None)


def one_hot_logits(best: list[int]) -> torch.Tensor:
    logits = torch.zeros(len(best), VOCAB)
    logits[torch.arange(len(best)), torch.tensor(best)] = 5.0
    return logits


# --- merging -----------------------------------------------------------------------------------


def test_drafts_merge_as_a_trie_sharing_the_paths_both_drafted():
    primary = chain(5, 6, 7)
    # other: 5 -> 6 -> 9 (shares 5 and 6), and 8 under the root
    other = FixedDrafter((-1, 0, 1, 2, 0), (5, 6, 9, 8))
    draft = propose(ComposedDrafter({"primary": primary, "other": other}))
    assert draft.node_tokens.tolist() == [ROOT, 5, 6, 7, 8, 9]
    assert draft.tree.parent == (-1, 0, 1, 2, 0, 2), "the primary's nodes first, then the others' by depth"
    assert draft.tree.chain_nodes == (1, 2, 3), "the first-ranked path is still the primary's chain"
    assert draft.node_scores is None and draft.carries is None


def test_new_nodes_of_later_branches_follow_by_depth_then_branch_order():
    primary = chain(5)
    second = FixedDrafter((-1, 0, 1), (6, 7))      # 6 -> 7
    third = FixedDrafter((-1, 0, 0), (8, 6))       # 8, and 6 again (shared with the second's)
    draft = propose(ComposedDrafter({"a": primary, "b": second, "c": third}))
    assert draft.node_tokens.tolist() == [ROOT, 5, 6, 8, 7]
    assert draft.tree.parent == (-1, 0, 0, 0, 2)


def test_the_merged_tree_is_cut_to_the_budget_keeping_the_primary_first():
    primary = chain(5, 6, 7)
    other = FixedDrafter((-1, 0, 0, 2), (5, 8, 9))   # 5 (shared), 8 -> 9
    composed = ComposedDrafter({"primary": primary, "other": other})
    draft = propose(composed, DraftBudget(max_depth=8, max_nodes=5))
    assert draft.node_tokens.tolist() == [ROOT, 5, 6, 7, 8] and draft.tree.parent == (-1, 0, 1, 2, 0)
    draft = propose(composed, DraftBudget(max_depth=8, max_nodes=3))
    assert draft.node_tokens.tolist() == [ROOT, 5, 6] and draft.tree.parent == (-1, 0, 1)


def test_branches_that_draft_nothing_contribute_nothing():
    lone = chain(5, 6)
    composed = ComposedDrafter({"silent": FixedDrafter(), "lone": lone})
    assert propose(composed).node_tokens.tolist() == [ROOT, 5, 6]
    assert propose(ComposedDrafter({"a": FixedDrafter(), "b": FixedDrafter()})) is None


def test_a_sampled_chain_is_verified_alone():
    sampled = chain(5, 6)
    sampled.draft_probs = torch.full((2, VOCAB), 1.0 / VOCAB)
    draft = propose(ComposedDrafter({"tree": FixedDrafter((-1, 0, 0), (7, 8)), "sampled": sampled}))
    assert draft.sampled_chain and draft.node_tokens.tolist() == [ROOT, 5, 6]


# --- chain_only: one branch's chain -------------------------------------------------------------


def test_under_chain_only_the_chain_with_the_longer_expected_acceptance_is_verified():
    short = chain(5, 6, scores=[0.5, 0.5])                                # 0.5 + 0.25
    likely = FixedDrafter((-1, 0, 1, 1, 2), (7, 8, 9, 10), [0.9, 0.9, 0.2, 0.9])   # chain 7, 8, 10
    draft = propose(ComposedDrafter({"short": short, "likely": likely}), CHAINS)
    assert draft.node_tokens.tolist() == [ROOT, 7, 8, 10] and draft.tree.parent == (-1, 0, 1, 2)
    assert draft.node_scores.tolist() == pytest.approx([1.0, 0.9, 0.9, 0.9])
    assert expected_accepted_length([0.9, 0.9, 0.9]) == pytest.approx(0.9 + 0.81 + 0.729)


def test_a_tie_goes_to_the_primary():
    draft = propose(ComposedDrafter({"a": chain(5, scores=[0.5]), "b": chain(6, scores=[0.5])}), CHAINS)
    assert draft.node_tokens.tolist() == [ROOT, 5]


def test_depth_acceptance_counts_a_depth_only_below_matched_ones_and_where_the_target_emitted():
    measured = DepthAcceptance()
    assert measured.rate(1) == measured.rate(5) == 0.5
    measured.record([1, 2, 3], [1, 2])        # depth 3: the target emitted nothing there
    measured.record([1, 9, 3], [1, 2, 3])     # depth 3: below a rejected depth, not tried
    measured.record([7], [1, 2, 3, 4])
    assert measured.tried == [3, 2] and measured.accepted == [2, 1]
    assert measured.rate(1) == pytest.approx(2.5 / 4) and measured.rate(2) == pytest.approx(1.5 / 3)


def test_without_scores_the_chain_is_chosen_by_the_acceptance_measured_so_far():
    composed = ComposedDrafter({"a": chain(5, 6), "b": chain(7, 8)})
    draft = propose(composed, CHAINS)
    assert draft.node_tokens.tolist() == [ROOT, 5, 6], "no measurements yet: a tie, the primary"
    composed.observe(draft, Acceptance([0], 7), Verification(None))      # the target emitted 7: b's token
    assert propose(composed, CHAINS).node_tokens.tolist() == [ROOT, 7, 8]
    assert composed.measured["a"].tried == [1] and composed.measured["b"].tried == [1]


# --- the branch contract --------------------------------------------------------------------------


def test_a_branch_that_does_not_declare_itself_composable_is_refused():
    class Private(FixedDrafter):
        capabilities = Capabilities()

    with pytest.raises(UsageError, match="'model'.*Private.*composable"):
        ComposedDrafter({"lookup": chain(5), "model": Private()})
    with pytest.raises(UsageError, match="at least one"):
        ComposedDrafter({})


def test_a_draft_with_a_side_channel_is_refused_from_any_branch_but_the_primary():
    states = FixedDrafter((-1, 0), (5,), carries=States(torch.zeros(2)))
    with pytest.raises(SpeccError, match="'states'.*Draft.carries: States.*primary"):
        propose(ComposedDrafter({"lookup": chain(6), "states": states}))


def test_the_primarys_side_channel_stays_with_its_nodes_in_the_merged_tree():
    """The primary's nodes keep their indices in the merge, so tensors indexed by them still
    name the same nodes; a chain of another branch's, verified alone, carries none."""
    states = torch.arange(3.0)
    primary = FixedDrafter((-1, 0), (5,), carries=States(states))
    merged = propose(ComposedDrafter({"model": primary, "lookup": chain(6, 7)}))
    assert merged.node_tokens.tolist() == [ROOT, 5, 6, 7]
    assert torch.equal(carried(merged, States).values, states)
    lookup_chain = propose(ComposedDrafter({"model": primary, "lookup": chain(6, 7, scores=[1.0, 1.0])}), CHAINS)
    assert lookup_chain.node_tokens.tolist() == [ROOT, 6, 7] and lookup_chain.carries is None


def test_the_ngram_drafter_is_composable_and_scores_nothing():
    drafter = NgramDrafter(3, 1, 4, 1)
    assert drafter.capabilities.composable
    draft = drafter.propose([1, 2, 3, 9, 1, 2], BUDGET, GREEDY, None)
    assert draft.node_tokens.tolist() == [2, 3, 9, 1, 2] and draft.node_scores is None
    with pytest.raises(UsageError, match="min_ngram"):
        NgramDrafter(1, 2, 4, 1)


# --- observing and attribution ----------------------------------------------------------------


def test_every_branch_observes_the_verified_round_and_is_credited_for_its_nodes():
    primary = chain(5, 6, 7)
    other = FixedDrafter((-1, 0, 1, 2, 0), (5, 6, 9, 8))
    composed = ComposedDrafter({"primary": primary, "other": other})
    draft = propose(composed)                         # [ROOT, 5, 6, 7, 8, 9]: 9 under 6
    # the target says 5, then 6, then 9 (the other's), then 3
    acceptance = accept_greedy(draft.node_tokens, one_hot_logits([5, 6, 9, 0, 0, 3]), draft.tree)
    assert acceptance.path == [0, 1, 2, 5] and acceptance.next_token == 3
    verification = Verification(None)
    composed.observe(draft, acceptance, verification)
    assert primary.seen == other.seen == [(draft, acceptance, verification)]
    report = composed.method_report()
    assert report == {"accepted_tokens": 3, "branches": {
        "primary": {"accepted_tokens": 2, "proposed_tokens": 3, "rounds_chosen": 1, "rounds_drafted": 1,
                                   "rounds_skipped": 0},
        "other": {"accepted_tokens": 3, "proposed_tokens": 4, "rounds_chosen": 1, "rounds_drafted": 1,
                                   "rounds_skipped": 0}}}
    assert composed.method_report()["branches"]["primary"]["rounds_drafted"] == 0, "a report starts the counts again"


def test_a_plain_step_after_an_empty_round_credits_nobody():
    silent = FixedDrafter()
    composed = ComposedDrafter({"silent": silent, "also": FixedDrafter()})
    assert propose(composed) is None
    composed.observe(None, None, Verification(None))
    assert silent.seen == [(None, None, Verification(None))]
    assert composed.method_report()["accepted_tokens"] == 0


def test_a_branch_report_is_included_under_its_name():
    class Reporting(FixedDrafter):
        capabilities = Capabilities(composable=True, reports=True)

        def method_report(self):
            return {"layers": [1, 2]}

    composed = ComposedDrafter({"lookup": chain(5), "model": Reporting((-1, 0), (6,))})
    report = composed.method_report()
    assert report["branches"]["model"]["method"] == {"layers": [1, 2]}
    assert "method" not in report["branches"]["lookup"]


def test_under_chain_only_only_the_chosen_branch_counts_as_chosen():
    # a's chain promises less than b's prior, so b is asked too (and then loses to a)
    composed = ComposedDrafter({"a": chain(5, 6, scores=[0.4, 0.4]), "b": chain(5, 7, scores=[0.1, 0.1])})
    draft = propose(composed, CHAINS)
    composed.observe(draft, Acceptance([0, 1, 2], 3, [5, 6]), Verification(None))
    branches = composed.method_report()["branches"]
    assert branches["a"] == {"accepted_tokens": 2, "proposed_tokens": 2, "rounds_chosen": 1, "rounds_drafted": 1,
                                   "rounds_skipped": 0}
    assert branches["b"] == {"accepted_tokens": 1, "proposed_tokens": 1, "rounds_chosen": 0, "rounds_drafted": 1,
                             "rounds_skipped": 0}


# --- end to end: lossless -----------------------------------------------------------------------

MAX_SEQ_LEN = 96
NEW_TOKENS = 24


@pytest.fixture(scope="module")
def target(checkpoints):
    program = build_program({"target": load_model(checkpoints("llama")[0])}, get_method("none"),
                            get_method("none").config_class(), MAX_SEQ_LEN)
    return MethodContext.eager(program, MAX_SEQ_LEN).model("target")


def recording_sizes(composed: ComposedDrafter) -> list[tuple[int, list[int]]]:
    """Per round: the composed draft's nodes, and each drafting branch's."""
    rounds, branch_sizes = [], []
    for drafter in composed.branches.values():
        def branch_propose(*args, propose=drafter.propose):
            draft = propose(*args)
            if draft is not None:
                branch_sizes.append(draft.node_tokens.numel())
            return draft
        drafter.propose = branch_propose

    def composed_propose(*args, propose=composed.propose):
        draft = propose(*args)
        if draft is not None:
            rounds.append((draft.node_tokens.numel(), list(branch_sizes)))
        branch_sizes.clear()
        return draft

    composed.propose = composed_propose
    return rounds


class ScriptedDrafter:
    """Drafts the next tokens of a known continuation (the target's greedy decoding), with
    one wrong token in some rounds, so rounds accept varied lengths."""

    capabilities = Capabilities(composable=True)

    def __init__(self):
        self.script: list[int] = []

    def begin(self, prompt, prefill) -> None:
        """The script is set per prompt by the test."""

    def observe(self, draft, acceptance, verification) -> None:
        """Nothing to learn."""

    def propose(self, tokens, budget, sampling, generator) -> Draft | None:
        upcoming = self.script[len(tokens):len(tokens) + min(3, budget.max_depth, budget.max_nodes - 1)]
        if len(tokens) % 3 == 0 and len(upcoming) > 1:
            upcoming[1] = (upcoming[1] + 1) % TINY_VOCAB
        if not upcoming:
            return None
        return Draft(tree=tree_from_parents((-1, *range(len(upcoming)))), node_tokens=torch.tensor([tokens[-1], *upcoming]))


@pytest.mark.parametrize("max_rows", [None, 8])   # 8: chain_only, one branch's chain per round
def test_composed_drafters_decode_exactly_what_greedy_decoding_does(target, one_thread, max_rows):
    scripted = ScriptedDrafter()
    composed = ComposedDrafter({"scripted": scripted, "lookup": NgramDrafter(2, 1, 4, 2)})
    rounds = recording_sizes(composed)
    accepted = 0
    for prompt in varied_prompts(8, MAX_SEQ_LEN, seed=11):
        plain = generate(target, None, prompt, NEW_TOKENS, GREEDY, MAX_SEQ_LEN, max_rows=max_rows)
        scripted.script = prompt + plain.token_ids
        speculative = generate(target, composed, prompt, NEW_TOKENS, GREEDY, MAX_SEQ_LEN, max_rows=max_rows)
        assert speculative.token_ids == plain.token_ids, f"prompt {prompt}"
        accepted += speculative.stats.accepted_tokens
    report = composed.method_report()
    assert report["accepted_tokens"] == accepted and report["branches"]["scripted"]["accepted_tokens"] > 0
    assert report["branches"]["lookup"]["rounds_drafted"] > 0
    grown = [size > max(sizes) for size, sizes in rounds]
    assert any(grown) == (max_rows is None), "trees merge new nodes unless only chains are verified"


# --- sparing a costly branch under chain_only ------------------------------------------------


class Counting(FixedDrafter):
    """A fixed chain that counts how often it is asked."""

    def __init__(self, *tokens, scores=None, cost=1.0):
        super().__init__((-1, *range(len(tokens))), tokens, scores)
        self.capabilities, self.asked = Capabilities(composable=True, draft_cost=cost), 0

    def propose(self, tokens, budget, sampling, generator):
        self.asked += 1
        return super().propose(tokens, budget, sampling, generator)


def test_under_chain_only_a_costly_branch_is_skipped_when_a_cheap_chain_promises_more():
    costly = Counting(7, 8, 9)
    cheap = Counting(5, 6, 7, scores=[0.95, 0.95, 0.95], cost=0.0)
    composed = ComposedDrafter({"model": costly, "lookup": cheap})
    draft = propose(composed, CHAINS)
    assert cheap.asked == 1 and costly.asked == 0, "the model branch's prior (0.5 per depth) promises less"
    assert draft.node_tokens.tolist() == [ROOT, 5, 6, 7]
    assert composed.method_report()["branches"]["model"]["rounds_skipped"] == 1


def test_under_chain_only_a_costly_branch_is_asked_when_the_cheap_chain_promises_less():
    costly = Counting(7, 8, 9)
    cheap = Counting(5, scores=[0.1], cost=0.0)
    composed = ComposedDrafter({"model": costly, "lookup": cheap})
    propose(composed, CHAINS)
    assert costly.asked == 1


def test_merged_trees_ask_every_branch_in_their_own_order():
    costly, cheap = Counting(7, 8), Counting(5, 6, scores=[0.99, 0.99], cost=0.0)
    draft = propose(ComposedDrafter({"model": costly, "lookup": cheap}))
    assert costly.asked == cheap.asked == 1
    assert draft.node_tokens.tolist()[:3] == [ROOT, 7, 8], "the primary's nodes stay first"
