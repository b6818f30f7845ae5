"""Checks of method options (decoding/builtin_methods.py): one line naming the option and what it takes."""
from __future__ import annotations

from multispec.decoding.method_entry import MAX_TREE_NODES
from multispec.errors import MultispecError, check


def stop_rule(o: dict) -> tuple[float | None, float | None]:
    confidence = None if o.get("confidence") is None else prob(o["confidence"], "confidence")
    entropy = None if o.get("entropy") is None else prob(o["entropy"], "entropy")
    check(confidence is None or entropy is None, "choose one stopping rule: confidence or entropy")
    return confidence, entropy


def max_nodes(o: dict, default: int) -> int:
    n = integer(o.get("max_nodes", default), "max_nodes", 1)
    check(n <= MAX_TREE_NODES, f"max_nodes must be at most {MAX_TREE_NODES} (one round's tree), got {n}")
    return n


def integer(v, name: str, lo: int) -> int:
    check(isinstance(v, int) and not isinstance(v, bool) and v >= lo, f"{name} must be an integer >= {lo}, got {v!r}")
    return v


def prob(v, name: str) -> float:
    check(isinstance(v, (int, float)) and 0 <= v <= 1, f"{name} must be in [0, 1], got {v!r}")
    return float(v)


def shape(v) -> tuple[int, ...]:
    from multispec.tree import Tree, parse_shape  # torch: imported when a method is built, not for `--help`

    check(isinstance(v, (str, tuple, list)), f"tree must be a shape such as (4, 2, 2, 1) or '4,2,2,1', got {v!r}")
    dims = parse_shape(v) if isinstance(v, str) else tuple(v)
    Tree.from_shape(dims)
    return dims


def node_or_sequence_verifier(name: str, tree: tuple[int, ...]) -> str:
    """A node verifier (walked from the root) or a sequence verifier (block: chains; traversal: trees)."""
    from multispec.verify.sequence import get_sequence_verifier

    check(isinstance(name, str), f"verifier must be a name, got {name!r}")
    spec = get_sequence_verifier(name)
    check(not spec.keyed, f"verifier {name!r} is the keyed verifier of the reproducible mode: ask for the mode "
                          "instead (reproducible=True with a seed; --reproducible --seed N; \"reproducible\": true in a "
                          "request), under any method (docs/reproducible.md)")
    try:
        spec.check_widths(set(tree))
    except MultispecError as e:
        raise MultispecError(f"tree {','.join(map(str, tree))} does not suit verifier {name!r}: {e}") from None
    return name


def chain_verifier(name, method: str) -> str:
    """sd and specdecpp draft one chain: token-level `sd` or `block` verification."""
    check(name in ("sd", "block"), f"method {method!r} verifies its chain with verifier 'sd' (token by token) "
                                   f"or 'block' (jointly), got {name!r}")
    return name
