"""Backend conformance: the static-cache Llama backend equals the transformers backend (fp32 logits within 1e-4)
on prefill, decode and tree forwards, keeps paths like it, and generates identical greedy output."""
import pytest
import torch

from engine_utils import run
from helpers import PYCODE, needs_pycode, tiny_llama
from multispec.models import forward_chain, make_backend
from multispec.sampling import SamplingConfig
from multispec.tree import Tree

TOL = 1e-4


def _compare(model):
    hf, fast = make_backend(model, "hf"), make_backend(model, "fast")
    v = hf.vocab_size
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, v, (9,), generator=gen)
    worst = 0.0
    a, b = forward_chain(hf, prompt, want_hidden=True), forward_chain(fast, prompt, want_hidden=True)
    worst = max(worst, float((a.logits - b.logits).abs().max()), float((a.hidden - b.hidden).abs().max()))
    tree = Tree.from_shape((3, 2, 1))
    tokens = torch.randint(0, v, (len(tree),), generator=gen)
    for be in (hf, fast):
        out = be.forward(tokens, tree.position_ids(9), tree.attention_mask(9))
        be.keep(tree.keep_indices(tree.paths[-2], 9))
        be.last = out.logits
    worst = max(worst, float((hf.last - fast.last).abs().max()))
    step = torch.randint(0, v, (1,), generator=gen)
    a, b = forward_chain(hf, step), forward_chain(fast, step)
    worst = max(worst, float((a.logits - b.logits).abs().max()))
    return worst


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_random_llama_parity(kv_heads):
    assert _compare(tiny_llama(vocab=64, hidden=32, layers=2, heads=4, kv_heads=kv_heads, seed=kv_heads)) < TOL


def test_greedy_generation_identical_to_hf_backend():
    from engine_utils import tiny_pair
    from multispec.engine import default_policy, generate_ids
    from multispec.methods import build_method

    target, draft = tiny_pair(vocab=48, seed=2)
    for method, options in (("ar", {}), ("sd", {"k": 3}), ("mcsd", {"tree": (3, 2, 1)}), ("ti-mcsd", {"tree": (2, 2, 1)})):
        outs = []
        for kind in ("hf", "fast"):
            config = build_method(method, **options)
            d = make_backend(draft, kind) if method != "ar" else None
            ids, _, _ = generate_ids(make_backend(target, kind), d, [1, 2, 3], config, SamplingConfig(0.0), 30, 0,
                                     set(), policy=default_policy(config))
            outs.append(ids)
        assert outs[0] == outs[1], method


def test_unsupported_model_is_refused():
    from transformers import GPT2Config, GPT2LMHeadModel

    from multispec.errors import MultispecError

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=32))
    with pytest.raises(MultispecError, match="fast backend supports"):
        make_backend(model, "fast")


@needs_pycode
def test_pycode_parity():
    import multispec

    pair = multispec.load_pair(target=str(PYCODE / "target"), draft=str(PYCODE / "draft"), dtype="float32")
    assert _compare(pair.target) < TOL
    assert _compare(pair.draft) < TOL
