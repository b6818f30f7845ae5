"""The transformers backend: tree forwards equal per-path sequential forwards; keeping a path equals a fresh pass."""
import torch

from helpers import tiny_llama
from multispec.models import forward_chain, make_backend
from multispec.tree import Tree

TOL = 1e-4  # fp32


def _fresh_logits(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0].float()


def test_tree_forward_matches_sequential_paths():
    model = tiny_llama(vocab=50, kv_heads=2)
    backend = make_backend(model)
    prefix = [3, 14, 15, 9, 2]
    tree = Tree.from_shape((3, 2, 1))
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 50, (len(tree),), generator=gen)
    forward_chain(backend, torch.tensor(prefix))
    out = backend.forward(tokens, tree.position_ids(len(prefix)), tree.attention_mask(len(prefix)))
    for path in tree.paths:
        ids = prefix + tokens[list(path)].tolist()
        ref = _fresh_logits(model, ids)[len(prefix):]
        assert torch.allclose(out.logits[list(path)], ref, atol=TOL), path


def test_keep_path_then_decode_equals_fresh_pass():
    model = tiny_llama(vocab=50, kv_heads=1)
    backend = make_backend(model)
    prefix = [1, 2, 3]
    tree = Tree.from_shape((2, 2, 2))
    tokens = torch.arange(len(tree)) % 50 + 5
    forward_chain(backend, torch.tensor(prefix))
    backend.forward(tokens, tree.position_ids(3), tree.attention_mask(3))
    path = tree.paths[-1]
    backend.keep(tree.keep_indices(path, 3))
    assert backend.cache_len == 3 + len(path)
    nxt = torch.tensor([7, 8])
    out = forward_chain(backend, nxt)
    ids = prefix + tokens[list(path)].tolist() + nxt.tolist()
    assert torch.allclose(out.logits, _fresh_logits(model, ids)[-2:], atol=TOL)


def test_sliced_mask_gives_same_logits_as_full_tree():
    model = tiny_llama(vocab=40)
    full = Tree.from_shape((3, 1, 1, 1))
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 40, (len(full),), generator=gen)
    a, b = make_backend(model), make_backend(model)
    for be in (a, b):
        forward_chain(be, torch.tensor([4, 5, 6]))
    out_full = a.forward(tokens, full.position_ids(3), full.attention_mask(3))
    n = full.level_end(2)
    sliced = full.attention_mask(3, rows=range(n), cols=n)
    out_cut = b.forward(tokens[:n], full.position_ids(3)[:n], sliced)
    assert torch.allclose(out_full.logits[:n], out_cut.logits, atol=TOL)
