"""Optimal multi-draft acceptance rates (design §8, P3) and each verifier's exact acceptance at one position.

p is ALWAYS the target distribution and q the draft distribution, both processed (design §1).
"""
from multispec.optimal.acceptance import optimal_acceptance, optimal_acceptance_greedy, optimal_acceptance_hub
from multispec.optimal.verifiers import (
    VERIFIERS,
    Estimate,
    naive_acceptance,
    verifier_acceptance,
    verifier_optimum,
)

__all__ = [
    "VERIFIERS",
    "Estimate",
    "naive_acceptance",
    "optimal_acceptance",
    "optimal_acceptance_greedy",
    "optimal_acceptance_hub",
    "verifier_acceptance",
    "verifier_optimum",
]
