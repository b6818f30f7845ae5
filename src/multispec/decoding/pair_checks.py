"""What a Decoder checks of its pair before any model runs (the backend, trees where attention cannot verify them,
what text re-tokenization cannot draft), and the draft backend of a draft with another tokenizer."""
from __future__ import annotations

from multispec.decoding.methods import MethodConfig, get_method
from multispec.errors import MultispecError, check
from multispec.models.int8 import QUANT_DTYPES
from multispec.loading import Pair, max_positions, vocab_rows


def default_backend(pair: Pair, uses_draft: bool = True) -> str:
    """The backend a run takes when none is given, one rule for the library, the CLI and the server (single
    sequences and batches alike): the fast one wherever the target, and the draft when the run drafts with it (a
    draft of another tokenizer included: its own fast backend behind the vocabulary bridge), have a fast form;
    compiled for a pair loaded with compile=True; else the transformers backend, which runs any causal LM."""
    if pair.compile:
        return "compiled"
    try:
        for model in (pair.target, pair.draft if uses_draft else None):
            if model is not None:
                pair.sidecar(model).fast_net()  # refuses a family the fast backend does not run (models/fast.py)
    except MultispecError:
        return "hf"
    return "fast"


def backend_name(pair: Pair, backend, uses_draft: bool = True) -> str:
    """The backend to run: `backend` checked, or the default (default_backend; uses_draft: the run drafts with the
    pair's draft model)."""
    from multispec.models import BACKENDS

    if backend is None:
        return default_backend(pair, uses_draft)
    check(backend in BACKENDS, f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    check(not (pair.compile and backend == "hf"),
          "backend 'hf' asked for on a pair loaded with compile=True; compiling applies to the fast backend")
    dtype = pair.sidecar(pair.target).weights_dtype
    check(backend != "compiled" or dtype not in QUANT_DTYPES,
          f"the compiled backend does not run {dtype} models; use the fast or hf backend")
    return backend


def cross_vocab_backend(pair: Pair, draft_model, kind: str, depth: int = 0):
    """The draft's backend in the target's token ids for a draft of another tokenizer (pair.cross_vocab): its own
    backend, sized to its own positions (at most 4,096 rows), behind the mode's wrapper. depth: the method's chain
    depth (0: adaptive, e.g. auto); re-tokenization drafts half as many draft tokens again per proposal (a target
    token often spans more than one of a smaller vocabulary's), at most 8."""
    from multispec.models import make_backend
    from multispec.models.intersection import IntersectionDraft
    from multispec.models.retokenize import RetokenizedDraft

    if pair.draft is None:  # callers build it for a pair with a cross-vocabulary draft only
        raise RuntimeError("cross_vocab_backend: the pair has no draft")
    rows = min(max_positions(pair.draft) or 4096, 4096)
    inner = make_backend(draft_model, kind, **({} if kind == "hf" else {"max_len": rows}),
                         sidecar=pair.sidecar(draft_model))
    if pair.cross_vocab == "uag":
        lookahead = min(8, depth + depth // 2 + 1) if depth else 8
        return RetokenizedDraft(inner, pair.tokenizer, pair.draft_tokenizer, vocab_rows(pair.target), rows,
                                lookahead)
    if pair.bridge is None:  # load_pair sets it with cross_vocab
        raise RuntimeError("cross_vocab_backend: the pair has no vocabulary bridge")
    return IntersectionDraft(inner, pair.bridge, rows)


def refuse_where_retokenizing(config: MethodConfig, entry, policy) -> None:
    """Text re-tokenization proposes one deterministic chain, with no draft hidden states: refuse what needs more."""
    check(not entry.may_draft_trees(config), f"method {config.name!r} drafts token trees, and a draft re-tokenized "
                                             "from text proposes one chain; use sd or auto, or cross_vocab='tli'")
    check(not policy.needs_hidden,
          f"method {config.name!r} reads the draft's hidden states, which text re-tokenization does not have; use "
          "sd or auto, or cross_vocab='tli'")


def refuse_trees_where_inexact(pair: Pair, config: MethodConfig, uses_draft: bool) -> None:
    """Models whose attention depends on cache-row order or uses ALiBi by row (MPT, GPT-Neo local layers, Bloom,
    Falcon-ALiBi) verify chains exactly but not token trees: refuse tree methods here, before any model runs
    (`auto` keeps to chains for them itself, see its registry entry)."""
    from multispec.models import tree_refusal

    if not get_method(config.name).may_draft_trees(config):
        return
    reason = tree_refusal(pair.target, pair.sidecar(pair.target)) or (
        tree_refusal(pair.draft, pair.sidecar(pair.draft)) if uses_draft and pair.draft is not None else None)
    check(reason is None, f"method {config.name!r} drafts token trees, and tree methods are not supported on this "
                          f"model ({reason}); use auto, sd, specdecpp, lookup or ar")
