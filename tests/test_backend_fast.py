"""Backend conformance: the static-cache Llama backend equals the transformers backend (fp32 logits within 1e-4)
on prefill, decode and tree forwards, keeps paths like it, and generates identical greedy output."""
import pytest
import torch

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
    from multispec.decoding.engine import generate_ids
    from multispec.decoding.methods import build_policy
    from multispec.decoding.methods import build_method

    target, draft = tiny_pair(vocab=48, seed=2)
    for method, options in (("ar", {}), ("sd", {"k": 3}), ("mcsd", {"tree": (3, 2, 1)}), ("ti-mcsd", {"tree": (2, 2, 1)})):
        outs = []
        for kind in ("hf", "fast"):
            config = build_method(method, **options)
            d = make_backend(draft, kind) if method != "ar" else None
            ids, _ = generate_ids(make_backend(target, kind), d, [1, 2, 3], config, SamplingConfig(0.0), 30, 0,
                                     set(), policy=build_policy(config))
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


FAMILY_ARCHS = ("llama", "llama-tied", "llama-rope-linear", "llama-rope-llama3", "mistral", "mistral-window", "qwen2",
                "qwen2-window", "qwen3", "gemma", "gemma2",
                "gemma3", "phi3", "granite", "smollm3", "olmo2", "olmo3")


@pytest.mark.parametrize("name", FAMILY_ARCHS)
def test_family_parity_and_greedy_identity(name):
    """Each claimed family (compat_archs: windows shorter than the sequence, biting soft-caps, logit scaling):
    logits equal the transformers backend's, and greedy output of ar / sd / mcsd is identical on both backends."""
    import copy

    from compat_archs import build
    from multispec.decoding.engine import generate_ids
    from multispec.decoding.methods import build_policy
    from multispec.decoding.methods import build_method

    target = build(name)
    assert _compare(target) < TOL
    draft = copy.deepcopy(target)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for prm in draft.parameters():
            prm.add_(0.05 * prm.std() * torch.randn(prm.shape, generator=g) if prm.numel() > 1 else 0)
    for method, options in (("ar", {}), ("sd", {"k": 3}), ("mcsd", {"tree": (3, 2, 1)})):
        outs = []
        for kind in ("hf", "fast"):
            config = build_method(method, **options)
            d = make_backend(draft, kind) if method != "ar" else None
            ids, _ = generate_ids(make_backend(target, kind), d, [5, 17, 3, 42], config, SamplingConfig(0.0), 20,
                                     0, set(), policy=build_policy(config))
            outs.append(ids)
        assert outs[0] == outs[1], method


def test_no_mask_chain_and_cache_size():
    """mask=None equals the explicit chain mask (past the window too); max_len sizes the cache, and a forward past
    it is refused in one line."""
    from compat_archs import build
    from multispec.errors import MultispecError
    from multispec.models.base import causal_mask

    model = build("mistral-window")
    cheap, explicit = make_backend(model, "fast", max_len=20), make_backend(model, "fast", max_len=20)
    assert cheap.max_positions == 20 and make_backend(model, "fast").max_positions == 128  # the config's limit
    assert make_backend(model, "fast").max_len == 128 + 256  # room for a round's tree at the limit
    for step in (torch.arange(9) + 3, torch.tensor([4]), torch.tensor([5, 6]), torch.tensor([7])):
        start, n = cheap.cache_len, step.shape[0]
        a = cheap.forward(step, torch.arange(start, start + n), None)
        b = explicit.forward(step, torch.arange(start, start + n), causal_mask(start, n))
        assert torch.allclose(a.logits, b.logits, atol=TOL)
    with pytest.raises(MultispecError, match="max_len"):
        forward_chain(cheap, torch.arange(8))


@pytest.mark.parametrize("kind", ["hf", "fast"])
def test_prefill_with_last_logits_only(kind):
    """forward_chain(last_only=True) skips the output layer for all but the last row: that row's logits and every
    later step equal a full prefill's."""
    model = tiny_llama(vocab=64, hidden=32, layers=2, heads=4, kv_heads=2, seed=5)
    full, last = make_backend(model, kind), make_backend(model, kind)
    prompt = torch.randint(0, 64, (12,), generator=torch.Generator().manual_seed(0))
    a, b = forward_chain(full, prompt), forward_chain(last, prompt, last_only=True)
    assert a.logits.shape == (12, 64) and b.logits.shape == (1, 64)
    assert torch.allclose(a.logits[-1], b.logits[-1], atol=1e-6)
    step = torch.tensor([3])
    assert torch.allclose(forward_chain(full, step).logits, forward_chain(last, step).logits, atol=1e-6)


@pytest.mark.parametrize("name", ["llama", "mistral-window", "gemma2", "gemma3"])
def test_blocked_prefill_and_window_rows(name, monkeypatch):
    """A long step attends by blocks of queries (PREFILL_BLOCK, made small here), each over the rows it can see, and
    sliding layers read only their window's rows (window_firsts): logits equal the transformers backend's on a
    prefill, a tree after it, the kept path and decode steps past the window; the ordered chain is tracked through
    a tree and its kept path."""
    from compat_archs import WINDOW, build
    from multispec.models import fast

    monkeypatch.setattr(fast, "PREFILL_BLOCK", 16)
    model = build(name)
    hf, fb = make_backend(model, "hf"), make_backend(model, "fast", max_len=100)
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, hf.vocab_size, (50,), generator=gen)
    assert fb.query_blocks(torch.arange(50), None, 0) is not None  # 4 blocks
    a, b = forward_chain(hf, prompt), forward_chain(fb, prompt)
    assert float((a.logits - b.logits).abs().max()) < TOL
    assert fb._chain == 50
    tree = Tree.from_shape((3, 2, 1))
    tokens = torch.randint(0, hf.vocab_size, (len(tree),), generator=gen)
    outs = [be.forward(tokens, tree.position_ids(50), tree.attention_mask(50)).logits for be in (hf, fb)]
    assert float((outs[0] - outs[1]).abs().max()) < TOL
    assert fb._chain == 50  # the tree's rows are not in position order
    for be in (hf, fb):
        be.keep(tree.keep_indices(tree.paths[-1], 50))
    assert fb.cache_len == 50 + len(tree.paths[-1])
    if fb.layout.windows:  # (without windows nothing reads the chain, and keep does not track it)
        assert fb._chain == fb.cache_len
        kinds = fb.layout.distinct_types
        firsts = fb.window_firsts(torch.tensor([fb.cache_len]))
        assert firsts[kinds.index("sliding_attention")] == fb.cache_len - WINDOW + 1
    for _ in range(3):
        step = torch.randint(0, hf.vocab_size, (1,), generator=gen)
        a, b = forward_chain(hf, step), forward_chain(fb, step)
        assert float((a.logits - b.logits).abs().max()) < TOL
