"""The method options shared by `multispec generate` and `multispec serve`: one list, so that the two commands
take the same options with the same help (build_method validates them)."""
import click

from multispec.decoding.methods import MAX_TREE_NODES

_OPTIONS = [  # click decorators, in the order --help lists them
    click.option("--k", type=int, help="sd: draft tokens per round (default 4); lookup: at most this many (10)."),
    click.option("--heuristic", is_flag=True, default=None, help="sd: adjust k like transformers (+2 / -1)."),
    click.option("--confidence", type=float, help="sd / dynamic: stop drafting once the draft's probability of its "
              "newest token is below this (transformers' assistant_confidence_threshold, e.g. 0.4)."),
    click.option("--entropy", type=float, help="sd / dynamic: stop drafting once AdaEDL's acceptance bound "
              "1 - sqrt(H(q)) is below this."),
    click.option("--ngram", type=int, help="lookup: longest n-gram matched in the context (3)."),
    click.option("--proposers", help="auto: any of draft,lookup,suffix (default all three; also draft+lookup); "
                 "draft alone needs a draft model."),
    click.option("--max-nodes", type=click.IntRange(1, MAX_TREE_NODES),
                 help=f"auto / suffix: the largest tree it may draft (32 / 16; at most {MAX_TREE_NODES})."),
    click.option("--tree", help="mcsd / ti-mcsd: tree shape, e.g. 4,2,2,1 (ti-mcsd: 2,4,3,1,1)."),
    click.option("--verifier", help="sd / specdecpp: sd or block; mcsd / dynamic: verifier name, e.g. traversal "
                 "(see `multispec verifiers`)."),
    click.option("--width", type=int, help="ti-mcsd / dynamic: first-level width W."),
    click.option("--depth", type=int, help="dynamic: maximum draft depth."),
    click.option("--target-init", is_flag=True, default=None, help="dynamic: level 1 from the target (lossy if W>=2)."),
    click.option("--decision-model", type=click.Path(), help="dynamic: decision-model directory."),
    click.option("--beta", type=float, help="dynamic: stop when every chain's predicted acceptance < beta (0.4)."),
    click.option("--head", type=click.Path(), help="specdecpp: acceptance-head directory."),
    click.option("--threshold", type=float, help="specdecpp: stop when P(some rejection) > h (0.7)."),
    click.option("--k-min", type=int, help="specdecpp: minimum draft length (2)."),
    click.option("--k-max", type=int, help="specdecpp: maximum draft length (20)."),
    click.option("--draft-vocab", type=int, help="Any method drafting with the draft model: its output layer on the "
                 "N most frequent tokens plus the prompt's (a cheaper draft; output unchanged)."),
    click.option("--draft-dtype", type=click.Choice(["float32", "int8"]), help="int8: int8 draft weights (CPU; a "
                 "cheaper draft; output unchanged)."),
]


def method_options(command):
    """Decorator: add every method option to a click command (it receives them as keyword arguments)."""
    for add in reversed(_OPTIONS):
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
