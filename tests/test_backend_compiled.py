"""The compiled fast backend equals the eager one: logits and hidden states of every bucket size, padded or exact,
chains and trees, within fp32 tolerance; padding is harmless (cache rows past the real ones may hold anything, and
a variant that lets real tokens see the padding fails the same check); greedy generation is token-identical for
ar, sd, mcsd and dynamic. One small model per module, so each bucket compiles once (seconds each, cold)."""
import pytest
import torch

from helpers import tiny_llama
from multispec.decoding.engine import generate_ids
from multispec.decoding.methods import build_policy
from multispec.decoding.methods import build_method
from multispec.models import forward_chain, make_backend
from multispec.models.fast_compile import BUCKETS, CompiledStep, has_cpp_compiler
from multispec.sampling import SamplingConfig
from multispec.tree import Tree

pytestmark = pytest.mark.skipif(not has_cpp_compiler(), reason="torch inductor needs a C++ compiler on the CPU")

TOL = 1e-5
VOCAB = 64
PROMPT = 70  # longer than the largest bucket: the prefill runs eagerly, the steps after it compiled


@pytest.fixture(scope="module")
def target():
    return tiny_llama(vocab=VOCAB, hidden=32, layers=2, heads=4, kv_heads=2, seed=3)


@pytest.fixture(scope="module")
def draft():
    return tiny_llama(vocab=VOCAB, hidden=16, layers=1, heads=2, kv_heads=2, seed=4)


def _both(model, max_len=400):
    return make_backend(model, "fast", max_len=max_len), make_backend(model, "compiled", max_len=max_len)


def _gap(a, b) -> float:
    return max(float((a.logits - b.logits).abs().max()), float((a.hidden - b.hidden).abs().max()))


@pytest.mark.slow
def test_every_bucket_matches_eager(target):
    eager, comp = _both(target)
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, VOCAB, (PROMPT,), generator=g)
    assert _gap(forward_chain(eager, prompt, want_hidden=True), forward_chain(comp, prompt, want_hidden=True)) < TOL
    keep = torch.arange(PROMPT)
    for n in (1, 2, 3, 4, 7, 8, 13, 16, 31, 32, 45, 64):  # every bucket, exact and padded
        toks = torch.randint(0, VOCAB, (n,), generator=g)
        gap = _gap(forward_chain(eager, toks, want_hidden=True), forward_chain(comp, toks, want_hidden=True))
        assert gap < TOL, (n, gap)
        assert comp.cache_len == eager.cache_len == PROMPT + n
        eager.keep(keep), comp.keep(keep)
    assert comp.compiled.seen == set(BUCKETS)  # the compiled path ran for every size (not an eager fallback)
    tree = Tree.from_shape((3, 2, 1))  # a token tree (10 tokens, padded to 16), then the step after its kept path
    toks = torch.randint(0, VOCAB, (len(tree),), generator=g)
    outs = [be.forward(toks, tree.position_ids(PROMPT), tree.attention_mask(PROMPT), want_hidden=True)
            for be in (eager, comp)]
    assert _gap(*outs) < TOL
    for be in (eager, comp):
        be.keep(tree.keep_indices(tree.paths[-2], PROMPT))
    step = torch.randint(0, VOCAB, (1,), generator=g)
    assert _gap(forward_chain(eager, step, want_hidden=True), forward_chain(comp, step, want_hidden=True)) < TOL


def _poison(backend):
    """Cache rows past the committed ones hold NaN: any read of them would turn the logits NaN."""
    for cache in (*backend.k_cache, *backend.v_cache):
        cache[:, backend.cache_len:] = float("nan")


def _padded_steps_gap(target) -> float:
    eager, comp = _both(target)
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, VOCAB, (PROMPT,), generator=g)
    forward_chain(eager, prompt), forward_chain(comp, prompt)
    worst = 0.0
    for n in (5, 3, 1, 11):  # padded to 8, 4, 1, 16: each step after a padded one reuses its padding rows
        _poison(comp)
        toks = torch.randint(0, VOCAB, (n,), generator=g)
        worst = max(worst, _gap(forward_chain(eager, toks, want_hidden=True),
                                forward_chain(comp, toks, want_hidden=True)))
    return worst


def test_padding_is_harmless(target):
    assert _padded_steps_gap(target) < TOL


def test_padding_visible_to_real_tokens_is_caught(target, monkeypatch):
    """The check above can fail: let the real tokens attend to the padded rows and it does."""
    right = CompiledStep.padded_mask

    def leaky(mask, n, b, start, width, dev):
        full = right(mask, n, b, start, width, dev)
        full[:n, start + n:start + b] = True
        return full

    monkeypatch.setattr(CompiledStep, "padded_mask", staticmethod(leaky))
    assert not _padded_steps_gap(target) < TOL


@pytest.mark.parametrize("method,options", [("ar", {}), ("sd", {"k": 3}), ("mcsd", {"tree": (3, 2, 1)}),
                                            ("dynamic", {"width": 3, "depth": 3})])
def test_greedy_generation_identical_to_eager(target, draft, method, options):
    outs = []
    config = build_method(method, **options)
    for kind in ("fast", "compiled"):
        d = make_backend(draft, kind, max_len=200) if method != "ar" else None
        ids, _ = generate_ids(make_backend(target, kind, max_len=200), d, [1, 2, 3], config,
                                 SamplingConfig(0.0), 40, 0, set(), policy=build_policy(config))
        outs.append(ids)
    assert outs[0] == outs[1]


def test_full_width_path_matches_eager(target):
    """The CUDA-graph layout (every cache row attended, masked; static shapes), run on the CPU."""
    eager, comp = _both(target, max_len=120)
    comp.compiled = CompiledStep(comp.net, full_width=True)
    rows = comp.k_cache[0].shape[1]
    comp.k_cache, comp.v_cache = comp.net.new_cache(rows), comp.net.new_cache(rows)  # not marked dynamic
    comp.compiled.prepare_cache(comp.k_cache, comp.v_cache)
    g = torch.Generator().manual_seed(2)
    prompt = torch.randint(0, VOCAB, (PROMPT,), generator=g)
    forward_chain(eager, prompt), forward_chain(comp, prompt)
    for n in (1, 5, 1):
        toks = torch.randint(0, VOCAB, (n,), generator=g)
        assert _gap(forward_chain(eager, toks, want_hidden=True), forward_chain(comp, toks, want_hidden=True)) < TOL
    tree = Tree.from_shape((2, 1, 1))
    toks = torch.randint(0, VOCAB, (len(tree),), generator=g)
    start = eager.cache_len
    outs = [be.forward(toks, tree.position_ids(start), tree.attention_mask(start), want_hidden=True)
            for be in (eager, comp)]
    assert _gap(*outs) < TOL
    assert comp.compiled.seen == {1, 8}


def test_cost_cache_keys_tell_models_and_modes_apart(target, draft):
    """auto's cost cache is keyed by backend kind and model: the fast backends expose the model they run."""
    from multispec.drafting.costs import model_key

    keys = {model_key(make_backend(m, kind, max_len=8), make_backend(m, kind, max_len=8).model)
            for m in (target, draft) for kind in ("fast", "compiled")}
    assert len(keys) == 4


def test_warm_up_compiles_no_step_that_attends_to_one_row(target, monkeypatch):
    """dynamo specialises a dimension of size 1, so a bucket first compiled attending to a single cache row would be
    compiled again by the first real step; warm_up steps attend to at least 3 rows."""
    from multispec.models.fast_compile import bucket

    widths = []
    real = CompiledStep.__call__

    def spy(self, backend, tokens, positions, mask, start, want_hidden):
        widths.append(start + bucket(tokens.shape[0]))
        return real(self, backend, tokens, positions, mask, start, want_hidden)

    monkeypatch.setattr(CompiledStep, "__call__", spy)
    backend = make_backend(target, "compiled", max_len=100)
    backend.compiled.seen.clear()  # warm every bucket again (compiled already: fast)
    backend.warm_up()
    assert len(widths) == len(BUCKETS) and min(widths) >= 3 and backend.cache_len == 0


def test_each_compiled_model_raises_dynamos_recompile_limit():
    """Every model of one class compiles the same function (its `run`), and dynamo counts that function's graphs
    across all of them: a process that compiles several pairs (a notebook; the suite in one process) ran past a
    fixed limit of one model's graphs. Each compiled model adds its share (a graph per bucket, twice over)."""
    import torch._dynamo

    from multispec.models import fast_compile

    per_model = 8 * len(BUCKETS) * 2
    nets = [make_backend(tiny_llama(vocab=VOCAB, hidden=16, layers=1, heads=2, kv_heads=2, seed=s), "fast").net
            for s in (5, 6, 7)]
    for net in nets:
        CompiledStep(net)
        assert torch._dynamo.config.recompile_limit >= per_model * fast_compile._STEPS
    assert fast_compile._STEPS >= len(nets)
