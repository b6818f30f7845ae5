"""Exact distortion of target-initialized trees (P1, design §6.1): the law of the first committed token.

`ti-mcsd` with W >= 2 draws W distinct level-1 tokens from the target's p_next, lets the draft grow a tree below
each, tests every root-to-leaf chain on its own and keeps the chain with the longest accepted run (ties: lowest
index). The kept level-1 token is therefore distributed as p(t) reweighted by how well the draft continues t.
`first_token_law` computes that law exactly, mirroring the engine:

- level 1: ordered W-tuples without replacement from p (sequential renormalised sampling, the law of
  `torch.multinomial(..., replacement=False)`); top-W when greedy;
- below: each node's children drawn without replacement from the processed draft q (`draw_wor`, padding tokens
  when q has too few tokens; top-k when greedy);
- chains: given the tokens, every path has its own coins, so path lengths are independent and
  P(max length under t <= l) = E[ prod over nodes v at depth l+1 below t of (1 - A(v))^{leaves(v)} ], where A(v) is
  the product of the acceptance probabilities min(1, p/q) (greedy: 1{token = argmax p}) from t's child down to v.
  The expectation over the drafted tokens is taken recursively (children are independent given their parent's
  tokens).

Cost: one target and one draft forward per distinct context up to depth D-1 below the prompt (V^(D-1) W-ish), so
this is for tiny vocabularies (tests, docs). Models are plain causal LMs (`model(input_ids).logits`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from multispec.sampling import SamplingConfig, process_logits
from multispec.verify.rrs_wor import law_wor


@dataclass
class FirstTokenLaw:
    """p: float64 [V] the target's processed law of the first new token; out: float64 [V] the law of the token
    ti-mcsd commits first; tv: 0.5 * sum |out - p|; contexts: number of distinct contexts evaluated."""

    p: torch.Tensor
    out: torch.Tensor
    tv: float
    contexts: int


def first_token_law(target: torch.nn.Module, draft: torch.nn.Module, prompt: list[int], tree: tuple[int, ...],
                    sampling: SamplingConfig) -> FirstTokenLaw:
    """Exact law of the first committed token of `ti-mcsd` with tree (W, k_2, ..., k_D) after `prompt`.

    target, draft: causal LMs sharing a (tiny) vocabulary; prompt: token ids (>= 1). See the module docstring."""
    shape = tuple(tree)
    depth = len(shape)  # level 1 + (depth - 1) draft levels; accepted lengths are 0..depth-1
    n0 = len(prompt)
    cache: dict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    def dists(ctx: tuple[int, ...]):
        """(p, q, raw target logits) at the end of ctx, float64 [V] each."""
        if ctx not in cache:
            ids = torch.tensor([ctx])
            with torch.no_grad():
                tl = target(input_ids=ids).logits[0, -1].double()
                dl = draft(input_ids=ids).logits[0, -1].double()
            q = torch.softmax(dl, -1) if sampling.greedy else process_logits(dl, sampling).double()
            p = process_logits(tl, sampling).double()
            cache[ctx] = (p / p.sum(), q / q.sum(), tl)  # float32 processing, renormalised in float64
        return cache[ctx]

    def children_law(ctx: tuple[int, ...], k: int) -> list[tuple[tuple[int, ...], float]]:
        _, q, _ = dists(ctx)
        if sampling.greedy:
            return [(tuple(q.topk(k).indices.tolist()), 1.0)]
        tuples, weights = law_wor(q, k)
        return list(zip(map(tuple, tuples.tolist()), weights.tolist()))

    def accept(ctx: tuple[int, ...], x: int) -> float:
        p, q, _ = dists(ctx)
        if sampling.greedy:
            return float(int(p.argmax()) == x)
        qx, px = float(q[x]), float(p[x])
        return min(1.0, px / qx) if qx > 0 else 0.0  # padding siblings (q = 0) are never accepted

    def leaves_below(rel: int) -> int:
        """Leaves under a node at relative depth rel (level-1 token: rel 0)."""
        out = 1
        for k in shape[rel + 1:]:
            out *= k
        return out

    memo: dict[tuple, float] = {}

    def below(ctx: tuple[int, ...], a_ctx: float, level: int) -> float:
        """E[prod over nodes v at relative depth level+1 under ctx's node of (1 - A(v))^leaves(v)]."""
        key = (ctx, level)
        if key in memo:
            return memo[key]
        rel = len(ctx) - n0 - 1
        if rel + 1 >= depth:  # a leaf: no path continues to depth level+1
            return 1.0
        g: dict[int, float] = {}

        def child(x: int) -> float:
            if x not in g:
                a = a_ctx * accept(ctx, x)
                if rel + 1 == level + 1:
                    g[x] = (1.0 - a) ** leaves_below(rel + 1)
                else:
                    g[x] = below(ctx + (x,), a, level)
            return g[x]

        total = 0.0
        for kids, w in children_law(ctx, shape[rel + 1]):
            prod = w
            for x in kids:
                prod *= child(x)
            total += prod
        memo[key] = total
        return total

    def cdf(t: int) -> list[float]:
        """P(longest accepted run under level-1 token t <= l), l = 0..depth-1."""
        return [below(tuple(prompt) + (t,), 1.0, level) for level in range(depth - 1)] + [1.0]

    p0, _, logits0 = dists(tuple(prompt))
    width = shape[0]
    if sampling.greedy:
        level1 = [(tuple(logits0.topk(width).indices.tolist()), 1.0)]
    else:
        width = min(width, int((p0 > 0).sum()))
        tuples, weights = law_wor(p0, width)
        level1 = list(zip(map(tuple, tuples.tolist()), weights.tolist()))
    cdfs: dict[int, list[float]] = {}
    out = torch.zeros_like(p0)
    for toks, w in level1:
        fs = [cdfs.setdefault(t, cdf(t)) for t in toks]
        for j, t in enumerate(toks):
            pick = 0.0
            for level in range(depth):
                pmf = fs[j][level] - (fs[j][level - 1] if level else 0.0)
                if pmf <= 0:
                    continue
                rest = 1.0
                for i in range(len(toks)):
                    if i < j:
                        rest *= fs[i][level - 1] if level else 0.0  # earlier chains strictly shorter
                    elif i > j:
                        rest *= fs[i][level]
                pick += pmf * rest
            out[t] += w * pick
    return FirstTokenLaw(p=p0, out=out, tv=0.5 * float((out - p0).abs().sum()), contexts=len(cache))


def first_token_tv(target: torch.nn.Module, draft: torch.nn.Module, prompt: list[int], tree: tuple[int, ...],
                   sampling: SamplingConfig) -> float:
    """Total-variation distance between the law of ti-mcsd's first committed token and the target's (exact)."""
    return first_token_law(target, draft, prompt, tree, sampling).tv


def tiny_pair_tv(width: int = 2, tree_below: tuple[int, ...] = (2, 1), temperature: float = 1.0, vocab: int = 8,
                 seed: int = 3, noise: float = 0.6, prompt: tuple[int, ...] = (1, 4, 2)) -> FirstTokenLaw:
    """The documented reference number: a random tiny Llama target (V = 8, H = 16, 1 layer) and a draft made by
    perturbing its weights (the pair of tests/test_engine_sampling.py), tree (W,) + tree_below."""
    from transformers import LlamaConfig, LlamaForCausalLM

    def tiny() -> torch.nn.Module:
        torch.manual_seed(seed)
        cfg = LlamaConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256, bos_token_id=0,
                          eos_token_id=None, pad_token_id=None, tie_word_embeddings=False)
        m = LlamaForCausalLM(cfg).float().eval()
        with torch.no_grad():
            m.lm_head.weight.mul_(3.0)
        return m

    target, draft = tiny(), tiny()
    g = torch.Generator().manual_seed(seed + 99)
    with torch.no_grad():
        for prm in draft.parameters():
            prm.add_(noise * prm.std() * torch.randn(prm.shape, generator=g))
    return first_token_law(target, draft, list(prompt), (width,) + tuple(tree_below),
                           SamplingConfig(temperature=temperature))


