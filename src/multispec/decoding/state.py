"""What a generation carries from round to round, and the small steps every round shape shares.

Vocabulary of the loop (docs/glossary.md has them all):
- root: the newest committed token, node 0 of a round's tree. A draft-initialized round feeds it to the target with
  the tree (the target has not consumed it); a target-initialized round already has it in the target's cache.
- pending: committed tokens the draft model has not consumed, the root last. A round that drafts with the draft
  model feeds them first; a round that does not (no speculation, lookup, suffix) leaves them pending.
- lt: the target's cache length when a round begins (the root's position in draft-initialized rounds).
- fed: how many tree nodes (a BFS prefix) the draft consumed while drafting.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from multispec.decoding.logprobs import LogprobRecorder
from multispec.decoding.methods import MethodConfig
from multispec.decoding.node_history import CommittedHistory
from multispec.drafting.protocol import DraftPolicy
from multispec.models.base import Backend, ForwardOut, Steps, chain
from multispec.sampling import SamplingConfig, adjust_logits, process_logits
from multispec.tree import Tree
from multispec.verify.sequence import SequenceVerifierSpec, get_sequence_verifier


def choose_verifier(method: MethodConfig, sampling: SamplingConfig, reproducible: bool,
                    needs: str | None = None) -> SequenceVerifierSpec:
    """The one rule for which verifier checks a round: greedy at T = 0 (each row's argmax); at T > 0 the keyed
    `gls` in the reproducible mode; else what the proposal needs (suffix trees: the rrs-wor walk), else the
    method's."""
    if sampling.greedy:
        return get_sequence_verifier("greedy")
    if reproducible:
        return get_sequence_verifier("gls")
    return get_sequence_verifier(needs or method.verifier)


@dataclass(frozen=True)
class Run:
    """One generation's fixed parts: the models, the method and its policy, the sampling, the verifier and the
    random streams (gen_draft: drafting draws; gen_verify: verification coins). key: the seed of the keyed
    verifier in the reproducible mode (node u of a tree rooted at position lt draws the noise of
    (key, lt + depth(u) + 1)), else None."""

    target: Backend
    draft: Backend | None
    method: MethodConfig
    sampling: SamplingConfig
    policy: DraftPolicy
    verifier: SequenceVerifierSpec
    gen_draft: torch.Generator
    gen_verify: torch.Generator
    key: int | None


@dataclass
class State:
    pending: list[int]  # committed tokens the draft has not consumed (last one: the root)
    history: list[int] = field(default_factory=list)  # prompt + committed tokens (proposers read it)
    committed: CommittedHistory | None = None  # what penalties / min_tokens read (None when the sampling reads none)
    ahead: list[int] = field(default_factory=list)  # committed before the root, not yet fed to the target (forced)
    vocab_seen: int = 0  # output tokens a reduced draft vocabulary has taken in (engine._grow_draft_vocab)
    logprobs: LogprobRecorder | None = None
    p_next: torch.Tensor | None = None  # target-initialized, T > 0: the law of the next token, float [V]
    # target-initialized only, float [V]: the next token's row adjusted (bias, penalties: greedy top-W ranks it),
    # and its log-probabilities when logprobs are recorded
    rank_next: torch.Tensor | None = None
    logprob_next: torch.Tensor | None = None

    def node_history(self, tree: Tree, tokens: torch.Tensor, rows, logits: torch.Tensor):
        """The processors' history of each row (node) in `rows`: committed + the node's path; None if none read."""
        if self.committed is None:
            return None
        return self.committed.for_nodes(tree, tokens, rows, logits.shape[-1])

    def draft_history(self, max_tree: Tree):
        """history(rows, tokens, logits) -> the processors' history of the draft's rows (nodes of max_tree), or
        None: the draft processes its logits like the target does, path by path, so it proposes what the target
        keeps."""
        if self.committed is None:
            return None
        return lambda rows, tokens, logits: self.committed.for_nodes(max_tree, tokens, rows, logits.shape[-1])

    def root_history(self, logits: torch.Tensor):
        return self.committed.at_root(logits.shape[-1]) if self.committed is not None else None


def chain_steps(backend: Backend, tokens: torch.Tensor, last_only: bool = False) -> Steps[ForwardOut]:
    """A chain of tokens (long [N]: a prefill) as forwards: one, or on a backend that prefills in chunks
    (models/batched.SlotBackend.prefill_chunk) one chunk per engine step, so that a joining prompt holds up the
    running sequences' steps by one chunk at most. Returns the last row's output (last_only) or every row's."""
    size = getattr(backend, "prefill_chunk", None)
    if size is None:
        return (yield chain(backend, tokens, last_only=last_only))
    outs = []
    for a in range(0, tokens.shape[0], size):
        if a:
            yield None  # this sequence's turn of the step is over: the next chunk goes in the next step
        outs.append((yield replace(chain(backend, tokens[a:a + size], last_only=last_only), chunk=True)))
    if last_only or len(outs) == 1:
        return outs[-1]
    return ForwardOut(logits=torch.cat([o.logits for o in outs]), hidden=None)


def prefill(target: Backend, prompt: list[int], target_init: bool, sampling: SamplingConfig,
            logprobs: LogprobRecorder | None, committed: CommittedHistory | None) -> Steps[State]:
    """Feed the prompt (all of it for target-initialized methods, all but the root otherwise), as forwards
    (`chain_steps`); with logprobs.prompt, every row's logits are kept to score the prompt's tokens (raw)."""
    ids = torch.tensor(prompt, dtype=torch.long)
    scorer = logprobs if logprobs is not None and logprobs.prompt else None  # scores the prompt's tokens
    if scorer is not None:
        scorer.prompt_tokens.append(None)
    fed = ids if target_init else ids[:-1]
    out = (yield from chain_steps(target, fed, last_only=scorer is None)) if len(fed) else None
    if scorer is not None and len(prompt) > 1:
        if out is None:  # unreachable: a prompt of 2 or more tokens feeds at least one
            raise RuntimeError("prefill: nothing was fed")
        scorer.add(torch.log_softmax(out.logits[:len(prompt) - 1].float(), -1), prompt[1:], prompt=True)
    state = State(pending=[prompt[-1]], history=list(prompt), committed=committed, logprobs=logprobs)
    if target_init:
        if out is None:  # unreachable: a target-initialized prefill feeds the whole (non-empty) prompt
            raise RuntimeError("prefill: nothing was fed")
        raw = out.logits[-1:]  # [1, V]
        adjusted = adjusted_logits(raw, sampling, state.root_history(raw))
        state.rank_next = (adjusted if adjusted is not None else raw)[0]
        p = None if sampling.greedy else process_logits(raw, sampling, state.root_history(raw))
        state.p_next = None if p is None else p[0]
        if logprobs is not None:
            state.logprob_next = logprobs.rows(sampling, raw, adjusted, p)[0]
    return state


def adjusted_logits(logits: torch.Tensor, sampling: SamplingConfig, history) -> torch.Tensor | None:
    """The logits after logit_bias / min_tokens / penalties, or None when the sampling has none of them."""
    return adjust_logits(logits, sampling, history) if sampling.adjusts else None


def keep_path(backend: Backend, tree: Tree, path, prefix_len: int) -> None:
    """Keep the first prefix_len cache rows and the rows of `path` (node indices appended after them). No call when
    that is every row, as after ar and after a chain accepted in full: nothing to drop, no index tensor."""
    if backend.cache_len != prefix_len + len(path) or any(u != i for i, u in enumerate(path)):
        backend.keep(tree.keep_indices(path, prefix_len))


def round_limit(target: Backend, remaining: int, target_init: bool, ahead: int = 0) -> tuple[int, int] | None:
    """(max draft depth, max tree nodes) for this round, so that a round never drafts past the token budget
    (it commits at most depth + 1 tokens), the model's positions or the backend's cache rows; None when not even
    one more token fits. The root sits at position lt = cache_len; a node at depth d at lt + d
    (target-initialized rounds: the root is already cached, at cache_len - 1; `ahead` tokens before the root still
    to be fed: at cache_len + ahead)."""
    lt = target.cache_len - (1 if target_init else 0) + ahead
    # Draft-initialized rounds commit at most depth + 1 tokens, and a shallower tree leaves their (lossless) law
    # unchanged. Target-initialized rounds pick the longest accepted chain (P1), so their depth is part of the
    # method's law: only the context bounds it, and the output is cut at the budget instead.
    depth = remaining - 1 if not target_init else 1 << 30
    nodes = 1 << 30
    if target.max_positions is not None:
        if lt >= target.max_positions:
            return None
        depth = min(depth, target.max_positions - 1 - lt)
    max_rows = getattr(target, "max_len", None)  # a static cache's rows (the fast backend); optional member
    if max_rows is not None:
        if lt >= max_rows:
            return None
        nodes = max_rows - lt
    return depth, nodes


def cap_tree(tree: Tree, limit: tuple[int, int]) -> Tree:
    """The largest depth-truncation of `tree` within `limit` = (max depth, max nodes incl. the root)."""
    depth, nodes = limit
    if tree.max_depth > depth:
        tree = tree.truncate(max(0, depth))
    while len(tree) > nodes and tree.max_depth > 0:
        tree = tree.truncate(tree.max_depth - 1)
    return tree


def cut(new: list[int], max_new: int, eos_ids: set[int], stop) -> tuple[int, str] | None:
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
