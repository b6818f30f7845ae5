"""Token-level intersection drafting (TLI, as vLLM's heterogeneous-vocabulary drafting): a draft with another
tokenizer behind the ordinary backend protocol, in the target's token ids.

The engine sees one row per target token (its "virtual" rows): it feeds committed target tokens and drafted tokens,
masks and keeps by those rows, and reads logits over the target's vocabulary. Underneath, each target token is
spelled in the draft's own tokens (VocabBridge.expand: one token when it is in the intersection, its bytes spelled
otherwise), so the draft always reads the committed text; a virtual row's logits are those of its last draft token,
put on the intersection (-inf elsewhere), so the draft proposes only tokens the target has, from its law
renormalised over them. Drafted tokens are always intersection tokens: one draft row each.

A draft whose positions run out (the embedded pair's draft has 256) reads a window of the text: between rounds,
when a round might not fit, the draft cache restarts from the newest half of its rows. Whatever the draft reads, the
output is the target's: the engine drafts from exactly the law it verifies with.
"""
from __future__ import annotations

import torch

from multispec.models.base import ForwardOut, takes_last_only
from multispec.models.vocab_bridge import VocabBridge

ROUND_ROOM = 96  # draft rows a round may add after its first forward (a tree's levels); a restart leaves this free


class IntersectionDraft:
    """The backend protocol over `inner` (a backend of the draft model, with `capacity` rows usable: its positions or
    its static cache, whichever is smaller), in target ids through `bridge`."""

    def __init__(self, inner, bridge: VocabBridge, capacity: int):
        self.inner, self.bridge, self.capacity = inner, bridge, capacity
        self.name = f"{inner.name}+intersection"
        self.vocab_size = bridge.target_vocab
        self.hidden_size = inner.hidden_size
        self.device = inner.device
        self.rows_signature = getattr(inner, "rows_signature", "")  # auto's cost key (drafting/costs.model_key)
        self.weights_dtype = getattr(inner, "weights_dtype", None)
        self.max_positions = None  # the draft's own limit is handled here (windows), never the engine's concern
        self.restarts = 0
        self.draftable = bridge.target_ids  # target ids drafted in one draft row each (auto's cost calibration)
        self._last_only = takes_last_only(inner)
        self.reset()

    def reset(self) -> None:
        self.inner.reset()
        self.rows: list[list[int]] = []  # virtual row -> its draft-cache rows (empty once a restart dropped it)
        self.tokens: list[int] = []  # draft-cache row -> its draft token id
        self.owner: list[int] = []  # draft-cache row -> its virtual row
        self.chain = True  # the virtual rows form one chain (after a reset or a keep), so a restart can re-feed them

    @property
    def cache_len(self) -> int:
        return len(self.rows)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None = None,
                want_hidden: bool = False, last_only: bool = False) -> ForwardOut:
        """tokens: long [N] target ids; mask: bool [N, cache_len + N] over virtual rows (None: a chain). positions
        are recomputed for the draft's rows (a row's position is the number of rows it attends to before it)."""
        ids = tokens.tolist()
        spelled = [self.bridge.expand(t) for t in ids]
        n_new = sum(len(s) for s in spelled)
        chain = self.chain and self._is_chain(mask)
        if len(self.tokens) + n_new + ROUND_ROOM > self.capacity and chain:
            self._restart(n_new)
            if len(self.tokens) + n_new + ROUND_ROOM > self.capacity:  # a long chain (a prompt): its newest part
                spelled = self._newest(spelled, max(1, self.capacity // 2 - len(self.tokens)))
                n_new = sum(len(s) for s in spelled)
        if len(self.tokens) + n_new > self.capacity:  # a tree level that no longer fits: uniform proposals
            return self._uniform(ids, spelled, want_hidden)
        v0, p0 = len(self.rows), len(self.tokens)
        owner = torch.tensor([i for i, s in enumerate(spelled) for _ in s], dtype=torch.long)  # [P] new virtual row
        last = torch.tensor([len(s) for s in spelled]).cumsum(0) - 1  # [N] each virtual row's last draft row
        feed = torch.tensor([d for s in spelled for d in s], dtype=torch.long)
        if mask is None:
            d_mask, d_pos = None, torch.arange(p0, p0 + n_new)
        else:
            mask = mask.to(torch.bool).cpu()
            if bool(mask[:, :v0].all()):  # every cached row (the round's first forward): no gather
                cached = torch.ones(n_new, p0, dtype=torch.bool)  # [P, p0]
            else:
                cached = mask[:, :v0][owner][:, torch.tensor(self.owner, dtype=torch.long)]
            new = mask[:, v0:][owner][:, owner]  # [P, P]
            same = owner[:, None] == owner[None, :]
            new &= ~same | torch.ones(n_new, n_new, dtype=torch.bool).tril()  # a token's own spelling: causal
            d_mask = torch.cat([cached, new], dim=1)
            d_pos = d_mask.sum(1) - 1
        if last_only and self._last_only and len(ids) > 0:
            out = self.inner.forward(feed, d_pos, d_mask, want_hidden, last_only=True)
            logits = out.logits[-1:].expand(len(ids), -1)  # only the last row is read
            hidden = out.hidden[-1:].expand(len(ids), -1) if out.hidden is not None else None
        else:
            out = self.inner.forward(feed, d_pos, d_mask, want_hidden)
            logits, hidden = out.logits[last], (out.hidden[last] if out.hidden is not None else None)
        for i, s in enumerate(spelled):
            self.rows.append(list(range(p0, p0 + len(s))))
            p0 += len(s)
        self.tokens.extend(feed.tolist())
        self.owner.extend((owner + v0).tolist())
        self.chain = chain
        return ForwardOut(logits=self.bridge.to_target_logits(logits), hidden=hidden)

    def keep(self, indices: torch.Tensor) -> None:
        """Keep virtual rows `indices` (the prefix and an accepted path: a chain again). The rows before the first
        one that moves stay as they are; only the tail is rewritten."""
        idx = indices.tolist()
        m = 0
        while m < len(idx) and idx[m] == m:
            m += 1
        start = self._end(m)  # draft rows of the unchanged virtual prefix
        tail = [r for v in idx[m:] for r in self.rows[v]]
        self.inner.keep(torch.cat([torch.arange(start), torch.tensor(tail, dtype=torch.long)]))
        rows, n = self.rows[:m], start
        for v in idx[m:]:
            rows.append(list(range(n, n + len(self.rows[v]))))
            n += len(self.rows[v])
        self.tokens = self.tokens[:start] + [self.tokens[r] for r in tail]
        self.owner = self.owner[:start] + [m + i for i, v in enumerate(idx[m:]) for _ in self.rows[v]]
        self.rows, self.chain = rows, True

    def _end(self, m: int) -> int:
        """Draft rows held by virtual rows [0, m) (rows dropped by a restart hold none)."""
        for v in range(m - 1, -1, -1):
            if self.rows[v]:
                return self.rows[v][-1] + 1
        return 0

    # ------------------------------------------------------------------ windows
    def _is_chain(self, mask: torch.Tensor | None) -> bool:
        """Whether rows fed with this mask extend the chain (every cached row, then causal among themselves)."""
        if mask is None:
            return True
        n = mask.shape[0]
        v0 = mask.shape[1] - n
        return bool(mask[:, :v0].all()) and bool((mask[:, v0:] == torch.ones(n, n, dtype=torch.bool).tril()).all())

    def _restart(self, n_new: int) -> None:
        """Re-feed the newest draft rows (at most half the capacity, leaving room for this forward and a round)
        from position 0; older virtual rows keep no draft rows."""
        budget = max(0, min(self.capacity // 2, self.capacity - n_new - ROUND_ROOM))
        keep_from = len(self.rows)
        total = 0
        while keep_from > 0 and total + len(self.rows[keep_from - 1]) <= budget:
            keep_from -= 1
            total += len(self.rows[keep_from])
        kept_rows = self.rows[keep_from:]
        feed = [self.tokens[r] for rs in kept_rows for r in rs]
        self.inner.reset()
        if feed:
            t = torch.tensor(feed, dtype=torch.long)
            kw = {"last_only": True} if self._last_only and len(feed) > 1 else {}
            self.inner.forward(t, torch.arange(len(feed)), None, False, **kw)
        n = 0
        rows = [[] for _ in range(keep_from)]
        for rs in kept_rows:
            rows.append(list(range(n, n + len(rs))))
            n += len(rs)
        self.rows, self.tokens = rows, feed
        self.owner = [v for v, rs in enumerate(rows) for _ in rs]
        self.restarts += 1

    @staticmethod
    def _newest(spelled: list[list[int]], budget: int) -> list[list[int]]:
        """The spellings of a chain with only its newest tokens kept, within `budget` draft rows (the last token
        always: its logits are read); the older ones hold no draft rows, as after a restart."""
        first, total = len(spelled) - 1, len(spelled[-1])
        while first > 0 and total + len(spelled[first - 1]) <= budget:
            first -= 1
            total += len(spelled[first])
        return [[] for _ in spelled[:first]] + spelled[first:]

    def _uniform(self, ids: list[int], spelled, want_hidden: bool) -> ForwardOut:
        """Rows that the draft cannot hold: the uniform law on the intersection (lossless, if useless)."""
        for _ in ids:
            self.rows.append([])
        self.chain = False
        logits = torch.zeros(len(ids), self.bridge.draft_vocab)
        hidden = torch.zeros(len(ids), self.hidden_size) if want_hidden else None
        return ForwardOut(logits=self.bridge.to_target_logits(logits), hidden=hidden)
