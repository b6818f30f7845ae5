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
from multispec.models.layout import attention_layout
from multispec.tree import Tree

_TOL = {torch.float32: 1e-3, torch.float64: 1e-6}  # relative to the largest |logit|; half precision: 5e-2


def probe_model(model: torch.nn.Module, name: str) -> None:
    """Raise MultispecError naming `name` unless the backend reproduces the model's own logits."""
    from multispec.models.hf import HFBackend

    head = model.get_output_embeddings()
    if head is None or getattr(head, "weight", None) is None:
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
    vocab = backend.vocab_size
    prefix = torch.randint(0, vocab, (n_prefix,), generator=gen).tolist()

    def full(ids: list[int]) -> torch.Tensor:  # the model's own logits, no cache: float32 [len(ids), V]
        out = model(input_ids=torch.tensor([ids], device=backend.device))
        return out.logits[0].float()

    def err(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a - b).abs().max()) / (1.0 + float(b.abs().max()))

    ref = full(prefix + [1, 2])
    got = [forward_chain(backend, torch.tensor(prefix)).logits]
    for t in (1, 2):
        got.append(forward_chain(backend, torch.tensor([t])).logits)
    worst = err(torch.cat(got), ref)
    if worst > tol:
        return worst, "its cached chain logits"
    if layout.tree_refusal:
        return None, ""
    base = backend.cache_len
    ids = prefix + [1, 2]
    tree = Tree.from_shape((2, 2, 1))
    tokens = torch.randint(0, vocab, (len(tree),), generator=gen)
    out = backend.forward(tokens, tree.position_ids(base), tree.attention_mask(base))
    for path in tree.paths:
        ref = full(ids + tokens[list(path)].tolist())[base:]
        worst = max(worst, err(out.logits[list(path)], ref))
    path = tree.paths[0]
    backend.keep(tree.keep_indices(path, base))
    nxt = forward_chain(backend, torch.tensor([3])).logits
    worst = max(worst, err(nxt, full(ids + tokens[list(path)].tolist() + [3])[-1:]))
    return (worst, "its tree logits") if worst > tol else (None, "")
