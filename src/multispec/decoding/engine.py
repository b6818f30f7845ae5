"""The generation loop: propose -> forward tree -> verify -> keep path -> update policy -> record metrics.

One draft-initialized round (`_di_round`), the data flowing down:

    policy.plan_round(history, pending) ─► RoundPlan(tree, proposer)       drafting/protocol.py
        │  proposer "draft": grow_tree(draft backend, ...) ─► tokens [N], q [N, V]   drafting/grow.py
        │  proposer "lookup": a chain copied from the context, q = point masses      drafting/lookup.py
        │  proposer "suffix": a tree from suffix tries, q = point masses           drafting/suffix.py
        │  proposer "none": the root alone (a plain target step)
        ▼
    target.forward(tokens, positions, tree mask) ─► logits [N, V]           models/ (the one cache owner)
        ▼
    spec.verify(tree, tokens, p, q, generator) ─► (accepted path, next token)   verify/ (pure)
        ▼
    _keep(target / draft, tree, path) ─► both caches hold prompt + committed tokens
        ▼
    RoundOutcome ─► policy.observe(outcome), Metrics.count(outcome)         decoding/metrics.py

Two round shapes share the loop:
- draft-initialized (ar, sd, mcsd, dynamic, specdecpp): the root is the last committed token, which the target has
  not consumed; the target verifies [root, tree] in one call and the walk commits the accepted path plus one
  bonus/residual token.
- target-initialized (ti-mcsd, dynamic with target_init): the target already knows its next-token distribution
  p_next; level 1 is drawn from it, the draft grows the rest, the target verifies the non-root nodes in one call
  and the longest accepted chain is committed (SPEC §6.6).
Only `models/` touches caches; this module passes tokens, positions and masks (STYLE §2.4).

History-dependent processors (penalties, min_tokens) give every tree node its own processed law: node u's row is
processed with the committed history plus u's own path (decoding/node_history.py), in verification and in drafting.
Log-probabilities (decoding/logprobs.py) are read from the verification forward that committed each token.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from multispec.decoding.logprobs import LogprobRecorder
from multispec.decoding.methods import MethodConfig
from multispec.decoding.metrics import Metrics
from multispec.decoding.node_history import CommittedHistory
from multispec.drafting.grow import grow_tree
from multispec.drafting.lookup import one_hot_law
from multispec.drafting.protocol import DraftPolicy, RoundOutcome, RoundPlan
from multispec.drafting.suffix import first_child_law
from multispec.errors import check
from multispec.models.base import Backend, forward_chain
from multispec.sampling import SamplingConfig, adjust_logits, process_logits
from multispec.tree import Tree
from multispec.verify import get_verifier
from multispec.verify.keyed import node_keys
from multispec.verify.sequence import get_sequence_verifier
from multispec.verify.ti_chains import verify_chains
from multispec.verify.tree_walk import walk_tree_greedy


def generate_ids(
    target: Backend, draft: Backend | None, prompt: list[int], method: MethodConfig, sampling: SamplingConfig,
    max_new_tokens: int, seed: int | None, eos_ids: set[int], stop=None, on_tokens=None,
    policy: DraftPolicy | None = None, reproducible: bool = False, logprobs: LogprobRecorder | None = None,
) -> tuple[list[int], Metrics]:
    """Run one generation on backends the caller built (the Decoder does). prompt: token ids (>= 1).
    stop(new_ids) -> int | None returns a cut length when a stop string completed. on_tokens(new_ids_so_far) is
    called after each round (streaming). policy: the method's draft policy (default: built from the registry
    without trained models). reproducible (T > 0): drafter-invariant verification (`gls`, verify/gumbel.py) with
    noise keyed by (seed, absolute position): the text then depends on the target, the prompt, the sampling
    settings and the seed only, whatever the method, its plans or the batch. eos_ids: the tokens that end the
    output (and that sampling.min_tokens holds back). logprobs: filled with the committed tokens' (and, if it asks,
    the prompt's) log-probabilities, cut with the output. max_new_tokens may be 0 (a prefill only: prompt
    logprobs). Returns the new token ids and the metrics record."""
    seed = 0 if seed is None else seed
    gen_draft = torch.Generator().manual_seed(seed)
    gen_verify = torch.Generator().manual_seed(seed + 1_000_003)
    if policy is None:
        from multispec.decoding.methods import build_policy

        policy = build_policy(method)
    policy.reset()
    # a sequence verifier (node walk, block, traversal or the keyed gls); spec.draw is the draft law it needs
    keyed = reproducible and not sampling.greedy
    spec = get_sequence_verifier("greedy" if sampling.greedy else "gls" if keyed else method.verifier)
    if keyed:
        check(not method.target_init, f"method {method.name!r} draws level 1 from the target (P1's longest chain): "
                                      "it has no reproducible mode; use sd, mcsd, dynamic, lookup, suffix or auto")
    key = seed if keyed else None
    c = Metrics()
    start = time.perf_counter()
    target.reset()
    # a policy that may never draft (auto) defers the draft's prefill to its first drafting round: the prompt
    # then stays pending, and that round's first draft forward feeds it
    defer = draft is not None and getattr(policy, "defers_draft_prefill", False) and not method.target_init
    if draft is not None:
        draft.reset()
        if len(prompt) > 1 and not defer:
            forward_chain(draft, torch.tensor(prompt[:-1], dtype=torch.long), last_only=True)
    committed = None
    if sampling.reads_history:
        committed = CommittedHistory(prompt, max(target.vocab_size, draft.vocab_size if draft is not None else 0),
                                     eos_ids)
    state = _prefill(target, prompt, method, sampling, logprobs, committed)
    if defer:
        state.pending = list(prompt)
    policy.prepare(target, draft, target.cache_len)
    c.t_prefill = time.perf_counter() - start
    new: list[int] = []
    while len(new) < max_new_tokens:
        limit = _round_limit(target, max_new_tokens - len(new), method.target_init)
        if limit is None:  # the context is full: nothing more can be decoded
            break
        if method.target_init:
            outcome = _ti_round(target, draft, state, policy, sampling, spec, gen_draft, gen_verify, c, limit)
        else:
            outcome = _di_round(target, draft, state, policy, sampling, spec, gen_draft, gen_verify, c, limit, key)
        policy.observe(outcome)
        c.count(outcome)
        if draft is not None and getattr(draft, "vocab_subset", None) is not None:  # between rounds, never inside
            draft.extend_vocab_subset(outcome.committed)  # one: a round's q is the law its drafts came from
        new.extend(outcome.committed)
        state.history.extend(outcome.committed)
        if committed is not None:
            committed.commit(outcome.committed)
        cut = _cut(new, max_new_tokens, eos_ids, stop)
        if cut is not None:
            new, reason = new[:cut[0]], cut[1]
            c.finish_reason = reason
            break
        if on_tokens is not None:
            on_tokens(new)
    if on_tokens is not None:
        on_tokens(new)
    policy.finish(state.history)
    if logprobs is not None:
        del logprobs.tokens[len(new):]
    c.new_tokens = len(new)
    c.seconds = time.perf_counter() - start
    return new, c


def _round_limit(target: Backend, remaining: int, target_init: bool) -> tuple[int, int] | None:
    """(max draft depth, max tree nodes) for this round, so that a round never drafts past the token budget
    (it commits at most depth + 1 tokens), the model's positions or the backend's cache rows; None when not even
    one more token fits. The root (the newest committed token) sits at position cache_len; a node at depth d at
    cache_len + d (target-initialized rounds: the root is already cached, at cache_len - 1)."""
    lt = target.cache_len - (1 if target_init else 0)
    # Draft-initialized rounds commit at most depth + 1 tokens, and a shallower tree leaves their (lossless) law
    # unchanged. Target-initialized rounds pick the longest accepted chain (P1), so their depth is part of the
    # method's law: only the context bounds it, and the output is cut at the budget instead.
    depth = remaining - 1 if not target_init else 1 << 30
    nodes = 1 << 30
    max_pos = getattr(target, "max_positions", None)
    if max_pos is not None:
        if lt >= max_pos:
            return None
        depth = min(depth, max_pos - 1 - lt)
    max_rows = getattr(target, "max_len", None)  # a static cache's rows (the fast backend)
    if max_rows is not None:
        if lt >= max_rows:
            return None
        nodes = max_rows - lt
    return depth, nodes


def _cap(tree: Tree, limit: tuple[int, int]) -> Tree:
    """The largest depth-truncation of `tree` within `limit` = (max depth, max nodes incl. the root)."""
    depth, nodes = limit
    if tree.max_depth > depth:
        tree = tree.truncate(max(0, depth))
    while len(tree) > nodes and tree.max_depth > 0:
        tree = tree.truncate(tree.max_depth - 1)
    return tree


@dataclass
class _State:
    pending: list[int]  # committed tokens the draft has not consumed (last one: the root)
    history: list[int] = field(default_factory=list)  # prompt + committed tokens (prompt lookup reads it)
    committed: CommittedHistory | None = None  # what penalties / min_tokens read (None when the sampling reads none)
    logprobs: LogprobRecorder | None = None
    p_next: torch.Tensor | None = None  # target-initialized, T > 0: the law of the next token, float [V]
    # target-initialized only, float [V]: the next token's row adjusted (bias, penalties: greedy top-W ranks it),
    # and its log-probabilities when logprobs are recorded
    rank_next: torch.Tensor | None = None
    logprob_next: torch.Tensor | None = None


def _prefill(target: Backend, prompt: list[int], method: MethodConfig, sampling: SamplingConfig,
             logprobs: LogprobRecorder | None, committed: CommittedHistory | None) -> _State:
    """Feed the prompt (all of it for target-initialized methods, all but the root otherwise); with
    logprobs.prompt, every row's logits are kept to score the prompt's tokens (raw)."""
    ids = torch.tensor(prompt, dtype=torch.long)
    score_prompt = logprobs is not None and logprobs.prompt
    if score_prompt:
        logprobs.prompt_tokens.append(None)
    fed = ids if method.target_init else ids[:-1]
    out = forward_chain(target, fed, last_only=not score_prompt) if len(fed) else None
    if score_prompt and len(prompt) > 1:
        logprobs.add(torch.log_softmax(out.logits[:len(prompt) - 1].float(), -1), prompt[1:], prompt=True)
    state = _State(pending=[prompt[-1]], history=list(prompt), committed=committed, logprobs=logprobs)
    if method.target_init:
        raw = out.logits[-1:]  # [1, V]
        adjusted = _adjusted(raw, sampling, _root_history(committed, raw))
        state.rank_next = (adjusted if adjusted is not None else raw)[0]
        p = None if sampling.greedy else process_logits(raw, sampling, _root_history(committed, raw))
        state.p_next = None if p is None else p[0]
        if logprobs is not None:
            state.logprob_next = logprobs.rows(sampling, raw, adjusted, p)[0]
    return state


def _adjusted(logits: torch.Tensor, sampling: SamplingConfig, history) -> torch.Tensor | None:
    """The logits after logit_bias / min_tokens / penalties, or None when the sampling has none of them."""
    return adjust_logits(logits, sampling, history) if sampling.adjusts else None


def _root_history(committed: CommittedHistory | None, logits: torch.Tensor):
    return committed.at_root(logits.shape[-1]) if committed is not None else None


def _node_history(state: _State, tree: Tree, tokens: torch.Tensor, rows, logits: torch.Tensor):
    """The processors' history of each row (node) in `rows`: committed + the node's path; None if none is read."""
    if state.committed is None:
        return None
    return state.committed.for_nodes(tree, tokens, rows, logits.shape[-1])


def _di_round(target, draft, state, policy, sampling, spec, gen_draft, gen_verify, c, limit,
              key: int | None = None) -> RoundOutcome:
    """key: the seed of a keyed verifier (gumbel / gls): node u of the tree rooted at position lt draws the noise
    of (key, lt + depth(u) + 1) when drafting its children and when verifying them."""
    t0 = time.perf_counter()
    plan = policy.plan_round(state.history, len(state.pending))
    max_tree = _cap(plan.tree, limit)
    proposer = plan.proposer if max_tree.max_depth > 0 else "none"
    n_pending = len(state.pending)
    if proposer == "none":  # one target step: the root alone
        d_tree, tokens, q, fed, root_index = max_tree.truncate(0), torch.tensor(state.pending[-1:]), None, 0, None
    elif proposer == "lookup":  # a chain copied from the context: its draft law is a point mass per node
        chain = list(plan.tokens[:max_tree.max_depth])
        d_tree, max_tree = Tree.chain(len(chain)), Tree.chain(len(chain))
        tokens = torch.tensor(state.pending[-1:] + chain, dtype=torch.long)
        q = None if sampling.greedy else one_hot_law(tokens, target.vocab_size, len(tokens))
        fed, root_index = 0, None
        c.drafted_tokens += len(chain)
    elif proposer == "suffix":  # a tree from suffix structures: point masses on each node's first child
        d_tree = max_tree  # _cap cuts whole levels of the BFS tree: a prefix of its nodes, tokens still aligned
        tokens = torch.tensor(state.pending[-1:] + list(plan.tokens[:len(d_tree) - 1]), dtype=torch.long)
        q = None if sampling.greedy else first_child_law(d_tree, tokens, target.vocab_size)
        fed, root_index = 0, None
        c.drafted_tokens += len(d_tree) - 1
    else:
        keys = node_keys(max_tree, key, target.cache_len) if key is not None else None
        d = grow_tree(draft, state.pending, max_tree, [], 0, sampling, spec.draw, gen_draft, policy, keys=keys,
                      history=_draft_history(state, max_tree))
        d_tree, tokens, q, fed, root_index = d.tree, d.tokens, d.q, d.fed, d.root_index
        c.draft_calls += d.draft_calls
        c.drafted_tokens += len(d_tree) - 1
    t1 = time.perf_counter()
    lt = target.cache_len
    n = len(d_tree)  # N_d: the drafted tree is the first n nodes of the max tree (SPEC §3.5)
    out = target.forward(tokens, max_tree.position_ids(lt)[:n], max_tree.attention_mask(lt, rows=range(n), cols=n))
    t_fwd = time.perf_counter() - t1
    tok = tokens.tolist()
    rows_history = _node_history(state, d_tree, tokens, range(n), out.logits)
    # the adjusted logits are read greedy and for logprobs; sampling, process_logits adjusts them itself
    adjusted = _adjusted(out.logits, sampling, rows_history) if sampling.greedy or state.logprobs is not None \
        else None
    p = None
    if sampling.greedy:  # the greedy verifier needs only each row's argmax: no one-hot p, no q, no plans
        path, nxt = walk_tree_greedy(d_tree, tok, (adjusted if adjusted is not None else out.logits).argmax(-1).tolist())
    else:
        p = process_logits(out.logits, sampling, rows_history)
        rng = node_keys(d_tree, key, lt) if key is not None else gen_verify
        # a suffix tree (deterministic distinct siblings, first-child point masses) is verified by the rrs-wor
        # node walk, which reaches sibling i with probability p(token i); keyed runs keep their gls
        verifier = _WALK if proposer == "suffix" and key is None else spec
        path, nxt = verifier.verify(d_tree, tokens, p, torch.zeros_like(p) if q is None else q, rng)
    c.target_calls += 1
    if state.logprobs is not None:  # committed token i is scored by the row of path[i], the node above it
        rows = list(path)
        lp = state.logprobs.rows(sampling, out.logits[rows], None if adjusted is None else adjusted[rows],
                                 None if p is None else p[rows])
        state.logprobs.add(lp, [tok[u] for u in path[1:]] + [nxt])
    t2 = time.perf_counter()
    _keep(target, d_tree, path, lt)
    if proposer == "draft":
        fed_path = [u for u in path if u < fed]
        _keep(draft, d_tree, fed_path, root_index)
        state.pending = [tok[u] for u in path if u >= fed] + [nxt]
    elif draft is not None:  # the draft consumed nothing this round: it catches up when it next drafts
        state.pending = state.pending[:-1] + [tok[u] for u in path] + [nxt]
    else:
        state.pending = [nxt]
    t3 = time.perf_counter()
    c.t_draft += t1 - t0
    c.t_verify += t2 - t1
    c.t_cache += t3 - t2
    times = {"round_s": t3 - t0, "target_fwd_s": t_fwd, "draft_s": t1 - t0, "pending": n_pending,
             "proposer": proposer}
    return RoundOutcome(plan=plan, tree=d_tree, path=tuple(path), committed=[tok[u] for u in path[1:]] + [nxt],
                        accepted=len(path) - 1, depth=d_tree.max_depth, times=times)


_WALK = get_sequence_verifier("rrs-wor")


def _keep(backend: Backend, tree: Tree, path, prefix_len: int) -> None:
    """Keep the first prefix_len cache rows and the rows of `path` (node indices appended after them). No call when
    that is every row, as after ar and after a chain accepted in full: nothing to drop, no index tensor."""
    if backend.cache_len != prefix_len + len(path) or any(u != i for i, u in enumerate(path)):
        backend.keep(tree.keep_indices(path, prefix_len))


def _ti_round(target, draft, state, policy, sampling, spec, gen_draft, gen_verify, c, limit) -> RoundOutcome:
    t0 = time.perf_counter()
    plan = policy.plan_round(state.history, len(state.pending))
    max_tree = plan.tree
    if max_tree.max_depth > limit[0]:  # near the end of the budget or context: a shallower tree (level 1 stays)
        max_tree = max_tree.truncate(max(1, limit[0]))
    level1 = _draw_level1(state, len(max_tree.level(1)), sampling, gen_draft)
    if len(level1) < len(max_tree.level(1)):  # the target has fewer candidates than W (e.g. top-k): narrower tree
        max_tree = _narrow(max_tree, len(level1))
    d = grow_tree(draft, state.pending, max_tree, level1, 1, sampling, _draft_law(spec), gen_draft, policy,
                  history=_draft_history(state, max_tree))
    c.draft_calls += d.draft_calls
    c.drafted_tokens += len(d.tree) - 1 - len(level1)
    t1 = time.perf_counter()
    lt = target.cache_len  # includes the root
    n = len(d.tree)
    # The root already sits in the target cache at row lt - 1, so the tree's mask over a prefix of lt - 1 rows,
    # without its root row, is exactly the mask of nodes 1..N-1. Mask and positions are sliced from the max tree's
    # one mask (SPEC §3.5): only the n drafted nodes are sent, never padding.
    out = target.forward(d.tokens[1:], max_tree.position_ids(lt - 1)[1:n],
                         max_tree.attention_mask(lt - 1, rows=range(1, n), cols=n))
    p = torch.zeros(n, out.logits.shape[-1])
    rows_history = _node_history(state, d.tree, d.tokens, range(1, n), out.logits)
    p[1:] = process_logits(out.logits, sampling, rows_history)
    below = spec.verify if spec.name == "traversal" else None  # W = 1: the verifier of the subtree below level 1
    verdict = verify_chains(d.tree, d.tokens, p, d.q, sampling.greedy, gen_verify, below)
    c.target_calls += 1
    t2 = time.perf_counter()
    path = verdict.path
    target.keep(torch.cat([torch.arange(lt), torch.tensor(path[1:]) + lt - 1]))
    fed_path = [u for u in path if u < d.fed]
    if fed_path[-1] == path[-1]:  # keep the newest committed token pending: it is the next root
        fed_path = fed_path[:-1]
    draft.keep(d.tree.keep_indices(fed_path, d.root_index))
    state.pending = [int(d.tokens[u]) for u in path if u not in fed_path]
    adjusted = _adjusted(out.logits, sampling, rows_history)  # [n - 1, V]: nodes 1..n-1
    ranked = adjusted if adjusted is not None else out.logits
    if state.logprobs is not None:  # path[1] was scored by the previous row; path[i] by the row of path[i - 1]
        rows = [u - 1 for u in path[1:-1]] + [verdict.next_node - 1]
        lp = state.logprobs.rows(sampling, out.logits[rows], None if adjusted is None else adjusted[rows],
                                 None if sampling.greedy else p[[u + 1 for u in rows]])
        state.logprobs.add(torch.cat([state.logprob_next[None], lp[:-1]]), [int(d.tokens[u]) for u in path[1:]])
        state.logprob_next = lp[-1]
    state.rank_next = ranked[verdict.next_node - 1]
    state.p_next = verdict.residual if verdict.residual is not None else p[verdict.next_node]
    c.t_draft += t1 - t0
    c.t_verify += t2 - t1
    t3 = time.perf_counter()
    c.t_cache += t3 - t2
    times = {"round_s": t3 - t0, "target_fwd_s": t2 - t1, "draft_s": t1 - t0, "proposer": "draft"}
    return RoundOutcome(plan=plan, tree=d.tree, path=tuple(path), committed=[int(d.tokens[u]) for u in path[1:]],
                        accepted=verdict.accepted, depth=d.tree.max_depth - 1, times=times)


def _draw_level1(state: _State, width: int, sampling: SamplingConfig, gen: torch.Generator) -> list[int]:
    """W distinct tokens from the target's next-token law: top-W when greedy, else sampled without replacement."""
    if sampling.greedy:
        return state.rank_next.topk(width).indices.tolist()
    p = state.p_next
    width = min(width, int((p > 0).sum()))
    return torch.multinomial(p, width, replacement=False, generator=gen).tolist()


def _draft_history(state: _State, max_tree: Tree):
    """history(rows, tokens, logits) -> the processors' history of the draft's rows (nodes of max_tree), or None:
    the draft processes its logits like the target does, path by path, so that it proposes what the target keeps."""
    if state.committed is None:
        return None
    return lambda rows, tokens, logits: state.committed.for_nodes(max_tree, tokens, rows, logits.shape[-1])


def _narrow(tree: Tree, width: int) -> Tree:
    shape = [len(tree.level(1))] + [len(tree.level(d)) // max(1, len(tree.level(d - 1)))
                                    for d in range(2, tree.max_depth + 1)]
    return Tree.from_shape((width,) + tuple(shape[1:]))


def _draft_law(spec):
    """Below level 1 of a target-initialized tree siblings are drafted without replacement (distinct candidates),
    the law the W = 1 tree walk (rrs-wor) verifies; greedy drafting takes the top-n."""
    return spec.draw if spec.name == "greedy" else get_verifier("rrs-wor").draw


def _cut(new: list[int], max_new: int, eos_ids: set[int], stop) -> tuple[int, str] | None:
    """Where to end the output and why ("stop": EOS or a stop string; "length": max_new), or None to go on."""
    for i, t in enumerate(new[:max_new]):
        if t in eos_ids:
            return i + 1, "stop"
    if stop is not None:
        k = stop(new)
        if k is not None and k <= max_new:
            return k, "stop"
    if len(new) >= max_new:
        return max_new, "length"
    return None

