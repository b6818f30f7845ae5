"""Method `eagle`: drafts with a trained feature head (models/eagle.py) instead of a draft model, a chain of k tokens
or a static tree, verified by the method's lossless verifier like sd and mcsd. The head is a method option
(`head=DIR`, `--head DIR`): read once per Decoder family, refused in one line when made for another target. The
pair needs no draft (a pair's draft is ignored). Train a head with `multispec train-head` (training/eagle.py).
`adapt=on` (with adapt_lr, adapt_steps, adapt_rows, adapt_every) trains a per-request copy of the head between rounds
on the committed positions' target features (models/eagle_adapt.py, drafting/adapting.py)."""
from __future__ import annotations

from pathlib import Path

from multispec.decoding.method_checks import chain_verifier, integer, node_or_sequence_verifier, shape
from multispec.decoding.method_entry import MethodConfig, MethodEntry, Option
from multispec.errors import MultispecError, check


def head_option(o: dict, method: str) -> str | None:
    """The `head` option: a folder, or "shipped" (the installed head for the target, found at load)."""
    head = o.get("head")
    check(head is None or str(head) == "shipped" or Path(str(head)).is_dir(), f"{method}: head not found: {head}")
    return None if head is None else str(head)


DEFAULT_K = 4  # eagle's chain length for a head that records no default of its own
SHAPES = ("k", "tree", "nodes")  # the options that give the draft's shape (one at most)


def _build_eagle(o: dict) -> MethodConfig:
    head = head_option(o, "eagle")
    if head is None:
        raise MultispecError("eagle needs a trained head: head=DIR (--head DIR); train one with multispec train-head")
    check(sum(x in o for x in SHAPES) <= 1,
          "eagle: give one of k (a chain), tree (a static tree) or nodes (a dynamic tree)")
    check("nodes" in o or not ({"depth", "width"} & set(o)), "eagle: depth and width shape a dynamic tree: give nodes")
    check(not ("nodes" in o and "confidence" in o), "eagle: confidence stops a chain or static tree, not nodes")
    if "nodes" in o:  # EAGLE-2's dynamic tree: `nodes` below the root, at most `depth` levels
        nodes = integer(o["nodes"], "nodes", 1)
        depth = integer(o.get("depth", min(5, nodes)), "depth", 1)
        check(depth <= nodes, f"eagle: depth {depth} is more than the tree's {nodes} nodes")
        o = {**o, "nodes": nodes, "depth": depth, "width": integer(o.get("width", 3), "width", 1)}
        check("verifier" not in o, "eagle: a dynamic tree's tokens are the head's top ones, not draws: it is verified "
                                   "by the rrs-wor walk (give no verifier)")
        tree: tuple[int, ...] = (nodes,)
        verifier = "rrs-wor"
    elif "tree" in o:
        tree = shape(o["tree"])
        verifier = node_or_sequence_verifier(o.get("verifier", "traversal"), tree)
    else:
        tree = (1,) * integer(o.get("k", DEFAULT_K), "k", 1)
        verifier = chain_verifier(o.get("verifier", "block"), "eagle")
    stop = o.get("confidence")
    check(stop is None or (isinstance(stop, (int, float)) and 0 < stop < 1),
          f"eagle: confidence must be a probability in (0, 1), got {stop!r}")
    return MethodConfig(name="eagle", tree=tree, verifier=verifier, head=str(head), options=adapt_options(o))


ADAPT_VALUES = {"on": True, "off": False, "true": True, "false": False, "1": True, "0": False, True: True, False: False}
ADAPT_KNOBS = {"adapt_lr": "lr", "adapt_steps": "steps", "adapt_rows": "rows", "adapt_every": "every"}  # option -> AdaptSettings field


def adapt_options(o: dict, method: str = "eagle") -> dict:
    """The options with `adapt` read as a boolean (on/off, true/false, 1/0) and its knobs checked (one line each,
    named by `method`; a knob without adapt=on is refused, not ignored)."""
    from multispec.models.eagle_adapt import AdaptSettings

    v = o.get("adapt", False)
    key = v.strip().lower() if isinstance(v, str) else v
    on = ADAPT_VALUES.get(key) if isinstance(key, (str, bool, int)) else None
    check(on is not None, f"{method}: adapt must be on or off, got {v!r}")
    knobs = {field: o[name] for name, field in ADAPT_KNOBS.items() if name in o}
    check(on or not knobs, f"{method}: {', '.join(n for n in ADAPT_KNOBS if n in o)} apply with adapt=on only "
                           "(online adaptation's settings)")
    try:
        AdaptSettings(**knobs)  # checked now, before any model loads
    except MultispecError as e:
        raise MultispecError(f"{method}: {e}") from None
    return {**o, "adapt": bool(on)}


def adapt_settings(config: MethodConfig):
    """The run's AdaptSettings (models/eagle_adapt.py), or None when adaptation is off."""
    from multispec.models.eagle_adapt import AdaptSettings

    o = config.options
    if not o.get("adapt"):
        return None
    return AdaptSettings(**{field: o[name] for name, field in ADAPT_KNOBS.items() if name in o})


def complete_eagle(config: MethodConfig, pair) -> MethodConfig:
    """Given none of k, tree or nodes: the draft shape the head recorded as fastest for it (its config.json
    "default", e.g. {"k": 3}; models/eagle_io.head_default), else a chain of DEFAULT_K. A recorded dynamic tree
    is not taken beside `confidence` (which stops chains and static trees)."""
    o = config.options
    if pair is None or any(x in o for x in SHAPES) or config.head is None:
        return config
    from multispec.models.eagle_io import head_default

    shape = head_default(config.head, pair.target)
    if not shape or ("nodes" in shape and "confidence" in o):
        return config
    try:
        return _build_eagle({**o, **shape})
    except MultispecError as e:
        raise MultispecError(f"eagle head {config.head}: its recorded default {shape} is not a draft shape ({e})") \
            from None


def load_eagle(config: MethodConfig, pair) -> dict:
    check(pair is not None, "eagle reads its head for a loaded pair's target")
    from multispec.models.eagle_io import load_head

    from multispec.models.int8 import QUANT_DTYPES, quantize_linears, weights_dtype

    head, token_ids = load_head(str(config.head), pair.target)
    check(not (config.options.get("adapt") and weights_dtype(pair.target) in QUANT_DTYPES),
          f"eagle: adapt=on trains the head through the target's output layer, which this "
          f"{weights_dtype(pair.target)} target holds quantized; load the target unquantized or leave adapt off")
    if weights_dtype(pair.target) in QUANT_DTYPES:  # a quantized target's head: its decoder layer in int8 (not the
        quantize_linears(head.transformer)  # fusion layer: its input joins an embedding and a feature of other scales)
    return {"eagle_head": head, "eagle_token_ids": token_ids}


def _eagle_policy(config: MethodConfig, pair, loaded: dict):
    from multispec.drafting.policies import ConfidenceStop, DynamicTree, FixedTree
    from multispec.tree import Tree

    o = config.options
    policy: FixedTree
    if "nodes" in o:
        policy = DynamicTree(o["nodes"], o["depth"], o["width"])  # (filled in by _build_eagle)
    else:
        tree, stop = Tree.from_shape(config.tree), o.get("confidence")
        policy = FixedTree(tree) if stop is None else ConfidenceStop(tree, float(stop))
        policy.proposer = "head"  # (ConfidenceStop takes no proposer)
    policy.defers_draft_prefill = True  # the head reads the target's features of the prompt: after its prefill
    settings = adapt_settings(config)
    if settings is None:
        return policy
    return adapting(policy, loaded, settings)


def adapting(policy, loaded: dict, settings):
    """`policy` with the head adapted per request (drafting/adapting.py): each request trains a copy of the head
    (eagle, and auto with a head)."""
    from multispec.drafting.adapting import AdaptingPolicy

    return AdaptingPolicy(policy, loaded["eagle_head"], settings)


def eagle_backends(config: MethodConfig, loaded: dict, target, pair) -> tuple:
    """The target wrapped to keep its features, and the head's backend reading them."""
    from multispec.models.eagle import FeatureTap, HeadBackend, TargetParts

    tap = FeatureTap(target)
    head, sidecar = loaded["eagle_head"], getattr(pair, "sidecar", None)  # (a stand-in pair has none: fresh ones)
    return tap, HeadBackend(head, TargetParts.of(pair.target), tap, loaded["eagle_token_ids"],
                            sidecar=sidecar and sidecar(head), target_sidecar=sidecar and sidecar(pair.target))


def eagle_batch(config: MethodConfig, loaded: dict, pair, slots: int, rows: int):
    """The head's side of a BatchEngine: its slot cache, and each slot's tap and head (models/eagle_batched.py)."""
    from multispec.models.eagle import TargetParts
    from multispec.models.eagle_batched import HeadBatch

    check(not config.options.get("adapt"), f"{config.name}: adapt=on adapts a head per sequence, which batched "
                                          "decoding does not do yet; decode one request at a time (batch size 1)")
    head = loaded["eagle_head"]
    return HeadBatch(head, TargetParts.of(pair.target), pair.sidecar(head), loaded["eagle_token_ids"], slots, rows)


ADAPT_OPTIONS = (  # eagle's and auto's (with a head)
    Option("adapt", "str", "on: the head keeps learning from the request, a copy of it trained between the rounds it "
                           "drafts on the committed positions' target features (lossless; per request; one "
                           "sequence at a time)", "off"),
    Option("adapt_lr", "float", "adapt=on: Adam's learning rate", 1e-4),
    Option("adapt_steps", "int", "adapt=on: optimiser steps per update", 1),
    Option("adapt_rows", "int", "adapt=on: the latest committed positions each step trains on", 32),
    Option("adapt_every", "int", "adapt=on: rounds the head drafts between updates, at first (the period doubles "
                                 "while updates do not pay for themselves, then adaptation is off)", 8))

EAGLE = MethodEntry(
    "eagle", (Option("head", "path", "eagle: a feature-head directory (multispec train-head), or 'shipped' (the "
                                          "head installed for this target)"),
              Option("k", "int", "draft tokens per round (default: the chain length the head recorded as fastest "
                                 f"for it, else {DEFAULT_K})"),
              Option("tree", "shape", "tree shape below the root (instead of a chain of k)"),
              Option("nodes", "int", "a dynamic tree (EAGLE-2) of this many nodes below the root, shaped each round "
                                     "by the head's path probabilities (instead of k or tree)"),
              Option("depth", "int", "a dynamic tree's most levels (default: 5, at most nodes)"),
              Option("width", "int", "a dynamic tree's children per expanded node and nodes expanded per level", 3),
              Option("verifier", "str", "block or sd on chains; a node or sequence verifier on trees"),
              Option("confidence", "float", "stop drafting deeper once the head's probability of each newest token "
                                            "is below this (EAGLE-2: the head's confidence estimates acceptance)"),
              *ADAPT_OPTIONS),
    _build_eagle, _eagle_policy, needs_draft=False, uses_draft=lambda c: False, load=load_eagle,
    draft_backend=eagle_backends, batch_draft=eagle_batch, complete=complete_eagle, summary="a chain or tree drafted by a trained feature head (EAGLE) on the "
                                           "target's hidden states, no draft model")
