"""Optimal-transport node verifier `ot` for n drafts i.i.d. from q (docs/optimal.md §7).

p is ALWAYS the target distribution and q the draft distribution (processed, design §1). The verifier reaches
the optimal acceptance α*(p, q, n) of `multispec.optimal.optimal_acceptance` with output law exactly p. It is
Khisti et al.'s canonical decomposition with an exact first step:

1. Selection. One draft is selected; the selected token Z has law r ("selection law"). r is chosen optimal:
   with the optimal cut H (the low-p/q tokens) and A = supp(q) ∖ H, r = min(p, c·q) on A and
   r = max(p, d·q) on H, c and d fixing r(A) = 1 − q(H)^n and r(H) = q(H)^n.
2. Single-draft speculative sampling from Z: accept with probability min(1, p(Z)/r(Z)), else draw the new
   token from norm((p − r)_+). Acceptance Σ min(p, r) = p(H) + 1 − q(H)^n = α*.

The selection is a *key race*: each draft independently gets a key u ∈ [0, 1] uniform on its token's pieces
(token z owns Lebesgue pieces of [0, 1] of total length q(z); the pieces of all tokens tile [0, 1]) and the
draft with the smallest key is selected. A key law whose mean of F'(u) = n(1 − u)^{n−1} is r(z)/q(z) gives
P(select z) = r(z). The pieces come from the shadow construction of a martingale coupling (§7 of the doc):
a closed form (nested intervals, vectorized) when it applies, otherwise a sequential shadow sweep.

Per call: O(V log V) for the selection law and the pieces, O(n^2) for the selection probabilities of the
realized drafts. `OTSelection.node_law` gives the exact law for given drafts; the production sampler draws
from that law, so the numbers checked by exact enumeration come from the code that samples.
"""
from __future__ import annotations

import bisect
import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from scipy.optimize import brentq

from multispec.errors import MultispecError
from multispec.verify.base import EPS, NodeLaw, NodeResult, Plan, VerifierSpec, draw_iid, law_iid

NEST_TOL = 1e-12  # nested intervals may overlap by rounding up to this much before the general sweep is used
PADDED_PIECES = 8  # select_probs pads rows whose tokens have at most this many key pieces (vectorized)


# ----------------------------------------------------------------------------------- the selection law r
def ipow(x, n: int):
    """x ** n for an integer n >= 0 by repeated multiplication (numpy's float pow is several times slower)."""
    if n == 0:
        return np.ones_like(x) if isinstance(x, np.ndarray) else 1.0
    out, base = None, x
    while n:
        if n & 1:
            out = base if out is None else out * base
        n >>= 1
        if n:
            base = base * base
    return out


def coverage(x: np.ndarray | float, n: int):
    """F(x) = 1 − (1 − x)^n: probability that some of n i.i.d. drafts lands in a set of q-mass x."""
    return 1.0 - ipow(1.0 - np.minimum(x, 1.0), n)


def selection_law(p: np.ndarray, q: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Optimal selection law r (float64 [V]), the support of q by p/q descending (long [m]) and the cut k:
    A = order[:k], H = order[k:] (docs/optimal.md §7.1).

    p: target float64 [V]; q: draft float64 [V]; both sum to 1. r is 0 where q = 0, r <= p on A,
    r >= p on H, r(A) = 1 − q(H)^n, Σ r = 1.
    """
    idx = np.flatnonzero(q > 0)
    order = idx[np.argsort(-(p[idx] / q[idx]))]  # p/q descending (the order within ties does not matter)
    qs, ps = q[order], p[order]
    cum_p = np.concatenate([[0.0], np.cumsum(ps)])
    tail_q = np.concatenate([np.cumsum(qs[::-1])[::-1], [0.0]])  # q(H_k), summed from the end (no 1 − x)
    k = int(np.argmax(cum_p - (1.0 - ipow(tail_q, n))))  # optimal cut: A = order[:k], H = order[k:]
    s = float(tail_q[k])
    r = np.zeros_like(p)
    r[order[:k]] = clamp_down(ps[:k], qs[:k], 1.0 - s ** n)
    r[order[k:]] = clamp_up(ps[k:], qs[k:], s ** n)
    return r, order, k


def clamp_down(ps: np.ndarray, qs: np.ndarray, total: float) -> np.ndarray:
    """min(p, c·q) with c such that the sum is `total` (<= Σp). ps, qs: float64 [k], p/q descending."""
    if ps.size == 0:
        return ps.copy()
    if total >= ps.sum():
        return ps.copy()
    ratio = ps / qs
    cq = np.cumsum(qs)  # tokens 0..i clamped
    rest = ps.sum() - np.cumsum(ps)  # p mass of tokens i+1.. (not clamped)
    c = (total - rest) / cq  # c if exactly tokens 0..i are clamped
    nxt = np.concatenate([ratio[1:], [0.0]])
    ok = np.flatnonzero((c >= nxt) & (c <= ratio))
    c_star = float(c[ok[0]]) if ok.size else float(c[-1])
    return np.minimum(ps, c_star * qs)


def clamp_up(ps: np.ndarray, qs: np.ndarray, total: float) -> np.ndarray:
    """max(p, d·q) with d such that the sum is `total` (>= Σp). ps, qs: float64 [m], p/q descending."""
    if ps.size == 0:
        return ps.copy()
    if total <= ps.sum():
        return ps.copy()
    ratio = ps / qs
    cq = np.cumsum(qs[::-1])[::-1]  # tokens i.. raised to d·q
    above = np.cumsum(ps) - ps  # p mass of tokens ..i-1 (kept at p)
    d = (total - above) / cq
    prev = np.concatenate([[np.inf], ratio[:-1]])
    ok = np.flatnonzero((d >= ratio) & (d <= prev))
    d_star = float(d[ok[-1]]) if ok.size else float(d[0])
    return np.maximum(ps, d_star * qs)


# ----------------------------------------------------------------------------------- key pieces
def interval_start(length: np.ndarray, mass: np.ndarray, lo: float, hi: float, n: int) -> np.ndarray:
    """A in [lo, hi − L] with F(A + L) − F(A) = M, elementwise (float64 arrays of one shape).

    With y = 1 − A, h = L/2 and z = y − h: E(z) = (z + h)^n − (z − h)^n = 2 Σ_{j odd} C(n, j) z^{n−j} h^j = M,
    a polynomial with non-negative coefficients (no cancellation), increasing and convex for z > 0. Closed
    forms for n <= 4 (then one Newton step to polish); Newton from the right (monotone) for larger n.
    """
    h = np.maximum(length, 1e-300) / 2
    if n == 2:
        z = mass / (4 * h)
    elif n == 3:  # 6h z^2 + 2h^3 = M
        z = np.sqrt(np.maximum(mass - 2 * h * h * h, 0.0) / (6 * h))
    elif n == 4:  # 8h z^3 + 8h^3 z = M: depressed cubic z^3 + h^2 z − M/(8h) = 0, one real root
        P, Q = h * h, mass / (8 * h)
        u = np.cbrt(Q / 2 + np.sqrt(Q * Q / 4 + P * P * P / 27))
        z = u - P / (3 * np.maximum(u, 1e-300))
    else:  # start right of the root: E(z) >= 2n h z^(n-1) (the j = 1 term), so that term alone overshoots
        z = np.minimum(np.full_like(h, 1.0 - lo) - h,
                       (np.maximum(mass, 0.0) / (2.0 * n * h)) ** (1.0 / (n - 1)))
    coef = [(n - j, 2.0 * math.comb(n, j)) for j in range(1, n + 1, 2)]  # (power of z, coefficient)
    hks = [c * ipow(h, n - k) for k, c in coef]
    for _ in range(1 if n <= 4 else 80):
        e = -mass
        de = 0.0
        for (k, c), hk in zip(coef, hks):
            zk1 = ipow(z, k - 1) if k else 0.0
            e = e + hk * (zk1 * z if k else 1.0)
            if k:
                de = de + k * hk * zk1
        step = np.where(de > 0, e / np.where(de > 0, de, 1.0), 0.0)
        z = z - step
        if n > 4 and not np.any(np.abs(step) > 4 * np.finfo(float).eps * np.abs(z)):  # converged (monotone)
            break
    return np.clip(1.0 - (z + h), lo, np.maximum(hi - length, lo))


def region_pieces(order: np.ndarray, q: np.ndarray, r: np.ndarray, lo: float, hi: float, n: int,
                  force_sweep: bool = False, ascending_first: bool = True
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Pieces (token long [P], lo float64 [P], hi float64 [P], slot long [P]: the piece's rank within its
    token) tiling [lo, hi] so that token z's keys have mean F' equal to r(z)/q(z).

    order: long [m], tokens with q > 0 by r/q descending (their q-mass is hi − lo, r-mass F(hi) − F(lo)).
    Each token in turn takes the shadow of its atom in the key measure left (docs/optimal.md §7.2); any
    order is valid. The closed form (nested intervals) is tried with r/q ascending and descending (the
    first one tried: ascending_first; A nests mostly descending, H ascending, on LLM pairs). If
    neither nests throughout, the order that nests longer gives its nested prefix in closed form and the
    sequential sweep places the other tokens in the two intervals left, in r/q ascending order whichever order
    nested (any order is valid): its runs then break 10–40x less often than in descending order on LLM pairs.
    """
    if order.size == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0), np.zeros(0), np.zeros(0, dtype=np.int64)
    # (tokens that nest, the order tried, their intervals (A, B): None while no order nests a token)
    best: tuple[int, np.ndarray, tuple[np.ndarray, np.ndarray] | None] = (0, order[::-1], None)
    if not force_sweep:
        for o in ((order[::-1], order) if ascending_first else (order, order[::-1])):
            A, B, good = nested_intervals(o, q, r, lo, hi, n)
            if good == o.size:
                return nested_pieces(o, A, B)
            if good > best[0]:
                best = (good, o, (A[:good], B[:good]))
    good, o, prefix = best
    if prefix is not None:  # good > 0: some tokens nest
        parts = [nested_pieces(o[:good], *prefix)]
        left = [(lo, prefix[0][-1]), (prefix[1][-1], hi)]
    else:
        parts, left = [], [(lo, hi)]
    rest = o[good:]
    tok, a, b = sweep_pieces(rest[np.argsort(r[rest] / q[rest], kind="stable")], q, r, left, n)
    tok = np.array(tok, dtype=np.int64)
    by_tok = np.argsort(tok, kind="stable")  # each token's pieces in the order placed: slots 0, 1, ...
    first = np.searchsorted(tok[by_tok], tok[by_tok])  # where each token's run starts in the sorted order
    slot = np.empty(tok.size, dtype=np.int64)
    slot[by_tok] = np.arange(tok.size) - first
    parts.append((tok, np.array(a), np.array(b), slot))
    tok_all, lo_all, hi_all, slot_all = (np.concatenate(x) for x in zip(*parts))
    return tok_all, lo_all, hi_all, slot_all


def nested_intervals(order, q, r, lo, hi, n):
    """Closed form: the keys of the first j tokens of `order` as one interval [A_j, B_j] whose length is their
    q-mass and whose F-mass is their r-mass. Returns (A, B, good): float64 [m] each, and the number of leading
    tokens whose intervals nest (m when all do)."""
    L = np.cumsum(q[order])
    M = np.cumsum(r[order])
    L[-1] = hi - lo  # the whole region, exactly
    A = interval_start(L, M, lo, hi, n)
    A[-1] = lo
    B = A + L
    B[-1] = hi
    bad = np.flatnonzero((np.diff(A) > NEST_TOL) | (np.diff(B) < -NEST_TOL))
    good = int(bad[0]) + 1 if bad.size else order.size
    return np.minimum.accumulate(A), np.maximum.accumulate(B), good


def nested_pieces(order, A, B):
    """Token order[j] owns [A_j, A_{j-1}) and [B_{j-1}, B_j) (two pieces each; slot 0 and 1)."""
    A_prev = np.concatenate([[A[0]], A[:-1]])
    B_prev = np.concatenate([[A[0]], B[:-1]])
    slot = np.repeat(np.array([0, 1], dtype=np.int64), order.size)
    return np.concatenate([order, order]), np.concatenate([A, B_prev]), np.concatenate([A_prev, B]), slot


def sweep_pieces(order: list[int] | np.ndarray, q: np.ndarray, r: np.ndarray, left: list[tuple[float, float]], n: int):
    """General shadow sweep: each token takes a window, contiguous in the key measure left (a sorted list of
    intervals), of length q(z) and F-mass r(z); the window's start solves a monotone equation (Brent).
    Returns lists (token, lo, hi) of pieces.

    After each window so placed, the tokens that follow usually take windows around the hole it left (two pieces
    each, as in the closed form): `nested_run` places such runs vectorized, token by token the same windows (a
    window of the right length and mass contiguous in the measure left is the unique root of the equation). The
    Brent step runs only where a run breaks, so a call costs O(tokens + breaks · (60 + intervals))."""
    F = lambda x: 1.0 - (1.0 - min(x, 1.0)) ** n  # noqa: E731
    iv = [list(x) for x in left if x[1] > x[0]]
    tok, out_a, out_b = [], [], []
    order = np.asarray(order, dtype=np.int64)
    m, idx = order.size, 0
    while idx < m:
        for from_right in (True, False):  # tokens the sweep would clamp to an end of the measure left, in a run
            if idx < m - 1 and iv:
                end = iv[-1] if from_right else iv[0]
                done, pieces, edge = edge_run(order[idx:m - 1], q, r, end[0], end[1], n, from_right)
                if done:
                    tok.extend(pieces[0].tolist())
                    out_a.extend(pieces[1].tolist())
                    out_b.extend(pieces[2].tolist())
                    idx += done
                    end[1 if from_right else 0] = edge
                    iv = [x for x in iv if x[1] > x[0]]
        if idx >= m:
            break
        t = int(order[idx])
        if not iv:  # consumed by rounding before the last token
            break
        length, mass = float(q[t]), float(r[t])
        ends = np.array(iv)  # [I, 2]
        cum_len = np.concatenate([[0.0], np.cumsum(ends[:, 1] - ends[:, 0])]).tolist()
        cum_f = np.concatenate([[0.0], np.cumsum(coverage(ends[:, 1], n) - coverage(ends[:, 0], n))]).tolist()
        total = cum_len[-1]

        def at(w):  # remaining-measure coordinate w -> (interval index, key u, F-mass below u)
            i = min(max(bisect.bisect_right(cum_len, w) - 1, 0), len(iv) - 1)
            u = min(iv[i][0] + (w - cum_len[i]), iv[i][1])
            return i, u, cum_f[i] + F(u) - F(iv[i][0])

        if idx == len(order) - 1:  # the last token takes everything left
            i0, u0, i1, u1 = 0, iv[0][0], len(iv) - 1, iv[-1][1]
        else:
            w_hi = max(total - length, 0.0)
            phi = lambda w: at(min(w + length, total))[2] - at(w)[2] - mass  # noqa: E731  decreasing in w
            if w_hi <= 0 or phi(0.0) <= 0:
                w = 0.0
            elif phi(w_hi) >= 0:
                w = w_hi
            else:
                w = brentq(phi, 0.0, w_hi, xtol=1e-17, rtol=4 * np.finfo(float).eps)
            i0, u0, _ = at(w)
            i1, u1, _ = at(min(w + length, total))
        for i in range(i0, i1 + 1):
            a, b = (u0 if i == i0 else iv[i][0]), (u1 if i == i1 else iv[i][1])
            if b > a:
                tok.append(t)
                out_a.append(a)
                out_b.append(b)
        idx += 1
        lo_b, hi_b = iv[i0][0], iv[i1][1]
        if idx < m - 1:  # the last token takes everything left: never part of a run
            done, u0, u1, pieces = nested_run(order[idx:m - 1], q, r, u0, u1, lo_b, hi_b, n)
            for x in pieces:
                tok.extend(x[0].tolist())
                out_a.extend(x[1].tolist())
                out_b.extend(x[2].tolist())
            idx += done
        # each one interval [a, b], or the list of fragments a disjoint run leaves
        left_part: list[Any] = [lo_b, u0]
        right_part: list[Any] = [u1, hi_b]
        for side, part in ((True, left_part), (False, right_part)):  # then disjoint windows beside the hole
            if idx < m - 1 and part[1] > part[0]:
                done, pieces, frags = disjoint_run(order[idx:m - 1], q, r, part[0], part[1], n, side)
                if done:
                    tok.extend(pieces[0].tolist())
                    out_a.extend(pieces[1].tolist())
                    out_b.extend(pieces[2].tolist())
                    idx += done
                    if side:
                        left_part = frags
                    else:
                        right_part = frags
        left_part = left_part if isinstance(left_part[0], list) else [left_part]
        right_part = right_part if isinstance(right_part[0], list) else [right_part]
        rest = iv[:i0] + left_part + right_part + iv[i1 + 1:]
        iv = [x for x in rest if x[1] > x[0]]
    return tok, out_a, out_b


def edge_run(order: np.ndarray, q: np.ndarray, r: np.ndarray, a: float, b: float, n: int, from_right: bool):
    """Tokens order[0], order[1], ... whose windows the sweep clamps to the right end of the measure left (the
    rightmost window of their length holds at least their F-mass: w = w_hi), or to the left end (the leftmost holds
    at most: w = 0), while they stay inside the end interval [a, b]: consecutive windows from that end. Returns
    (tokens placed, pieces (token, lo, hi) arrays, the end interval's new end)."""
    placed, chunk, edge = 0, RUN_CHUNK, (b if from_right else a)
    toks, los, his = [], [], []
    while placed < order.size:
        ts = order[placed:placed + chunk]
        length, mass = q[ts], r[ts]
        if from_right:
            y = edge - np.concatenate([[0.0], np.cumsum(length)[:-1]])
            x = y - length
            inside, room = x >= a, (y - a) > length  # w_hi > 0: some measure is left of the window
            ok = inside & room & (coverage(y, n) - coverage(x, n) - mass >= 0)
        else:
            x = edge + np.concatenate([[0.0], np.cumsum(length)[:-1]])
            y = x + length
            ok = (y <= b) & (coverage(y, n) - coverage(x, n) - mass <= 0)
        good = int(np.argmin(ok)) if not ok.all() else ts.size
        if good:
            toks.append(ts[:good])
            los.append(x[:good])
            his.append(y[:good])
            edge = float(x[good - 1] if from_right else y[good - 1])
            placed += good
        if good < ts.size:
            break
        chunk *= 2
    if not placed:
        return 0, None, edge
    return placed, tuple(np.concatenate(v) for v in (toks, los, his)), edge


def disjoint_run(order: np.ndarray, q: np.ndarray, r: np.ndarray, a: float, b: float, n: int, leftward: bool):
    """Tokens order[0], order[1], ... each placed as one window inside [a, b] (all key measure there left), the
    windows disjoint and moving from b leftward (or from a rightward): a window of the right length and F-mass
    inside measure left is the sweep's unique root, whatever else is left elsewhere. Returns (tokens placed,
    pieces (token, lo, hi) arrays, the fragments of [a, b] still left, sorted)."""
    t = int(order[0])  # most calls place nothing: the first window must fit, which scalar bounds tell cheaply
    if q[t] > b - a or not (coverage(b, n) - coverage(b - q[t], n) - RUN_MASS_TOL <= r[t]
                            <= coverage(a + q[t], n) - coverage(a, n) + RUN_MASS_TOL):
        return 0, None, None
    placed, chunk, edge = 0, RUN_CHUNK, (b if leftward else a)
    toks, los, his = [], [], []
    frags: list[list[float]] = []
    while placed < order.size:
        ts = order[placed:placed + chunk]
        length, mass = q[ts], r[ts]
        x = interval_start(length, mass, a, b, n)
        y = x + length
        got = coverage(y, n) - coverage(x, n)
        fits = (np.abs(got - mass) <= RUN_MASS_TOL) & (x >= a) & (y <= b)
        if leftward:
            prev = np.concatenate([[edge], x[:-1]])
            ok = fits & (y <= prev)
        else:
            prev = np.concatenate([[edge], y[:-1]])
            ok = fits & (x >= prev)
        good = int(np.argmin(ok)) if not ok.all() else ts.size
        if good:
            toks.append(ts[:good])
            los.append(x[:good])
            his.append(y[:good])
            gap_lo, gap_hi = (y[:good], prev[:good]) if leftward else (prev[:good], x[:good])
            frags.extend([lo_, hi_] for lo_, hi_ in zip(gap_lo.tolist(), gap_hi.tolist()) if hi_ > lo_)
            edge = float(x[good - 1] if leftward else y[good - 1])
            placed += good
        if good < ts.size:
            break
        chunk *= 2
    if not placed:
        return 0, None, None
    frags.append([a, edge] if leftward else [edge, b])
    frags = sorted(f for f in frags if f[1] > f[0]) or [[a, a]]
    return placed, tuple(np.concatenate(x) for x in (toks, los, his)), frags


RUN_CHUNK = 32  # nested_run's first chunk of tokens (doubled while whole chunks nest)
RUN_MASS_TOL = 1e-13  # a run's window must carry its F-mass to this (else the Brent step places the token)


def nested_run(order: np.ndarray, q: np.ndarray, r: np.ndarray, u0: float, u1: float, lo: float, hi: float,
               n: int):
    """Tokens order[0], order[1], ... placed around the hole [u0, u1] (no key measure left inside it; measure
    left on [lo, u0] and [u1, hi]) while their windows nest: the first j of them and the hole make one interval
    [A_j, B_j] of length (u1 − u0) + their q-mass and F-mass (F(u1) − F(u0)) + their r-mass, A_j decreasing and
    B_j increasing inside [lo, hi]. Returns (tokens placed, A, B: the new hole, pieces: list of (token, lo, hi)
    arrays)."""
    placed, pieces, chunk = 0, [], RUN_CHUNK
    while placed < order.size:
        ts = order[placed:placed + chunk]
        length = (u1 - u0) + np.cumsum(q[ts])
        mass = (coverage(u1, n) - coverage(u0, n)) + np.cumsum(r[ts])
        A = interval_start(length, mass, lo, hi, n)
        B = A + length
        a_prev = np.concatenate([[u0], A[:-1]])
        b_prev = np.concatenate([[u1], B[:-1]])
        got = coverage(B, n) - coverage(A, n)
        ok = ((A <= a_prev + NEST_TOL) & (B >= b_prev - NEST_TOL) & (A >= lo) & (B <= hi)
              & (np.abs(got - mass) <= RUN_MASS_TOL))
        good = int(np.argmin(ok)) if not ok.all() else ts.size
        if good:
            A_g = np.minimum.accumulate(np.concatenate([[u0], A[:good]]))
            B_g = np.maximum.accumulate(np.concatenate([[u1], B[:good]]))
            A_g[1:] = np.maximum(A_g[1:], lo)
            B_g[1:] = np.minimum(B_g[1:], hi)
            for x, lo_x, hi_x in ((ts[:good], A_g[1:], A_g[:-1]), (ts[:good], B_g[:-1], B_g[1:])):
                keep = hi_x > lo_x
                pieces.append((x[keep], lo_x[keep], hi_x[keep]))
            placed += good
            u0, u1 = float(A_g[-1]), float(B_g[-1])
        if good < ts.size:
            break
        chunk *= 2
    return placed, u0, u1, pieces


# ----------------------------------------------------------------------------------- one position
@functools.lru_cache(maxsize=None)
def gauss_legendre(k: int) -> tuple[np.ndarray, np.ndarray]:
    """k-point Gauss–Legendre nodes and weights on [−1, 1] (exact for polynomials of degree <= 2k − 1)."""
    return np.polynomial.legendre.leggauss(k)


@dataclass(frozen=True)
class OTSelection:
    """Everything `ot` needs at one position.

    p: target float64 [V]; q: draft float64 [V]; r: selection law float64 [V] (as realized by the pieces);
    start long [V+1], lo, hi float64 [P]: token z's keys are uniform on the union of its pieces
    [lo[i], hi[i]) for i in start[z]:start[z+1] (CSR); n: number of drafts; swept: tokens with more than
    two pieces, which only the sequential sweep makes (a cost diagnostic).
    """

    p: np.ndarray
    q: np.ndarray
    r: np.ndarray
    start: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    n: int
    swept: int = 0  # tokens with more than 2 key pieces: placed by the sequential sweep (0: closed form only)

    @property
    def acceptance(self) -> float:
        """Σ min(p, r): the acceptance rate of `ot` at this position (= α*)."""
        return float(np.minimum(self.p, self.r).sum())

    def piece_lengths(self) -> np.ndarray:
        """Total key length of each token, float64 [V] (equals q when the pieces tile [0, 1])."""
        counts = np.diff(self.start)
        return np.bincount(np.repeat(np.arange(counts.size), counts), weights=self.hi - self.lo,
                           minlength=counts.size)

    def select_probs(self, drafts: np.ndarray, chunk: int = 4096) -> np.ndarray:
        """P(draft j has the smallest key), float64 [B, k], for drafts long [B, k] (tokens with q > 0).

        The integrand f_j(u) Π_{i≠j} (1 − K_i(u)) is a polynomial of degree <= k − 1 between consecutive
        piece ends, so Gauss–Legendre with k nodes per segment integrates it exactly (segments of length 0,
        from repeated ends, add 0). Rows whose tokens have few pieces are done together, padded; the others
        one by one.
        """
        drafts = np.atleast_2d(drafts)
        counts = self.start[drafts + 1] - self.start[drafts]  # [B, k]
        out = np.empty(drafts.shape)
        few = counts.max(1) <= PADDED_PIECES
        rows = np.flatnonzero(few)
        for i in range(0, rows.size, chunk):
            sub = rows[i:i + chunk]
            out[sub] = self._padded(drafts[sub], int(counts[sub].max()))
        for b in np.flatnonzero(~few):
            out[b] = self._one_row(drafts[b])
        return out

    def _padded(self, drafts: np.ndarray, width: int) -> np.ndarray:
        """select_probs for drafts long [B, k] whose tokens have <= width pieces, vectorized."""
        b, k = drafts.shape
        first = self.start[drafts][:, :, None] + np.arange(width)  # [B, k, K]
        valid = first < self.start[drafts + 1][:, :, None]
        idx = np.where(valid, first, 0)
        lo = np.where(valid, self.lo[idx] if self.lo.size else 0.0, 0.0)  # empty pieces [0, 0)
        hi = np.where(valid, self.hi[idx] if self.hi.size else 0.0, 0.0)
        qs = self.q[drafts]  # [B, k]
        ends = np.concatenate([lo.reshape(b, -1), hi.reshape(b, -1), np.zeros((b, 1)), np.ones((b, 1))], 1)
        ends.sort(axis=1)  # [B, E]
        nodes, weights = gauss_legendre(k)
        mid, half = (ends[:, 1:] + ends[:, :-1]) / 2, (ends[:, 1:] - ends[:, :-1]) / 2  # [B, E-1]
        u = (mid[:, :, None] + half[:, :, None] * nodes).reshape(b, -1)  # [B, G]
        w = (half[:, :, None] * weights).reshape(b, -1)  # [B, G]
        uu = u[:, None, :, None]  # [B, 1, G, 1]
        lo4, hi4 = lo[:, :, None, :], hi[:, :, None, :]  # [B, k, 1, K]
        inside = ((uu >= lo4) & (uu < hi4)).any(-1)  # [B, k, G]
        below = np.clip(uu - lo4, 0.0, hi4 - lo4).sum(-1)  # [B, k, G]
        safe_q = np.where(qs > 0, qs, 1.0)[:, :, None]
        dens = np.where(qs[:, :, None] > 0, inside / safe_q, 0.0)
        surv = np.clip(1.0 - below / safe_q, 0.0, 1.0)  # 1 − K_i(u)
        out = np.empty((b, k))
        for j in range(k):
            others = np.prod(np.delete(surv, j, axis=1), axis=1)  # [B, G]
            out[:, j] = np.einsum("bg,bg->b", w, dens[:, j] * others)
        return out

    def _one_row(self, drafts: np.ndarray) -> np.ndarray:
        """select_probs for one row, drafts long [k], any number of pieces: O(P log P + P k^2)."""
        k = drafts.size
        pieces = [(self.lo[self.start[x]:self.start[x + 1]], self.hi[self.start[x]:self.start[x + 1]])
                  for x in drafts.tolist()]
        edges = np.unique(np.concatenate([a for a, _ in pieces] + [b for _, b in pieces] + [np.array([0.0, 1.0])]))
        seg = np.diff(edges)  # [S]
        dens = np.zeros((k, seg.size))
        for j, (a, b) in enumerate(pieces):
            cover = np.zeros(edges.size)
            np.add.at(cover, np.searchsorted(edges, a), 1.0)
            np.add.at(cover, np.searchsorted(edges, b), -1.0)
            qx = self.q[drafts[j]]
            dens[j] = np.cumsum(cover)[:-1] / qx if qx > 0 else 0.0
        k_start = np.concatenate([np.zeros((k, 1)), np.cumsum(dens * seg, 1)[:, :-1]], 1)  # K_j at segment starts
        nodes, weights = gauss_legendre(k)
        x = (nodes + 1) / 2  # [G] in [0, 1]
        surv = np.clip(1.0 - (k_start[:, :, None] + dens[:, :, None] * seg[None, :, None] * x), 0.0, 1.0)
        w = seg[:, None] * weights[None, :] / 2  # [S, G]
        out = np.empty(k)
        for j in range(k):
            others = np.prod(np.delete(surv, j, axis=0), axis=0)  # [S, G]
            out[j] = float(np.sum(w * dens[j][:, None] * others))
        return out

    def node_law(self, drafts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Exact law for drafts long [B, k] (or [k]): accept float64 [B, k] and residual float64 [B, V]
        as in base.NodeLaw (a [k] input gives [k] and [V])."""
        single = np.ndim(drafts) == 1
        drafts = np.atleast_2d(drafts)
        sel = self.select_probs(drafts)
        r_x = self.r[drafts]
        ok = r_x > 0
        accept = np.where(ok, sel * np.minimum(1.0, self.p[drafts] / np.where(ok, r_x, 1.0)), 0.0)
        excess = np.maximum(self.p - self.r, 0.0)
        mass = excess.sum()
        residual_law = excess / mass if mass > EPS else self.p
        residual = np.maximum(0.0, 1.0 - accept.sum(1))[:, None] * residual_law[None, :]
        return (accept[0], residual[0]) if single else (accept, residual)


def ot_selection(p, q, n: int, force_sweep: bool = False) -> OTSelection:
    """Build `ot`'s selection at one position.

    p: target, q: draft (float [V], numpy or torch; renormalized); n >= 1. force_sweep: skip the closed
    form (tests of the general path).
    """
    p = np.asarray(p.detach().cpu().double().numpy() if hasattr(p, "detach") else p, dtype=np.float64)
    q = np.asarray(q.detach().cpu().double().numpy() if hasattr(q, "detach") else q, dtype=np.float64)
    p, q = p / p.sum(), q / q.sum()
    if n == 1:  # the single draft is always selected: r = q, each token keyed on its own slot
        support = np.flatnonzero(q > 0)
        bounds = np.concatenate([[0.0], np.cumsum(q[support])])
        bounds[-1] = 1.0
        tok, lo, hi, slot = support.astype(np.int64), bounds[:-1], bounds[1:], np.zeros(support.size, np.int64)
    else:
        r, order, k = selection_law(p, q, n)
        a = float(q[order[:k]].sum())
        pa = region_pieces(order[:k], q, r, 0.0, a, n, force_sweep, ascending_first=False)
        ph = region_pieces(order[k:], q, r, a, 1.0, n, force_sweep)
        tok, lo, hi, slot = (np.concatenate([x, y]) for x, y in zip(pa, ph))
    # the selection law realized by the pieces (the optimal r up to rounding): what stage 2 must use
    r = np.bincount(tok, weights=coverage(hi, n) - coverage(lo, n), minlength=p.size)
    start = np.concatenate([[0], np.cumsum(np.bincount(tok, minlength=p.size))])
    at = start[tok] + slot  # CSR position of each piece: its token's block, then its rank
    lo_csr, hi_csr = np.empty(tok.size), np.empty(tok.size)
    lo_csr[at], hi_csr[at] = lo, hi
    swept = int(np.count_nonzero(np.diff(start) > 2))  # closed-form tokens have <= 2 pieces (a lower bound)
    return OTSelection(p=p, q=q, r=r, start=start, lo=lo_csr, hi=hi_csr, n=n, swept=swept)


# ----------------------------------------------------------------------------------- the VerifierSpec
def _no_plan(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor) -> Plan:
    raise MultispecError("verifier 'ot' is not a rejection chain (no Plan): use its verify / law")


def _row_groups(p: torch.Tensor, q: torch.Tensor) -> list[tuple[int, int]]:
    """Runs [start, end) of consecutive rows of p, q [B, V] that are equal (one position), in order."""
    b = p.shape[0]
    if p.stride(0) == 0 and q.stride(0) == 0:  # p.expand(B, -1): one position
        return [(0, b)]
    same = ((p[1:] == p[:-1]).all(-1) & (q[1:] == q[:-1]).all(-1)).tolist()
    starts = [0] + [i + 1 for i, eq in enumerate(same) if not eq]
    return list(zip(starts, starts[1:] + [b]))


@dataclass(frozen=True)
class OTVerifierSpec(VerifierSpec):
    """`ot`: a VerifierSpec whose verify/law come from OTSelection instead of a Plan (same interface)."""

    def plan(self, p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor) -> Plan:
        return _no_plan(p, q, drafts)

    def law(self, p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor) -> NodeLaw:
        """Exact law of `verify` for fixed drafts. p: target float [B, V]; q: draft float [B, V];
        drafts: long [B, n]. Returns NodeLaw (accept [B, n], residual [B, V]) in p's dtype."""
        self.check_inputs(p, q, drafts)
        d = drafts.cpu().numpy()
        parts = [ot_selection(p[a], q[a], d.shape[1]).node_law(d[a:b]) for a, b in _row_groups(p, q)]
        accept = torch.from_numpy(np.concatenate([x for x, _ in parts])).to(p.dtype).to(p.device)
        residual = torch.from_numpy(np.concatenate([y for _, y in parts])).to(p.dtype).to(p.device)
        return NodeLaw(accept=accept, residual=residual)

    def verify(self, p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor,
               generator: torch.Generator | None) -> NodeResult:
        """Sample from `law`: the accepted draft or none, then (if none) the new token from the residual.
        drafts: long [B, n] i.i.d. from q. Returns NodeResult (token, accepted long [B])."""
        node = self.law(p.double(), q.double(), drafts)
        reject = (1.0 - node.accept.sum(-1, keepdim=True)).clamp_min(0.0)  # [B, 1]
        choice = torch.multinomial(torch.cat([node.accept, reject], 1), 1, generator=generator).squeeze(1)
        n = drafts.shape[1]
        new = torch.zeros(drafts.shape[0], dtype=torch.long)
        rows = torch.nonzero(choice == n).flatten()
        if rows.numel():  # the new token, only where no draft is accepted
            res = node.residual[rows]
            mass = res.sum(-1, keepdim=True)
            res = torch.where(mass > 0, res / torch.where(mass > 0, mass, torch.ones_like(mass)), p[rows].double())
            new[rows] = torch.multinomial(res, 1, generator=generator).squeeze(1)
        new = new.to(drafts.device)
        accepted = torch.where(choice < n, choice, torch.full_like(choice, -1)).to(drafts.device)
        token = torch.where(accepted >= 0, drafts.gather(1, accepted.clamp_min(0)[:, None]).squeeze(1), new)
        return NodeResult(token=token, accepted=accepted)


SPEC = OTVerifierSpec(
    name="ot",
    description="optimal transport, i.i.d. drafts: key-race selection + single-draft SD, acceptance = α* iid; "
                "CPU cost per call (V <= 32k, n <= 8): median ~3 ms, most pairs < 30 ms, worst measured 77 ms "
                "(benchmarks/results/ot/ot_worst_case.json)",
    lossless=True,
    drafts="any",
    draw_fn=draw_iid,
    plan_fn=_no_plan,
    law_fn=law_iid,
    draft_law="i.i.d. from q",
)
