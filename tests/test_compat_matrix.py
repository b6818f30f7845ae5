"""The compatibility matrix: for every architecture in compat_archs.ARCHS (tiny random models, built here), either
- `ar` equals the model's own greedy `generate`, and sd, mcsd, dynamic and ti-mcsd (W = 1) equal `ar` at T = 0 with
  the output running past the sliding window; T = 1 runs; a draft equal to the target runs; or
- (attention by cache row) the chain methods (ar, sd) are exact and tree methods are refused in one line; or
- the model is refused at load (`_check_supported`, what `load_pair` calls) in one line.
No raw traceback, no silent divergence. The expected class of each architecture is fixed in compat_archs."""
from __future__ import annotations

import copy

import pytest
import torch

from compat_archs import ARCHS, CHAIN_ONLY, REFUSED, WINDOW, build
from multispec.api import Pair, generate
from multispec.loading import check_supported
from multispec.errors import MultispecError

PROMPT = [5, 17, 3, 42, 9, 28, 11, 60]
NEW = 20  # prompt + output = 28 tokens, past every window (WINDOW = 6) several times over
TREE_METHODS = (("mcsd", {"tree": (3, 2, 2)}), ("dynamic", {"width": 3, "depth": 3}),
                ("ti-mcsd", {"tree": (1, 3, 2, 1)}), ("suffix", {}))
assert len(PROMPT) + NEW > 4 * WINDOW


class _IdsTokenizer:
    """Prompts are token ids here; decoding only has to produce some text."""

    bos_token_id = eos_token_id = None

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


def _pair(target, draft) -> Pair:
    return Pair(target=target, draft=draft, tokenizer=_IdsTokenizer(), target_path="t", draft_path="d")


def _near_copy(model: torch.nn.Module, noise: float = 0.05) -> torch.nn.Module:
    """A draft that mostly agrees with the target, so trees get accepted paths that are not cache prefixes."""
    draft = copy.deepcopy(model)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for prm in draft.parameters():
            if prm.numel() > 1:
                prm.add_(noise * prm.std() * torch.randn(prm.shape, generator=g))
    return draft


def _own_greedy(model) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([PROMPT]), max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False)
    return out[0, len(PROMPT):].tolist()


def _one_line(err: pytest.ExceptionInfo) -> str:
    msg = str(err.value)
    assert msg and "\n" not in msg, msg
    return msg


@pytest.mark.parametrize("name", sorted(ARCHS))
def test_architecture(name):
    target = build(name)
    if name in REFUSED:
        with pytest.raises(MultispecError) as err:
            check_supported(target, name)
        assert "unsupported" in _one_line(err)
        return
    check_supported(target, name)
    pair = _pair(target, _near_copy(target))

    def run(method, temperature=0.0, **options):
        return generate(pair, PROMPT, method=method, max_new_tokens=NEW, temperature=temperature, seed=0,
                        **options).token_ids

    from multispec.models import forward_chain, make_backend, tree_refusal

    assert (tree_refusal(target) is not None) == (name in CHAIN_ONLY)

    backend = make_backend(target)
    out = forward_chain(backend, torch.tensor(PROMPT), want_hidden=True)  # hidden states stay available for heads
    assert out.hidden.shape == (len(PROMPT), backend.hidden_size)
    assert out.logits.shape == (len(PROMPT), backend.vocab_size)
    ar = run("ar")
    assert ar == _own_greedy(target), "ar differs from the model's own greedy generate"
    assert run("sd", k=3) == ar
    if name in CHAIN_ONLY:
        for method, options in TREE_METHODS:
            with pytest.raises(MultispecError) as err:
                run(method, **options)
            assert "tree methods are not supported" in _one_line(err)
        assert len(run("sd", temperature=1.0, k=3)) == NEW
        same = _pair(target, target)
        assert generate(same, PROMPT, method="sd", max_new_tokens=NEW, temperature=0.0, k=3).token_ids == ar
        return
    for method, options in TREE_METHODS:
        assert run(method, **options) == ar, method
    assert len(run("mcsd", temperature=1.0, tree=(3, 2, 2))) == NEW
    same = _pair(target, target)
    assert generate(same, PROMPT, method="mcsd", max_new_tokens=NEW, temperature=0.0, tree=(2, 2)).token_ids == ar


@pytest.mark.parametrize("name", ["mpt", "gpt_neo-local"])
def test_probe_refuses_row_ordered_attention_it_was_not_told_about(monkeypatch, name):
    """The deliberately broken variant: with the row-order rule removed, the load-time probe itself refuses the
    model (its tree logits disagree with its own full forward) instead of letting trees decode it wrongly."""
    import dataclasses

    from multispec.models import layout, probe

    real = layout.attention_layout
    monkeypatch.setattr(probe, "attention_layout", lambda c: dataclasses.replace(real(c), tree_refusal=None))
    with pytest.raises(MultispecError) as err:
        check_supported(build(name), name)
    assert "tree logits disagree" in _one_line(err)
