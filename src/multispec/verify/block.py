"""Block verification of a drafted chain (Sun et al., "Block Verification Accelerates Speculative Decoding",
ICLR 2025, arXiv 2403.10444, Algorithm 2).

Chain nodes 0..g: node 0 is the root (the last committed token), node i > 0 holds draft X_i ~ q[i-1].
p[i] = target p(.|c, X_1..X_i), q[i] = the draft law X_{i+1} was drawn from. With w_0 = 1:

    w_i = min(1, w_{i-1} p[i-1](X_i) / q[i-1](X_i))          (sequence-level acceptance weight)
    h_g = w_g;  h_i = R_i / S_i for i < g,  R_i = sum_x (w_i p[i] - q[i])_+,  S_i = sum_x (q[i] - w_i p[i])_+
    tau = the LAST i in 1..g whose coin u_i satisfies u_i * S_i < R_i (u_g < h_g), else 0
    next token ~ p[g] if tau = g, else norm((w_tau p[tau] - q[tau])_+)

(The paper writes h_i = R_i / (R_i + 1 - w_i); R_i + 1 - w_i = S_i because p[i] and q[i] both sum to 1.)
By induction P(tau >= i, stream after X_1..X_i starts with s | X_1..X_i) = w_i * p(s | c, X_1..X_i), which at
i = 0 is losslessness; it is optimal in expected accepted length among chain verifiers and never worse than
token-level verification (identical for g = 1). At temperature 0 the engine verifies greedily instead.

`verify_block` samples (production); `block_law` enumerates every outcome with its exact probability from the
same weights and residuals (coins -> probabilities).
"""
from __future__ import annotations

import torch

from multispec.errors import check
from multispec.sampling import sample
from multispec.tree import Tree
from multispec.verify.base import accept_probability, normalize_or


def chain_nodes(tree: Tree) -> int:
    """The length g of a chain tree (nodes 0..g, node i's child i + 1); MultispecError for a branching tree."""
    check(all(len(kids) <= 1 for kids in tree.children),
          "block verification verifies a chain (one draft per level); this tree branches: use traversal")
    return len(tree) - 1


def _weights(tokens: torch.Tensor, p: torch.Tensor, q: torch.Tensor, g: int) -> list[float]:
    """w_0..w_g as floats. A draft the draft law gives no mass (never drawn by it) gets weight 0."""
    w = [1.0]
    for i in range(1, g + 1):
        x = int(tokens[i])
        qx, px = float(q[i - 1, x]), float(p[i - 1, x])
        w.append(min(1.0, w[-1] * px / qx) if qx > 0 else 0.0)
    return w


def _residual(w: float, p_row: torch.Tensor, q_row: torch.Tensor) -> torch.Tensor:
    """float [V]: norm((w p - q)_+), the law of the new token when the block stops at a node of weight w
    (p itself when that has no mass, design §1.5)."""
    return normalize_or((w * p_row - q_row).clamp_min(0)[None], p_row[None])[0]


def _stop_terms(w: list[float], p: torch.Tensor, q: torch.Tensor, g: int) -> tuple[list[float], list[float]]:
    """(num, den) for i = 1..g: the coin of node i stops the block there iff u * den < num."""
    nums, dens = [], []
    for i in range(1, g + 1):
        if i == g:
            nums.append(w[g])
            dens.append(1.0)
            continue
        diff = w[i] * p[i] - q[i]  # [V]
        nums.append(float(diff.clamp_min(0).sum()))
        dens.append(float((-diff).clamp_min(0).sum()))
    return nums, dens


def verify_block(tree: Tree, tokens: torch.Tensor, p: torch.Tensor, q: torch.Tensor,
                 generator: torch.Generator | None) -> tuple[tuple[int, ...], int]:
    """Verify a drafted chain jointly. tokens: long [g+1]; p, q: float [g+1, V] (q[g] unused).

    Returns (path, next_token): nodes 0..tau, and the bonus (tau = g) or residual token.
    """
    g = chain_nodes(tree)
    w = _weights(tokens, p, q, g)
    nums, dens = _stop_terms(w, p, q, g)
    tau = 0
    if g:
        coins = torch.rand(g, generator=generator, dtype=torch.float64).tolist()
        for i in range(g, 0, -1):  # the last stop wins: scan from the end
            if coins[i - 1] * dens[i - 1] < nums[i - 1]:
                tau = i
                break
    law = p[g] if tau == g else _residual(w[tau], p[tau], q[tau])
    return tuple(range(tau + 1)), int(sample(law, generator))


def block_law(tree: Tree, tokens: torch.Tensor, p: torch.Tensor,
              q: torch.Tensor) -> dict[tuple[tuple[int, ...], int], float]:
    """Exact law of `verify_block` (same arguments, no generator): {(path, next_token): probability}."""
    g = chain_nodes(tree)
    w = _weights(tokens, p, q, g)
    nums, dens = _stop_terms(w, p, q, g)
    h = accept_probability(torch.tensor(nums, dtype=torch.float64), torch.tensor(dens, dtype=torch.float64))
    law: dict[tuple[tuple[int, ...], int], float] = {}
    later_fail = 1.0  # P(every coin after node i fails)
    for tau in range(g, -1, -1):
        stop = later_fail * (float(h[tau - 1]) if tau else 1.0)
        if tau:
            later_fail *= 1 - float(h[tau - 1])
        if stop <= 0:
            continue
        out = p[tau] if tau == g else _residual(w[tau], p[tau], q[tau])
        for y, py in enumerate(out.tolist()):
            if py > 0:
                law[(tuple(range(tau + 1)), y)] = stop * py
    return law


__all__ = ["block_law", "chain_nodes", "verify_block"]
