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


def test_no_mask_is_the_causal_chain_also_past_a_window_and_after_a_kept_path():
    """mask=None (the cheap path) gives the logits of the explicit chain mask: on a fresh cache, for one-token
    decodes, past a sliding window, and after keeping a tree path whose rows are not a cache prefix."""
    from compat_archs import build
    from multispec.models.base import causal_mask

    model = build("gemma2")  # sliding + full layers, window 6, soft-caps
    cheap, explicit = make_backend(model), make_backend(model)
    masks_given = []
    own = cheap.model

    def spy(**kwargs):
        masks_given.append(kwargs["attention_mask"])
        return own(**kwargs)

    cheap.model = spy
    tree = Tree.from_shape((2, 2))
    tokens = torch.arange(len(tree)) * 7 % 64
    ids = []
    steps = [torch.tensor([5, 17, 3, 42, 9, 28, 11, 60]), torch.tensor([2]), torch.tensor([30, 31]), "tree",
             torch.tensor([12]), torch.tensor([13, 14, 15]), torch.tensor([16])]
    for step in steps:
        if isinstance(step, str):
            start = cheap.cache_len
            for be in (cheap, explicit):
                be.forward(tokens, tree.position_ids(start), tree.attention_mask(start))
                be.keep(tree.keep_indices(tree.paths[-1], start))
            ids += tokens[list(tree.paths[-1])].tolist()
            continue
        start, n = cheap.cache_len, step.shape[0]
        positions = torch.arange(start, start + n)
        a = cheap.forward(step, positions, None, want_hidden=True)
        b = explicit.forward(step, positions, causal_mask(start, n), want_hidden=True)
        assert torch.allclose(a.logits, b.logits, atol=TOL) and torch.allclose(a.hidden, b.hidden, atol=TOL)
        ids += step.tolist()
        assert torch.allclose(a.logits, _fresh_logits(model, ids)[-n:], atol=TOL)
    assert cheap.cache_len == explicit.cache_len == len(ids) > 12
    tree_call = 3
    assert all(m is None for i, m in enumerate(masks_given) if i != tree_call)  # no mask built on the cheap path
    assert isinstance(masks_given[tree_call], dict)  # gemma2: one mask per layer type


def test_max_positions_is_the_config_limit():
    from compat_archs import build

    assert make_backend(build("llama")).max_positions == 128
    assert make_backend(build("gpt2")).max_positions == 128


def test_row_ordered_attention_runs_chains_and_refuses_trees_in_one_line():
    from compat_archs import build
    from multispec.errors import MultispecError

    backend = make_backend(build("mpt"))
    forward_chain(backend, torch.tensor([1, 2, 3]))
    tree = Tree.from_shape((2, 1))
    try:
        backend.forward(torch.tensor([4, 5, 6, 7]), tree.position_ids(3), tree.attention_mask(3))
    except MultispecError as e:
        assert "ALiBi" in str(e) and "\n" not in str(e)
    else:
        raise AssertionError("a tree forward on an ALiBi-by-row model was not refused")


def test_load_pair_refuses_a_recurrent_model_in_one_line(tmp_path):
    import pytest

    import multispec
    from compat_archs import build
    from multispec.errors import MultispecError

    build("mamba").save_pretrained(tmp_path / "mamba")
    with pytest.raises(MultispecError, match="recurrent") as err:
        multispec.load_pair(target=str(tmp_path / "mamba"), device="cpu")
    assert "\n" not in str(err.value)


def test_a_position_past_the_limit_is_refused_in_one_line():
    import pytest

    from compat_archs import build
    from multispec.errors import MultispecError

    backend = make_backend(build("gpt2"))  # learned absolute positions: 128
    forward_chain(backend, torch.arange(128) % 64)  # positions 0..127: all of them
    with pytest.raises(MultispecError, match="limit of 128 positions"):
        forward_chain(backend, torch.tensor([1]))
