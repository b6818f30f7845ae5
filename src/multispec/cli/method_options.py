"""The method options of `multispec generate` and `multispec serve`, generated from the method registry: each
method declares its options once (decoding/registry.py `Option`: kind, help, default), and every option of every
registered method gets one flag here, its help naming what each method makes of it. build_method validates the
values (one line, before any model loads)."""
import click

from multispec.decoding.methods import REGISTRY, Option

_CLICK_TYPES = {"int": int, "float": float, "str": str, "shape": str, "path": click.Path()}


def _flag(name: str, declared: list[tuple[str, Option]]):
    """One click option for `name`, declared by each (method, Option) in `declared`."""
    kinds = {o.kind for _, o in declared}
    kind = declared[0][1].kind if len(kinds) == 1 else "str"  # methods disagreeing: build_method parses
    said: dict[str, list[str]] = {}  # one help text, the methods that say it
    for m, o in declared:
        said.setdefault(o.describe().removeprefix(f"{m}: "), []).append(m)  # the method is named once, below
    text = "; ".join(f"{' / '.join(ms)}: {d}" for d, ms in said.items()) + "."
    flag = "--" + name.replace("_", "-")
    if kind == "flag":
        return click.option(flag, is_flag=True, default=None, help=text)
    bounds = {o.bounds for _, o in declared}
    if kind == "int" and len(bounds) == 1 and None not in bounds:
        return click.option(flag, type=click.IntRange(*declared[0][1].bounds), help=text)
    return click.option(flag, type=_CLICK_TYPES[kind], help=text)


def _registry_options() -> list:
    by_name: dict[str, list[tuple[str, Option]]] = {}
    for entry in REGISTRY.values():
        for o in entry.options:
            if o.kind != "object":  # Python objects (a shared store) have no command-line form
                by_name.setdefault(o.name, []).append((entry.name, o))
    return [_flag(name, declared) for name, declared in by_name.items()]


_DECODER_OPTIONS = [  # the Decoder's own options, for every method drafting with the draft model
    click.option("--draft-vocab", type=int, help="Any method drafting with the draft model: its output layer on the "
                 "N most frequent tokens plus the prompt's (a cheaper draft; output unchanged)."),
    click.option("--draft-dtype", type=click.Choice(["float32", "int8"]), help="int8: int8 draft weights (CPU; a "
                 "cheaper draft; output unchanged)."),
]


def method_options(command):
    """Decorator: add every method option to a click command (it receives them as keyword arguments)."""
    for add in reversed(_registry_options() + _DECODER_OPTIONS):  # read when the command is built
        command = add(command)
    return command


def collect_method_options(kwargs: dict) -> dict:
    """The method options given on the command line (None = not given), the tree shape parsed."""
    from multispec.tree import parse_shape

    options = {key: v for key, v in kwargs.items() if v is not None}
    if "tree" in options:
        options["tree"] = parse_shape(options["tree"])
    return options


def check_method_options(method: str | None, options: dict):
    """Validate the method's options and the Decoder's draft options (draft_vocab, draft_dtype) before any model
    loads; returns the MethodConfig (None when method is None: the default method with no options checked). The
    keyed verifiers are refused here, pointing to --reproducible, the way to run them."""
    from multispec.api import KEYED_VERIFIERS
    from multispec.decoding.methods import DEFAULT_METHOD, build_method
    from multispec.models.cheap import CheapDraft
    from multispec.errors import check

    verifier = options.get("verifier")
    check(verifier not in KEYED_VERIFIERS, f"--verifier {verifier} is the keyed verifier of the reproducible mode, "
                                           "chosen by --reproducible --seed N under any method (server requests: "
                                           "\"reproducible\": true); docs/reproducible.md")

    CheapDraft(vocab=options.get("draft_vocab"), dtype=options.get("draft_dtype"))
    method_only = {k: v for k, v in options.items() if k not in ("draft_vocab", "draft_dtype")}
    return build_method(method or DEFAULT_METHOD, **method_only)
