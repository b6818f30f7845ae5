"""Logit processing shared by target and draft: logit bias, min_tokens, penalties, temperature, min-p, top-k, top-p.

The processed target distribution is the distribution every lossless method preserves (design §1.2).
Temperature 0 means greedy: the processed distribution is one-hot on the argmax of the adjusted logits (lowest
index on ties). The order is vLLM's (v1 sampler): logit_bias and min_tokens, then the repetition, frequency and
presence penalties, then temperature, min-p, top-k and top-p.

Degenerate values act as their limits: a temperature so small that logits / T overflows samples greedily, and
top-p always keeps the most likely token (vLLM's rule), however small top_p is. A law that is not a distribution
(NaN logits, e.g. a float16 forward that overflowed) raises MultispecError naming the cause, here and in
`sample_rows`: no sampler ever returns an out-of-range id.

Penalties and min_tokens read the history of the row they process (`History`): in a drafted tree that history is
the node's own path, so one target forward holds a different processed law at every node, and each is exactly the
law plain decoding would use after that path (decoding/engine.py builds the per-node histories).
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import torch

from multispec.errors import MultispecError, check

LOGIT_BIAS_LIMIT = 100.0  # OpenAI's range for a logit_bias value
TOP_K_OFF = (0, -1)  # top_k values that mean "off" (transformers: 0; vLLM: 0 or -1)
NAN_LOGITS = ("the model's logits are NaN (its forward overflowed, as float16 does for some models); load the "
              "pair in float32 or bfloat16 (--dtype)")


def greedy_argmax(logits: torch.Tensor) -> torch.Tensor:
    """long [...]: each row's argmax, refusing NaN logits in one line (torch's argmax takes a NaN as the largest,
    so a row with one is caught by reading the chosen values: O(rows), not O(V))."""
    best = logits.argmax(-1)
    check(not bool(logits.gather(-1, best.unsqueeze(-1)).isnan().any()), NAN_LOGITS)
    return best


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == x and abs(x) != float("inf")


@dataclass(frozen=True)
class SamplingConfig:
    """How logits become probabilities. Validated on construction (OpenAI's / vLLM's ranges and meanings).

    temperature: 0 for greedy, else > 0.  top_k: None or >= 1 (0 and -1 mean off, as in transformers and vLLM:
    stored as None).  top_p: None or in (0, 1].
    min_p: None or in [0, 1]: drop tokens below min_p times the most likely one's probability.
    repetition_penalty > 0 (1 = off): a logit of a token seen in the prompt or the output is divided by it when
    positive, multiplied when negative (transformers, vLLM). presence_penalty, frequency_penalty in [-2, 2]
    (0 = off): the logit of a token the output holds c > 0 times drops by presence + frequency * c (OpenAI: output
    tokens only). logit_bias: ((token id, bias in [-100, 100]), ...) added to the logits. min_tokens >= 0: the stop
    tokens (EOS, stop_token_ids) are impossible while the output is shorter. grammar: a structured.Grammar (JSON
    schema, regex, choice, Lark/GBNF) whose masks restrict every row to what it allows after the row's own history.
    """

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    min_tokens: int = 0
    grammar: Any = field(default=None, compare=False)  # structured.Grammar

    def __post_init__(self) -> None:
        t = self.temperature
        check(isinstance(t, (int, float)) and not isinstance(t, bool) and t == t, f"temperature must be a number, got {t!r}")
        check(t >= 0, f"temperature must be >= 0 (0 means greedy), got {t}")
        check(t != float("inf"), "temperature must be finite")
        if self.top_k is not None:
            check(isinstance(self.top_k, int) and not isinstance(self.top_k, bool)
                  and (self.top_k >= 1 or self.top_k in TOP_K_OFF),
                  f"top_k must be an integer >= 1 (0 or -1: off), got {self.top_k!r}")
            if self.top_k in TOP_K_OFF:
                object.__setattr__(self, "top_k", None)  # frozen: the one normalisation of a validated value
        if self.top_p is not None:
            check(
                isinstance(self.top_p, (int, float)) and not isinstance(self.top_p, bool) and 0 < self.top_p <= 1,
                f"top_p must be in (0, 1], got {self.top_p!r}",
            )
        if self.min_p is not None:
            check(_number(self.min_p) and 0 <= self.min_p <= 1, f"min_p must be in [0, 1], got {self.min_p!r}")
        r = self.repetition_penalty
        check(_number(r) and r > 0, f"repetition_penalty must be a number > 0 (1 means off), got {r!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            check(_number(v) and -2 <= v <= 2, f"{name} must be in [-2, 2], got {v!r}")
        check(isinstance(self.logit_bias, tuple), "logit_bias must be a tuple of (token id, bias) pairs")
        for pair in self.logit_bias:
            check(isinstance(pair, tuple) and len(pair) == 2, f"logit_bias entries must be (token id, bias), got {pair!r}")
            tok, bias = pair
            check(isinstance(tok, int) and not isinstance(tok, bool) and tok >= 0,
                  f"logit_bias token ids must be integers >= 0, got {tok!r}")
            check(_number(bias) and abs(bias) <= LOGIT_BIAS_LIMIT,
                  f"logit_bias values must be in [-100, 100], got {bias!r} for token {tok}")
        m = self.min_tokens
        check(isinstance(m, int) and not isinstance(m, bool) and m >= 0, f"min_tokens must be an integer >= 0, got {m!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def reads_history(self) -> bool:
        """Whether the processed law depends on the tokens before the row (penalties, min_tokens)."""
        return self.penalised or self.grammar is not None

    @property
    def penalised(self) -> bool:
        """Whether a processor reads the history's tokens or length (penalties, min_tokens), not only a grammar."""
        return (self.repetition_penalty != 1 or self.presence_penalty != 0 or self.frequency_penalty != 0
                or self.min_tokens > 0)

    @property
    def adjusts(self) -> bool:
        """Whether any processor changes the logits before temperature (so greedy is not the raw argmax)."""
        return self.reads_history or bool(self.logit_bias)


BOUND_BY_DECODER = ("grammar",)  # SamplingConfig fields the Decoder fills (a grammar compiled for its tokenizer)


def config_values(params) -> dict:
    """The SamplingConfig fields a request sets, by name: every SamplingConfig field that `params` (a
    multispec.params.SamplingParams) has too, where it is not None (None: the config's default, i.e. off). The one
    map from a request to its law; the Decoder adds what depends on the model (Decoder.check_request)."""
    return {f.name: getattr(params, f.name) for f in fields(SamplingConfig)
            if f.name not in BOUND_BY_DECODER and getattr(params, f.name, None) is not None}


@dataclass
class History:
    """What history-dependent processors read, one row per processed row. seen: bool [N, V], the tokens in the
    prompt or the output (repetition_penalty); counts: float32 [N, V], how often each token occurs in the output
    (presence and frequency penalties); out_len: long [N], the output's length (min_tokens); stop_ids: the token
    ids min_tokens holds back (EOS unless ignored, and stop_token_ids); allowed: bool [N, V], what the grammar allows
    after each row's history (None: no grammar)."""

    seen: torch.Tensor
    counts: torch.Tensor
    out_len: torch.Tensor
    stop_ids: tuple[int, ...] = ()
    allowed: torch.Tensor | None = None


def _float(x: torch.Tensor) -> torch.Tensor:
    return x if x.dtype == torch.float64 else x.float()


def adjust_logits(logits: torch.Tensor, config: SamplingConfig, history: History | None = None) -> torch.Tensor:
    """The logits after logit_bias, min_tokens and the penalties (before temperature). logits: float [N, V];
    history: one row per logits row, needed when config.reads_history. Returns float32 [N, V] (float64 stays
    float64: the exact-law tests enumerate in it), a new tensor."""
    logits = _float(logits).clone()
    v = logits.shape[-1]
    for tok, bias in config.logit_bias:
        if tok < v:
            logits[..., tok] += bias
    if not config.reads_history:
        return logits
    check(history is not None, "internal: penalties and min_tokens need the history of each row")
    if history.allowed is not None:
        logits = logits.masked_fill(~history.allowed[..., :v].to(logits.device), float("-inf"))
    if config.min_tokens > 0 and history.stop_ids:
        short = history.out_len < config.min_tokens  # [N]
        ids = torch.tensor([t for t in history.stop_ids if t < v], dtype=torch.long)
        rows = short.nonzero().squeeze(-1)
        if len(ids) and len(rows):
            logits[rows[:, None], ids[None, :]] = float("-inf")
    r = config.repetition_penalty
    if r != 1:
        penalised = torch.where(logits > 0, logits / r, logits * r)
        logits = torch.where(history.seen, penalised, logits)
    if config.frequency_penalty != 0:
        logits = logits - config.frequency_penalty * history.counts
    if config.presence_penalty != 0:
        logits = logits - config.presence_penalty * (history.counts > 0).float()
    return logits


def process_logits(logits: torch.Tensor, config: SamplingConfig, history: History | None = None) -> torch.Tensor:
    """Turn raw logits into the processed next-token distribution.

    logits: float [..., V] on any device; history: see `adjust_logits` (rows of a 2-D logits). Returns float32
    [..., V] probabilities (float64 for float64 logits) summing to 1 on the last axis. Greedy returns the one-hot
    argmax of the adjusted logits.
    min-p keeps tokens whose probability is at least min_p times the largest; top-k keeps the k largest logits (ties
    at the k-th value are all kept, as in transformers); top-p keeps the smallest prefix of the sorted distribution
    whose mass reaches top_p (the token that crosses top_p is kept, and the most likely token always is). A row
    that logits / temperature overflows is greedy (`_scaled`); NaN logits raise MultispecError (NAN_LOGITS).
    """
    logits = adjust_logits(logits, config, history) if config.adjusts else _float(logits)
    check(not bool(logits.isnan().any()), NAN_LOGITS)
    if config.greedy:
        return _one_hot_argmax(logits).float()
    logits = _scaled(logits, config.temperature)
    if config.min_p:
        probs = torch.softmax(logits, dim=-1)
        low = probs < config.min_p * probs.max(-1, keepdim=True).values
        logits = logits.masked_fill(low, float("-inf"))
    if config.top_k is not None and config.top_k < logits.shape[-1]:
        kth = torch.topk(logits, config.top_k, dim=-1).values[..., -1:]  # [..., 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if config.top_p is not None and config.top_p < 1:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        mass_before = sorted_p.cumsum(-1) - sorted_p  # mass strictly before each sorted token
        drop_sorted = mass_before >= config.top_p  # a top_p below the dtype's smallest number rounds to 0 here...
        drop_sorted[..., 0] = False  # ...so the most likely token is kept explicitly (vLLM)
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def _one_hot_argmax(logits: torch.Tensor) -> torch.Tensor:
    """float [..., V] -> long [..., V]: one-hot on each row's argmax (lowest index on ties)."""
    return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1])


def _scaled(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """logits / temperature: float [..., V], finite or -inf. A row whose division overflows (a temperature so small,
    e.g. 1e-310, that it rounds to 0 in the logits' dtype, or whose quotient passes the dtype's largest number) is
    the limit T -> 0 instead: 0 on its argmax and -inf elsewhere, i.e. greedy."""
    scaled = logits / temperature
    overflow = (scaled.isnan() | (scaled == float("inf"))).any(-1, keepdim=True)  # [..., 1]
    if not bool(overflow.any()):
        return scaled
    greedy = torch.zeros_like(logits).masked_fill(_one_hot_argmax(logits) == 0, float("-inf"))  # [..., V]
    return torch.where(overflow, greedy, scaled)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Draw one token per row. probs: float [..., V] (any positive scale). Returns long [...]."""
    flat = probs.reshape(-1, probs.shape[-1])
    return sample_rows(flat, 1, generator)[:, 0].reshape(probs.shape[:-1])


def sample_rows(probs: torch.Tensor, n: int, generator: torch.Generator | None) -> torch.Tensor:
    """n independent draws per row (with replacement) from probs: float [B, V] (any positive scale), by inverting
    the cumulative sum in float64: token i is drawn when a uniform u * total falls in [cdf[i - 1], cdf[i]), so a
    zero-probability token is never drawn. Returns long [B, n].

    Why not torch.multinomial: on the CPU it draws one exponential per token for a single sample (~370 us at
    V = 8k, a twentieth of a small target's step, paid for every drafted and every committed token); this is
    ~45 us.

    A row with no mass or a non-finite one (NaN) raises MultispecError: inverting its cdf would give id V."""
    cdf = probs.double().cumsum(-1)  # [B, V]
    total = cdf[:, -1:]  # [B, 1]
    if not bool(((total > 0) & total.isfinite()).all()):
        raise MultispecError(_not_a_law(total))
    where = generator.device if generator is not None else probs.device  # a CPU generator serves CUDA laws too
    u = torch.rand(probs.shape[0], n, generator=generator, dtype=torch.float64, device=where).to(probs.device) * total
    u = torch.minimum(u, torch.nextafter(total, torch.zeros_like(total)))  # u < total even after rounding
    return torch.searchsorted(cdf, u, right=True)


def _not_a_law(total: torch.Tensor) -> str:
    """The message for rows of sample_rows that are not a distribution. total: float64 [B, 1], each row's mass."""
    if bool(total.isnan().any()):
        return NAN_LOGITS
    return "internal: a sampling law has no finite positive mass (a row of zeros or infinities)"
