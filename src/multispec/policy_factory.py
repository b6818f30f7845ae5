"""Build a method's draft policy, loading the trained models it needs (acceptance head, decision model)."""
from __future__ import annotations

from pathlib import Path

from multispec.drafting.policies import AnyChainAbove, ConfidenceStop, EntropyStop, ThresholdStop
from multispec.engine import default_policy
from multispec.errors import MultispecError
from multispec.methods import MethodConfig
from multispec.tree import Tree

HEAD_DIRNAME = "acceptance_head"


def make_policy(config: MethodConfig, pair):
    if config.name == "auto":
        from multispec.drafting.auto import AutoPolicy

        from multispec.models import tree_refusal

        proposers = tuple(p for p in config.proposers if p != "draft" or pair.draft is not None)
        chains_only = any(m is not None and hasattr(m, "config") and tree_refusal(m) for m in (pair.target, pair.draft))
        return AutoPolicy(proposers=proposers, max_nodes=config.max_nodes, max_width=1 if chains_only else 4)
    if config.name == "specdecpp":
        from multispec.heads.acceptance import load_head

        path = config.head
        if path is None:
            guess = Path(pair.draft_path or "") / HEAD_DIRNAME
            if not guess.is_dir():
                raise MultispecError("specdecpp needs an acceptance head: pass head=PATH (--head PATH), or put one in "
                                     f"the draft's directory as {HEAD_DIRNAME}/")
            path = str(guess)
        head = load_head(path, device=next(pair.draft.parameters()).device)
        return ThresholdStop(head.predict, config.threshold, config.k_min, config.k_max)
    if config.name == "dynamic" and config.decision_model is not None:
        from multispec.heads.decision import load_decision_model

        model = load_decision_model(config.decision_model, device=next(pair.draft.parameters()).device)
        return AnyChainAbove(Tree.from_shape(config.tree), model.predict, config.beta)
    if config.confidence is not None:
        return ConfidenceStop(Tree.from_shape(config.tree), config.confidence)
    if config.entropy is not None:
        return EntropyStop(Tree.from_shape(config.tree), config.entropy)
    return default_policy(config)
