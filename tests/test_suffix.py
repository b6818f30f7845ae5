"""Suffix speculation (issue 30): the tries against a brute-force scan, tree invariants, incremental updates, the
shared store (LRU cap, threads, memory) and the point-mass draft law's losslessness under the node walk."""
import math
import random
import threading
import tracemalloc

import pytest
import torch

from multispec.drafting.suffix import ContextIndex, SuffixPolicy, SuffixProposer, SuffixStore, first_child_law
from multispec.drafting.suffix_trie import Trie as _Trie
from multispec.errors import MultispecError
from multispec.verify import REGISTRY
from multispec.verify.traversal import traversal_law
from multispec.verify.tree_walk import walk_tree_law


# ----------------------------------------------------------------- brute force
def occurrences(seqs, w):
    """Occurrences of the string w in the sequences (none across a boundary)."""
    m = len(w)
    return sum(1 for s in seqs for j in range(len(s) - m + 1) if tuple(s[j:j + m]) == w)


def next_counts(seqs, w):
    """{x: occurrences of w + x} for every token x that follows w somewhere."""
    m, out = len(w), {}
    for s in seqs:
        for j in range(len(s) - m):
            if tuple(s[j:j + m]) == w:
                out[s[j + m]] = out.get(s[j + m], 0) + 1
    return out


def naive_match(seqs, context, max_match, depth):
    """Longest suffix (<= max_match, <= depth - 1) of context that occurs in seqs followed by a token."""
    for m in range(min(max_match, depth - 1, len(context)), 0, -1):
        if next_counts(seqs, tuple(context[-m:])):
            return m
    return 0


def naive_scores(seqs, s, cap, min_prob):
    """{path (tuple of tokens below s): score} of every candidate node within depth cap."""
    out = {}

    def visit(path, score):
        if len(path) == cap:
            return
        counts = next_counts(seqs, s + path)
        total = sum(counts.values())
        for x, c in counts.items():
            if c / total >= min_prob:
                out[path + (x,)] = score * c / total
                visit(path + (x,), score * c / total)

    visit((), 1.0)
    return out


def dump(trie, ref=0, prefix=()):
    """{string: count} of every string below `ref`, lazy chains included."""
    out = {}
    for count, token, child in trie.children(ref):
        out[prefix + (token,)] = count
        out.update(dump(trie, child, prefix + (token,)))
    return out


def naive_counts(seqs, depth):
    """{string: occurrences} of every substring of length <= depth."""
    out = {}
    for s in seqs:
        for j in range(len(s)):
            for m in range(1, depth + 1):
                if j + m <= len(s):
                    w = tuple(s[j:j + m])
                    out[w] = out.get(w, 0) + 1
    return out


def check_invariants(prop, context, max_nodes):
    tree, tokens, scores = prop.tree, prop.tokens, prop.scores
    assert len(tree) == len(tokens) == len(scores) <= max_nodes + 1
    assert tokens[0] == context[-1] and scores[0] == 1.0
    for u, kids in enumerate(tree.children):
        assert list(kids) == list(range(kids[0], kids[0] + len(kids))) if kids else True  # contiguous
        sib = [tokens[k] for k in kids]
        assert len(set(sib)) == len(sib), "siblings must be distinct"
        assert all(scores[k] <= scores[u] + 1e-12 for k in kids)
        assert [scores[k] for k in kids] == sorted((scores[k] for k in kids), reverse=True)
    assert list(tree.depths) == sorted(tree.depths)  # breadth-first


def check_against_naive(prop, seqs, context, max_nodes, depth, max_match, factor, offset, min_prob):
    """The proposal is the top-max_nodes (by score) of the brute-force candidate tree below the naive match."""
    m = naive_match(seqs, context, max_match, depth)
    if m == 0:
        assert prop.source == "none" and len(prop.tree) == 1
        return
    assert prop.match_len == m
    s = tuple(context[-m:])
    cap = min(depth - m, int(factor * m + offset))
    cand = naive_scores(seqs, s, cap, min_prob)
    for u in range(1, len(prop.tree)):
        path = tuple(prop.tokens[v] for v in prop.tree.path_to(u)[1:])
        assert len(path) <= cap
        assert math.isclose(prop.scores[u], cand[path], rel_tol=1e-9)
    best = sorted(cand.values(), reverse=True)[:max_nodes]
    assert len(prop.tree) - 1 == len(best)
    got = sorted(prop.scores[1:], reverse=True)
    assert all(math.isclose(a, b, rel_tol=1e-9) for a, b in zip(got, best))
    for u, kids in enumerate(prop.tree.children):  # children ranked by count (ties: token id)
        path = tuple(prop.tokens[v] for v in prop.tree.path_to(u)[1:])
        counts = next_counts(seqs, s + path)
        keys = [(-counts[prop.tokens[k]], prop.tokens[k]) for k in kids]
        assert keys == sorted(keys)


def stream(rng, n, vocab, repetitive):
    if not repetitive:
        return [rng.randrange(vocab) for _ in range(n)]
    motifs = [[rng.randrange(vocab) for _ in range(rng.randint(2, 7))] for _ in range(4)]
    out = []
    while len(out) < n:
        out += rng.choice(motifs) if rng.random() < 0.85 else [rng.randrange(vocab)]
    return out[:n]


# ----------------------------------------------------------------- context index
@pytest.mark.parametrize("repetitive", [False, True])
@pytest.mark.parametrize("vocab", [3, 12])
def test_context_proposals_match_brute_force(repetitive, vocab):
    rng = random.Random(vocab * 10 + repetitive)
    depth, max_match, factor, offset, min_prob = 10, 6, 2.0, 1, 0.05
    for trial in range(6):
        prop_obj = SuffixProposer(depth=depth, max_match=max_match, factor=factor, offset=offset, min_prob=min_prob)
        ctx = stream(rng, rng.randint(1, 90), vocab, repetitive)
        for cut in sorted(rng.sample(range(1, len(ctx) + 1), min(5, len(ctx)))):
            context = ctx[:cut]
            max_nodes = rng.choice([1, 3, 8, 20])
            prop = prop_obj.propose(context, max_nodes)
            check_invariants(prop, context, max_nodes)
            check_against_naive(prop, [context], context, max_nodes, depth, max_match, factor, offset, min_prob)


def test_incremental_updates_equal_a_rebuild():
    rng = random.Random(1)
    for repetitive in (False, True):
        ctx = stream(rng, 300, 6, repetitive)
        inc, pos = ContextIndex(depth=9), 0
        while pos < len(ctx):
            pos = min(len(ctx), pos + rng.randint(1, 7))
            inc.update(ctx[:pos])
        full = ContextIndex(depth=9)
        full.update(ctx)
        assert dump(inc.trie) == dump(full.trie)
        assert inc.longest_match(8)[1] == full.longest_match(8)[1]
        assert dump(full.trie) == naive_counts([ctx], 9)


def test_novel_text_costs_constant_nodes_per_token():
    rng = random.Random(7)
    ctx = [rng.randrange(10_000) for _ in range(3_000)]
    index = ContextIndex(depth=32)
    index.update(ctx)
    assert index.trie.n_nodes <= 2 * len(ctx)  # a materialised depth-32 trie would hold ~32 per token
    full = dump(index.trie)
    assert len(full) == len(naive_counts([ctx], 32))  # every substring is still there, most of them implicit
    assert {w: c for w, c in full.items() if len(w) <= 3} == naive_counts([ctx], 3)


def test_context_that_does_not_extend_is_reindexed():
    p = SuffixProposer(depth=8, max_match=4, factor=4, min_prob=0.0)
    a = p.propose([1, 2, 3, 1, 2], 4)
    assert a.tokens[1] == 3
    b = p.propose([7, 8, 9, 7, 8], 4)  # a new request without reset(): rebuilt, nothing from the first
    assert b.tokens[1:] == (9, 7, 8)
    fresh = SuffixProposer(depth=8, max_match=4, factor=4, min_prob=0.0).propose([7, 8, 9, 7, 8], 4)
    assert b == fresh


def test_depth_cap_and_max_depth():
    ctx = [5, 6, 7, 8, 9, 10, 11, 12] * 4
    for factor, offset, m_expected in [(1.0, 0, 6), (0.5, 1, 6)]:
        p = SuffixProposer(depth=30, max_match=6, factor=factor, offset=offset, min_prob=0.0)
        prop = p.propose(ctx, 50)
        assert prop.match_len == m_expected
        assert prop.tree.max_depth == min(30 - 6, int(factor * 6 + offset))
    prop = SuffixProposer(depth=30, max_match=6, factor=4.0).propose(ctx, 50, max_depth=3)
    assert prop.tree.max_depth == 3


def test_no_match_gives_the_root_alone():
    prop = SuffixProposer().propose([1, 2, 3, 4], 10)
    assert len(prop.tree) == 1 and prop.tokens == (4,) and prop.source == "none" and prop.expected_accepted == 0
    assert len(SuffixProposer().propose([1, 1, 1], 0).tree) == 1
    with pytest.raises(MultispecError):
        SuffixProposer().propose([], 3)
    with pytest.raises(MultispecError):
        SuffixProposer(depth=8, max_match=8)


def test_branching_tree_ranks_by_frequency():
    # "a b" was followed by c three times and by d once: c first, d second, scores 3/4 and 1/4.
    ctx = [1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 4, 0, 1, 2, 3, 0, 1, 2]
    prop = SuffixProposer(depth=8, max_match=2, factor=1.0, offset=0, min_prob=0.0).propose(ctx, 5)
    assert prop.match_len == 2 and prop.tree.parents == (-1, 0, 0, 1, 2)
    assert prop.tokens == (2, 3, 4, 0, 0)
    assert prop.scores[1:3] == (0.75, 0.25)


# ----------------------------------------------------------------- store
def test_store_proposals_match_brute_force():
    rng = random.Random(3)
    depth, max_match = 10, 6
    for repetitive in (False, True):
        store = SuffixStore(max_tokens=10_000, depth=depth)
        seqs = [stream(rng, rng.randint(1, 60), 5, repetitive) for _ in range(8)]
        for i, s in enumerate(seqs):
            store.add(i, s)
        for _ in range(20):
            context = stream(rng, rng.randint(1, 30), 5, repetitive)
            max_nodes = rng.choice([2, 6, 15])
            prop = store.propose(context, max_nodes, max_match, 1.5, 1, 0.05)
            check_invariants(prop, context, max_nodes)
            check_against_naive(prop, seqs, context, max_nodes, depth, max_match, 1.5, 1, 0.05)


def test_proposer_takes_the_better_source():
    store = SuffixStore(depth=16)
    store.add("old", [9, 1, 2, 3, 4, 5, 6, 7, 8])
    p = SuffixProposer(store, depth=16, max_match=8, factor=2.0, min_prob=0.0)
    prop = p.propose([1, 2, 3, 4], 10)  # nothing repeats in the context: the store answers
    assert prop.source == "store" and prop.tokens == (4, 5, 6, 7, 8)
    prop = p.propose([1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2], 2)  # both match; the context is as good: it wins ties
    assert prop.source == "context"


def test_store_lru_eviction_and_cap():
    store = SuffixStore(max_tokens=100, depth=6)
    rng = random.Random(4)
    seqs = {}
    for i in range(60):
        s = [rng.randrange(7) for _ in range(rng.randint(1, 40))]
        store.add(i, s)
        seqs[i] = s
        if i % 5 == 0 and i > 0:
            store.touch(i - 3)
        assert store.n_tokens <= 100
        assert store.n_tokens == sum(len(v) for v in store._seqs.values())
    fresh = _Trie(6)
    for s in store._seqs.values():
        fresh.add(s)
    assert dump(store._trie) == dump(fresh) == naive_counts(store._seqs.values(), 6)  # removals leave what is held
    assert store.n_nodes <= 6 * store.n_tokens  # a node left at count 1 by a removal stays a node (no re-folding)
    store.add("huge", list(range(250)))
    assert store.n_tokens == 100 and len(store) == 1 and store._seqs["huge"] == tuple(range(150, 250))


def test_store_lru_order():
    store = SuffixStore(max_tokens=10, depth=4)
    store.add("a", [1, 2, 3, 4])
    store.add("b", [5, 6, 7])
    store.touch("a")
    store.add("c", [8, 9, 10])  # 10 tokens: nothing evicted
    assert len(store) == 3
    store.add("d", [11])  # b is the least recently used
    assert "b" not in store and {"a", "c", "d"} <= set(store._seqs)
    store.add("a", [1, 2])  # replacing a key re-counts it
    assert store.n_tokens == 2 + 3 + 1
    store.remove("c")
    assert store.n_tokens == 3 and "c" not in store


def test_store_threads():
    store = SuffixStore(max_tokens=2_000, depth=8)
    errors = []

    def work(seed):
        rng = random.Random(seed)
        try:
            for i in range(150):
                s = stream(rng, rng.randint(5, 40), 6, True)
                store.add((seed, i), s)
                prop = SuffixProposer(store, depth=8, max_match=5, factor=2.0).propose(s[: rng.randint(1, len(s))], 8)
                check_invariants(prop, prop.tokens[:1], 8)
        except Exception as exc:  # collected and re-raised in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert store.n_tokens <= 2_000 and store.n_tokens == sum(len(v) for v in store._seqs.values())
    assert dump(store._trie) == naive_counts(store._seqs.values(), 8)


def test_determinism():
    rng = random.Random(5)
    seqs = [stream(rng, 50, 5, True) for _ in range(6)]
    ctx = stream(rng, 120, 5, True)
    outs = []
    for _ in range(2):
        store = SuffixStore(depth=12)
        for i, s in enumerate(seqs):
            store.add(i, s)
        p = SuffixProposer(store, depth=12, max_match=8, factor=2.0, min_prob=0.0)
        outs.append([p.propose(ctx[:n], 12) for n in range(1, len(ctx) + 1)])
    assert outs[0] == outs[1]


def test_memory_is_bounded_over_10k_requests():
    store = SuffixStore(max_tokens=5_000, depth=8)
    rng = random.Random(6)
    tracemalloc.start()
    sizes = {}
    try:
        for i in range(10_000):
            store.add(i, [rng.randrange(50) for _ in range(rng.randint(5, 25))])
            if i in (2_000, 9_999):
                sizes[i] = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert store.n_tokens <= 5_000
    assert store.n_nodes <= 5_000 * 8
    assert len(store._trie.count) <= (5_000 + 25) * 8 + 1  # ids are reused: the lists stop growing
    assert sizes[9_999] <= 1.25 * sizes[2_000]


# ----------------------------------------------------------------- the draft law
def stream_law_holds(law, tree, toks, p):
    """Lossless: P(the stream starts with the tokens of path(u) then y) = prod(p along path(u)) * p[u](y), for every
    node u and token y; an outcome that ends the round earlier continues with draws from the target."""
    for u in range(len(tree)):
        path = tree.path_to(u)
        want_prefix = [toks[v] for v in path[1:]]
        reach = math.prod(float(p[path[i - 1], toks[path[i]]]) for i in range(1, len(path)))
        for y in range(p.shape[1]):
            t, got = want_prefix + [y], 0.0
            for (pa, nxt), prob in law.items():
                s = [toks[v] for v in pa[1:]] + [nxt]
                if s[:len(t)] == t:
                    got += prob
                elif t[:len(s)] == s:
                    got += prob * math.prod(float(p[path[j], t[j]]) for j in range(len(s), len(t)))
            assert math.isclose(got, reach * float(p[u, y]), abs_tol=1e-12)


def test_first_child_law_is_lossless_and_the_walk_reaches_every_sibling():
    """q = one-hot of the first child. Node walk + rrs-wor: lossless, and a node is accepted exactly when the
    stream follows its path (expected accepted = sum of path probabilities, the most any verifier can give a
    deterministic tree), because a residual token equal to a later sibling is routed into it. Traversal with the
    same q: lossless, but a later sibling has no draft mass (Q = 0 once the first is deleted): fewer accepted."""
    torch.manual_seed(0)
    vocab = 6
    ctx = [1, 2, 3, 1, 2, 4, 1, 2, 5, 1, 2, 3, 3, 1, 2]
    prop = SuffixProposer(depth=8, max_match=2, factor=1.5, min_prob=0.0).propose(ctx, 6)
    tree, tokens, toks = prop.tree, torch.tensor(prop.tokens), prop.tokens
    assert len(tree.children[0]) == 3  # three distinct siblings
    p = torch.softmax(torch.randn(len(tree), vocab, dtype=torch.float64), -1)
    q = first_child_law(tree, tokens, vocab).double()
    walk = walk_tree_law(tree, tokens, p, q, REGISTRY["rrs-wor"])
    trav = traversal_law(tree, tokens, p, q)
    for law in (walk, trav):
        assert math.isclose(sum(law.values()), 1.0, rel_tol=1e-9)
        stream_law_holds(law, tree, toks, p)
    reach = [math.prod(float(p[a, toks[b]]) for a, b in zip(tree.path_to(u), tree.path_to(u)[1:]))
             for u in range(len(tree))]
    accepted = {name: sum(prob * (len(pa) - 1) for (pa, _), prob in law.items())
                for name, law in (("walk", walk), ("traversal", trav))}
    assert math.isclose(accepted["walk"], sum(reach[1:]), rel_tol=1e-9)
    assert accepted["traversal"] < accepted["walk"] - 0.1
    for u in range(len(tree)):  # the walk never ends a round on a token it drafted below u: it was routed
        for kid in tree.children[u]:
            assert walk.get((tree.path_to(u), toks[kid]), 0.0) == 0.0


# ----------------------------------------------------------------- the policy
def test_policy_plans_and_store_lifecycle():
    store = SuffixStore(depth=16)
    policy = SuffixPolicy(max_nodes=6, store=store, depth=16, max_match=8, factor=4.0, min_prob=0.0)
    policy.reset()
    history = [10, 11, 12, 13, 14, 10, 11]
    plan = policy.plan_round(history, 1)
    assert plan.proposer == "suffix" and plan.tokens == (12, 13, 14, 10, 11)
    assert len(plan.tokens) == len(plan.tree) - 1 and len(plan.tree) <= 7
    assert policy.plan_round([1, 2, 3], 1).proposer == "none"  # nothing repeats: a plain target step
    history = [20, 21, 22, 23, 24, 25]
    policy.plan_round(history, 1)
    history += [26]
    policy.finish(history)  # the engine, once the generation is over: prompt + output go to the store
    policy.reset()
    assert len(store) == 1 and store.n_tokens == 7
    plan = policy.plan_round([7, 21, 22, 23], 1)  # a new request: the store remembers 21 22 23 -> 24 25 26
    assert plan.proposer == "suffix" and plan.tokens == (24, 25, 26) and plan.label == "suffix:store"
    policy.reset()
    assert len(store) == 1  # reset stores nothing: only finished generations enter the store


def test_suffix_rounds_on_a_backend_give_the_target_greedy_output():
    """The contract the engine relies on, run by hand on the transformers backend: [root] + plan.tokens fed with
    the plan tree's positions and mask, the greedy walk, keep the path. The output equals the target's own
    greedy continuation, and some accepted paths go through a sibling other than the first."""
    from helpers import tiny_llama
    from multispec.models import forward_chain, make_backend
    from multispec.verify.tree_walk import walk_tree_greedy

    target = tiny_llama(vocab=16, hidden=16, layers=1, heads=2, kv_heads=1, seed=2, scale=1.5)
    rng = random.Random(2)
    prompt = [rng.randrange(16) for _ in range(40)]
    n_new = 48
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n_new):
            ids.append(int(target(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    reference = ids[len(prompt):]

    backend = make_backend(target)
    forward_chain(backend, torch.tensor(prompt[:-1]), last_only=True)
    policy = SuffixPolicy(max_nodes=8, factor=4.0, min_prob=0.0)
    policy.reset()
    history, accepted, off_first = list(prompt), 0, 0
    while len(history) - len(prompt) < n_new:
        plan = policy.plan_round(history, 1)
        tree = plan.tree
        tokens = history[-1:] + list(plan.tokens)
        assert len(tokens) == len(tree)
        lt = backend.cache_len
        out = backend.forward(torch.tensor(tokens), tree.position_ids(lt), tree.attention_mask(lt))
        path, nxt = walk_tree_greedy(tree, tokens, out.logits.argmax(-1).tolist())
        backend.keep(tree.keep_indices(path, lt))
        history += [tokens[u] for u in path[1:]] + [nxt]
        accepted += len(path) - 1
        off_first += any(tree.children[tree.parents[u]][0] != u for u in path[1:])
    assert history[len(prompt):len(prompt) + n_new] == reference
    assert accepted > 0 and off_first > 0
