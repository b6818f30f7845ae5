"""Many sequences at once (decoding/batch.py, models/batched.py): a batched forward equals each sequence's own
forward, a batched sequence's output equals its batch-1 output (greedy) and keeps the target's law (T > 0) while
other sequences join and leave, and a deliberately broken batch (one row's mask shifted by one) is caught."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from compat_archs import build
from engine_utils import chi_square_pvalue, exact_joint, tiny_pair
from helpers import assert_one_line_error, run_cli, save_tiny_pair, tiny_llama
from multispec import generate, load_pair
from multispec.decoding.batch import BatchEngine
from multispec.decoding.decoder import Decoder
from multispec.errors import MultispecError
from multispec.loading import Pair
from multispec.models.base import causal_mask
from multispec.models.batched import PAD_LIMIT, Role, SlotCache, Step, _call_rows, run_batch, split_by_width
from multispec.models.fast import FastBackend, FastNet
from multispec.models.sidecar import ModelSidecar
from multispec.sampling import SamplingConfig

GREEDY = SamplingConfig(temperature=0.0)


def _pair(target, draft) -> Pair:
    tok = SimpleNamespace(eos_token_id=None, bos_token_id=None)
    return Pair(target=target, draft=draft, tokenizer=tok, target_path="t", draft_path="d")


def run_batched(decoder: Decoder, prompts, slots: int, sampling, max_new, seeds, rows: int = 96):
    """Every prompt through a BatchEngine of `slots` slots, a slot taking the next prompt when its sequence ends
    (sequences join and leave between rounds). max_new: one int or one per prompt."""
    batch = BatchEngine(decoder, slots, rows)
    return [new for new, _ in drive(batch, prompts, sampling, max_new, seeds)], batch


def drive(batch: BatchEngine, prompts, sampling, max_new, seeds) -> list:
    """Each prompt's (new ids, metrics) from `batch`, a free slot taking the next prompt between steps."""
    max_new = max_new if isinstance(max_new, list) else [max_new] * len(prompts)
    out: list = [None] * len(prompts)
    waiting, running = list(range(len(prompts)))[::-1], {}
    while waiting or running:
        while waiting and batch.free:
            i = waiting.pop()
            running[batch.add_ids(prompts[i], sampling, max_new[i], seeds[i])] = i
        for seq_id, result in batch.step():
            if isinstance(result, BaseException):
                raise result
            out[running.pop(seq_id)] = result
    return out


# ---------------------------------------------------------------------------------------------------- the forward
def _prefill(cache: SlotCache, alone, lens: dict, g: torch.Generator) -> None:
    """A random prompt of lens[slot] tokens into each slot of the batched cache and into that slot's own backend."""
    for s, n in lens.items():
        p = torch.randint(0, cache.net.vocab_size, (n,), generator=g)
        run_batch(cache, [Step(s, p, torch.arange(n))])
        alone[s].forward(p, torch.arange(n), causal_mask(0, n))


def _tree(a: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions and mask of a 3-node tree after `a` cached rows: a root and two children."""
    pos, mask = torch.tensor([a, a + 1, a + 1]), torch.ones(3, a + 3, dtype=torch.bool)
    mask[0, a + 1:] = mask[1, a + 2] = mask[2, a + 1] = False
    return pos, mask


@pytest.mark.parametrize("arch", ["llama", "gemma2", "gemma3", "qwen3", "phi3", "mistral-window"])
def test_batched_forward_equals_each_sequences_own_forward(arch):
    """Ragged steps in one forward — a prefill longer than PAD_LIMIT (attends alone), chains, a token tree with
    its own mask, slots left empty between members — give each sequence the logits and hidden states of its own
    FastBackend, then again after a keep that drops a branch (sliding windows, soft-caps, per-type RoPE included)."""
    model = build(arch)
    sidecar = ModelSidecar(model)
    net = sidecar.fast_net()
    vocab = net.vocab_size
    g = torch.Generator().manual_seed(1)
    lens = [PAD_LIMIT + 9, 5, 12]
    slots = [0, 2, 3]
    cache = SlotCache(sidecar, 4, 128)
    alone = [FastBackend(model, max_len=128) for _ in lens]
    prompts = [torch.randint(0, vocab, (n,), generator=g) for n in lens]
    outs = run_batch(cache, [Step(s, p, torch.arange(len(p)), last_only=True) for s, p in zip(slots, prompts)])
    for b, p, o in zip(alone, prompts, outs):
        ref = b.forward(p, torch.arange(len(p)), causal_mask(0, len(p)), last_only=True)
        torch.testing.assert_close(o.logits[-1], ref.logits[-1], atol=1e-5, rtol=1e-5)
    a = lens[1]
    tree = torch.zeros(3, a + 3, dtype=torch.bool)  # root, then two children of the root
    tree[:, :a] = True
    tree[0, a] = tree[1, a] = tree[1, a + 1] = tree[2, a] = tree[2, a + 2] = True
    steps = [(torch.tensor([3]), torch.tensor([lens[0]]), None),
             (torch.tensor([1, 2, 4]), torch.tensor([a, a + 1, a + 1]), tree),
             (torch.tensor([5, 6]), torch.arange(lens[2], lens[2] + 2), None)]
    outs = run_batch(cache, [Step(s, t, p, m, want_hidden=True) for s, (t, p, m) in zip(slots, steps)])
    for b, (t, p, m), o in zip(alone, steps, outs):
        ref = b.forward(t, p, m, want_hidden=True)
        torch.testing.assert_close(o.logits, ref.logits, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(o.hidden, ref.hidden, atol=1e-5, rtol=1e-5)
    kept = torch.tensor(list(range(a)) + [a, a + 2])
    cache.keep(2, kept)
    alone[1].keep(kept)
    o = run_batch(cache, [Step(2, torch.tensor([7]), torch.tensor([a + 2]))])[0]
    torch.testing.assert_close(o.logits, alone[1].forward(torch.tensor([7]), torch.tensor([a + 2])).logits,
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_one_and_many_token_steps_attend_in_their_own_groups(arch):
    """One forward of one-token steps and longer ones (a chain, a tree with its mask) on slots far apart: the
    longer steps attend over a copy of their own slots' rows, the one-token steps over the caches' views, and every
    output equals its sequence's own FastBackend; in a second forward, slots side by side (no copy)."""
    model = build(arch)
    sidecar = ModelSidecar(model)
    net = sidecar.fast_net()
    cache = SlotCache(sidecar, 8, 96)
    g = torch.Generator().manual_seed(4)
    slots = [0, 3, 5, 7]
    alone = {s: FastBackend(model, max_len=96) for s in slots}
    _prefill(cache, alone, dict(zip(slots, (9, 14, 6, 11))), g)
    for shapes in ({0: 1, 3: 4, 5: 1, 7: "tree"}, {0: 3, 3: 1, 5: 2, 7: 1}):
        steps, refs = [], []
        for s, kind in shapes.items():
            a = cache.lens[s]
            n = 3 if kind == "tree" else kind
            t = torch.randint(0, net.vocab_size, (n,), generator=g)
            if kind == "tree":
                pos, mask = _tree(a)
            else:
                pos, mask = torch.arange(a, a + n), None
            steps.append(Step(s, t, pos, mask))
            refs.append(alone[s].forward(t, pos, causal_mask(a, n) if mask is None else mask))
        for o, ref in zip(run_batch(cache, steps), refs):
            torch.testing.assert_close(o.logits, ref.logits, atol=1e-5, rtol=1e-5)
        for s, kind in shapes.items():  # keep every row (a tree: the root and its first child)
            a = cache.lens[s] - (3 if kind == "tree" else kind)
            kept = torch.arange(a + 2) if kind == "tree" else torch.arange(cache.lens[s])
            cache.keep(s, kept)
            alone[s].keep(kept)


def _mixed_widths(arch: str, monkeypatch) -> list:
    """Eight slots, one holding a prompt of 100 tokens among short ones (4-10), then one forward of a one-token step
    on most slots, 2-token chains on two slots far apart and a 3-node tree: every output against each sequence's
    own FastBackend. An attention call is made to cost what 4 rows do (a tiny model's rows cost almost nothing).
    Returns the forward's attention parts (split_by_width's (steps, dense) for the one-token steps)."""
    from multispec.models import batched

    model = build(arch)
    sidecar = ModelSidecar(model)
    net = sidecar.fast_net()
    monkeypatch.setattr(batched, "CALL_BYTES", 4 * 2 * net.n_kv * net.head_dim * 4)  # 4 fp32 rows
    cache = SlotCache(sidecar, 8, 128)
    alone = [FastBackend(model, max_len=128) for _ in range(8)]
    g = torch.Generator().manual_seed(5)
    lens = [6, 100, 4, 9, 10, 5, 7, 8]
    _prefill(cache, alone, dict(enumerate(lens)), g)
    steps, refs = [], []
    for s, a in enumerate(lens):
        n = 2 if s in (0, 7) else 3 if s == 4 else 1
        t = torch.randint(0, net.vocab_size, (n,), generator=g)
        pos, mask = torch.arange(a, a + n), None
        if s == 4:
            pos, mask = _tree(a)
        steps.append(Step(s, t, pos, mask))
        refs.append(alone[s].forward(t, pos, causal_mask(a, n) if mask is None else mask))
    for o, ref in zip(run_batch(cache, steps), refs):
        torch.testing.assert_close(o.logits, ref.logits, atol=1e-5, rtol=1e-5)
    ones = [j for j, st in enumerate(steps) if len(st.tokens) == 1]
    return split_by_width(ones, [a + len(st.tokens) for a, st in zip(lens, steps)], list(range(8)),
                          _call_rows(net))


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_one_long_prompt_among_short_ones_attends_apart(arch, monkeypatch):
    """The one-token steps are split by width: the long prompt's slot attends alone, the short ones padded to their
    own width (not to 101 rows), and every output equals its sequence's own forward; the two 2-token chains, on
    slots 0 and 7, attend each alone (a padded group would read the six slots between)."""
    parts = _mixed_widths(arch, monkeypatch)
    assert ([1], False) in parts or ([1], True) in parts
    assert all(1 not in g or len(g) == 1 for g, _ in parts)


def test_a_chain_attending_alone_without_its_causal_mask_is_caught(monkeypatch):
    """The 2-token chains attend alone: built as a one-token step's mask is (none), each token would read the
    other's row, and the outputs differ from their sequences' own forwards."""
    real = FastNet.masks

    def no_causal(self, mask, positions, keys, start, n, firsts=None):
        if mask is None and n <= PAD_LIMIT:
            return (None,) * len(self.layout.distinct_types)
        return real(self, mask, positions, keys, start, n, firsts)

    monkeypatch.setattr(FastNet, "masks", no_causal)
    with pytest.raises(AssertionError):
        _mixed_widths("llama", monkeypatch)


def test_split_by_width_separates_outliers_and_keeps_alike_widths_together():
    assert split_by_width(list(range(8)), [100, 110, 105, 98, 120, 101, 99, 103], list(range(8)), 60) \
        == [(list(range(8)), True)]
    parts = split_by_width(list(range(8)), [20, 1000, 25, 30, 22, 24, 26, 21], list(range(8)), 60)
    assert ([1], True) in parts and sorted(j for g, _ in parts for j in g) == list(range(8))
    assert split_by_width([0, 7], [40] * 7 + [41], list(range(8)), 10) == [([0, 7], False)]  # far apart: alone


def _sliding_rounds(arch: str, broken: bool = False) -> SlotCache:
    """Two slots through 40 rounds each (a 3-node tree, a keep of one branch, now and then a 3-token chain) on a
    cache whose sliding layers hold window + 12 rows, every output against each sequence's own FastBackend."""
    model = build(arch)
    sidecar = ModelSidecar(model)
    net = sidecar.fast_net()
    cache = SlotCache(sidecar, 2, 160, slack=12)
    alone = [FastBackend(model, max_len=160) for _ in range(2)]
    g = torch.Generator().manual_seed(2)
    _prefill(cache, alone, {0: 7, 1: 16}, g)
    for r in range(40):
        steps, refs = [], []
        for s in range(2):
            a = cache.lens[s]
            t = torch.randint(0, net.vocab_size, (3,), generator=g)
            if r % 5 == 4:  # a chain
                pos, mask = torch.arange(a, a + 3), None
            else:
                pos, mask = _tree(a)
            steps.append(Step(s, t, pos, mask))
            refs.append(alone[s].forward(t, pos, causal_mask(a, 3) if mask is None else mask))
        if broken and r == 30:  # slot 1's sliding rows read one row off
            cache.base[1] += 1
        for o, ref in zip(run_batch(cache, steps), refs):
            torch.testing.assert_close(o.logits, ref.logits, atol=1e-5, rtol=1e-5)
        for s in range(2):
            a = cache.lens[s] - 3
            kept = torch.tensor(list(range(a + 3)) if r % 5 == 4 else list(range(a + 1)) + [a + 1 + (r + s) % 2])
            cache.keep(s, kept)
            alone[s].keep(kept)
    return cache


@pytest.mark.parametrize("arch", ["gemma3", "mistral-window"])
def test_sliding_layers_sized_to_their_window_keep_every_output(arch):
    """Sliding-window layers of a SlotCache hold window + slack rows, dropping what no query sees any more: over
    80+ rows per slot their outputs equal each sequence's own full-cache FastBackend (full layers keep every row)."""
    cache = _sliding_rounds(arch)
    assert cache.base[0] > 0 and cache.base[1] > 0  # rows were dropped, more than once
    sized = [c.shape[2] for c, sl in zip(cache.k, cache.sliding) if sl]
    assert sized and set(sized) == {cache.window + 12}
    assert all(c.shape[2] == 160 for c, sl in zip(cache.k, cache.sliding) if not sl)


def test_a_sliding_cache_read_from_the_wrong_row_is_caught():
    with pytest.raises(AssertionError):
        _sliding_rounds("gemma3", broken=True)


# ---------------------------------------------------------------------------------------------------- greedy
@pytest.mark.parametrize("method,options", [("ar", {}), ("sd", {"k": 3}), ("mcsd", {"tree": (2, 2, 1)}),
                                            ("lookup", {}), ("auto", {})])
def test_batched_greedy_equals_batch_one(method, options):
    """Seven prompts of different lengths through four slots (sequences join as others finish) give each prompt
    the tokens of its own batch-1 run on the same backend."""
    target, draft = tiny_pair(vocab=16, seed=3, noise=0.3)
    decoder = Decoder(_pair(target, draft), method, "fast", **options)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 16, (n,), generator=g).tolist() for n in (3, 9, 1, 14, 6, 2, 11)]
    max_new = [12, 20, 7, 16, 20, 9, 13]
    alone = [decoder.run(p, GREEDY, m, 0)[0] for p, m in zip(prompts, max_new)]
    together, group = run_batched(decoder, prompts, 4, GREEDY, max_new, [0] * len(prompts))
    assert together == alone
    stats = group.stats()["target"]
    assert stats["mean_batch"] > 1.5, stats  # the sequences really shared forwards


def test_a_batch_reuses_the_last_batchs_buffers_and_keeps_every_output():
    """An ended batch hands its cache buffers to the next batch over the model that fits in them (views of them):
    no allocation, and the rows the new batch has not written (filled with large garbage here) change no output.
    A batch that needs more rows gets new buffers."""
    target, draft = tiny_pair(vocab=16, seed=3, noise=0.3)
    decoder = Decoder(_pair(target, draft), "sd", "fast", k=3)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 16, (n,), generator=g).tolist() for n in (5, 2, 12, 8, 3)]
    _, first = run_batched(decoder, prompts[:2], 4, GREEDY, 10, [0, 0])
    buffers, draft_buffers = first.target_cache._buffers, first.draft_cache._buffers
    first.release()
    for bufs in (*buffers, *draft_buffers):
        for b in bufs:
            b.copy_(torch.randn(b.shape, generator=g) * 100)
    alone = [decoder.run(p, GREEDY, 14, 0)[0] for p in prompts]
    together, second = run_batched(decoder, prompts, 3, GREEDY, 14, [0] * len(prompts), rows=80)
    assert together == alone
    assert second.target_cache.k[0].data_ptr() == buffers[0][0].data_ptr()
    assert second.target_cache.k[0].shape[0] == 3 and second.target_cache.k[0].shape[2] == 80
    second.release()
    third = BatchEngine(decoder, 3, 200)  # more rows than the spare holds: new buffers
    assert third.target_cache.k[0].data_ptr() != buffers[0][0].data_ptr()
    third.release()


@pytest.mark.parametrize("method,options", [("ar", {}), ("sd", {"k": 3})])
def test_batched_greedy_verification_reads_the_batchs_argmax(monkeypatch, method, options):
    """A greedy lane's verification reads each row's argmax from the batched forward (one argmax and one copy to
    the CPU for the batch) instead of taking its own: with the engine's own greedy_argmax made unusable, a batch
    still decodes every prompt's batch-1 tokens. Argmaxes deliberately wrong (the broken variant) are caught."""
    from multispec.decoding import round_verify
    from multispec.models import batched

    target, draft = tiny_pair(vocab=16, seed=3, noise=0.3)
    decoder = Decoder(_pair(target, draft), method, "fast", **options)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 16, (n,), generator=g).tolist() for n in (3, 9, 1, 14, 6)]
    alone = [decoder.run(p, GREEDY, 12, 0)[0] for p in prompts]

    def unusable(logits):
        raise AssertionError("a batched greedy lane took its own argmax")

    monkeypatch.setattr(round_verify, "greedy_argmax", unusable)
    assert run_batched(decoder, prompts, 3, GREEDY, 12, [0] * len(prompts))[0] == alone
    real = batched._argmax_rows

    def argmin(steps, logits):
        return [None if b is None else logits[j].argmin(-1).cpu() for j, b in enumerate(real(steps, logits))]

    monkeypatch.setattr(batched, "_argmax_rows", argmin)
    assert run_batched(decoder, prompts, 3, GREEDY, 12, [0] * len(prompts))[0] != alone


def test_a_nan_row_leaves_its_step_to_refuse_it_and_the_others_their_argmax():
    from multispec.models.batched import _argmax_rows

    logits = [torch.tensor([[0.0, 2.0, 1.0], [3.0, 0.0, 0.0]]), torch.tensor([[0.0, float("nan"), 1.0]]),
              torch.tensor([[5.0, 0.0, 9.0]])]
    steps = [SimpleNamespace(argmax=True), SimpleNamespace(argmax=True), SimpleNamespace(argmax=False)]
    best = _argmax_rows(steps, logits)
    assert best[0].tolist() == [1, 0] and best[1] is None and best[2] is None


# ---------------------------------------------------------------------------------------------------- the law
def context_pair(seed: int = 5, vocab: int = 4):
    """A target whose next-token law moves with every visible row (uniform attention over strong value vectors,
    a faint token embedding: dropping or adding one row moves the law by 0.1-0.2 in total variation, where a random
    tiny Llama barely notices), and a draft made from it by perturbing every weight."""
    models = []
    for _ in range(2):
        m = tiny_llama(vocab=vocab, hidden=32, layers=1, heads=4, kv_heads=2, seed=seed, scale=6.0)
        with torch.no_grad():
            m.model.embed_tokens.weight.mul_(0.01)
            for layer in m.model.layers:
                layer.self_attn.q_proj.weight.zero_()
                layer.self_attn.v_proj.weight.mul_(5)
                layer.self_attn.o_proj.weight.mul_(5)
        models.append(m)
    g = torch.Generator().manual_seed(seed + 99)
    with torch.no_grad():
        for prm in models[1].parameters():
            prm.add_(0.3 * prm.std() * torch.randn(prm.shape, generator=g))
    return models


def _law_pvalues(decoder, target, prompts, n_each, slots, vocab=4):
    """Chi-square p-values, one per prompt, of the batched outputs' tokens 2 and 3 (rounds after the first,
    where a cache kept wrong shows) against the target's exact law of them."""
    jobs = [p for p in prompts for _ in range(n_each)]
    jobs = [jobs[i] for i in np.random.default_rng(0).permutation(len(jobs))]
    # sequences leave at different times (3, 4 or 5 new tokens; 3, 5 or 7 until the suite passed 15 minutes: the
    # first 3 tokens of every sequence, all this test reads, are the same either way, and so are its p-values)
    max_new = [3 + i % 3 for i in range(len(jobs))]
    outs, group = run_batched(decoder, jobs, slots, SamplingConfig(temperature=1.0), max_new,
                              list(range(len(jobs))), rows=48)
    assert group.stats()["target"]["mean_batch"] > 2
    counts = {tuple(p): np.zeros(vocab ** 2) for p in prompts}
    for p, out in zip(jobs, outs):
        counts[tuple(p)][out[1] * vocab + out[2]] += 1
    pvalues = []
    for p in prompts:
        law = exact_joint(target, p, SamplingConfig(temperature=1.0), 3, vocab).reshape(vocab, vocab * vocab)
        pvalues.append(chi_square_pvalue(counts[tuple(p)], law.sum(axis=0)))
    return pvalues


PROMPTS_LAW = [[1], [2, 0, 3]]
N_LAW = 2500  # runs per prompt of the lossless batched-law test (test_a_broken_batch_is_caught: what it catches)


@pytest.mark.slow
def test_batched_sampling_keeps_the_target_law():
    """T = 1, a token tree (mcsd, three candidates: a round commits at most two tokens, so token 3 is always
    verified on a cache kept by an earlier round), six slots, two prompts of different lengths interleaved, sequences of three
    lengths leaving and new ones joining: the joint law of each prompt's tokens 2 and 3 is the target's."""
    target, draft = context_pair()
    decoder = Decoder(_pair(target, draft), "mcsd", "fast", tree=(3,))
    pvalues = _law_pvalues(decoder, target, PROMPTS_LAW, N_LAW, 6)
    assert min(pvalues) > 1e-3, pvalues


@pytest.mark.slow
@pytest.mark.parametrize("method,options,broken", [("sd", {"k": 2, "verifier": "sd"}, False),
                                                   ("sd", {"k": 2}, False), ("lookup", {"k": 2}, False),
                                                   ("sd", {"k": 2, "verifier": "sd"}, True)])
def test_batched_chain_verification_keeps_the_target_law(monkeypatch, method, options, broken):
    """T = 1 with the step's sampled chains verified together in tensor operations (verify/batched.py; on a GPU by
    default, forced here on the CPU): sd's node walk, block (sd's default) and naive (lookup's point masses), six
    slots, sequences joining and leaving: the joint law of each prompt's tokens 2 and 3 is the target's. The broken
    variant (sd's residual drawn from p instead of (p - q)+) is caught at this size, 2,000 runs per prompt (p = 4e-11
    on this seed stream; 2,500 until the suite passed 15 minutes; 1,500: 2e-7, 1,000: 1e-5, not below 1e-6)."""
    from multispec.decoding import engine, round_verify
    from multispec.verify import batched as vb

    monkeypatch.setattr(round_verify, "BATCH_VERIFY_ON_CPU", True)
    sizes, real = [], engine.verify_chains
    monkeypatch.setattr(engine, "verify_chains", lambda requests: sizes.append(len(requests)) or real(requests))
    if broken:
        monkeypatch.setattr(vb, "_sd_residual", lambda p_rows, q_rows: p_rows)
    target, draft = context_pair()
    decoder = Decoder(_pair(target, draft), method, "fast", **options)
    pvalues = _law_pvalues(decoder, target, PROMPTS_LAW, 2000, 6)
    assert max(sizes) > 2  # several sequences verified at once
    assert (min(pvalues) < 1e-6) if broken else (min(pvalues) > 1e-3), pvalues


def _mask_misses_last_row(real):
    def run(cache, steps):
        for s in steps:
            a = cache.lens[s.slot]
            if cache.role == Role.TARGET and a > 1:
                s.mask = (causal_mask(a, s.tokens.shape[0]) if s.mask is None else s.mask).clone()
                s.mask[:, a - 1] = False
        return real(cache, steps)
    return run


@pytest.mark.slow
@pytest.mark.parametrize("broken,n_each", [("mask", N_LAW), ("cache_len", 3500)])
def test_a_broken_batch_is_caught(monkeypatch, broken, n_each):
    """The same test catches a batch whose target steps miss their last cached row (a mask shifted by one), and
    one whose target slots keep one row too many after a round (a rejected node's keys left visible, as a cache
    length off by one would). The shifted mask fails it at the lossless test's own size (p = 6e-30 and 5e-44 on
    this seed stream; 5,000 runs per prompt until the suite passed 15 minutes); the cache length off by one needs
    more: 3,500 runs per prompt (p = 7e-10; 2,500: 0.003, 3,000: 6e-5, 4,000: 2e-9, 5,000: 1e-9)."""
    from multispec.models import batched

    if broken == "mask":
        monkeypatch.setattr(batched, "run_batch", _mask_misses_last_row(batched.run_batch))
    else:
        real = SlotCache.keep

        def keep_one_more(cache, slot, indices):
            real(cache, slot, indices)
            if cache.role == Role.TARGET and cache.lens[slot] < cache.rows:
                cache.lens[slot] += 1

        monkeypatch.setattr(SlotCache, "keep", keep_one_more)
    target, draft = context_pair()
    decoder = Decoder(_pair(target, draft), "mcsd", "fast", tree=(3,))
    pvalues = _law_pvalues(decoder, target, PROMPTS_LAW, n_each, 6)
    assert min(pvalues) < 1e-6, pvalues


# ---------------------------------------------------------------------------------------------------- the API
@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    paths = save_tiny_pair(tmp_path_factory.mktemp("batch_pair"))
    return load_pair(target=str(paths["target"]), draft=str(paths["draft"]), device="cpu"), paths


def test_generate_with_a_list_returns_one_result_per_prompt_in_order(pair):
    p, _ = pair
    prompts = ["def f(x):", "for n in range(2):", "x = 1"]
    many = generate(p, prompts, method="sd", max_new_tokens=10, temperature=0, seed=7, batch_size=2)
    assert [r.stats["seed"] for r in many] == [7, 8, 9]  # prompt i uses seed + i
    for prompt, r in zip(prompts, many):
        one = generate(p, prompt, method="sd", max_new_tokens=10, temperature=0, seed=7, backend="fast")
        assert r.token_ids == one.token_ids and r.text == one.text
        assert r.stats["backend"] == "fast" and r.stats["batch"]["size"] == 2
    ids = generate(p, [[0, 5, 6], [0, 7]], method="ar", max_new_tokens=4, temperature=0)
    assert len(ids) == 2 and all(len(r.token_ids) <= 4 for r in ids)


def test_a_batch_takes_the_reproducible_mode_from_the_seed_it_was_given(pair):
    """auto verifies with keyed noise when the caller seeds it, in a batch as alone: an unseeded batch draws a seed
    per prompt but stays in the ordinary mode (it paid the keyed noise before), a seeded one takes the mode, and
    reproducible= still decides outright."""
    p, _ = pair
    prompts = ["def f(x):", "x = 1", "for n in range(2):", "import os"]
    kw = dict(method="auto", max_new_tokens=6, temperature=1.0, batch_size=4)
    assert not generate(p, prompts[0], method="auto", max_new_tokens=6, temperature=1.0).stats["reproducible"]
    assert [r.stats["reproducible"] for r in generate(p, prompts, **kw)] == [False] * 4
    assert [r.stats["reproducible"] for r in generate(p, prompts, seed=3, **kw)] == [True] * 4
    assert [r.stats["reproducible"] for r in generate(p, prompts, seed=3, reproducible=False, **kw)] == [False] * 4
    assert [r.stats["reproducible"] for r in generate(p, prompts, reproducible=True, **kw)] == [True] * 4


def test_batch_size_one_decodes_each_prompt_on_the_decoder_itself(pair, monkeypatch):
    """batch_size=1 builds no BatchEngine (a slot only adds cost): each prompt decodes on the Decoder, the same
    tokens as alone, batch stats of size 1 with no batched forwards."""
    import multispec.decoding.batch_offline as offline

    p, _ = pair

    def no_group(*a, **k):
        raise AssertionError("a BatchEngine was built for batch_size=1")

    monkeypatch.setattr(offline, "BatchEngine", no_group)
    prompts = ["def f(x):", "x = 1"]
    out = generate(p, prompts, method="auto", max_new_tokens=8, temperature=0, seed=1, batch_size=1)
    for prompt, r in zip(prompts, out):
        assert r.token_ids == generate(p, prompt, method="auto", max_new_tokens=8, temperature=0).token_ids
        assert r.stats["batch"]["size"] == 1 and "forwards" not in r.stats["batch"] and not r.stats["warnings"]
    with pytest.raises(AssertionError):  # two at a time do batch
        generate(p, prompts, method="ar", max_new_tokens=4, temperature=0, batch_size=2)


def test_hf_backend_runs_a_batch_one_sequence_at_a_time_and_says_so(pair):
    p, _ = pair
    out = generate(p, ["def f(x):", "x = 1"], method="ar", max_new_tokens=5, temperature=0, backend="hf")
    assert all(any("one at a time" in w for w in r.stats["warnings"]) for r in out)
    assert [r.token_ids for r in out] == [generate(p, s, method="ar", max_new_tokens=5, temperature=0).token_ids
                                          for s in ("def f(x):", "x = 1")]


@pytest.mark.parametrize("prompts,kw,needle", [
    ([], {}, "list of prompts is empty"),
    (["def f(x):", ""], {}, "prompts[1]: the prompt is empty"),
    (["def f(x):", [0, 1]], {}, "mix strings and token-id lists (prompts[0] is a str, prompts[1] is not)"),
    (["def f(x):", None], {}, "prompts[1]: the prompt must be a str or a list of token ids, got NoneType"),
    (["a", "b"], {"seed": [1, 2, 3]}, "3 seeds for 2 prompts"),
    (["a", "b"], {"batch_size": 0}, "batch_size must be"),
    (["a", "b"], {"stream": print}, "stream takes one prompt"),
    ("a", {"batch_size": 2}, "batch_size applies to a list"),
])
def test_bad_batches_get_one_line_errors(pair, prompts, kw, needle):
    p, _ = pair
    with pytest.raises(MultispecError) as e:
        generate(p, prompts, max_new_tokens=3, **kw)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_generate_cli_decodes_a_jsonl_file_and_repeated_prompt_files_as_a_batch(pair, tmp_path, capsys):
    import json

    _, paths = pair
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "def f(x):"}\n\n"x = 1"\n')
    args = ("generate", "--target", str(paths["target"]), "--draft", str(paths["draft"]), "--method", "sd",
            "--max-new-tokens", "6", "--temperature", "0", "--seed", "3")
    code, out, err = run_cli(capsys, *args, "--prompt-file", str(f), "--json", "--batch-size", "2")
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert sorted((r["index"], r["seed"]) for r in rows) == [(0, 3), (1, 4)]
    assert all("token_ids" in r for r in rows)
    assert "2 prompts, batch size 2" in err
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("def f(x):")
    b.write_text("x = 1")
    code, out2, _ = run_cli(capsys, *args, "--prompt-file", str(a), "--prompt-file", str(b), "--json")
    texts = dict(sorted((r["index"], r["text"]) for r in rows))
    assert code == 0 and {json.loads(x)["index"]: json.loads(x)["text"] for x in out2.splitlines()} == texts


@pytest.mark.parametrize("content,extra,needle", [
    ('{"prompt": 3}\n', (), "expected a JSON string"),
    ("not json\n", (), "line 1 is not JSON"),
    ('"a"\n"b"\n', ("--baseline",), "--baseline and --stream take one prompt"),
    ('"a"\n""\n', (), "p.jsonl line 2: the prompt is empty"),
])
def test_generate_cli_refuses_bad_prompt_files_in_one_line(tmp_path, capsys, content, extra, needle):
    f = tmp_path / "p.jsonl"
    f.write_text(content)
    code, _, err = run_cli(capsys, "generate", "--prompt-file", str(f), *extra)
    assert_one_line_error(code, err, needle)


def test_batch_size_without_several_prompts_is_refused(capsys):
    code, _, err = run_cli(capsys, "generate", "def f(x):", "--batch-size", "4")
    assert_one_line_error(code, err, "--batch-size applies to several prompts")


def test_a_batch_refuses_a_run_that_does_not_fit_its_rows():
    target = tiny_llama(vocab=16, hidden=16, layers=1, heads=2, kv_heads=1)
    decoder = Decoder(_pair(target, None), "ar", "fast")
    batch = BatchEngine(decoder, 2, 20)
    with pytest.raises(MultispecError, match="cache rows"):
        batch.add_ids(list(range(10)), GREEDY, 12, 0)
    assert batch.live == 0 and batch.free == 2  # nothing joined, no slot taken


def test_the_engine_runs_every_generation_in_the_callers_thread_a_slot_at_a_time():
    """Ten generations on four slots: every forward runs in the caller's thread (no thread, no coroutine library
    per sequence), at most four run at once, they share forwards, the same requests give the same batches, an error
    in one sequence ends that one only (the others finish) and a full batch refuses another in one sentence."""
    target, draft = tiny_pair(vocab=16, seed=3, noise=0.3)
    decoder = Decoder(_pair(target, draft), "sd", "fast", k=3)
    prompts = [[1 + i % 5, 2, 3 + i % 7] for i in range(10)]

    def fails(new):
        if len(new) >= 4:
            raise ValueError("request 7 fails")

    def run_all():
        batch = BatchEngine(decoder, 4, 64)
        out, errors, most = {}, {}, 0
        waiting, running = list(range(len(prompts)))[::-1], {}
        while waiting or running:
            while waiting and batch.free:
                i = waiting.pop()
                running[batch.add_ids(prompts[i], GREEDY, 12, 0, on_tokens=fails if i == 7 else None)] = i
            most = max(most, batch.live)
            for seq_id, result in batch.step():
                i = running.pop(seq_id)
                if isinstance(result, BaseException):
                    errors[i] = result
                else:
                    out[i] = result[0]
        assert most == 4 and list(errors) == [7] and "request 7" in str(errors[7]) and len(out) == 9
        full = BatchEngine(decoder, 1, 64)
        full.add_ids([1, 2], GREEDY, 4, 0)
        with pytest.raises(MultispecError, match="slots is busy"):
            full.add_ids([1, 2], GREEDY, 4, 0)
        return [out[i] for i in sorted(out)], batch.stats()["target"]

    first, stats = run_all()
    assert (first, stats) == run_all() and stats["mean_batch"] > 2, stats


def test_a_failed_batched_forward_fails_its_sequences_and_hangs_none(monkeypatch):
    """If a batched forward itself fails (a bug: here every forward raises), each sequence in it gets the error as
    its result instead of waiting forever, the slots free, and the engine takes new requests."""
    from multispec.decoding import engine

    target, draft = tiny_pair(vocab=16, seed=3, noise=0.3)
    decoder = Decoder(_pair(target, draft), "sd", "fast", k=3)
    batch = BatchEngine(decoder, 4, 64)
    ids = [batch.add_ids([1, 2, 3 + i], GREEDY, 12, 0) for i in range(4)]

    def broken(requests):
        return [RuntimeError("a bug in the forward")] * len(requests)

    monkeypatch.setattr(engine, "forward_all", broken)
    ended = batch.step()
    assert sorted(i for i, _ in ended) == ids and all("a bug in the forward" in str(r) for _, r in ended)
    assert batch.live == 0 and batch.free == 4
    monkeypatch.undo()
    i = batch.add_ids([1, 2, 3], GREEDY, 4, 0)
    while batch.live:
        ended = batch.step()
    assert ended[0][0] == i and len(ended[0][1][0]) == 4


def test_bench_batch_size_measures_every_method_and_transformers_batched_generate(pair, tmp_path, capsys):
    import json

    _, paths = pair
    data = tmp_path / "prompts.jsonl"
    data.write_text("\n".join(json.dumps({"prompt": p}) for p in ("def f(x):", "x = 1", "for n in", "if x:")))
    code, out, err = run_cli(capsys, "bench", "--target", str(paths["target"]), "--draft", str(paths["draft"]),
                             "--dataset", str(data), "--batch-size", "2", "--methods", "ar;sd:k=2;hf-assisted",
                             "--max-new-tokens", "4", "--temperatures", "0,1", "--out", str(tmp_path / "out"))
    assert code == 0, err
    rows = json.loads((tmp_path / "out" / "results.json").read_text())["rows"]
    assert {(r["method"], r["temperature"]) for r in rows} == {(m, t) for m in ("ar", "sd:k=2", "hf-generate")
                                                              for t in (0.0, 1.0)}
    assert all(r["batch_size"] == 2 and r["prompts"] == 4 and r["tokens_per_s"] > 0 for r in rows)
    assert "batched ar" in out


@pytest.mark.parametrize("mode", ["auto", "off"])
def test_bench_batch_size_templates_chat_data_sets_as_one_sequence_bench_does(pair, tmp_path, monkeypatch, mode):
    """--batch-size tokenizes a chat data set's prompts through the chat template (as the one-sequence bench),
    unless --chat-template off; the results record which."""
    import json

    import multispec.decoding.batch_offline as offline
    from multispec.bench.batched import run_batch_bench
    from multispec.data import load_prompts
    from multispec.text import encode_chat, encode_prompt

    loaded, _ = pair
    monkeypatch.setattr(loaded.tokenizer, "chat_template", "{% for m in messages %}<{{ m['content'] }}>{% endfor %}",
                        raising=False)
    (tmp_path / "alpaca_eval.jsonl").write_text(json.dumps({"instruction": "Add one to x."}) + "\n")
    seen = []
    real = offline.generate_batch
    monkeypatch.setattr(offline, "generate_batch", lambda d, prompts, **kw: seen.append(prompts) or real(d, prompts,
                                                                                                            **kw))
    res = run_batch_bench(loaded, ["alpaca"], str(tmp_path), "ar", [0.0], 1, 2, None, 0, tmp_path / "out",
                          progress=lambda line: None, chat_template=mode)
    vocab, prompt = loaded.target.config.vocab_size, load_prompts("alpaca", str(tmp_path))[0]
    want = encode_chat(loaded.tokenizer, vocab, [{"role": "user", "content": prompt.message}]) if mode == "auto" \
        else encode_prompt(loaded.tokenizer, vocab, prompt.text)  # off: the data set's raw-text form
    assert seen[-1] == [want] and res["settings"]["chat_template_applied"] == {"alpaca": mode == "auto"}


@pytest.mark.parametrize("args,needle", [
    (["generate", "--prompt-file", "{jsonl}", "--batch-size", "0"], "--batch-size"),
    (["generate", "--prompt-file", "{blank}", "--lines"], "no prompts"),
    (["serve", "--max-batch", "0"], "--max-batch"),
    (["bench", "--batch-size", "0", "--out", "{out}"], "--batch-size"),
])
def test_batch_options_refuse_bad_values_in_one_line(tmp_path, capsys, args, needle):
    (tmp_path / "p.jsonl").write_text('"a"\n"b"\n')
    (tmp_path / "blank.txt").write_text("\n  \n")
    args = [a.format(jsonl=tmp_path / "p.jsonl", blank=tmp_path / "blank.txt", out=tmp_path / "o") for a in args]
    code, _, err = run_cli(capsys, *args)
    assert_one_line_error(code, err, needle)


def test_chunked_prefill_keeps_every_output(monkeypatch):
    """A prompt longer than PREFILL_CHUNK is fed in chunks, each its own batched forward (a joining prompt does not
    stall the others for its whole prefill); outputs and prompt logprobs stay those of batch-1 decoding."""
    import multispec
    from multispec.models import batched

    pair = multispec.load_pair()
    prompts = ["def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
               "import os\n", "for i in range(10):\n    print(i * i)\n"]
    alone = [multispec.generate(pair, p, method=m, backend="fast", max_new_tokens=16, temperature=0).token_ids
             for m in ("ar", "sd") for p in prompts]
    scored = multispec.generate(pair, prompts[0], method="ar", backend="fast", max_new_tokens=0, prompt_logprobs=True)
    from multispec.decoding import engine

    sizes = []
    forward_all = batched.forward_all
    monkeypatch.setattr(batched, "PREFILL_CHUNK", 8)
    monkeypatch.setattr(engine, "forward_all", lambda requests: sizes.extend(r.tokens.shape[0] for r in requests)
                        or forward_all(requests))
    got = [r.token_ids for m in ("ar", "sd") for r in multispec.generate(pair, prompts, method=m, batch_size=3,
                                                                         max_new_tokens=16, temperature=0)]
    assert got == alone and max(sizes) == 8  # the long prompt went in chunks of 8, one per step
    rescored = multispec.generate(pair, [prompts[0], prompts[1]], method="ar", batch_size=2, max_new_tokens=0,
                                  prompt_logprobs=True)[0]
    assert [x.logprob for x in rescored.prompt_logprobs[1:]] == pytest.approx(
        [x.logprob for x in scored.prompt_logprobs[1:]], abs=1e-5)
