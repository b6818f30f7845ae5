"""The method registry: every decoding method is one `MethodEntry` (decoding/method_entry.py). The built-in ones are
declared in decoding/builtin_methods.py, auto_method.py and eagle_method.py and listed once, in order, in
`ALL_METHODS`; the lookup table is built from it, so importing this module is enough to see them all. `register`
adds a user's method (generate, bench, serve and the CLI see it at once).
"""
from __future__ import annotations

from multispec.decoding.auto_method import AUTO
from multispec.decoding.builtin_methods import METHODS
from multispec.decoding.eagle_method import EAGLE
from multispec.decoding.method_entry import (AUTO_PROPOSERS, DEFAULT_AUTO_PROPOSERS, DEFAULT_METHOD,  # noqa: F401
                                             HEAD_DIRNAME, MAX_NODES_HELP, MAX_TREE_NODES, OPTION_KINDS, MethodConfig,
                                             MethodEntry, Option)
from multispec.drafting.protocol import DraftPolicy
from multispec.errors import check

ALL_METHODS: tuple[MethodEntry, ...] = (AUTO, *METHODS, EAGLE)  # the built-ins, in the order the CLI lists them

REGISTRY: dict[str, MethodEntry] = {entry.name: entry for entry in ALL_METHODS}


def register(entry: MethodEntry, replace: bool = False) -> MethodEntry:
    """Add a user's method to the registry (generate, bench, serve and the CLI see it at once)."""
    check(replace or entry.name not in REGISTRY, f"method {entry.name!r} is already registered")
    REGISTRY[entry.name] = entry
    return entry


def unregister(name: str) -> None:
    REGISTRY.pop(name, None)


def method_names() -> tuple[str, ...]:
    return tuple(REGISTRY)


def get_method(name: str) -> MethodEntry:
    from multispec.params import SamplingParams

    check(not isinstance(name, SamplingParams), "method must be a string, got a SamplingParams: sampling settings "
                                                "go to generate (decoder.generate(prompt, SamplingParams(...)), "
                                                "params= or keywords), not in the method's place")
    check(isinstance(name, str), f"method must be a string, got {name!r}")
    check(name in REGISTRY, f"unknown method {name!r}; choose one of {', '.join(REGISTRY)}")
    return REGISTRY[name]


def build_method(name: str, **options) -> MethodConfig:
    """Validate `name` and its options; raise MultispecError naming the first problem."""
    entry = get_method(name)
    options = {k: v for k, v in options.items() if v is not None}
    unknown = set(options) - entry.option_names
    check(not unknown, f"method {name!r} does not take option(s) {', '.join(sorted(unknown))}; "
                       f"it takes {', '.join(sorted(entry.option_names)) or 'none'}")
    return entry.build(options)


def build_policy(config: MethodConfig, pair=None, loaded: dict | None = None) -> DraftPolicy:
    """The draft policy of `config`, loading its trained models unless `loaded` holds them. pair: the loaded Pair
    (None in tests that drive the engine directly: then no trained models and every auto proposer is allowed)."""
    entry = get_method(config.name)
    if loaded is None:
        loaded = entry.load(config, pair) if entry.load is not None else {}
    return entry.make_policy(config, pair, loaded)
