"""Node verifiers (design §4) and the tree walk (design §4.7).

Every verifier is a pure function of the processed target p, the processed draft q, the drafted tokens and an
explicit torch.Generator (see `base`). ALL_VERIFIERS lists them in a fixed order; REGISTRY maps a name to its
VerifierSpec (the sequence verifiers: verify/sequence.py).
"""
from __future__ import annotations

from multispec.errors import check
from multispec.verify import greedy, greedy_md, kseq, mcns, rrs, rrs_wor, sd, spechub
from multispec.verify import ot
from multispec.verify.base import NodeLaw, NodeResult, Plan, VerifierSpec

ALL_VERIFIERS: tuple[VerifierSpec, ...] = (
    greedy.SPEC, sd.SPEC, mcns.SPEC, rrs.SPEC, rrs_wor.SPEC, kseq.SPEC, spechub.SPEC, greedy_md.SPEC,
    ot.SPEC,  # optimal transport, i.i.d. drafts (docs/optimal.md §7)
)
REGISTRY: dict[str, VerifierSpec] = {spec.name: spec for spec in ALL_VERIFIERS}


def get_verifier(name: str) -> VerifierSpec:
    """The VerifierSpec called `name`; MultispecError listing the valid names otherwise."""
    check(name in REGISTRY, f"unknown verifier {name!r}; valid names: {', '.join(REGISTRY)}")
    return REGISTRY[name]


__all__ = ["ALL_VERIFIERS", "REGISTRY", "NodeLaw", "NodeResult", "Plan", "VerifierSpec", "get_verifier"]
