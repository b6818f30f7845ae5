"""The built-in decoding methods (all but auto and eagle, which have modules of their own): each one
`MethodEntry` (decoding/method_entry.py) plus its builder, policy and loaders; decoding/registry.py lists them in
`ALL_METHODS`. A new draft source is one proposer (drafting/proposers.py).

The methods, what each drafts and how it is verified: the README's "Methods and verifiers" table. Each entry's
options are declared once (`Option`) and the CLI's flags are generated from them (cli/method_options.py).
"""
from __future__ import annotations

from pathlib import Path

from multispec.decoding.auto_method import SUFFIX_STORE_TOKENS, load_suffix_store
from multispec.decoding.method_checks import chain_verifier, integer, max_nodes as max_nodes_option, \
    node_or_sequence_verifier, prob, shape, stop_rule
from multispec.decoding.method_entry import HEAD_DIRNAME, MAX_NODES_HELP, MAX_TREE_NODES, MethodConfig, MethodEntry, \
    Option
from multispec.errors import check, parse_bool


# ---------------------------------------------------------------------------------------------- the methods
def _build_ar(o: dict) -> MethodConfig:
    return MethodConfig(name="ar", options=o)


def _build_lookup(o: dict) -> MethodConfig:
    k = integer(o.get("k", 10), "k", 1)
    return MethodConfig(name="lookup", tree=(1,) * k, verifier="naive", ngram=integer(o.get("ngram", 3), "ngram", 1),
                        options=o)


def _build_sd(o: dict) -> MethodConfig:
    confidence, entropy = stop_rule(o)
    k = integer(o.get("k", 4), "k", 1)
    heuristic = parse_bool(o.get("heuristic", False), "heuristic")
    check(not (heuristic and (confidence is not None or entropy is not None)),
          "sd: choose one of heuristic, confidence, entropy")
    # block by default: never worse than token-level sd in expectation, +10-12% MAL at k >= 6 (docs/results.md)
    verifier = chain_verifier(o.get("verifier", "block"), "sd")
    return MethodConfig(name="sd", tree=(1,) * k, verifier=verifier, heuristic=heuristic,
                        confidence=confidence, entropy=entropy, options=o)


def _build_mcsd(o: dict) -> MethodConfig:
    tree = shape(o.get("tree", (4, 2, 2, 1)))
    # traversal by default: +4.8% / +8.6% MAL over the rrs-wor walk at T = 1 on identical drafts (docs/results.md)
    verifier = node_or_sequence_verifier(o.get("verifier", "traversal"), tree)
    return MethodConfig(name="mcsd", tree=tree, verifier=verifier, options=o)


def _build_ti_mcsd(o: dict) -> MethodConfig:
    tree = shape(o.get("tree", (2, 4, 3, 1, 1)))
    if "width" in o:
        tree = (integer(o["width"], "width", 1),) + tree[1:]
    check(len(tree) >= 2, "ti-mcsd needs a tree of depth >= 2 (level 1 comes from the target)")
    verifier = o.get("verifier", "sd")  # "sd": P1's chains, or the rrs-wor walk below level 1 when W = 1
    check(verifier == "sd" or (verifier == "traversal" and tree[0] == 1),
          f"ti-mcsd takes verifier 'traversal' (below a single level-1 token, width 1) or none, got {verifier!r}"
          f" with width {tree[0]}")
    return MethodConfig(name="ti-mcsd", tree=tree, verifier=verifier, target_init=True, options=o)


def _build_dynamic(o: dict) -> MethodConfig:
    confidence, entropy = stop_rule(o)
    width = integer(o.get("width", 4), "width", 1)
    depth = integer(o.get("depth", 5), "depth", 1)
    beta = prob(o.get("beta", 0.4), "beta")
    target_init = parse_bool(o.get("target_init", False), "target_init")
    tree = (width,) + (1,) * (depth - 1 + (1 if target_init else 0))
    verifier = "sd" if target_init else node_or_sequence_verifier(o.get("verifier", "rrs-wor"), tree)
    dm = o.get("decision_model")
    if dm is not None:
        check(Path(dm).exists(), f"decision model not found: {dm}")
        check(confidence is None and entropy is None, "dynamic: a decision model and a stopping rule "
                                                      "(confidence / entropy) cannot be combined")
    return MethodConfig(name="dynamic", tree=tree, verifier=verifier, target_init=target_init,
                        decision_model=None if dm is None else str(dm), beta=beta, confidence=confidence,
                        entropy=entropy, options=o)


def _build_specdecpp(o: dict) -> MethodConfig:
    k_min = integer(o.get("k_min", 2), "k_min", 1)
    k_max = integer(o.get("k_max", 20), "k_max", k_min)
    h = prob(o.get("threshold", 0.7), "threshold")
    head = o.get("head")
    if head is not None:
        check(Path(head).exists(), f"acceptance head not found: {head}")
    verifier = chain_verifier(o.get("verifier", "sd"), "specdecpp")
    return MethodConfig(name="specdecpp", tree=(1,) * k_max, verifier=verifier,
                        head=None if head is None else str(head), threshold=h, k_min=k_min, k_max=k_max, options=o)


def _fixed_tree_policy(config: MethodConfig, pair, loaded: dict):
    """The max tree every round, stopped early by a training-free rule when one is set (sd, mcsd, ti-mcsd, dynamic
    without a decision model); transformers' heuristic k for sd:heuristic."""
    from multispec.drafting.policies import ConfidenceStop, EntropyStop, FixedTree, HeuristicK
    from multispec.tree import Tree

    if config.heuristic:
        return HeuristicK(len(config.tree))
    tree = Tree.from_shape(config.tree) if config.tree else Tree.chain(0)
    if config.confidence is not None:
        return ConfidenceStop(tree, config.confidence)
    if config.entropy is not None:
        return EntropyStop(tree, config.entropy)
    return FixedTree(tree)


def _dynamic_policy(config: MethodConfig, pair, loaded: dict):
    if "decision_model" not in loaded:
        return _fixed_tree_policy(config, pair, loaded)
    from multispec.drafting.policies import AnyChainAbove
    from multispec.tree import Tree

    return AnyChainAbove(Tree.from_shape(config.tree), loaded["decision_model"].predict, config.beta)


def _load_decision_model(config: MethodConfig, pair) -> dict:
    if config.decision_model is None:
        return {}
    from multispec.heads.decision import load_decision_model

    return {"decision_model": load_decision_model(config.decision_model, device=_draft_device(pair))}


def _load_head(config: MethodConfig, pair) -> dict:
    from multispec.heads.acceptance import load_head

    path = config.head
    if path is None:
        guess = Path(getattr(pair, "draft_path", None) or "") / HEAD_DIRNAME
        check(guess.is_dir(), "specdecpp needs an acceptance head: pass head=PATH (--head PATH), or put one in the "
                              f"draft's directory as {HEAD_DIRNAME}/")
        path = str(guess)
    return {"head": load_head(path, device=_draft_device(pair))}


def _draft_device(pair):
    return next(pair.draft.parameters()).device if pair is not None and pair.draft is not None else "cpu"


def _specdecpp_policy(config: MethodConfig, pair, loaded: dict):
    from multispec.drafting.policies import ThresholdStop

    return ThresholdStop(loaded["head"].predict, config.threshold, config.k_min, config.k_max)


def _lookup_policy(config: MethodConfig, pair, loaded: dict):
    from multispec.drafting.policies import LookupPolicy

    return LookupPolicy(len(config.tree), config.ngram)


def _build_suffix(o: dict) -> MethodConfig:
    max_nodes = max_nodes_option(o, 16)
    factor = o.get("factor", 2.0)
    check(isinstance(factor, (int, float)) and not isinstance(factor, bool) and factor > 0,
          f"suffix: factor must be a number > 0, got {factor!r}")
    prob(o.get("min_prob", 0.1), "min_prob")
    store = o.get("store")
    if store is not None:
        from multispec.drafting.suffix import SuffixStore

        check(isinstance(store, SuffixStore), f"suffix: store must be a SuffixStore, got {type(store).__name__}")
    else:
        integer(o.get("store_tokens", SUFFIX_STORE_TOKENS), "store_tokens", 0)
    # naive sampling: each sibling is reached with probability p(token), the most any lossless verifier gives a
    # deterministic tree (as the rrs-wor walk with first-child point masses; traversal reaches fewer)
    return MethodConfig(name="suffix", verifier="naive", max_nodes=max_nodes, options=o)


def _suffix_policy(config: MethodConfig, pair, loaded: dict):
    from multispec.drafting.suffix import SuffixPolicy

    store = loaded.get("store")
    return SuffixPolicy(max_nodes=config.max_nodes, store=store, depth=store.depth if store is not None else 32,
                        factor=float(config.options.get("factor", 2.0)),
                        min_prob=float(config.options.get("min_prob", 0.1)))


_VERIFIER_NODE = "a node or sequence verifier (`multispec verifiers`)"
_CONFIDENCE = Option("confidence", "float", "stop drafting once the draft's probability of its newest token is "
                                            "below this (transformers' assistant_confidence_threshold, e.g. 0.4)")
_ENTROPY = Option("entropy", "float", "stop drafting once AdaEDL's acceptance bound 1 - sqrt(H(q)) is below this")

METHODS: tuple[MethodEntry, ...] = (
    MethodEntry("ar", (), _build_ar, _fixed_tree_policy, needs_draft=False,
                summary="plain decoding (target only)"),
    MethodEntry("sd", (Option("k", "int", "draft tokens per round", 4),
                       Option("heuristic", "flag", "adjust k like transformers (+2 after a full accept, else -1)"),
                       _CONFIDENCE, _ENTROPY,
                       Option("verifier", "str", "sd (token by token) or block (jointly)", "block")),
                _build_sd, _fixed_tree_policy, summary="a chain of k draft tokens"),
    MethodEntry("mcsd", (Option("tree", "shape", "tree shape below the root", "4,2,2,1"),
                         Option("verifier", "str", _VERIFIER_NODE, "traversal")),
                _build_mcsd, _fixed_tree_policy, summary="a draft-initialized static tree (P1)"),
    MethodEntry("ti-mcsd", (Option("tree", "shape", "tree shape below the root, level 1 from the target",
                                   "2,4,3,1,1"),
                            Option("width", "int", "first-level width W (LOSSY when W >= 2)"),
                            Option("verifier", "str", "traversal below a single level-1 token (W = 1), else none")),
                _build_ti_mcsd, _fixed_tree_policy,
                summary="level 1 from the target, the draft below (P1; LOSSY when W >= 2)"),
    MethodEntry("dynamic", (Option("width", "int", "first-level width W", 4),
                            Option("depth", "int", "maximum draft depth", 5),
                            Option("verifier", "str", _VERIFIER_NODE, "rrs-wor"),
                            Option("decision_model", "path", "decision-model directory"),
                            Option("beta", "float", "stop when every chain's predicted acceptance < beta", 0.4),
                            Option("target_init", "flag", "level 1 from the target (LOSSY if W >= 2)"),
                            _CONFIDENCE, _ENTROPY),
                _build_dynamic, _dynamic_policy, load=_load_decision_model,
                summary="a fork tree grown level by level, a decision model may stop it"),
    MethodEntry("specdecpp", (Option("head", "path", "acceptance-head directory (default: the draft's "
                                                     f"{HEAD_DIRNAME}/)"),
                              Option("threshold", "float", "stop when P(some rejection) > h", 0.7),
                              Option("k_min", "int", "minimum draft length", 2),
                              Option("k_max", "int", "maximum draft length", 20),
                              Option("verifier", "str", "sd or block", "sd")),
                _build_specdecpp, _specdecpp_policy, load=_load_head,
                summary="a chain stopped by a trained acceptance head (P2)"),
    MethodEntry("lookup", (Option("k", "int", "at most this many tokens copied per round", 10),
                           Option("ngram", "int", "longest n-gram matched in the context", 3)),
                _build_lookup, _lookup_policy, needs_draft=False,
                summary="a chain copied from the context (prompt lookup), no draft model"),
    MethodEntry("suffix", (Option("max_nodes", "int", MAX_NODES_HELP, 16, (1, MAX_TREE_NODES)),
                           Option("factor", "float", "tree depth at most factor x the matched suffix's length", 2.0),
                           Option("min_prob", "float", "children rarer than this (conditional frequency) are not "
                                                       "drafted", 0.1),
                           Option("store_tokens", "int", "tokens of past requests kept for later ones (0: none)",
                                  SUFFIX_STORE_TOKENS),
                           Option("store", "object", "a SuffixStore shared with other decoders")),
                _build_suffix, _suffix_policy, needs_draft=False, load=load_suffix_store,
                tree_nodes=lambda c: c.max_nodes, drafts_trees=lambda c: True,
                summary="a token tree from suffix tries over the context and past requests, no draft model"),
)
