"""Text re-tokenization drafting (transformers' universal assisted generation): a draft with another tokenizer that
continues the text in its own tokens, its continuation re-encoded with the target's tokenizer and proposed as a
deterministic chain.

Behind the ordinary backend protocol, in target ids: the engine feeds a chain of target tokens and reads, at the
last one, logits that put all mass on the next token of the current proposal (a point mass, as prompt lookup's q),
so drafting from them is deterministic and verification accepts token x with probability p(x): lossless whatever
the draft says. A proposal is made when the chain leaves the last one: the committed text (decoded target tokens)
is encoded with the draft's tokenizer, the draft's cache is brought in line with it (its longest common prefix with
what the cache holds is kept, the changed tail re-fed), the draft continues greedily for `lookahead` tokens, and
the continuation is re-encoded with the target's tokenizer together with the last committed tokens, so a word
across the boundary tokenizes as the target would tokenize it.

Chains only: a tree's siblings would all be the same point mass (the Decoder refuses tree methods here).
"""
from __future__ import annotations

import torch

from multispec.models.base import ForwardOut, forward_chain

BOUNDARY = 3  # committed target tokens re-encoded with the continuation


class RetokenizedDraft:
    """inner: a backend of the draft model; capacity: its usable rows (positions or static cache)."""

    def __init__(self, inner, target_tokenizer, draft_tokenizer, target_vocab: int, capacity: int,
                 lookahead: int = 8):
        self.inner, self.capacity, self.lookahead = inner, capacity, lookahead
        self.t_tok, self.d_tok = target_tokenizer, draft_tokenizer
        self.name = f"{inner.name}+retokenize"
        self.vocab_size = target_vocab
        self.hidden_size = inner.hidden_size
        self.device = inner.device
        self.rows_signature = getattr(inner, "rows_signature", "")  # auto's cost key (drafting/costs.model_key)
        self.weights_dtype = getattr(inner, "weights_dtype", None)
        self.max_positions = None  # windows of the text keep the draft within its own limit
        self.draft_runs = 0
        self.reset()

    def reset(self) -> None:
        self.inner.reset()
        self.ids: list[int] = []  # virtual rows: target ids
        self.cached: list[int] = []  # the draft cache's draft ids
        self.window = 0  # the first draft token (of the whole text's encoding) the draft reads
        self.proposal: tuple[list[int], list[int]] = ([], [])  # (the virtual rows it continues, its target ids)

    @property
    def cache_len(self) -> int:
        return len(self.ids)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None = None,
                want_hidden: bool = False, last_only: bool = False) -> ForwardOut:
        """Append a chain of target tokens; logits [N, V]: a point mass on the proposal's next token at the last
        row (other rows are never read: zeros)."""
        self.ids.extend(tokens.tolist())
        logits = torch.zeros(len(tokens), self.vocab_size)
        nxt = self._next()
        if nxt is not None:
            logits[-1].fill_(float("-inf"))
            logits[-1, nxt] = 0.0
        hidden = torch.zeros(len(tokens), self.hidden_size) if want_hidden else None
        return ForwardOut(logits=logits, hidden=hidden)

    def keep(self, indices: torch.Tensor) -> None:
        self.ids = [self.ids[i] for i in indices.tolist()]

    # ------------------------------------------------------------------ proposals
    def _next(self) -> int | None:
        """The proposal's token after self.ids, proposing anew when the chain left the last proposal."""
        prefix, toks = self.proposal
        start = len(prefix)
        k = len(self.ids) - start
        if not (0 <= k < len(toks) and self.ids[start:] == toks[:k] and self.ids[:start] == prefix):
            self._propose()
            prefix, toks = self.proposal
            k = 0
        return toks[k] if k < len(toks) else None

    def _propose(self) -> None:
        self.draft_runs += 1
        text = self._decode(self.ids)
        draft_ids = self.d_tok(text).input_ids  # as the draft's tokenizer encodes a prompt (its BOS included)
        if len(draft_ids) - self.window + self.lookahead + 1 > self.capacity:  # the window jumps ahead: the
            self.window = len(draft_ids) - self.capacity // 2  # newest half of the draft's rows, re-fed once
        draft_ids = draft_ids[self.window:]
        cont = self._continue(draft_ids) if draft_ids else []
        self.proposal = (list(self.ids), self._retokenize(cont))

    def _continue(self, draft_ids: list[int]) -> list[int]:
        """Sync the draft cache with draft_ids, then `lookahead` greedy draft tokens."""
        common = 0
        limit = min(len(self.cached), len(draft_ids) - 1)  # the last token is fed again for its logits
        while common < limit and self.cached[common] == draft_ids[common]:
            common += 1
        if common < len(self.cached):
            self.inner.keep(torch.arange(common))
        self.cached = list(draft_ids)
        out = forward_chain(self.inner, torch.tensor(draft_ids[common:], dtype=torch.long), last_only=True)
        cont = []
        for _ in range(self.lookahead):
            nxt = int(out.logits[-1].argmax())
            cont.append(nxt)
            if nxt == self.d_tok.eos_token_id or len(self.cached) >= self.capacity:
                break
            out = forward_chain(self.inner, torch.tensor([nxt]))
            self.cached.append(nxt)
        return cont

    def _retokenize(self, cont: list[int]) -> list[int]:
        """The draft's continuation in target ids, encoded together with the last committed tokens (dropped again
        when they come back unchanged). A continuation ending inside a character drops that character."""
        eos = self.d_tok.eos_token_id
        ends = eos is not None and cont and cont[-1] == eos
        text = self._decode([c for c in cont if c != eos], draft=True).rstrip("\ufffd")
        tail = self.ids[-BOUNDARY:]
        head = self._decode(tail)
        enc = self.t_tok(head + text, add_special_tokens=False).input_ids
        if enc[:len(tail)] == tail:
            out = enc[len(tail):]
        else:
            out = self.t_tok(text, add_special_tokens=False).input_ids
        out = [t for t in out if t < self.vocab_size]
        if ends and self.t_tok.eos_token_id is not None:
            out.append(self.t_tok.eos_token_id)
        return out

    def _decode(self, ids: list[int], draft: bool = False) -> str:
        tok = self.d_tok if draft else self.t_tok
        return tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
