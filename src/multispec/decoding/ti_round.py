"""The target-initialized round (P1, design §6.6; ti-mcsd, dynamic with target_init): the only round shape that may be
LOSSY (width W >= 2 at T > 0).

The target already knows the next token's law p_next (from the previous round's verification forward, or the
prefill): level 1 is W tokens drawn from it, the draft model grows the levels below, the target verifies the
non-root nodes in one call (the root is already in its cache), and the longest accepted chain is committed
(verify/ti_chains.py). With W = 1 the subtree below the single level-1 token is an ordinary draft tree, verified
losslessly by the rrs-wor walk or traversal.
"""
from __future__ import annotations

import time
import torch

from multispec.decoding.state import Run, State, adjusted_logits
from multispec.drafting.grow import grow_tree
from multispec.drafting.protocol import RoundOutcome, RoundTimes
from multispec.sampling import SamplingConfig, greedy_argmax, process_logits
from multispec.tree import Tree
from multispec.verify import get_verifier
from multispec.verify.ti_chains import verify_chains


def ti_round(run: Run, state: State, limit: tuple[int, int]) -> RoundOutcome:
    t0 = time.perf_counter()
    n_pending = len(state.pending)
    plan = run.policy.plan_round(state.history, n_pending)
    max_tree = plan.tree
    if max_tree.max_depth > limit[0]:  # near the end of the budget or context: a shallower tree (level 1 stays)
        max_tree = max_tree.truncate(max(1, limit[0]))
    level1 = _draw_level1(state, len(max_tree.level(1)), run.sampling, run.gen_draft)
    if len(level1) < len(max_tree.level(1)):  # the target has fewer candidates than W (e.g. top-k): narrower tree
        max_tree = _narrow(max_tree, len(level1))
    draft = run.draft
    if draft is None:  # Decoder refuses these methods without a draft (MethodEntry.needs_draft)
        raise RuntimeError("a target-initialized round drafts with the draft model, but the run has none")
    d = grow_tree(draft, state.pending, max_tree, level1, 1, run.sampling, _draft_law(run), run.gen_draft,
                  run.policy, history=state.draft_history(max_tree))
    t1 = time.perf_counter()
    lt = run.target.cache_len  # includes the root
    n = len(d.tree)
    # The root already sits in the target cache at row lt - 1, so the tree's mask over a prefix of lt - 1 rows,
    # without its root row, is exactly the mask of nodes 1..N-1. Mask and positions are sliced from the max tree's
    # one mask (design §3.5): only the n drafted nodes are sent, never padding.
    out = run.target.forward(d.tokens[1:], max_tree.position_ids(lt - 1)[1:n],
                             max_tree.attention_mask(lt - 1, rows=range(1, n), cols=n))
    p = torch.zeros(n, out.logits.shape[-1])  # [N, V]: row 0 (the root) unused
    rows_history = state.node_history(d.tree, d.tokens, range(1, n), out.logits)
    p[1:] = process_logits(out.logits, run.sampling, rows_history)
    below = run.verifier.verify if run.verifier.name == "traversal" else None  # W = 1: the subtree's verifier
    verdict = verify_chains(d.tree, d.tokens, p, d.q, run.sampling.greedy, run.gen_verify, below)
    t2 = time.perf_counter()
    path = verdict.path
    run.target.keep(torch.cat([torch.arange(lt), torch.tensor(path[1:]) + lt - 1]))
    fed_path = [u for u in path if u < d.fed]
    if fed_path[-1] == path[-1]:  # keep the newest committed token pending: it is the next root
        fed_path = fed_path[:-1]
    draft.keep(d.tree.keep_indices(fed_path, d.root_index))
    state.pending = [int(d.tokens[u]) for u in path if u not in fed_path]
    _next_law(run, state, out.logits, rows_history, p, path, verdict, d.tokens)
    t3 = time.perf_counter()
    times = RoundTimes(round_s=t3 - t0, draft_s=t1 - t0, target_fwd_s=t2 - t1, verify_s=t2 - t1, cache_s=t3 - t2,
                       pending=n_pending, proposer="draft")
    return RoundOutcome(plan=plan, tree=d.tree, path=tuple(path), committed=[int(d.tokens[u]) for u in path[1:]],
                        accepted=verdict.accepted, depth=d.tree.max_depth - 1, drafted=len(d.tree) - 1 - len(level1),
                        draft_calls=d.draft_calls, times=times)


def _next_law(run: Run, state: State, logits: torch.Tensor, rows_history, p: torch.Tensor, path, verdict,
              tokens: torch.Tensor) -> None:
    """Carry the next token's law (and its greedy ranking, and logprobs) into the next round; record the committed
    tokens' logprobs: path[1] was scored by the previous round's row, path[i] by the row of path[i - 1]."""
    adjusted = adjusted_logits(logits, run.sampling, rows_history)  # [n - 1, V]: nodes 1..n-1
    ranked = adjusted if adjusted is not None else logits
    if state.logprobs is not None:
        previous = state.logprob_next  # set by the prefill, then by every round, when logprobs are recorded
        if previous is None:
            raise RuntimeError("target-initialized round: logprobs recorded but no log-probabilities carried over")
        rows = [u - 1 for u in path[1:-1]] + [verdict.next_node - 1]
        lp = state.logprobs.rows(run.sampling, logits[rows], None if adjusted is None else adjusted[rows],
                                 None if run.sampling.greedy else p[[u + 1 for u in rows]])
        state.logprobs.add(torch.cat([previous[None], lp[:-1]]), [int(tokens[u]) for u in path[1:]])
        state.logprob_next = lp[-1]
    state.rank_next = ranked[verdict.next_node - 1]
    state.p_next = verdict.residual if verdict.residual is not None else p[verdict.next_node]


def _draw_level1(state: State, width: int, sampling: SamplingConfig, gen: torch.Generator) -> list[int]:
    """W distinct tokens from the target's next-token law: top-W when greedy, else sampled without replacement."""
    if sampling.greedy:
        ranked = state.rank_next  # set by the prefill, then by every round
        if ranked is None:
            raise RuntimeError("target-initialized round: no next-token ranking carried over")
        greedy_argmax(ranked)  # NaN logits: one line, not a silent token
        return ranked.topk(width).indices.tolist()
    p = state.p_next  # set at T > 0 by the prefill, then by every round
    if p is None:
        raise RuntimeError("target-initialized round: no next-token law carried over")
    width = min(width, int((p > 0).sum()))
    return torch.multinomial(p, width, replacement=False, generator=gen).tolist()


def _narrow(tree: Tree, width: int) -> Tree:
    shape = [len(tree.level(1))] + [len(tree.level(d)) // max(1, len(tree.level(d - 1)))
                                    for d in range(2, tree.max_depth + 1)]
    return Tree.from_shape((width,) + tuple(shape[1:]))


def _draft_law(run: Run):
    """Below level 1 of a target-initialized tree siblings are drafted without replacement (distinct candidates),
    the law the W = 1 tree walk (rrs-wor) verifies; greedy drafting takes the top-n."""
    return run.verifier.draw if run.verifier.name == "greedy" else get_verifier("rrs-wor").draw
