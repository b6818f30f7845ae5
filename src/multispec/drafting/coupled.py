"""The draft law of the drafter-invariant verifiers `gumbel` and `gls` (issue 26): coupled drafting.

q is the draft distribution (processed, design §1). A node's children are the top n tokens of log q + G, where G is
the Gumbel noise of the absolute position those children occupy, keyed by (seed, position) with
`multispec.verify.keyed` -- the same noise the verifier uses for the target there. n = 1 is the chain draft
d = argmax(log q + G); marginally the n drafts are n draws from q without replacement (the law `rrs-wor`
drafts with), but they are coupled with the target's Gumbel-max token, which is what makes them accepted often.

What the engine passes (it cannot be carried by `draw(q, n, generator)`, which knows no position):
- seed: the request's seed (the int given to `generate`), the same for drafting, verifying and plain `ar`;
- for the children of node u: position = the absolute position of those children, i.e. their position id in the
  target forward: root_position + depth(u) + 1, where root_position is the position of the round's root (the
  newest committed token; `target.cache_len` at the start of a draft-initialized round). Siblings and cousins
  share it. `multispec.verify.keyed.node_keys(tree, seed, root_position)` gives every node's position, and
  `.row(u)` the keys of node u alone.
"""
from __future__ import annotations

import torch

from multispec.errors import check
from multispec.verify.keyed import PositionKeys, gumbel_top


def coupled_draw(q: torch.Tensor, n: int, keys: PositionKeys) -> torch.Tensor:
    """n coupled drafts per row: the top n of log q + G(seed, keys.positions[b]), best first.

    q: float [B, V] (the draft's processed next-token law at B parents, any device); n: drafts per row
    (1 <= n <= V; when q has fewer than n tokens with mass the rest are the lowest-index tokens with q = 0, never
    accepted unless the target draws them); keys: PositionKeys with B positions, the absolute position of each
    row's children. Returns long [B, n] on q's device. Deterministic: no generator.
    """
    check(q.dim() == 2, f"q must be [B, V], got shape {tuple(q.shape)}")
    check(isinstance(keys, PositionKeys) and len(keys) == q.shape[0],
          f"coupled_draw needs PositionKeys with one position per row of q ({q.shape[0]}), got {keys!r}")
    check(isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= q.shape[1],
          f"the number of drafts must be an integer in 1..{q.shape[1]}, got {n!r}")
    return gumbel_top(q, n, keys.gumbel(q.shape[1], q.device))


__all__ = ["coupled_draw"]
