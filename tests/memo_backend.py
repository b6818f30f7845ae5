"""A backend whose 'KV cache' records (token, position) entries and whose logits are looked up by the exact
visible context (design §11.3). Any mask, position or keep-path bug changes the context a token sees, so it changes
the logits or trips the contiguity assertion. Logits come from a real model, memoised per context, which makes
1e4-sample end-to-end chi-square tests affordable on a CPU."""
from __future__ import annotations

import torch

from multispec.models.base import ForwardOut


class MemoBackend:
    name = "memo"
    max_positions = None  # the Backend protocol: no position limit

    def __init__(self, model: torch.nn.Module, memo: dict | None = None):
        self.model = model
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.hidden_size = int(model.get_output_embeddings().weight.shape[1])
        self.device = torch.device("cpu")
        self.memo = {} if memo is None else memo
        self.entries: list[tuple[int, int]] = []

    @property
    def cache_len(self) -> int:
        return len(self.entries)

    def reset(self) -> None:
        self.entries = []

    def _lookup(self, ctx: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        hit = self.memo.get(ctx)
        if hit is None:
            with torch.no_grad():
                h = self.model.base_model(input_ids=torch.tensor([ctx])).last_hidden_state[0, -1]
                hit = (self.model.get_output_embeddings()(h).float(), h.float())
            self.memo[ctx] = hit
        return hit

    def forward(self, tokens, positions, mask, want_hidden=False) -> ForwardOut:
        n = tokens.shape[0]
        assert mask.shape == (n, len(self.entries) + n)
        new = list(zip(tokens.tolist(), positions.tolist()))
        entries = self.entries + new
        logits, hidden = [], []
        rows = mask.tolist()
        for i in range(n):
            visible = sorted((e for e, ok in zip(entries, rows[i]) if ok), key=lambda e: e[1])
            assert [pos for _, pos in visible] == list(range(new[i][1] + 1)), "non-contiguous visible positions"
            assert visible[-1] == new[i]
            lg, h = self._lookup(tuple(tok for tok, _ in visible))
            logits.append(lg)
            hidden.append(h)
        self.entries = entries
        return ForwardOut(torch.stack(logits), torch.stack(hidden) if want_hidden else None)

    def keep(self, indices) -> None:
        self.entries = [self.entries[i] for i in indices.tolist()]
