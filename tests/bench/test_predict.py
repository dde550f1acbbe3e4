"""SWIFT eq. 6 and S3D eq. 11-12 against hand-computed values."""

from __future__ import annotations

import pytest

from specc.bench.predict import draft_depth, predict, swift_expected_speedup
from specc.bench.statistics import per_depth_acceptance
from specc.runtime.speedup_model import improvement_factor, tokens_per_round
from specc.runtime.stats import GenerationStats


def test_swift_eq6_hand_values():
    # 3 * 0.8 / (2 * 0.5 + 0.8) = 2.4 / 1.8
    assert swift_expected_speedup(3.0, 0.8, 0.5) == pytest.approx(4 / 3)
    assert swift_expected_speedup(5.0, 1.0, 0.0) == pytest.approx(5.0)     # free drafts: E = M
    assert swift_expected_speedup(1.0, 0.5, 0.3) == pytest.approx(1.0)     # nothing gained, nothing lost
    # verification twice as dear as a plain forward: 2.4 / (1.0 + 1.6)
    assert swift_expected_speedup(3.0, 0.8, 0.5, verify_cost=2.0) == pytest.approx(2.4 / 2.6)
    with pytest.raises(ValueError):
        swift_expected_speedup(2.0, 0.0, 0.5)


def test_s3d_tau_hand_values():
    assert tokens_per_round([0.6]) == pytest.approx(1.6)                 # 1 * 0.4 + 2 * 0.6
    assert tokens_per_round([0.8, 0.5]) == pytest.approx(2.2)            # 0.2 + 2 * 0.8 * 0.5 + 3 * 0.4
    assert tokens_per_round([1.0, 1.0, 1.0]) == pytest.approx(4.0)
    assert tokens_per_round([]) == pytest.approx(1.0)
    assert improvement_factor(2.2, 0.1, 0.5) == pytest.approx(2.2 / 1.6)


def test_tau_from_measured_rounds_is_one_plus_mean_accepted():
    # every round counted γ = 3 deep, as the S3D prediction counts them: α_k = CTAR(k) / CTAR(k - 1)
    rounds = [3, 2, 1, 2, 0]
    alphas = per_depth_acceptance(rounds, [3] * len(rounds))
    assert alphas == pytest.approx([0.8, 0.75, 1 / 3])
    assert tokens_per_round(alphas) == pytest.approx(1 + sum(rounds) / len(rounds))
    assert per_depth_acceptance([0, 0], [3, 3]) == [0.0, None, None]   # nothing got past depth 1


def test_s3d_counts_an_early_stop_as_a_rejection():
    # rounds drafted 3, 1 and 3 deep: the report's α_2 leaves the 1-deep round out, S3D's counts it
    baseline = [GenerationStats(new_tokens=11, target_forward_passes=11, verify_seconds=1.0)]
    engine = [GenerationStats(new_tokens=8, target_forward_passes=4, drafted_tokens=7, accepted_tokens=4,
                              accepted_per_round=[3, 1, 0], draft_steps_per_round=[3, 1, 3], draft_seconds=0.3,
                              wall_seconds=1.0)]
    assert per_depth_acceptance([3, 1, 0], [3, 1, 3]) == pytest.approx([2 / 3, 1.0, 1.0])
    s3d = predict(engine, baseline, 3)["s3d_eq12"]
    assert s3d["per_depth_acceptance"] == pytest.approx([2 / 3, 0.5, 1.0])
    assert s3d["tau"] == pytest.approx(1 + 4 / 3)


def test_draft_depth_is_what_the_method_declares_for_its_config():
    from specc.contract.descriptor import get_method

    def manifest(method: str, **fields) -> dict:
        config = get_method(method).config_class(**fields)
        return {"method": method, "method_config": config.to_json()}

    assert draft_depth(manifest("draft-model", draft_model="d", num_draft_tokens=4)) == 4
    assert draft_depth(manifest("kangaroo", max_draft_steps=5)) == 5
    assert draft_depth(manifest("firp", steps=3)) == 3   # FIRP's k
    assert draft_depth(manifest("none")) is None


def test_predict_combines_measured_costs():
    # baseline: 10 decode steps in 1.0 s -> a target forward costs 0.1 s
    baseline = [GenerationStats(new_tokens=11, target_forward_passes=11, verify_seconds=1.0)]
    # engine: 8 drafted tokens in 0.4 s -> c = 0.05 / 0.1 = 0.5; M = 12 / 4 = 3; α = 6 / 8
    engine = [GenerationStats(new_tokens=12, target_forward_passes=4, drafted_tokens=8, accepted_tokens=6,
                              accepted_per_round=[2, 2, 2], draft_steps_per_round=[3, 3, 2], draft_seconds=0.4, verify_seconds=0.3,
                              prefill_seconds=0.1, wall_seconds=0.83)]
    p = predict(engine, baseline, 3)
    assert p["target_forward_seconds"] == pytest.approx(0.1)
    assert p["swift_eq6"]["c"] == pytest.approx(0.5)
    assert p["swift_eq6"]["expected_speedup"] == pytest.approx(3 * 0.75 / (2 * 0.5 + 0.75))
    # 3 verification rounds (4 forwards, one is the prefill) in 0.3 s: v = 0.1 / 0.1 = 1
    assert p["swift_eq6"]["v"] == pytest.approx(1.0)
    assert p["swift_eq6"]["with_measured_verify"] == pytest.approx(p["swift_eq6"]["expected_speedup"])
    s3d = p["s3d_eq12"]
    assert s3d["gamma"] == 3 and s3d["tau"] == pytest.approx(3.0)
    assert s3d["beta"] == pytest.approx(0.4 / 3 / 0.1)
    assert s3d["delta"] == pytest.approx(0.03 / 3 / 0.1)
    assert s3d["improvement_factor"] == pytest.approx(3.0 / (0.1 + 4 / 3 + 1))


def test_eq6_counts_tree_depth_not_tree_nodes():
    # a tree round drafts 3 depths with 4 siblings each: 12 nodes but 3 sequential draft steps
    baseline = [GenerationStats(new_tokens=11, target_forward_passes=11, verify_seconds=1.0)]
    engine = [GenerationStats(new_tokens=10, target_forward_passes=4, drafted_tokens=36, accepted_tokens=6,
                              accepted_per_round=[2, 2, 2], draft_steps_per_round=[3, 3, 3], draft_seconds=0.45,
                              wall_seconds=1.0)]
    eq6 = predict(engine, baseline, None)["swift_eq6"]
    assert eq6["alpha"] == pytest.approx(6 / 9) and eq6["c"] == pytest.approx(0.05 / 0.1)
    assert eq6["expected_speedup"] == pytest.approx(2.5 * (2 / 3) / (1.5 * 0.5 + 2 / 3))


def test_predict_says_why_a_formula_does_not_apply():
    baseline = [GenerationStats(new_tokens=5, target_forward_passes=5, verify_seconds=0.4)]
    plain = [GenerationStats(new_tokens=5, target_forward_passes=5, verify_seconds=0.4)]
    p = predict(plain, baseline, None)
    assert p["swift_eq6"]["expected_speedup"] is None and "drafted no tokens" in p["swift_eq6"]["reason"]
    rejected = [GenerationStats(new_tokens=3, target_forward_passes=3, drafted_tokens=4, accepted_tokens=0,
                                accepted_per_round=[0, 0], draft_steps_per_round=[2, 2], draft_seconds=0.1, wall_seconds=1.0)]
    p = predict(rejected, baseline, None)
    assert p["swift_eq6"]["expected_speedup"] is None and "α = 0" in p["swift_eq6"]["reason"]
    assert p["s3d_eq12"]["improvement_factor"] is None and "draft depth" in p["s3d_eq12"]["reason"]
