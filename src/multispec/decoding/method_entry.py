"""What a decoding method is: `MethodEntry` (its options, whether it needs a draft, how it builds its validated
`MethodConfig` before any model runs (style §2.9), which trained models it loads, how it builds its draft policy),
`Option` and the method defaults. The registry (decoding/registry.py) lists the built-in entries."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from multispec.drafting.protocol import DraftPolicy
from multispec.errors import check

DEFAULT_METHOD = "auto"  # the API's, the CLI's and the server's default method: change it here only
AUTO_PROPOSERS = ("draft", "lookup", "suffix")  # what auto may use
# suffix by default: +12-25 % tokens/s greedy on HumanEval / Spec-Bench, 1-6 % slower at T = 1
# (benchmarks/results/suffix/, benchmarks/results/current; docs/suffix.md)
DEFAULT_AUTO_PROPOSERS = ("draft", "lookup", "suffix")
HEAD_DIRNAME = "acceptance_head"  # specdecpp looks for its head here, in the draft's directory
MAX_TREE_NODES = 64  # auto's and suffix's max_nodes: the largest tree one round may draft
MAX_NODES_HELP = f"the largest tree a round may draft (at most {MAX_TREE_NODES})"


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
    proposers: tuple[str, ...] = DEFAULT_AUTO_PROPOSERS  # auto
    max_nodes: int = 32  # auto and suffix: the largest tree a round may draft
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


@dataclass(frozen=True)
class Option:
    """One option of one method, declared once: the CLI's flag, its type and its help are generated from it
    (cli/method_options.py). kind: "int", "float", "str", "flag" (a boolean), "path", "shape" (a tree shape such
    as 4,2,2,1) or "object" (Python only, e.g. a shared store: no flag). default: what the method applies when the
    option is not given (None: nothing, or a rule the help states)."""

    name: str
    kind: str
    help: str
    default: object = None
    bounds: tuple[int, int] | None = None  # "int": the closed range the flag accepts

    def describe(self) -> str:
        return self.help + ("" if self.default is None else f" ({self.default})")


OPTION_KINDS = ("int", "float", "str", "flag", "path", "shape", "object")


@dataclass(frozen=True)
class MethodEntry:
    """One decoding method.

    name, options: the method's name and its options (`Option`: name, kind, help, default; declared once). build(options) -> MethodConfig: validate the
    options (already stripped of None values) and fill in defaults. needs_draft: refused on a pair without a draft.
    uses_draft(config): whether a run drafts with the draft model (default: needs_draft). load(config, pair) -> dict:
    trained models read from disk, once per Decoder family (`Decoder.spawn` shares them). make_policy(config, pair,
    loaded) -> DraftPolicy: a fresh policy (its adaptive state resets every generation). tree_nodes(config): the
    most tree nodes one round may draft (sizes static caches; default: the full tree of config.tree).
    drafts_trees(config): whether a round may draft siblings, which models that attend by cache row cannot verify
    (the Decoder refuses the method there; default: a level of config.tree wider than one).
    reproducible_when_seeded: a seeded sampling run verifies with position-keyed noise by default (auto: its plans
    follow measured timings, so without the mode a seed would not fix its text; docs/reproducible.md).
    chooses_cheap_draft: given neither draft_vocab nor draft_dtype, the Decoder drafts with the fastest form of the
    draft on this machine (auto; models/cheap.choose_cheap_draft). draft_backend(config, loaded, target, pair) ->
    (target, draft): a method drafting with a trained model of its own (eagle's head) builds its draft backend from
    what it loaded and the target's backend, which it may wrap; it applies when the config names a head (config.head:
    eagle always, auto when given one). batch_draft(config, loaded, pair, slots, rows): draft_backend's form for a
    BatchEngine, an object with `cache` (the drafter's SlotCache, models/batched.py), `model` and `backends(slot,
    target) -> (target, draft)` (None: such a run is not batched). complete(config, pair) -> MethodConfig: the
    config with the defaults that depend on the pair filled in, once per Decoder before anything reads it (eagle:
    the draft shape its head recorded as fastest)."""

    name: str
    options: tuple  # Option declarations; bare names are taken as undocumented "str" options
    build: Callable[[dict], MethodConfig]
    make_policy: Callable[[MethodConfig, object, dict], DraftPolicy]
    needs_draft: bool = True
    uses_draft: Callable[[MethodConfig], bool] | None = None
    load: Callable[[MethodConfig, object], dict] | None = None
    tree_nodes: Callable[[MethodConfig], int] | None = None
    drafts_trees: Callable[[MethodConfig], bool] | None = None
    summary: str = ""
    reproducible_when_seeded: bool = False  # a seeded run at T > 0 uses the reproducible mode unless told not to
    chooses_cheap_draft: bool = False  # without draft_vocab / draft_dtype, the Decoder picks the fastest draft form
    draft_backend: Callable[[MethodConfig, dict, object, object], tuple] | None = None
    batch_draft: Callable[[MethodConfig, dict, object, int, int], object] | None = None
    complete: Callable[[MethodConfig, object], MethodConfig] | None = None

    def __post_init__(self) -> None:
        specs = tuple(o if isinstance(o, Option) else Option(str(o), "str", "") for o in self.options)
        for o in specs:
            check(o.kind in OPTION_KINDS, f"method {self.name!r}: option {o.name!r} has unknown kind {o.kind!r}")
        object.__setattr__(self, "options", specs)

    @property
    def option_names(self) -> frozenset:
        return frozenset(o.name for o in self.options)

    def drafts_with_own(self, config: MethodConfig) -> bool:
        """Whether this run drafts with a trained drafter of the method's own (draft_backend), not a draft model."""
        return self.draft_backend is not None and config.head is not None

    def drafts_with_model(self, config: MethodConfig) -> bool:
        return self.uses_draft(config) if self.uses_draft is not None else self.needs_draft

    def may_draft_trees(self, config: MethodConfig) -> bool:
        return self.drafts_trees(config) if self.drafts_trees is not None else any(w > 1 for w in config.tree)

    def max_tree_nodes(self, config: MethodConfig) -> int:
        if self.tree_nodes is not None:
            return self.tree_nodes(config)
        return sum(math.prod(config.tree[:d + 1]) for d in range(len(config.tree)))
