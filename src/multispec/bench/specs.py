"""Method specs of `multispec bench`: a method name plus options, `name[:key=value[,key=value...]]`.

    ar                                   sd:k=4                       sd:heuristic=1
    mcsd:tree=4-2-2-1,verifier=rrs-wor   ti-mcsd:tree=2-4-3-1-1       dynamic:width=4,depth=5,decision_model=PATH
    specdecpp:head=PATH,threshold=0.7    hf-assisted                  hf-assisted:num_assistant_tokens=6
    hf-assisted:best                     auto:proposers=draft+lookup,max_nodes=16            dynamic:target_init=false
    sd:k=4,draft_vocab=1024,draft_dtype=int8 (the Decoder's draft options)                  auto:backend=fast

List values use '-' (tree shapes: levels) or '+' (auto's proposers) between items, since ',' separates options.
Booleans (heuristic, target_init) are strict: true/false/1/0, any case; anything else is refused. Other values are
parsed as int, then float, else kept as text. Every spec is validated by
`multispec.decoding.methods.build_method` (or the hf-assisted rules) before any model loads.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from multispec.errors import MultispecError, check, parse_bool
from multispec.decoding.methods import REGISTRY, MethodConfig, build_method, method_names
from multispec.models import BACKENDS

HF_ASSISTED = "hf-assisted"
DECODER_OPTIONS = ("draft_vocab", "draft_dtype")  # options of the Decoder (any method that drafts), not of a method
HF_BEST_SWEEP = (1, 2, 3, 4, 6, 8)
BOOL_OPTIONS = {"heuristic", "target_init"}


@dataclass(frozen=True)
class MethodSpec:
    """One benchmarked method. label: the spec text, normalized (the row name in every table).
    config: the validated MethodConfig (None for hf-assisted). hf_tokens: hf-assisted's fixed
    num_assistant_tokens (None: transformers' defaults); hf_best: sweep HF_BEST_SWEEP and keep the fastest."""

    label: str
    name: str
    options: dict = field(default_factory=dict)
    config: MethodConfig | None = None
    hf_tokens: int | None = None
    hf_best: bool = False
    backend: str = "hf"
    decoder_options: dict = field(default_factory=dict)  # draft_vocab / draft_dtype: the Decoder's, not the method's

    @property
    def lossless(self) -> bool:
        return True if self.config is None else self.config.lossless


def parse_method_specs(text: str) -> list[MethodSpec]:
    """'ar;sd:k=4;mcsd:tree=4-2-2-1' -> validated MethodSpecs, in order; duplicate labels are refused."""
    parts = [p.strip() for p in str(text).split(";") if p.strip()]
    check(parts, "no methods given; e.g. --methods 'ar;sd:k=4;mcsd:tree=4-2-2-1'")
    specs = [parse_method_spec(p) for p in parts]
    labels = [s.label for s in specs]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    check(not dup, f"method spec(s) given twice: {', '.join(dup)}")
    return specs


def check_draft_given(specs: list[MethodSpec], has_draft: bool, hf_assisted_drafts: bool = True) -> None:
    """Before any model loads: refuse the specs that need a draft model when none is given, naming them and the
    methods that need none. hf_assisted_drafts: whether hf-assisted runs here with the draft (the batched bench
    runs transformers' plain batched generate instead)."""
    needing = [s.label for s in specs if (s.name == HF_ASSISTED and hf_assisted_drafts)
               or (s.name in REGISTRY and REGISTRY[s.name].needs_draft)]
    if has_draft or not needing:
        return
    free = ", ".join(name for name, entry in REGISTRY.items() if not entry.needs_draft)
    raise MultispecError(f"{', '.join(needing)} need{'s' if len(needing) == 1 else ''} a draft model: pass --draft, "
                         f"or bench methods that need none ({free})")


def parse_method_spec(text: str) -> MethodSpec:
    """One spec, e.g. 'mcsd:tree=4-2-2-1,verifier=rrs-wor'. Raises MultispecError naming the problem."""
    text = text.strip()
    name, _, rest = text.partition(":")
    name = name.strip()
    known = (*method_names(), HF_ASSISTED)
    check(name in known, f"method spec {text!r}: unknown method {name!r}; choose one of {', '.join(known)}")
    options: dict = {}
    flags: list[str] = []
    for item in (x.strip() for x in rest.split(",") if rest.strip()):
        check(item != "", f"method spec {text!r}: empty option (stray ',')")
        key, eq, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not eq:
            flags.append(key)
            continue
        check(key != "" and value.strip() != "", f"method spec {text!r}: option {item!r} is not key=value")
        check(key not in options, f"method spec {text!r}: option {key!r} given twice")
        options[key] = _value(key, value.strip())
    if name == HF_ASSISTED:
        return _hf_spec(text, options, flags)
    check(not flags, f"method spec {text!r}: option(s) {', '.join(flags)} need a value (key=value)")
    backend = options.pop("backend", "hf")
    check(backend in BACKENDS, f"method spec {text!r}: unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    decoder_options = {k: options.pop(k) for k in DECODER_OPTIONS if k in options}
    try:
        for key in BOOL_OPTIONS & set(options):
            options[key] = parse_bool(options[key], key)
        config = build_method(name, **options)
        from multispec.models.cheap import CheapDraft

        CheapDraft(vocab=decoder_options.get("draft_vocab"), dtype=decoder_options.get("draft_dtype"))
    except MultispecError as e:
        raise MultispecError(f"method spec {text!r}: {e}") from None
    label_options = {**options, **decoder_options, **({} if backend == "hf" else {"backend": backend})}
    return MethodSpec(label=_label(name, label_options), name=name, options=options, config=config, backend=backend,
                      decoder_options=decoder_options)


def _hf_spec(text: str, options: dict, flags: list[str]) -> MethodSpec:
    best = flags == ["best"] or options.get("num_assistant_tokens") == "best"
    check(all(f == "best" for f in flags), f"method spec {text!r}: unknown flag(s) {', '.join(flags)}; "
                                           "hf-assisted takes num_assistant_tokens=N or best")
    unknown = set(options) - {"num_assistant_tokens"}
    check(not unknown, f"method spec {text!r}: hf-assisted does not take {', '.join(sorted(unknown))}; "
                       "it takes num_assistant_tokens=N, or best")
    if best:
        check(len(flags) + len(options) == 1, f"method spec {text!r}: 'best' takes no other option")
        return MethodSpec(label=f"{HF_ASSISTED}:best", name=HF_ASSISTED, options={"best": True}, hf_best=True)
    n = options.get("num_assistant_tokens")
    if n is None:
        return MethodSpec(label=HF_ASSISTED, name=HF_ASSISTED)
    check(isinstance(n, int) and n >= 1, f"method spec {text!r}: num_assistant_tokens must be an integer >= 1")
    return MethodSpec(label=_label(HF_ASSISTED, options), name=HF_ASSISTED, options=options, hf_tokens=n)


def _value(key: str, v: str):
    if key == "tree":
        return v.replace("-", ",")  # build_method parses and validates the shape
    if key in ("head", "decision_model", "verifier", "proposers"):
        return v
    for cast in (int, float):
        try:
            return cast(v)
        except ValueError:
            pass
    return v


def _label(name: str, options: dict) -> str:
    if not options:
        return name
    text = {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in options.items()}
    shown = [f"{k}={v.replace(',', '-')}" for k, v in text.items()]
    return f"{name}:{','.join(shown)}"
