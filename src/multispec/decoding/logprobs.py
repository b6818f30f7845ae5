"""Log-probabilities of the tokens a generation commits, and of the prompt's tokens, from the target's own forwards.

Each committed token's log-probability comes from the verification forward that committed it: the row of its
parent node in the drafted tree (a token accepted deep in a tree is scored by the row of the node above it, whose
attention saw exactly its path). No extra forward runs. Two modes, as vLLM's `logprobs_mode`:
- "raw" (the default, vLLM's raw_logprobs): log_softmax of the target's logits, before any processing; the values
  a plain forward of prompt + output gives (what log-likelihood evaluations read).
- "processed" (vLLM's processed_logprobs): the log of the processed law the token was drawn from (logit_bias,
  penalties, temperature, min-p, top-k, top-p; a token those remove has -inf); under greedy decoding (T = 0),
  log_softmax of the logits after logit_bias, min_tokens and the penalties.
Prompt tokens are always scored raw (the prefill's rows; the first token has none).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from multispec.params import LOGPROBS_MODES, MAX_TOP_LOGPROBS
from multispec.sampling import SamplingConfig


@dataclass(frozen=True)
class TokenLogprob:
    """token_id and its log-probability; top: the `top` most likely tokens of the same row, most likely first."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass
class LogprobRecorder:
    """Collects TokenLogprobs as the engine commits tokens. top: alternatives per token (0..20); mode: see module
    docstring; prompt: also score the prompt's tokens (prompt[0] is None: nothing precedes it)."""

    top: int = 0
    mode: str = "raw"
    prompt: bool = False
    tokens: list[TokenLogprob] = field(default_factory=list)
    prompt_tokens: list[TokenLogprob | None] = field(default_factory=list)

    def __post_init__(self) -> None:  # the request's values, checked by SamplingParams; a caller's bug here
        if not (0 <= self.top <= MAX_TOP_LOGPROBS and self.mode in LOGPROBS_MODES):
            raise ValueError(f"LogprobRecorder: top {self.top!r}, mode {self.mode!r}")

    def rows(self, sampling: SamplingConfig, raw: torch.Tensor, adjusted: torch.Tensor | None,
             p: torch.Tensor | None) -> torch.Tensor:
        """float32 [n, V] log-probabilities of n rows in this recorder's mode. raw: the target's logits [n, V];
        adjusted: after logit_bias / min_tokens / penalties (None: none apply); p: the processed law (T > 0)."""
        if self.mode == "raw":
            return torch.log_softmax(raw.float(), -1)
        if sampling.greedy or p is None:
            return torch.log_softmax((adjusted if adjusted is not None else raw).float(), -1)
        return p.float().log()

    def add(self, logprobs: torch.Tensor, ids: list[int], prompt: bool = False) -> None:
        """Record ids[i] scored by row i of logprobs (float [n, V])."""
        if not ids:
            return
        chosen = logprobs[torch.arange(len(ids)), torch.tensor(ids)].tolist()
        if self.top:
            values, indices = logprobs.topk(min(self.top, logprobs.shape[-1]), -1)  # [n, k]
            tops = [tuple(zip(i, v)) for i, v in zip(indices.tolist(), values.tolist())]
        else:
            tops = [()] * len(ids)
        out = self.prompt_tokens if prompt else self.tokens
        out.extend(TokenLogprob(t, lp, top) for t, lp, top in zip(ids, chosen, tops))
