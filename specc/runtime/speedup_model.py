"""S3D eq. 11-12: the tokens a speculative round yields and the improvement factor, from
per-depth acceptance (any method's rounds, not only S3D's).

τ(γ) = Σ_{n=1}^{γ+1} n · Π_{k<n} α_k · z_n, z_n = 1 − α_n for n ≤ γ and 1 for
n = γ + 1; IF = τ / (δ + β + 1), with β the draft cost and δ the other overhead
per round, in target forwards. S3D's compile-time selection (`methods/s3d/select.py`) ranks
candidates by them; `specc bench` predicts every method's speedup with them.
"""

from __future__ import annotations


def s3d_tau(per_depth_acceptance: list[float]) -> float:
    """Expected new tokens per round, τ(γ) with γ = len(per_depth_acceptance)."""
    gamma = len(per_depth_acceptance)
    tau, reach = 0.0, 1.0   # reach = Π_{k<n} α_k
    for n in range(1, gamma + 2):
        stop = 1.0 - per_depth_acceptance[n - 1] if n <= gamma else 1.0
        tau += n * reach * stop
        if n <= gamma:
            reach *= per_depth_acceptance[n - 1]
    return tau


def s3d_improvement_factor(tau: float, overhead: float, draft_cost: float) -> float:
    """IF = τ / (δ + β + 1)."""
    return tau / (overhead + draft_cost + 1.0)
