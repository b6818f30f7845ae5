"""Method `auto` (drafting/auto/): every round the plan with the most expected tokens per second — no speculation,
a lookup chain, a suffix tree, a draft chain or tree — from measured acceptance and costs. Drafts with the pair's
draft model, or with a feature head (`head=DIR`, as method eagle). Also the store of past requests that auto's
suffix trees share with method suffix (`load_suffix_store`). Its own module, as eagle's: methods.py's size."""
from __future__ import annotations

from multispec.decoding.method_checks import max_nodes as max_nodes_option
from multispec.decoding.method_entry import (AUTO_PROPOSERS, DEFAULT_AUTO_PROPOSERS, MAX_NODES_HELP, MAX_TREE_NODES,
                                             MethodConfig, MethodEntry, Option)
from multispec.errors import check, parse_bool

SUFFIX_STORE_TOKENS = 200_000  # the shared store's default cap (tokens); about 0.4 KB each (drafting/suffix.py)


def _build_auto(o: dict) -> MethodConfig:
    from multispec.decoding import eagle_method

    proposers = o.get("proposers", DEFAULT_AUTO_PROPOSERS)
    proposers = tuple(x.strip() for x in proposers.replace("+", ",").split(",")) \
        if isinstance(proposers, str) else tuple(proposers)
    bad = [x for x in proposers if x not in AUTO_PROPOSERS]
    check(bool(proposers) and not bad, f"auto: proposers must be among {', '.join(AUTO_PROPOSERS)}, got {proposers!r}")
    head = eagle_method.head_option(o, "auto")  # a feature head drafts auto's draft plans instead of a draft model
    check(head is None or "draft" in proposers, "auto: a head drafts the draft plans; keep draft among proposers")
    parse_bool(o.get("fresh_start", False), "fresh_start")
    if any(k in o for k in ("adapt", *eagle_method.ADAPT_KNOBS)):  # the head's rounds train a per-request copy
        o = eagle_method.adapt_options(o, "auto")
        check(head is not None or not o["adapt"], "auto: adapt=on adapts a feature head; give head=DIR "
                                                  "(or head=shipped)")
    return MethodConfig(name="auto", verifier="traversal", proposers=proposers, max_nodes=max_nodes_option(o, 32),
                        head=head, options=o)


def _auto_policy(config: MethodConfig, pair, loaded: dict):
    """auto with the proposers this pair allows: no draft model, no draft proposer; chains only on models whose
    attention cannot verify trees exactly (models.tree_refusal)."""
    from multispec.drafting.auto import AutoPolicy
    from multispec.models import tree_refusal

    store, memory = loaded.get("store"), not parse_bool(config.options.get("fresh_start", False), "fresh_start")
    if pair is None or config.head is not None:  # (with a head, it drafts: no draft model is read)
        policy = AutoPolicy(proposers=config.proposers, max_nodes=config.max_nodes, suffix_store=store,
                            draft_proposer="head" if config.head is not None else "draft", memory=memory)
        settings = _eagle().adapt_settings(config)  # adapt=on: the rounds the head drafts train a copy of it
        return policy if settings is None else _eagle().adapting(policy, loaded, settings)
    proposers = tuple(p for p in config.proposers if p != "draft" or pair.draft is not None)
    check(bool(proposers), "auto: proposers=draft needs a draft model; load the pair with a draft, or let auto use "
                     "lookup (proposers=draft,lookup)")
    sidecar = getattr(pair, "sidecar", None)  # the pair's keeps each answer (a stand-in pair may have none)
    chains_only = any(m is not None and hasattr(m, "config") and tree_refusal(m, sidecar(m) if sidecar else None)
                      for m in (pair.target, pair.draft))
    if chains_only:  # suffix trees are trees
        proposers = tuple(p for p in proposers if p != "suffix")
    one_chain = chains_only or getattr(pair, "cross_vocab", None) == "uag"  # a re-tokenized draft: one chain
    return AutoPolicy(proposers=proposers, max_nodes=config.max_nodes, max_width=1 if one_chain else 4,
                      suffix_store=store, memory=memory)


def _load_auto(config: MethodConfig, pair) -> dict:
    loaded = load_suffix_store(config, pair) if "suffix" in config.proposers else {}
    return {**loaded, **_eagle().load_eagle(config, pair)} if config.head is not None else loaded


def load_suffix_store(config: MethodConfig, pair) -> dict:
    """The store of past requests, shared by every Decoder spawned from one (the server's workers)."""
    from multispec.drafting.suffix import SuffixStore

    store = config.options.get("store")
    if store is None:
        cap = config.options.get("store_tokens", SUFFIX_STORE_TOKENS)
        store = SuffixStore(max_tokens=cap) if cap > 0 else None
    return {"store": store}


def _eagle():
    from multispec.decoding import eagle_method  # (imported when used: the registry lists auto before eagle)

    return eagle_method


def _adapt_options() -> tuple:
    from multispec.decoding.eagle_method import ADAPT_OPTIONS  # (head=DIR: its adaptation, as eagle's)

    return ADAPT_OPTIONS


AUTO = MethodEntry("auto", (Option("proposers", "str", "any of draft,lookup,suffix (also draft+lookup); draft alone "
                                                       "needs a draft model", "all three"),
                            Option("max_nodes", "int", MAX_NODES_HELP, 32, (1, MAX_TREE_NODES)),
                            Option("head", "path", "a feature head (or 'shipped') drafts auto's draft plans"),
                            Option("fresh_start", "flag", "start from the priors, not from (nor storing) the acceptance "
                                   "earlier generations of this pair learned"),
                            *_adapt_options()),
                   _build_auto, _auto_policy, needs_draft=False,
                   uses_draft=lambda c: "draft" in c.proposers and c.head is None, tree_nodes=lambda c: c.max_nodes,
                   load=_load_auto, draft_backend=lambda *args: _eagle().eagle_backends(*args),
                   batch_draft=lambda *args: _eagle().eagle_batch(*args),
                   reproducible_when_seeded=True, chooses_cheap_draft=True,
                   summary="per round: no speculation, a lookup chain or a draft tree, from measured acceptance and "
                           "costs")
