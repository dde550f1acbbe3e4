"""Spreads, speedups, pooled acceptance (per depth too), CTAR, the identity check and branch
shares, on hand-made data."""

from __future__ import annotations

import pytest

from specc.bench import statistics as st
from specc.bench.runner import Run
from specc.runtime.stats import GenerationStats


def _run(system, prompt, repeat, seconds, tokens, stats=None):
    return Run(system, prompt, repeat, seconds, tokens, stats)


def test_spread_is_median_min_max():
    s = st.spread([3.0, 1.0, 2.0, 10.0])
    assert (s.median, s.min, s.max, s.n) == (2.5, 1.0, 10.0, 4)
    assert st.spread([4.0]).to_json() == {"median": 4.0, "min": 4.0, "max": 4.0, "n": 1}
    with pytest.raises(ValueError):
        st.spread([])


def test_throughput_pools_prompts_within_a_repeat():
    runs = [_run("a", 0, 0, 1.0, [1] * 10), _run("a", 1, 0, 3.0, [1] * 10),   # 20 tokens / 4 s
            _run("a", 0, 1, 2.0, [1] * 10), _run("a", 1, 1, 2.0, [1] * 30),   # 40 tokens / 4 s
            _run("b", 0, 0, 1.0, [1] * 99)]
    assert st.throughput_by_repeat(runs, "a", {0, 1}) == [5.0, 10.0]
    assert st.throughput_by_repeat(runs, "a", {1}) == [10 / 3, 15.0]


def test_speedup_is_taken_per_repeat_then_summarised():
    s = st.speedup([20.0, 30.0, 40.0], [10.0, 10.0, 40.0])
    assert (s.median, s.min, s.max) == (2.0, 1.0, 3.0)
    with pytest.raises(ValueError):
        st.speedup([1.0], [1.0, 2.0])


def test_first_difference():
    assert st.first_difference([1, 2, 3], [1, 2, 3]) is None
    assert st.first_difference([1, 2, 3], [1, 9, 3]) == 1
    assert st.first_difference([1, 2], [1, 2, 3]) == 2


def test_identity_flags_a_deliberately_different_output():
    reference = {0: [5, 6, 7], 1: [8, 9], 2: [4]}
    runs = [_run("e", 0, 0, 1, [5, 6, 7]), _run("e", 1, 0, 1, [8, 9]), _run("e", 2, 0, 1, [4]),
            _run("e", 0, 1, 1, [5, 6, 7]), _run("e", 1, 1, 1, [8, 1]), _run("e", 2, 1, 1, [4]),
            _run("other", 0, 0, 1, [0])]
    result = st.identity(reference, runs, "e")
    assert result["identical"] == 2 and result["total"] == 3
    assert result["share"] == pytest.approx(2 / 3)
    assert result["mismatches"] == [{"prompt_index": 1, "first_difference": 1}]


def _stats(new, forwards, drafted, accepted, rounds, steps=None, **seconds):
    return GenerationStats(new_tokens=new, target_forward_passes=forwards, drafted_tokens=drafted,
                           accepted_tokens=accepted, accepted_per_round=rounds,
                           draft_steps_per_round=steps or [], **seconds)


def test_ctar_counts_rounds_accepting_at_least_w():
    rounds = [3, 2, 1, 2, 0]
    assert [st.ctar(rounds, w) for w in (1, 2, 3, 4)] == [0.8, 0.6, 0.2, 0.0]
    assert st.ctar([], 1) is None


def test_acceptance_pools_generations():
    a = _stats(10, 4, 8, 6, [3, 2, 1], steps=[3, 3, 2])
    b = _stats(5, 3, 4, 2, [2, 0], steps=[2, 1])   # a tree: 4 nodes over 3 depths
    acc = st.acceptance([a, b])
    assert acc["mean_accepted_length"] == pytest.approx(15 / 7)
    assert acc["acceptance_rate"] == pytest.approx(8 / 12)
    assert acc["step_acceptance_rate"] == pytest.approx(8 / 11) and acc["draft_steps"] == 11
    assert b.step_acceptance_rate == pytest.approx(2 / 3)
    assert acc["ctar"] == {"1": 0.8, "2": 0.6, "3": 0.2, "4": 0.0, "5": 0.0, "6": 0.0}
    assert acc["accepted_per_round_histogram"] == {"0": 1, "1": 1, "2": 2, "3": 1}
    # depth 2 is reached by the rounds (accepted, depth) (3, 3) (2, 3) (1, 2) (2, 2), not (0, 1)
    assert acc["alpha_per_depth"] == pytest.approx([4 / 5, 3 / 4, 1 / 2])
    # the runtime's own per-generation CTAR agrees on a single generation
    assert [st.acceptance([a])["ctar"][str(w)] for w in range(1, 7)] == [a.ctar(w) for w in range(1, 7)]


def test_acceptance_without_drafting():
    acc = st.acceptance([_stats(8, 8, 0, 0, [])])
    assert acc["mean_accepted_length"] == 1.0
    assert acc["acceptance_rate"] is None and acc["step_acceptance_rate"] is None
    assert acc["ctar"]["1"] is None and acc["accepted_per_round_histogram"] == {}
    assert acc["alpha_per_depth"] == []


def test_alpha_per_depth_of_chains_conditions_on_the_depths_above():
    # 4-token chains: accepted 4, 2, 0, 3 -> depth 1: 3/4; 2: 3/3; 3: 2/3; 4: 1/2
    assert st.per_depth_acceptance([4, 2, 0, 3], [4, 4, 4, 4]) == pytest.approx([3 / 4, 1.0, 2 / 3, 1 / 2])
    # a drafter that stopped early is not tried below its draft: the 1-token chain counts at depth 1 only
    assert st.per_depth_acceptance([1, 1, 2], [1, 3, 3]) == pytest.approx([1.0, 1 / 2, 0.0])
    assert st.per_depth_acceptance([0, 0], [3, 3]) == [0.0, None, None]   # nothing got past depth 1


def test_alpha_per_depth_of_trees_follows_the_accepted_path():
    # trees 3 deep, whatever their width: the accepted path's length decides how far a round got
    rates = st.per_depth_acceptance([3, 1, 2, 0], [3, 3, 2, 3])
    assert rates == pytest.approx([3 / 4, 2 / 3, 1.0])   # depth 3: only the (3, 3) round got there
    assert st.per_depth_acceptance([], []) == []
    with pytest.raises(ValueError, match="draft depths"):
        st.per_depth_acceptance([1, 2], [2])


def test_time_split_and_decode_throughput():
    s = _stats(11, 4, 6, 6, [2, 2, 2], draft_seconds=1.0, verify_seconds=2.0, prefill_seconds=0.5,
               wall_seconds=4.0)
    split = st.time_split([s])
    assert split["share"] == {"draft": 0.25, "verify": 0.5, "prefill": 0.125, "other": 0.125}
    assert st.decode_throughput([s]) == pytest.approx(10 / 3.5)


def test_decode_throughput_is_per_repeat():
    def stats(wall):
        return _stats(5, 5, 0, 0, [], prefill_seconds=1.0, wall_seconds=wall)

    runs = [_run("e", 0, 0, 9, [1] * 5, stats(3.0)), _run("e", 1, 0, 9, [1] * 5, stats(3.0)),   # 8 tokens / 4 s
            _run("e", 0, 1, 9, [1] * 5, stats(2.0)), _run("e", 1, 1, 9, [1] * 5, stats(2.0))]   # 8 tokens / 2 s
    assert st.decode_throughput_by_repeat(runs, "e", {0, 1}) == [2.0, 4.0]
    assert st.decode_throughput_by_repeat([_run("hf", 0, 0, 1, [1])], "hf", {0}) is None


def _composed_report(eagle: tuple[int, int], lookup: tuple[int, int], accepted: int) -> dict:
    """A `ComposedDrafter.method_report()`: (accepted, proposed) per branch."""
    def counts(pair, **own):
        return {"accepted_tokens": pair[0], "proposed_tokens": pair[1], "rounds_chosen": 2, "rounds_drafted": 3,
                **own}
    return {"branches": {"eagle": counts(eagle), "lookup": counts(lookup, method={"hits": [1, 2]})},
            "accepted_tokens": accepted}


def test_branch_shares_sum_each_branch_over_runs():
    reports = [_composed_report((8, 20), (3, 6), 10), _composed_report((4, 10), (3, 4), 6), {"exits": 3}]
    shares = st.branch_shares(reports)
    assert shares["accepted_tokens"] == 16 and shares["runs"] == 2
    eagle, lookup = shares["branches"]["eagle"], shares["branches"]["lookup"]
    assert eagle["accepted_tokens"] == 12 and eagle["proposed_tokens"] == 30 and eagle["rounds_drafted"] == 6
    assert eagle["share_of_accepted"] == pytest.approx(12 / 16) and eagle["acceptance_rate"] == pytest.approx(0.4)
    # a node both drafted counts for both: the shares add up to more than 1
    assert lookup["share_of_accepted"] == pytest.approx(6 / 16) and lookup["acceptance_rate"] == pytest.approx(0.6)
    assert "method" not in lookup    # a branch's own report stays with its run


def test_branch_shares_without_branches_or_tokens():
    assert st.branch_shares([]) is None and st.branch_shares([{"layers_executed": [3, 4]}]) is None
    idle = st.branch_shares([_composed_report((0, 0), (0, 0), 0)])["branches"]["eagle"]
    assert idle["share_of_accepted"] is None and idle["acceptance_rate"] is None
