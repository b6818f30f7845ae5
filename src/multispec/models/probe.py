"""The load-time probe: decode a few tokens through the transformers backend the way the engine does (prefill,
one-token decodes, a token tree, keeping one of its paths) and compare every logit with the model's own forward
over the whole sequence without a cache. What disagrees, or raises, is refused in one line at `load_pair`, so a
model is either decoded exactly or not loaded, never wrong or a traceback mid-generation.

Costs a handful of forwards of at most ~40 tokens (more only when a sliding window is shorter, to cross it).
"""
from __future__ import annotations

import torch

from multispec.errors import MultispecError
from multispec.models.base import forward_chain
from multispec.models.int8 import is_int8
from multispec.models.layout import attention_layout
from multispec.tree import Tree

_TOL = {torch.float32: 1e-3, torch.float64: 1e-6}  # relative to the largest |logit|; half precision: 5e-2


def probe_model(model: torch.nn.Module, name: str) -> None:
    """Raise MultispecError naming `name` unless the backend reproduces the model's own logits."""
    from multispec.models.hf import HFBackend

    head = model.get_output_embeddings()
    if head is None or (getattr(head, "weight", None) is None and not is_int8(head)):
        raise MultispecError(f"{name}: unsupported model (no output embedding)")
    try:
        layout = attention_layout(model.config)
    except MultispecError as e:
        raise MultispecError(f"{name}: {e}") from None
    try:
        worst, where = _probe(model, HFBackend(model, layout), layout)
    except MultispecError:
        raise
    except Exception as e:  # any failure of a model's own code is a refusal, said in one line
        first = (str(e).splitlines() or [""])[0][:200]
        raise MultispecError(f"{name}: unsupported model: its forward fails with a key/value cache and explicit "
                             f"masks ({type(e).__name__}: {first})") from None
    if worst is not None:
        raise MultispecError(f"{name}: unsupported model: {where} disagree with its own full forward "
                             f"(max logit error {worst:.3g}); it cannot be decoded exactly")


@torch.inference_mode()
def _probe(model, backend, layout) -> tuple[float | None, str]:
    dtype = next(model.parameters()).dtype
    tol = _TOL.get(dtype, 5e-2)
    windows = [w for w in layout.windows.values()]
    n_prefix = max(8, min(windows, default=0) + 3) if min(windows, default=1 << 30) <= 64 else 8
    gen = torch.Generator().manual_seed(0)
    allowed = _text_ids(model.config, backend.vocab_size)
    prefix = allowed[torch.randint(0, len(allowed), (n_prefix,), generator=gen)].tolist()

    def full(ids: list[int]) -> torch.Tensor:  # the model's own logits, no cache: float32 [len(ids), V]
        out = model(input_ids=torch.tensor([ids], device=backend.device))
        return out.logits[0].float()

    def err(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a - b).abs().max()) / (1.0 + float(b.abs().max()))

    a, b, c = allowed[:3].tolist()
    ref = full(prefix + [a, b])
    got = [forward_chain(backend, torch.tensor(prefix)).logits]
    for t in (a, b):
        got.append(forward_chain(backend, torch.tensor([t])).logits)
    worst = err(torch.cat(got), ref)
    if worst > tol:
        return worst, "its cached chain logits"
    if layout.tree_refusal:
        return None, ""
    base = backend.cache_len
    ids = prefix + [a, b]
    tree = Tree.from_shape((2, 2, 1))
    tokens = allowed[torch.randint(0, len(allowed), (len(tree),), generator=gen)]
    out = backend.forward(tokens, tree.position_ids(base), tree.attention_mask(base))
    for path in tree.paths:
        ref = full(ids + tokens[list(path)].tolist())[base:]
        worst = max(worst, err(out.logits[list(path)], ref))
    path = tree.paths[0]
    backend.keep(tree.keep_indices(path, base))
    nxt = forward_chain(backend, torch.tensor([c])).logits
    worst = max(worst, err(nxt, full(ids + tokens[list(path)].tolist() + [c])[-1:]))
    return (worst, "its tree logits") if worst > tol else (None, "")


def _text_ids(config, vocab: int) -> torch.Tensor:
    """long [K]: token ids for the probe, without the config's special ids (image / video placeholders would make
    a multimodal model expect pixels)."""
    special = set()
    for cfg in (config, config.get_text_config(decoder=True)):
        for key, value in vars(cfg).items():
            if key.endswith(("token_id", "token_index", "token_ids")) and value is not None:
                special.update(value if isinstance(value, (list, tuple)) else [value])
    ids = torch.tensor([i for i in range(min(vocab, 4096)) if i not in special], dtype=torch.long)
    return ids if len(ids) >= 3 else torch.arange(vocab)
