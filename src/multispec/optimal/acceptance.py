"""Optimal acceptance rate of n-draft speculative decoding at one position (design §8, P3).

p is ALWAYS the target distribution and q the draft distribution (processed, design §1). With the draft law Q
fixed, the best any lossless verifier can do is the optimal-transport value (design §8.1)

    alpha* = min_{H ⊆ V} [ 1 + p(H) − Q(all n drafts ∈ H) ],

and for the draft laws here an optimal H is a prefix of the tokens sorted by p/q ascending (design §8.3: a proof
for i.i.d. drafts, an exhaustive check for drafts without replacement; docs/optimal.md). Tokens with q = 0
are never in an optimal H (they add p mass and no Q mass), so the search runs over the support of q only.

Q(all n drafts ∈ H) without replacement, for every prefix H at once, is computed
- exactly, by enumerating ordered draft tuples, when the support of q is small, and otherwise
- from the exponential-race integral 1 − Q(all ∈ H) = q(V∖H) ∫_0^∞ e^{−t} Σ_{j<n} e_j(e^{q_i t} − 1 : i ∈ H) dt,
  with the trapezoidal rule in s = log t (an analytic integrand, so the error falls like exp(−c/h);
  measured ≤ 1e-13 against exact enumeration, docs/optimal.md §2). The elementary symmetric sums e_j of all
  prefixes are nested cumulative sums of non-negative terms, rescaled per grid column (no cancellation).
"""
from __future__ import annotations

import itertools
import math

import numpy as np

from multispec.errors import MultispecError, check

SUM_TOL = 1e-6  # |Σp − 1| and |Σq − 1| allowed before renormalizing
EXACT_TUPLES = 2_000  # enumerate ordered draft tuples without replacement up to this many (V <= 8 at n = 4)
QUAD_STEP = 0.2  # trapezoid step in s = log t
QUAD_T_MIN = 1e-6  # below this the j >= 1 terms hold < t_min^2 / 2 of the integral


# ----------------------------------------------------------------------------------- input checks
def as_distribution(x, name: str) -> np.ndarray:
    """A 1-D probability vector (numpy array, torch tensor or sequence) as float64 [V], renormalized.

    Raises MultispecError when x is not 1-D, not finite, has negative mass or does not sum to 1 within 1e-6.
    """
    if hasattr(x, "detach"):  # torch.Tensor, without importing torch here
        x = x.detach().cpu().double().numpy()
    try:
        v = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise MultispecError(f"{name} must be a 1-D probability vector: {e}") from e
    check(v.ndim == 1, f"{name} must be a 1-D probability vector, got shape {tuple(v.shape)}")
    check(v.size >= 1, f"{name} is empty")
    check(bool(np.all(np.isfinite(v))), f"{name} has non-finite entries")
    check(bool(np.all(v >= 0)), f"{name} has negative mass (min {v.min():.3g})")
    total = float(v.sum())
    check(abs(total - 1.0) <= SUM_TOL, f"{name} must sum to 1 within {SUM_TOL:g}, sums to {total:.9g}")
    return v / total


def check_pair(p, q) -> tuple[np.ndarray, np.ndarray]:
    """Validated (p, q) as float64 [V] each, same shape. p: target, q: draft."""
    p = as_distribution(p, "p (target)")
    q = as_distribution(q, "q (draft)")
    check(p.shape == q.shape, f"p (target) and q (draft) must have the same shape, got {p.shape} and {q.shape}")
    return p, q


def check_n(n) -> int:
    """n as int; raises MultispecError unless it is an integer >= 1."""
    check(isinstance(n, (int, np.integer)) and not isinstance(n, (bool, np.bool_)),
          f"the number of drafts n must be an integer, got {n!r}")
    check(n >= 1, f"the number of drafts n must be >= 1, got {n}")
    return int(n)


# ----------------------------------------------------------------------------------- prefix search
def prefix_order(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Indices of the tokens with q > 0, sorted by p/q ascending (stable). long [m]."""
    idx = np.flatnonzero(q > 0)
    ratio = p[idx] / q[idx]
    return idx[np.argsort(ratio, kind="stable")]


def optimal_acceptance(p, q, n: int, replacement: bool = True) -> float:
    """Exact optimal acceptance rate of n-draft speculative decoding (design §8).

    p: target probabilities, float [V] (numpy or torch, any device); q: draft probabilities, float [V].
    n: number of drafts, i.i.d. from q (replacement=True) or drawn successively without replacement from q
    (replacement=False, needs at least n tokens with q > 0). Returns α* as a Python float.
    """
    p, q = check_pair(p, q)
    n = check_n(n)
    m = int(np.count_nonzero(q > 0))
    if not replacement:
        check(m >= n, f"without replacement needs at least n = {n} tokens with q > 0, q has {m}")
    order = prefix_order(p, q)
    cum_p = np.concatenate([[0.0], np.cumsum(p[order])])  # [m+1], p(H_k) for prefix sizes k = 0..m
    if replacement or n == 1:
        cum_q = np.concatenate([[0.0], np.cumsum(q[order])])
        cum_q[-1] = 1.0  # the full support of q: exactly 1
        all_in = cum_q ** n
    else:
        all_in = all_in_prefix_wor(q[order], n)
    return float(min(1.0, np.min(1.0 + cum_p - all_in)))


def all_in_prefix_wor(q_sorted: np.ndarray, n: int) -> np.ndarray:
    """Q(all n drafts ∈ H_k) for sampling without replacement, every prefix H_k (k = 0..m) of q_sorted.

    q_sorted: float64 [m], all > 0, summing to 1 (the draft law in prefix order). Returns float64 [m+1].
    """
    m = q_sorted.size
    if math.perm(m, n) <= EXACT_TUPLES:
        return all_in_prefix_wor_exact(q_sorted, n)
    return all_in_prefix_wor_quad(q_sorted, n)


def optimal_acceptance_all_n(p, q, n_max: int) -> dict[tuple[int, bool], float]:
    """optimal_acceptance for every n = 1..n_max and both modes, sharing the sort and the quadrature.

    p: target float [V]; q: draft float [V]. Returns {(n, replacement): α*}; without-replacement entries only
    for n <= the number of tokens with q > 0.
    """
    p, q = check_pair(p, q)
    n_max = check_n(n_max)
    order = prefix_order(p, q)
    m = order.size
    cum_p = np.concatenate([[0.0], np.cumsum(p[order])])
    cum_q = np.concatenate([[0.0], np.cumsum(q[order])])
    cum_q[-1] = 1.0
    out = {}
    for n in range(1, n_max + 1):
        out[(n, True)] = float(min(1.0, np.min(1.0 + cum_p - cum_q ** n)))
    top = min(n_max, m)
    if math.perm(m, top) <= EXACT_TUPLES:
        rows = {n: all_in_prefix_wor_exact(q[order], n) for n in range(1, top + 1)}
    else:
        table = all_in_prefix_wor_quad_upto(q[order], top)
        rows = {n: table[n] for n in range(1, top + 1)}
    for n, all_in in rows.items():
        out[(n, False)] = float(min(1.0, np.min(1.0 + cum_p - all_in)))
    return out


def all_in_prefix_wor_exact(q_sorted: np.ndarray, n: int) -> np.ndarray:
    """Exact Q(all ∈ H_k) by enumerating the ordered tuples of distinct tokens. float64 [m+1]."""
    m = q_sorted.size
    tuples = np.array(list(itertools.permutations(range(m), n)), dtype=np.int64).reshape(-1, n)  # [M, n]
    left = np.ones((tuples.shape[0], m), dtype=bool)  # [M, m] tokens not drawn yet
    rows = np.arange(tuples.shape[0])
    prob = np.ones(tuples.shape[0])
    for i in range(n):
        # the mass left, summed over the tokens left (not 1 − drawn: that cancels when q is peaked)
        prob *= q_sorted[tuples[:, i]] / (left @ q_sorted)
        left[rows, tuples[:, i]] = False
    last = tuples.max(axis=1)  # the tuple lies in H_k iff k > last
    by_last = np.bincount(last + 1, weights=prob, minlength=m + 1)
    out = np.cumsum(by_last)
    out[-1] = 1.0
    return out


def all_in_prefix_wor_quad(q_sorted: np.ndarray, n: int, step: float = QUAD_STEP) -> np.ndarray:
    """Q(all ∈ H_k) from the exponential race, trapezoid in log t. float64 [m+1]; error ~1e-13."""
    return all_in_prefix_wor_quad_upto(q_sorted, n, step)[n]


def all_in_prefix_wor_quad_upto(q_sorted: np.ndarray, n: int, step: float = QUAD_STEP) -> np.ndarray:
    """Q(all n' drafts ∈ H_k) for every n' = 1..n at once (one grid, sized for n). float64 [n+1, m+1].

    With E_i ~ Exp(q_i) the drafts are the first n arrivals, so for H = H_k and a = q(V∖H):
        1 − Q(all ∈ H) = a ∫_0^∞ e^{−t} Σ_{j<n} e_j(r_i(t) : i ∈ H) dt,   r_i(t) = e^{q_i t} − 1
    (the integrand times e^{−a t}·e^{−q(H) t} is P(no arrival from V∖H and fewer than n from H by t)).
    The j = 0 term integrates to 1. e_j over prefixes: E_j[k] = Σ_{i≤k} r_i E_{j−1}[i−1] (cumulative sums).
    """
    m = q_sorted.size
    top = float(np.sort(q_sorted)[::-1][: n - 1].sum())
    rate = max(1.0 - top, 1e-300)  # slowest decay of e^{-t} e_j(t), j < n
    log_count = sum(math.log(m - i) for i in range(n - 1))  # log C(m, n-1) bound, plus margin below
    t_max = (log_count + 36.0 + math.log(1.0 / rate)) / rate  # tail of the integral <= e^{-36}
    s = np.arange(math.log(QUAD_T_MIN), math.log(t_max) + step, step)  # [G]
    t = np.exp(s)
    qt = q_sorted[:, None] * t[None, :]  # [m, G]
    log_r = qt + np.log(-np.expm1(-qt))  # [m, G] log(e^{q t} − 1), stable for any q t > 0
    base = np.log(step * t) - t  # [G] trapezoid weight h·t and the e^{-t} factor, in logs
    a = np.concatenate([np.cumsum(q_sorted[::-1])[::-1], [0.0]])  # [m+1], q(V∖H_k)
    out = np.zeros((n + 1, m + 1))
    out[1] = 1.0 - a
    J = np.ones(m + 1)
    log_prev = np.zeros((m, t.size))  # log E_{j-1}[i-1]; E_0 = 1
    for j in range(1, n):
        # log E_j[k] = logsumexp_{i<=k} (log r_i + log E_{j-1}[i-1]): exact in log space, every prefix
        # keeps its own relative precision (a shift shared by a column would flush small prefixes to 0).
        log_e = np.logaddexp.accumulate(log_r + log_prev, axis=0)  # [m, G]
        J[1:] += np.exp(log_e + base).sum(axis=1)  # e^{-t} E_j <= 1: no overflow
        out[j + 1] = np.clip(1.0 - a * J, 0.0, 1.0)
        if j + 1 < n:
            log_prev = np.vstack([np.full((1, t.size), -np.inf), log_e[:-1]])
    return out


# ----------------------------------------------------------------------------------- other draft laws
def greedy_top(q: np.ndarray, k: int) -> np.ndarray:
    """The k most probable tokens of q, ties towards the lowest index (as multispec.verify.base.top_tokens)."""
    return np.argsort(-q, kind="stable")[:k]


def optimal_acceptance_greedy(p, q, n: int) -> float:
    """Optimal acceptance of P3's greedy draft law (design §4.6, §8.2): T = top n−1 tokens of q, x_n ~ q_T.

    p: target float [V]; q: draft float [V]; n >= 1 (at most the vocabulary size).
    α* = p(T) + Σ_{y∉T} min(p(y), q_T(y)), q_T = q restricted to V∖T, renormalized. When q(V∖T) = 0 the n-th draft is the next token of q's
    order (as verify.greedy_md) and α* = p(top-n of q).
    """
    p, q = check_pair(p, q)
    n = check_n(n)
    check(n <= p.size, f"greedy drafts need n <= vocabulary size {p.size}, got n = {n}")
    top = greedy_top(q, n - 1)
    rest = np.ones(p.size, dtype=bool)
    rest[top] = False
    mass = float(q[rest].sum())
    if mass <= 0:  # no random draft possible: the n-th draft is the next token in order (verify.greedy_md pad)
        return min(1.0, float(p[greedy_top(q, n)].sum()))
    accepted = float(p[top].sum()) + float(np.minimum(p[rest], q[rest] / mass).sum())
    return min(1.0, accepted)


def optimal_acceptance_hub(p, q) -> float:
    """Optimal acceptance of SpecHub's pair law (n = 2, design §4.5, §8.2): hub a = argmax q in every pair.

    p: target float [V]; q: draft float [V]. As a set the pair has the law of P3's greedy drafts with n = 2,
    so α* = p(a) + Σ_{y≠a} min(p(y), q(y)/(1 − q(a))) (p(a) when q(a) = 1).
    """
    return optimal_acceptance_greedy(p, q, 2)
