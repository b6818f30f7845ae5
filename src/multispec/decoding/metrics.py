"""The one metrics record of a generation. `generate`'s stats, the bench's records and the server's `spec_decode`
and Prometheus counters are all read from `Metrics.stats()`; names follow vLLM's spec-decode metrics
(vllm/v1/spec_decode/metrics.py) where vLLM has one."""
from __future__ import annotations

from dataclasses import dataclass, field

from multispec.drafting.protocol import RoundOutcome

# The keys of Metrics.stats(), in order. The server's `spec_decode` object is SPEC_DECODE_KEYS of them.
SPEC_DECODE_KEYS = ("num_spec_steps", "num_draft_tokens", "num_accepted_draft_tokens", "mean_acceptance_length",
                    "draft_acceptance_rate", "accepted_per_position")


@dataclass
class Metrics:
    """Raw counts and times of one generation, filled by the engine round by round."""

    new_tokens: int = 0
    target_calls: int = 0  # verification (or decode) forwards, prefill excluded
    draft_calls: int = 0
    rounds: int = 0
    accepted: int = 0  # draft tokens accepted (target-drawn level-1 tokens excluded)
    drafted_depth: int = 0  # sum over drafting rounds of the depth of draft tokens in the tree
    drafted_tokens: int = 0  # draft tokens sent to the target (tree nodes, root excluded)
    num_drafts: int = 0  # rounds that drafted
    accepted_per_pos: list[int] = field(default_factory=list)  # [d - 1]: rounds that accepted a token at depth d
    forced_tokens: int = 0  # committed because the grammar allowed nothing else, without a target call of their own
    t_prefill: float = 0.0
    t_draft: float = 0.0
    t_verify: float = 0.0
    t_cache: float = 0.0
    seconds: float = 0.0  # wall time of the whole generation, prefill included
    finish_reason: str = "length"  # "stop" (EOS or a stop string) or "length" (max_new_tokens or the context)

    def count(self, outcome: RoundOutcome) -> None:
        """Add one round: the only writer of the per-round counters and times (the prefill's and the totals are
        set by the loop)."""
        self.rounds += 1
        self.target_calls += 1
        self.draft_calls += outcome.draft_calls
        self.drafted_tokens += outcome.drafted
        self.t_draft += outcome.times.draft_s
        self.t_verify += outcome.times.verify_s
        self.t_cache += outcome.times.cache_s
        self.accepted += outcome.accepted
        self.drafted_depth += outcome.depth
        if outcome.depth <= 0:
            return
        self.num_drafts += 1
        if len(self.accepted_per_pos) < outcome.depth:
            self.accepted_per_pos.extend([0] * (outcome.depth - len(self.accepted_per_pos)))
        for d in range(outcome.accepted):
            self.accepted_per_pos[d] += 1

    def stats(self) -> dict:
        """The reported figures. tau: tokens per target call (P1's τ); mean_acceptance_length: 1 + accepted draft
        tokens per drafting round (vLLM's, counting the bonus token); draft_acceptance_rate: accepted / drafted
        depth; accepted_per_position[d - 1]: how many drafting rounds accepted a token at depth d."""
        return {
            "new_tokens": self.new_tokens,
            "target_calls": self.target_calls,
            "draft_calls": self.draft_calls,
            "rounds": self.rounds,
            "tau": self.new_tokens / max(1, self.target_calls),
            "drafted_tokens": self.drafted_tokens,
            "num_spec_steps": self.num_drafts,
            "num_draft_tokens": self.drafted_depth,
            "num_accepted_draft_tokens": self.accepted,
            "mean_acceptance_length": 1 + self.accepted / self.num_drafts if self.num_drafts else None,
            "draft_acceptance_rate": self.accepted / self.drafted_depth if self.drafted_depth else None,
            "accepted_per_position": list(self.accepted_per_pos),
            "forced_tokens": self.forced_tokens,
            "seconds": self.seconds,
            "tokens_per_s": self.new_tokens / self.seconds if self.seconds > 0 else None,
            "prefill_s": self.t_prefill,
            "draft_s": self.t_draft,
            "verify_s": self.t_verify,
            "cache_s": self.t_cache,
            "finish_reason": self.finish_reason,
        }
