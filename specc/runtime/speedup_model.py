"""The tokens a speculative round yields and the improvement factor, from per-depth acceptance,
for any method's rounds (the formulas: ../shared/METHODS.md, "Expected speedup", eq. 11-12 of
its papers).

τ(γ) = Σ_{n=1}^{γ+1} n · Π_{k<n} α_k · z_n, z_n = 1 − α_n for n ≤ γ and 1 for
n = γ + 1; IF = τ / (δ + β + 1), with β the draft cost and δ the other overhead
per round, in target forwards. `specc bench` predicts every method's speedup with them, and a
method may rank compile-time choices by them.
"""

from __future__ import annotations


def tokens_per_round(per_depth_acceptance: list[float]) -> float:
    """Expected new tokens per round, τ(γ) with γ = len(per_depth_acceptance)."""
    gamma = len(per_depth_acceptance)
    tau, reach = 0.0, 1.0   # reach = Π_{k<n} α_k
    for n in range(1, gamma + 2):
        stop = 1.0 - per_depth_acceptance[n - 1] if n <= gamma else 1.0
        tau += n * reach * stop
        if n <= gamma:
            reach *= per_depth_acceptance[n - 1]
    return tau


def improvement_factor(tau: float, overhead: float, draft_cost: float) -> float:
    """IF = τ / (δ + β + 1)."""
    return tau / (overhead + draft_cost + 1.0)
