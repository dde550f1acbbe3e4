"""Speedup predicted from measured acceptance and costs, to set beside the
measured speedup over the compiled autoregressive engine.

SWIFT eq. 6:  E = M·α / ((M − 1)·c + α), with α = accepted tokens per draft
step and c = draft cost per draft step / target forward cost. (M − 1)/α is
the draft steps per round, so the denominator is a round's cost in target
forwards. A draft step is one sequential drafter call: for a tree it
proposes every sibling at that depth, so α and c are per depth, not per
node (for chains the two coincide). Eq. 6 assumes verifying a round costs
one plain forward; `with_measured_verify` replaces that 1 by v, the
measured verification time per round over a plain forward:
E_v = M·α / ((M − 1)·c + α·v). Where E_v is near the measurement and E is
not, the gap is verification cost (on CPU a forward's cost grows with the
tokens verified); where both are off, it is elsewhere in the loop.

S3D eq. 11–12:  τ(γ) = Σ_{n=1}^{γ+1} n · Π_{k<n} α_k · z_n, z_n = 1 − α_n for
n ≤ γ and 1 for n = γ + 1;  IF = τ / (δ + β + 1), where α_k is the
acceptance rate of the k-th draft token given the first k − 1 were accepted,
β the draft cost per round and δ the other per-round overhead, both in
target forwards. The paper's β is a parameter share of a one-pass drafter;
here it is measured draft time, so the formula also covers drafters that run
several steps. Unlike the measurement, it assumes verifying γ + 1 tokens
costs one plain forward.
"""

from __future__ import annotations

from specc.bench.statistics import per_depth_acceptance
from specc.runtime.speedup_model import improvement_factor, tokens_per_round
from specc.runtime.stats import GenerationStats



def swift_expected_speedup(mean_accepted_length: float, acceptance_rate: float, cost_ratio: float,
                           verify_cost: float = 1.0) -> float:
    m, a, c = mean_accepted_length, acceptance_rate, cost_ratio
    if m < 1 or not 0 < a <= 1 or c < 0 or verify_cost <= 0:
        raise ValueError(f"SWIFT eq. 6 needs M >= 1, 0 < α <= 1, c >= 0 and v > 0; got M={m}, α={a}, c={c}, "
                         f"v={verify_cost}")
    return m * a / ((m - 1) * c + a * verify_cost)


def draft_depth(manifest: dict) -> int | None:
    """γ of an engine: the bound on draft tokens per round its method declares
    (`MethodDescriptor.draft_depth`) for its config. For a drafter that may stop
    early, γ is the bound and an early stop counts as a rejection in the α_k
    measured from CTAR, so τ still matches the rounds."""
    from specc.contract.descriptor import get_method

    method = get_method(manifest["method"])
    if method.draft_depth is None:
        return None
    return method.draft_depth(method.config_class.from_json(manifest["method_config"]))


def target_forward_seconds(baseline_stats: list[GenerationStats]) -> float | None:
    """Mean time of one single-token target forward, from the compiled
    autoregressive engine's decode steps (prefill excluded)."""
    steps = sum(s.target_forward_passes - 1 for s in baseline_stats)
    seconds = sum(s.verify_seconds for s in baseline_stats)
    return seconds / steps if steps > 0 and seconds > 0 else None


def predict(engine_stats: list[GenerationStats], baseline_stats: list[GenerationStats], gamma: int | None) -> dict:
    """Both formulas' inputs and outputs, with a reason wherever one is not applicable."""
    target = target_forward_seconds(baseline_stats)
    drafted = sum(s.draft_steps for s in engine_stats)
    accepted = sum(s.accepted_tokens for s in engine_stats)
    new_tokens = sum(s.new_tokens for s in engine_stats)
    forwards = sum(s.target_forward_passes for s in engine_stats)
    draft_seconds = sum(s.draft_seconds for s in engine_stats)
    result: dict = {"target_forward_seconds": target}
    if target is None:
        reason = "the compiled autoregressive baseline made no decode steps to time"
        return result | {"swift_eq6": {"expected_speedup": None, "reason": reason},
                         "s3d_eq12": {"improvement_factor": None, "reason": reason}}
    if drafted == 0:
        reason = "the engine drafted no tokens"
        return result | {"swift_eq6": {"expected_speedup": None, "reason": reason},
                         "s3d_eq12": {"improvement_factor": None, "reason": reason}}
    m, alpha = new_tokens / forwards, accepted / drafted
    c = draft_seconds / drafted / target
    result["draft_seconds_per_draft_step"] = draft_seconds / drafted
    v = sum(s.verify_seconds for s in engine_stats) / max(1, forwards - len(engine_stats)) / target
    result["swift_eq6"] = (
        {"expected_speedup": swift_expected_speedup(m, alpha, c), "M": m, "alpha": alpha, "c": c,
         "v": v, "with_measured_verify": swift_expected_speedup(m, alpha, c, verify_cost=v) if v > 0 else None}
        if alpha > 0 else
        {"expected_speedup": None, "M": m, "alpha": alpha, "c": c,
         "reason": "no draft token was accepted (α = 0), where eq. 6 is undefined"}
    )
    result["s3d_eq12"] = _s3d(engine_stats, gamma, target)
    return result


def _s3d(engine_stats: list[GenerationStats], gamma: int | None, target: float) -> dict:
    if gamma is None:
        return {"improvement_factor": None,
                "reason": "the method declares no draft depth (MethodDescriptor.draft_depth)"}
    rounds = [a for s in engine_stats for a in s.accepted_per_round]
    steps = sum(s.target_forward_passes - 1 for s in engine_stats)
    overhead = sum(s.wall_seconds - s.prefill_seconds - s.draft_seconds - s.verify_seconds for s in engine_stats)
    # every round counted γ deep: an early stop is a rejection, so τ matches the rounds
    # (0 where no round got that far: the product of α before it is 0 already)
    alphas = [alpha or 0.0 for alpha in per_depth_acceptance(rounds, [gamma] * len(rounds))]
    tau = tokens_per_round(alphas)
    beta = sum(s.draft_seconds for s in engine_stats) / len(rounds) / target
    delta = max(0.0, overhead) / steps / target
    return {"improvement_factor": improvement_factor(tau, delta, beta), "tau": tau, "gamma": gamma,
            "beta": beta, "delta": delta, "per_depth_acceptance": alphas}
