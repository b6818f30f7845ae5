"""The method registry as the rest of the package imports it: every decoding method is one `MethodEntry` — its
options, whether it needs a draft, how it builds its validated `MethodConfig` (before any model runs, style §2.9),
which trained models it loads, and how it builds its draft policy (decoding/method_entry.py). The built-ins are
declared in decoding/builtin_methods.py, auto_method.py and eagle_method.py and listed once in
`registry.ALL_METHODS`; a new method is one `register(MethodEntry(...))` plus one policy (drafting/protocol.py),
and a new draft source one proposer (drafting/proposers.py).
"""
from __future__ import annotations

from multispec.decoding.method_entry import (AUTO_PROPOSERS, DEFAULT_AUTO_PROPOSERS, DEFAULT_METHOD,  # noqa: F401
                                             HEAD_DIRNAME, MAX_NODES_HELP, MAX_TREE_NODES, MethodConfig, MethodEntry,
                                             Option)
from multispec.decoding.registry import (ALL_METHODS, REGISTRY, build_method, build_policy, get_method,  # noqa: F401
                                         method_names, register, unregister)
