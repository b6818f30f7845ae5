"""A feature head batched (models/eagle_batched.py, decoding/batch.py): eagle and auto with a head decode many
sequences at once with one head forward per depth across the batch and one target forward over the round batch.
Greedy output is each prompt's batch-1 output, each slot's head holds exactly the teacher-forced features of its
own text, the law at T = 1 is the target's; broken variants (a head reading another slot's feature, a tap whose
features are not gathered on keep, heads run one sequence at a time, a target slot not cut) are caught."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from helpers import tiny_llama
from test_batch import drive
from test_eagle import _head_dir, cheap_head_costs  # a random head whose drafts the target sometimes accepts
from multispec.decoding.batch import BatchEngine, batchable
from multispec.decoding.decoder import Decoder
from multispec.errors import MultispecError
from multispec.loading import Pair
from multispec.models.batched import Role
from multispec.models.eagle import FeatureTap, TargetParts, new_head
from multispec.models.eagle_batched import HeadBatch, HeadNet, HeadSlot
from multispec.models.eagle_io import save_head
from multispec.sampling import SamplingConfig

torch.set_num_threads(1)
GREEDY = SamplingConfig(temperature=0.0)
PROMPTS = [[1, 2, 3], [0, 7, 7, 7, 2, 9, 4], [5], [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]]


def _pair(target) -> Pair:
    tok = SimpleNamespace(eos_token_id=None, bos_token_id=None)
    return Pair(target=target, draft=None, tokenizer=tok, target_path="t", draft_path="d")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    target = tiny_llama(vocab=16, hidden=32, layers=2, heads=4, kv_heads=2, seed=0, scale=3.0)
    return target, _head_dir(target, tmp_path_factory.mktemp("head") / "head")


def _batched(decoder: Decoder, prompts, slots: int, sampling, max_new, seeds, rows: int = 96):
    """Every prompt through a BatchEngine of `slots` slots (a freed slot takes the next prompt), each plan run as its
    policy made it (auto: not priced against a plain batch step, so that its head plans run). Returns the (new ids,
    metrics) of each prompt, the batch, and each prompt's head (HeadSlot, in prompt order)."""
    heads, real = [], HeadBatch.backends

    def recording(self, slot, target):
        tap, head = real(self, slot, target)
        heads.append(head)
        return tap, head

    HeadBatch.backends = recording
    try:
        batch = BatchEngine(decoder, slots, rows)
        batch.engine.costs = None
        out = drive(batch, prompts, sampling, max_new, seeds)
    finally:
        HeadBatch.backends = real
    return out, batch, heads


def _teacher_forced(target, head, ids: list[int]) -> torch.Tensor:
    """float [L, H]: the head's features over `ids` by one teacher-forced forward (the target's features, causal)."""
    with torch.no_grad():
        return head.teacher_forced(TargetParts.of(target), torch.tensor([ids]),
                                   target.model(input_ids=torch.tensor([ids])).last_hidden_state)[0]


def _assert_heads_teacher_forced(target, prompts, outs, heads) -> None:
    """Each prompt's head holds, after its run, the rows of its committed text only, each the head's feature of
    one teacher-forced forward over that text."""
    assert sum(m.accepted for _, m in outs) > 0
    for prompt, (ids, m), h in zip(prompts, outs, heads):
        rows = h._pos.shape[0]
        assert rows > len(prompt)
        assert torch.equal(h._pos, torch.arange(rows)), "a head kept rows off the committed path"
        ref = _teacher_forced(target, h.model, (prompt + ids)[:rows])
        torch.testing.assert_close(h._out.float(), ref, atol=1e-4, rtol=1e-4)


def _pin_costs(decoder: Decoder) -> None:
    """Every policy the decoder makes (its own and each slot's) plans from fixed costs where the head is cheap
    against the target, as test_eagle._chi_square's do: timed costs on a busy machine could leave the head unused."""
    real = decoder.new_policy

    def pinned():
        policy = real()
        policy.fixed_costs = cheap_head_costs()
        policy.reset()
        return policy

    decoder.new_policy = pinned
    decoder.policy = pinned()


@pytest.mark.parametrize("method,options", [("eagle", {"k": 3}), ("eagle", {"tree": (2, 2, 1)}),
                                            ("eagle", {"k": 4, "confidence": 0.3}),
                                            ("auto", {"proposers": "draft"})])
def test_batched_greedy_equals_batch_one(tiny, method, options):
    """Four distinct prompts through four slots, then seven through three (slots reused as sequences end): each
    prompt's tokens are its batch-1 tokens; every head forward carried several sequences, and each head's rows
    are the teacher-forced ones of its own text."""
    target, head_dir = tiny
    decoder = Decoder(_pair(target), method, "fast", head=str(head_dir), **options)
    if method == "auto":  # its plans from fixed costs in which the head is cheap, not from this machine's load
        _pin_costs(decoder)
    assert batchable(decoder)
    prompts = PROMPTS + [[2, 2], [9, 8, 7, 6, 5, 4], [4, 4, 1]]
    max_new = [20, 14, 24, 9, 16, 20, 11]
    alone = [decoder.run(p, GREEDY, n, 0) for p, n in zip(prompts, max_new)]
    for slots, count in ((4, 4), (3, 7)):
        outs, batch, heads = _batched(decoder, prompts[:count], slots, GREEDY, max_new[:count], [0] * count)
        assert [o[0] for o in outs] == [a[0] for a in alone[:count]]
        if method == "eagle":  # the same drafts (auto's plans follow its timings)
            assert [o[1].accepted for o in outs] == [a[1].accepted for a in alone[:count]]
            _assert_heads_teacher_forced(target, prompts[:count], outs, heads)
        stats = batch.stats()
        assert stats["target"]["mean_batch"] > 1.5 and stats["head"]["forwards"] > 0, stats
        assert method == "auto" or stats["head"]["mean_batch"] > 1.5, stats  # (auto drafts where it expects gains)


def _roll_features(real):
    def rolled(self, tokens, features, ns):  # each row reads the feature of the row before it in the batch
        return real(self, tokens, [torch.cat([f for f in features]).roll(1, 0).split(ns)[j]
                                   for j in range(len(ns))], ns)
    return rolled


@pytest.mark.parametrize("mutant", ["other_slots_feature", "tap_not_gathered"])
def test_a_head_reading_the_wrong_feature_is_caught(tiny, monkeypatch, mutant):
    """The teacher-forced check fails when a head row reads its neighbour's feature in the batch (another slot's,
    the flattening off by one), or when the tap keeps its rejected rows' features (keep not gathering them). The
    output stays the target's either way: features only shape the drafts."""
    target, head_dir = tiny
    decoder = Decoder(_pair(target), "eagle", "fast", head=str(head_dir), k=3)
    if mutant == "other_slots_feature":
        monkeypatch.setattr(HeadNet, "feature_input", _roll_features(HeadNet.feature_input))
    else:
        monkeypatch.setattr(FeatureTap, "keep", lambda self, indices: self.inner.keep(indices))
    outs, _, heads = _batched(decoder, PROMPTS, 4, GREEDY, 20, [0] * 4)
    with pytest.raises((AssertionError, MultispecError)):
        _assert_heads_teacher_forced(target, PROMPTS, outs, heads)


@pytest.mark.parametrize("alone", [False, True])
def test_one_head_forward_per_depth_across_the_batch(tiny, monkeypatch, alone):
    """k = 3 on four short prompts (no catch-up forward): every step runs at most three forwards of the head's
    cache (models/batched.run_batch calls, wherever made), and in a step of four drafting sequences each carries
    all four. Broken variant: heads run one sequence at a time (no batch part), caught by the count."""
    from multispec.models import batched, eagle_batched

    target, head_dir = tiny
    if alone:
        monkeypatch.setattr(HeadSlot, "batch_part", lambda self, r, every_hidden=False: None)
    calls: list = []
    for module in (batched, eagle_batched):
        real = module.run_batch
        monkeypatch.setattr(module, "run_batch", lambda cache, steps, real=real: calls.append(
            (cache.role, len(steps))) or real(cache, steps))
    decoder = Decoder(_pair(target), "eagle", "fast", head=str(head_dir), k=3)
    batch = BatchEngine(decoder, 4, 96)
    for p in PROMPTS:
        batch.add_ids(p, GREEDY, 12, 0)
    per_step = []
    while batch.live:
        calls.clear()
        batch.step()
        per_step.append([n for role, n in calls if role == Role.DRAFT])
    ok = all(len(sizes) <= 3 for sizes in per_step) and [4, 4, 4] in per_step
    assert ok != alone, per_step
    if not alone:
        assert batch.stats()["head"]["forwards"] == sum(map(len, per_step))


def test_a_cross_vocabulary_draft_still_refuses_to_batch(tiny):
    target, head_dir = tiny
    decoder = Decoder(_pair(target), "eagle", "fast", head=str(head_dir), k=2)
    decoder.pair = SimpleNamespace(**{**vars(decoder.pair), "cross_vocab": "uag"})
    assert not batchable(decoder)
    with pytest.raises(MultispecError, match="another tokenizer"):
        BatchEngine(decoder, 2, 64)


@pytest.fixture(scope="module")
def law_decoders(tmp_path_factory):
    """The law tests' target (one whose next-token law moves with every visible row, test_batch.context_pair) and
    its eagle decoders: a chain, a tree, and one level of three siblings (where a row that sees its sibling shows
    most)."""
    from test_batch import context_pair

    target = context_pair()[0]
    head_dir = _head_dir(target, tmp_path_factory.mktemp("law_head") / "head", seed=4)
    return target, {name: Decoder(_pair(target), "eagle", "fast", head=str(head_dir), **options)
                    for name, options in (("chain", {"k": 2}), ("tree", {"tree": (2, 1)}), ("wide", {"tree": (3,)}))}


@pytest.mark.slow
@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_batched_sampling_keeps_the_target_law(law_decoders, shape):
    """T = 1, six slots, two prompts interleaved, sequences of three lengths leaving and joining: the joint law of
    each prompt's tokens 2 and 3 (verified on caches, the tap's features and the head's rows kept by earlier rounds)
    is the target's."""
    from test_batch import PROMPTS_LAW, _law_pvalues

    target, decoders = law_decoders
    pvalues = _law_pvalues(decoders[shape], target, PROMPTS_LAW, 1500, 6)
    assert min(pvalues) > 1e-3, pvalues


@pytest.mark.slow
def test_a_target_slot_not_cut_is_caught(law_decoders, monkeypatch):
    """The same test fails when the tap gathers its features but does not cut its target slot's rows."""
    from test_batch import PROMPTS_LAW, _law_pvalues

    target, decoders = law_decoders
    monkeypatch.setattr(FeatureTap, "keep", lambda self, indices: setattr(self, "hidden", self.hidden[indices]))
    try:  # stale rows can also push the tap's rows out of line with the cache: an IndexError
        pvalues = _law_pvalues(decoders["wide"], target, PROMPTS_LAW, 1500, 6)
    except IndexError:
        return
    assert min(pvalues) < 1e-6, pvalues


@pytest.mark.parametrize("half", [False, True])
def test_reduced_layers_grown_from_one_subset_share_one_product(half):
    """compact_together (a batch's reduced output layers) equals each layer's own compact: layers grown apart from
    one subset (their own tails, one regathered past REPACK) and one of another subset, rows of several counts."""
    from multispec.models.reduced_vocab import RestrictedHead, compact_together

    g = torch.Generator().manual_seed(0)
    layer = torch.nn.Linear(8, 40, bias=True)
    base = RestrictedHead(layer, torch.arange(0, 40, 3), 40, half=half)
    heads = [base, base.extend([1, 2]), base.extend([5]).extend([7, 8]), RestrictedHead(layer, [4, 9, 30], 40, half)]
    heads.append(RestrictedHead(layer, [0], 40, half, (heads[1].ids, heads[1]._gather_base(heads[1].ids))))
    hidden = [torch.randn(n, 8, generator=g) for n in (1, 3, 2, 1, 2)]
    with torch.no_grad():
        together = compact_together(heads, hidden)
        for h, x, got in zip(heads, hidden, together):
            torch.testing.assert_close(got, h.compact(x))
            ref = layer(x)[:, h.ids]
            torch.testing.assert_close(got.float(), ref, atol=1e-2 if half else 1e-5, rtol=1e-2 if half else 1e-5)


def test_a_reduced_vocabulary_head_batches_with_its_batch_one_drafts(tmp_path):
    """A head whose output layer covers 12 of the 16 tokens: batched, each prompt's tokens and accepted drafts are
    its batch-1 ones (each on a fresh decoder: a decoder's head grows its vocabulary with every run's tokens)."""
    target = tiny_llama(vocab=16, hidden=32, layers=2, heads=4, kv_heads=2, seed=0, scale=3.0)
    torch.manual_seed(1)
    head = new_head(target)
    with torch.no_grad():
        head.fc.weight.mul_(3.0)
    head_dir = save_head(head, target, tmp_path / "head", token_ids=torch.arange(12))
    decoder = Decoder(_pair(target), "eagle", "fast", head=str(head_dir), tree=(2, 1))
    alone = [decoder.spawn().run(p, GREEDY, 16, 0) for p in PROMPTS]
    outs, batch, heads = _batched(decoder, PROMPTS, 4, GREEDY, 16, [0] * 4)
    assert [o[0] for o in outs] == [a[0] for a in alone]
    assert [o[1].accepted for o in outs] == [a[1].accepted for a in alone]
    assert all(h.vocab_subset is not None for h in heads) and batch.stats()["head"]["mean_batch"] > 1.5


def test_long_prompts_go_in_chunks_with_every_feature_kept(tiny, monkeypatch):
    """Prompts longer than PREFILL_CHUNK (8 here): the target's prefill goes through the tap a chunk per step, the
    head's catch-up (more than CATCH_UP_ALONE pending tokens) in chunks of its own; tokens, drafts and the heads'
    rows are still batch-1's and the teacher-forced ones."""
    from multispec.models import batched, eagle_batched

    target, head_dir = tiny
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 16, (n,), generator=g).tolist() for n in (30, 21, 5, 40)]
    decoder = Decoder(_pair(target), "eagle", "fast", head=str(head_dir), k=3)
    alone = [decoder.run(p, GREEDY, 24, 0) for p in prompts]
    for module in (batched, eagle_batched):
        monkeypatch.setattr(module, "PREFILL_CHUNK", 8)
    outs, _, heads = _batched(decoder, prompts, 4, GREEDY, 24, [0] * 4)
    assert [o[0] for o in outs] == [a[0] for a in alone]
    assert [o[1].accepted for o in outs] == [a[1].accepted for a in alone]
    _assert_heads_teacher_forced(target, prompts, outs, heads)
