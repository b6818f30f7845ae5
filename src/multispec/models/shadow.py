"""A cost-faithful benchmark regime: a random-weight "shadow" Llama run beside every target forward.

On a CPU a small trained target steps almost as cheaply as its draft, which is not the regime speculative
decoding exists for (draft ~2-5 % of a target step). `ShadowBackend` wraps any target backend and runs, beside
each forward, a random Llama of a bigger shape over the same tokens, positions and mask, with its own KV cache kept
by the same `keep` calls. Outputs are always the real target's, so what is accepted (and every output token) stays
the trained pair's; only step costs become those of the bigger model. Nothing here claims anything about a real
larger model's acceptance: every output of a shadowed run carries `shadow_label(shape)`.

`shadow_hook` does the same for code that calls a transformers model directly (transformers' assisted and plain
generate): a forward pre-hook runs the shadow over the new input ids after cropping the shadow's cache to the
target's cache length.
"""
from __future__ import annotations

import re

import torch

from multispec.errors import check
from multispec.models.base import ForwardOut, causal_mask, takes_last_only
from multispec.models.hf_compat import passed_cache

HEAD_DIM = 64
SHAPE_RE = re.compile(r"^\s*(\d+)\s*[xX]\s*(\d+)\s*$")


def parse_shadow_shape(text: str) -> tuple[int, int]:
    """'12x768' -> (layers 12, hidden 768). hidden must be a positive multiple of 64 (heads = hidden / 64)."""
    m = SHAPE_RE.match(str(text))
    check(m is not None, f"shadow target {text!r}: expected LAYERSxHIDDEN such as 12x768")
    layers, hidden = int(m.group(1)), int(m.group(2))
    check(1 <= layers <= 128, f"shadow target {text!r}: layers must be in [1, 128]")
    check(hidden >= HEAD_DIM and hidden % HEAD_DIM == 0 and hidden <= 16384,
          f"shadow target {text!r}: hidden must be a multiple of {HEAD_DIM} in [{HEAD_DIM}, 16384]")
    return layers, hidden


def shadow_label(shape: str) -> str:
    """The line every output of a shadowed run carries."""
    layers, hidden = parse_shadow_shape(shape)
    return f"SHADOW TARGET {layers}x{hidden}: step costs of a larger model, acceptance of the trained pair"


def intermediate_size(hidden: int) -> int:
    """The Llama MLP width: about 8/3 * hidden, rounded to a multiple of 64."""
    return max(HEAD_DIM, round(8 * hidden / 3 / HEAD_DIM) * HEAD_DIM)


def shadow_model(shape: str, vocab_size: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu", seed: int = 0) -> torch.nn.Module:
    """A random-weight LlamaForCausalLM of `shape` ('LAYERSxHIDDEN') over `vocab_size` tokens (the target's)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    layers, hidden = parse_shadow_shape(shape)
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=intermediate_size(hidden),
                      num_hidden_layers=layers, num_attention_heads=hidden // HEAD_DIM,
                      num_key_value_heads=hidden // HEAD_DIM, max_position_embeddings=8192,
                      tie_word_embeddings=False)
    fork = torch.random.fork_rng(devices=[])  # the user's global RNG state is left as it was
    with fork:
        torch.manual_seed(seed)
        model = LlamaForCausalLM(cfg)
    return model.to(device=device, dtype=dtype).eval()


def shadow_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def make_shadow_backend(model: torch.nn.Module, max_len: int = 2048):
    """The shadow's own backend: the static-cache fast backend (plain torch ops, no per-step allocation)."""
    from multispec.models.fast import FastBackend

    return FastBackend(model, max_len=max_len)


class ShadowBackend:
    """Wraps a target backend; every forward also runs `shadow` (a Backend over a random model) on the same tokens,
    positions and mask, and returns the real target's output. keep/reset apply to both caches, so they stay in
    step (same length, same rows)."""

    def __init__(self, inner, shadow):
        self.inner, self.shadow = inner, shadow
        self.name = inner.name
        shadow_model = getattr(shadow, "model", None)
        n = sum(p.numel() for p in shadow_model.parameters()) if shadow_model is not None else 0
        self.cost_key = f"shadow-{n}"  # auto's cost cache must not mix shadowed and plain step costs
        self.vocab_size, self.hidden_size, self.device = inner.vocab_size, inner.hidden_size, inner.device

    @property
    def cache_len(self) -> int:
        return self.inner.cache_len

    def reset(self) -> None:
        self.inner.reset()
        self.shadow.reset()

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None,
                want_hidden: bool = False, last_only: bool = False) -> ForwardOut:
        """As `Backend.forward`: tokens, positions long [N]; mask bool [N, cache_len + N] (or whatever the wrapped
        backend accepts; it is passed to both unchanged)."""
        self.shadow.forward(tokens, positions, mask)
        if last_only and takes_last_only(self.inner):
            return self.inner.forward(tokens, positions, mask, want_hidden, last_only=True)
        return self.inner.forward(tokens, positions, mask, want_hidden)

    def keep(self, indices: torch.Tensor) -> None:
        self.shadow.keep(indices)
        self.inner.keep(indices)

    def __getattr__(self, name):  # other attributes (model, config, ...) are the real target's
        return getattr(self.inner, name)


def shadow_hook(model: torch.nn.Module, shadow) -> torch.utils.hooks.RemovableHandle:
    """Run `shadow` (a Backend) beside every forward of a transformers causal LM `model`, for callers that drive
    the model themselves (transformers' generate and assisted generation; batch 1, a plain causal chain).

    Before each call the shadow's cache is cut to the length of the model's own cache (the rows transformers kept
    after a rejection), then the new input ids are appended causally. Returns the hook handle (call .remove())."""

    def hook(module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None:
            return
        cache = passed_cache(kwargs)
        past = int(cache.get_seq_length()) if cache is not None else 0
        if past == 0:  # a new generation
            shadow.reset()
        elif shadow.cache_len < past:  # rows the shadow never saw (not seen in generate): stand in with zeros
            shadow.reset()
            shadow.forward(torch.zeros(past, dtype=torch.long), torch.arange(past), causal_mask(0, past))
        elif shadow.cache_len > past:
            shadow.keep(torch.arange(past))
        new = ids[0].detach().cpu()
        start = shadow.cache_len
        shadow.forward(new, torch.arange(start, start + len(new)), causal_mask(start, len(new)))

    return model.register_forward_pre_hook(hook, with_kwargs=True)
