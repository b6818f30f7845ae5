"""Method configurations: a validated, frozen description of how to draft and verify, built from a method name
and its options before any model runs (STYLE §2.9).

| method    | drafting                                          | verification                     | lossless |
|-----------|---------------------------------------------------|----------------------------------|----------|
| ar        | none (target only)                                | sample from the target           | yes      |
| sd        | chain of k draft tokens (optionally heuristic k)  | `block` (default) or `sd`        | yes      |
| mcsd      | draft-initialized static tree (default 4,2,2,1)   | `traversal` (default), any node verifier | per verifier |
| ti-mcsd   | level 1 from the target, draft below (2,4,3,1,1)  | longest accepted chain (P1)      | only W=1 |
|           |                                                   | (W=1: rrs-wor walk or traversal) |          |
| dynamic   | fork tree (W,1,..,1) grown level by level, decision model may stop it | multi-draft verifier | per verifier |
|           | (`traversal`; `block` when W = 1)                  |                                  |          |
| specdecpp | chain up to k_max, acceptance head stops it       | single-draft `sd` or `block`     | yes      |
| lookup    | chain copied from the context (prompt lookup), no draft model | `block`, q = one-hot | yes |
| auto      | per round: no speculation, a lookup chain, or a draft tree chosen from measured acceptance and costs | `traversal` | yes |

`sd` and `dynamic` also take a training-free stopping rule: `confidence=h` (stop when the draft's probability of its
newest token is below h, transformers' assistant_confidence_threshold) or `entropy=h` (AdaEDL's entropy bound).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from multispec.errors import MultispecError, check, parse_bool

METHODS = ("auto", "ar", "sd", "mcsd", "ti-mcsd", "dynamic", "specdecpp", "lookup")
DEFAULT_METHOD = "auto"  # the API's, the CLI's and the server's default method: change it here only
NEEDS_DRAFT = ("sd", "mcsd", "ti-mcsd", "dynamic", "specdecpp")  # auto uses a draft when there is one
AUTO_PROPOSERS = ("draft", "lookup")

_OPTIONS = {
    "ar": set(),
    "sd": {"k", "heuristic", "confidence", "entropy", "verifier"},
    "mcsd": {"tree", "verifier"},
    "ti-mcsd": {"tree", "width", "verifier"},
    "dynamic": {"width", "depth", "verifier", "decision_model", "beta", "target_init", "confidence", "entropy"},
    "specdecpp": {"head", "threshold", "k_min", "k_max", "verifier"},
    "lookup": {"k", "ngram"},
    "auto": {"proposers", "max_nodes"},
}


@dataclass(frozen=True)
class MethodConfig:
    name: str
    tree: tuple[int, ...] = ()  # max tree shape below the root; () for ar
    verifier: str = "sd"
    heuristic: bool = False
    target_init: bool = False  # level 1 drawn from the target (ti-mcsd; dynamic with target_init)
    decision_model: str | None = None
    beta: float = 0.4
    head: str | None = None
    threshold: float = 0.7
    k_min: int = 2
    k_max: int = 20
    confidence: float | None = None  # training-free stop: draft probability of the newest token below this
    entropy: float | None = None  # training-free stop: AdaEDL entropy bound below this
    ngram: int = 3  # lookup: longest n-gram matched
    proposers: tuple[str, ...] = AUTO_PROPOSERS  # auto
    max_nodes: int = 32  # auto: the largest tree it may draft
    options: dict = field(default_factory=dict, compare=False)

    @property
    def width(self) -> int:
        return self.tree[0] if self.tree else 0

    @property
    def lossless(self) -> bool:
        """Lossless at every temperature (the conservative flag, used before the temperature is known)."""
        return self.lossless_at(0.0) and self.lossless_at(1.0)

    def lossless_at(self, temperature: float) -> bool:
        """Whether the output law equals the processed target's at this temperature.

        Temperature 0: the engine verifies every draft-initialized method greedily (argmax of p), so all of them are
        lossless; target-initialized trees with W >= 2 are not (a level-1 token that is not the argmax can win by
        a longer accepted chain). Temperature > 0: the verifier decides; `greedy` is the temperature-0 verifier and
        commits argmax p, not a draw from p, so it is LOSSY there."""
        from multispec.verify.sequence import get_sequence_verifier

        if self.target_init:
            return self.width == 1
        if temperature == 0 or self.name == "ar":
            return True
        return self.verifier != "greedy" and get_sequence_verifier(self.verifier).lossless


def build_method(name: str, **options) -> MethodConfig:
    """Validate `name` and its options; raise MultispecError naming the first problem."""
    check(name in METHODS, f"unknown method {name!r}; choose one of {', '.join(METHODS)}")
    options = {k: v for k, v in options.items() if v is not None}
    unknown = set(options) - _OPTIONS[name]
    check(not unknown, f"method {name!r} does not take option(s) {', '.join(sorted(unknown))}; "
                       f"it takes {', '.join(sorted(_OPTIONS[name])) or 'none'}")
    o = options
    if name == "ar":
        return MethodConfig(name="ar", options=o)
    if name == "auto":
        proposers = o.get("proposers", AUTO_PROPOSERS)
        proposers = tuple(x.strip() for x in proposers.replace("+", ",").split(",")) \
            if isinstance(proposers, str) else tuple(proposers)
        bad = [x for x in proposers if x not in AUTO_PROPOSERS]
        check(proposers and not bad, f"auto: proposers must be among {', '.join(AUTO_PROPOSERS)}, got {proposers!r}")
        return MethodConfig(name="auto", verifier="traversal", proposers=proposers,
                            max_nodes=_int(o.get("max_nodes", 32), "max_nodes", 1), options=o)
    if name == "lookup":
        k = _int(o.get("k", 10), "k", 1)
        return MethodConfig(name="lookup", tree=(1,) * k, verifier="block", ngram=_int(o.get("ngram", 3), "ngram", 1),
                            options=o)
    confidence, entropy = _stop_rule(o)
    if name == "sd":
        k = _int(o.get("k", 4), "k", 1)
        heuristic = parse_bool(o.get("heuristic", False), "heuristic")
        check(not (heuristic and (confidence is not None or entropy is not None)),
              "sd: choose one of heuristic, confidence, entropy")
        # block by default: never worse than token-level sd in expectation, +10-12% MAL at k >= 6 (README)
        verifier = _chain_verifier(o.get("verifier", "block"), "sd")
        return MethodConfig(name="sd", tree=(1,) * k, verifier=verifier, heuristic=heuristic,
                            confidence=confidence, entropy=entropy, options=o)
    if name == "mcsd":
        tree = _shape(o.get("tree", (4, 2, 2, 1)))
        # traversal by default: +4.8% / +8.6% MAL over the rrs-wor walk at T = 1 on identical drafts (README)
        verifier = _verifier(o.get("verifier", "traversal"), tree)
        return MethodConfig(name="mcsd", tree=tree, verifier=verifier, options=o)
    if name == "ti-mcsd":
        tree = _shape(o.get("tree", (2, 4, 3, 1, 1)))
        if "width" in o:
            tree = (_int(o["width"], "width", 1),) + tree[1:]
        check(len(tree) >= 2, "ti-mcsd needs a tree of depth >= 2 (level 1 comes from the target)")
        verifier = o.get("verifier", "sd")  # "sd": P1's chains, or the rrs-wor walk below level 1 when W = 1
        check(verifier == "sd" or (verifier == "traversal" and tree[0] == 1),
              f"ti-mcsd takes verifier 'traversal' (below a single level-1 token, width 1) or none, got {verifier!r}"
              f" with width {tree[0]}")
        return MethodConfig(name="ti-mcsd", tree=tree, verifier=verifier, target_init=True, options=o)
    if name == "dynamic":
        width = _int(o.get("width", 4), "width", 1)
        depth = _int(o.get("depth", 5), "depth", 1)
        beta = _prob(o.get("beta", 0.4), "beta")
        target_init = parse_bool(o.get("target_init", False), "target_init")
        tree = (width,) + (1,) * (depth - 1 + (1 if target_init else 0))
        verifier = "sd" if target_init else _verifier(o.get("verifier", "rrs-wor"), tree)
        dm = o.get("decision_model")
        if dm is not None:
            check(Path(dm).exists(), f"decision model not found: {dm}")
            check(confidence is None and entropy is None, "dynamic: a decision model and a stopping rule "
                                                          "(confidence / entropy) cannot be combined")
        return MethodConfig(name="dynamic", tree=tree, verifier=verifier, target_init=target_init,
                            decision_model=None if dm is None else str(dm), beta=beta, confidence=confidence,
                            entropy=entropy, options=o)
    # specdecpp
    k_min = _int(o.get("k_min", 2), "k_min", 1)
    k_max = _int(o.get("k_max", 20), "k_max", k_min)
    h = _prob(o.get("threshold", 0.7), "threshold")
    head = o.get("head")
    if head is not None:
        check(Path(head).exists(), f"acceptance head not found: {head}")
    verifier = _chain_verifier(o.get("verifier", "sd"), "specdecpp")
    return MethodConfig(name="specdecpp", tree=(1,) * k_max, verifier=verifier,
                        head=None if head is None else str(head), threshold=h, k_min=k_min, k_max=k_max, options=o)


def _stop_rule(o: dict) -> tuple[float | None, float | None]:
    confidence = None if o.get("confidence") is None else _prob(o["confidence"], "confidence")
    entropy = None if o.get("entropy") is None else _prob(o["entropy"], "entropy")
    check(confidence is None or entropy is None, "choose one stopping rule: confidence or entropy")
    return confidence, entropy


def _int(v, name: str, lo: int) -> int:
    check(isinstance(v, int) and not isinstance(v, bool) and v >= lo, f"{name} must be an integer >= {lo}, got {v!r}")
    return v


def _prob(v, name: str) -> float:
    check(isinstance(v, (int, float)) and 0 <= v <= 1, f"{name} must be in [0, 1], got {v!r}")
    return float(v)


def _shape(v) -> tuple[int, ...]:
    from multispec.tree import Tree, parse_shape  # torch: imported when a method is built, not for `--help`

    check(isinstance(v, (str, tuple, list)), f"tree must be a shape such as (4, 2, 2, 1) or '4,2,2,1', got {v!r}")
    shape = parse_shape(v) if isinstance(v, str) else tuple(v)
    Tree.from_shape(shape)
    return shape


def _verifier(name: str, tree: tuple[int, ...]) -> str:
    """A node verifier (walked from the root) or a sequence verifier (block: chains; traversal: trees)."""
    from multispec.verify.sequence import get_sequence_verifier

    check(isinstance(name, str), f"verifier must be a name, got {name!r}")
    spec = get_sequence_verifier(name)
    try:
        spec.check_widths(set(tree))
    except MultispecError as e:
        raise MultispecError(f"tree {','.join(map(str, tree))} does not suit verifier {name!r}: {e}") from None
    return name


def _chain_verifier(name, method: str) -> str:
    """sd and specdecpp draft one chain: token-level `sd` or `block` verification."""
    check(name in ("sd", "block"), f"method {method!r} verifies its chain with verifier 'sd' (token by token) "
                                   f"or 'block' (jointly), got {name!r}")
    return name
