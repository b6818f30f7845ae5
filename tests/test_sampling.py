"""Logit processing (design §1.2-1.3): temperature, top-k, top-p, greedy one-hot, validation."""
from __future__ import annotations

import math

import pytest
import torch

from multispec.errors import MultispecError
from multispec.sampling import SamplingConfig, process_logits, sample


def test_defaults_and_greedy_flag():
    assert SamplingConfig().greedy
    assert not SamplingConfig(temperature=0.7).greedy


@pytest.mark.parametrize("kwargs", [
    {"temperature": -0.1}, {"temperature": float("nan")}, {"temperature": float("inf")}, {"temperature": "1"},
    {"temperature": 1.0, "top_k": -2}, {"temperature": 1.0, "top_k": 2.5},
    {"temperature": 1.0, "top_p": 0.0}, {"temperature": 1.0, "top_p": 1.5}, {"temperature": 1.0, "top_p": -0.1},
    {"temperature": 1.0, "top_p": "0.9"},
])
def test_invalid_values_raise(kwargs):
    with pytest.raises(MultispecError):
        SamplingConfig(**kwargs)


def test_greedy_is_one_hot_on_the_lowest_argmax():
    logits = torch.tensor([[0.5, 2.0, 2.0, -1.0], [3.0, 0.0, 0.0, 3.0]])
    probs = process_logits(logits, SamplingConfig(temperature=0))
    assert probs.dtype == torch.float32
    assert probs.tolist() == [[0, 1, 0, 0], [1, 0, 0, 0]]


def test_temperature_scales_logits():
    logits = torch.tensor([1.0, 2.0, 0.5, -1.0])
    for t in (0.5, 1.0, 2.0):
        probs = process_logits(logits, SamplingConfig(temperature=t))
        assert torch.allclose(probs, torch.softmax(logits / t, -1), atol=1e-7)


def test_top_k_keeps_the_k_largest_and_ties():
    logits = torch.tensor([1.0, 3.0, 2.0, 0.0, 2.0])
    probs = process_logits(logits, SamplingConfig(temperature=1.0, top_k=2))
    assert (probs > 0).tolist() == [False, True, True, False, True]  # the tie at the 2nd value is kept
    kept = torch.tensor([3.0, 2.0, 2.0])
    assert torch.allclose(probs[[1, 2, 4]], torch.softmax(kept, -1))
    probs = process_logits(logits, SamplingConfig(temperature=1.0, top_k=1))
    assert probs.tolist() == [0, 1, 0, 0, 0]
    big = process_logits(logits, SamplingConfig(temperature=1.0, top_k=10))
    assert torch.allclose(big, torch.softmax(logits, -1))


def test_top_p_keeps_the_smallest_prefix_reaching_p():
    probs_in = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs_in.log()
    out = process_logits(logits, SamplingConfig(temperature=1.0, top_p=0.7))
    assert (out > 0).tolist() == [True, True, False, False]  # 0.5 < 0.7, 0.8 crosses: the crossing token is kept
    assert torch.allclose(out[:2], torch.tensor([0.625, 0.375]))
    out = process_logits(logits, SamplingConfig(temperature=1.0, top_p=0.5))
    assert (out > 0).tolist() == [True, False, False, False]
    out = process_logits(logits, SamplingConfig(temperature=1.0, top_p=0.81))
    assert (out > 0).tolist() == [True, True, True, False]
    out = process_logits(logits, SamplingConfig(temperature=1.0, top_p=1.0))
    assert torch.allclose(out, probs_in)


def test_top_k_then_top_p_batched():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0], [1.0, 2.0, 3.0, 4.0]]).log_softmax(-1)
    out = process_logits(logits, SamplingConfig(temperature=1.0, top_k=3, top_p=0.9))
    assert out.shape == (2, 4)
    assert torch.allclose(out.sum(-1), torch.ones(2))
    assert out[0, 3] == 0 and out[1, 0] == 0  # removed by top-k
    assert (out > 0).sum().item() <= 6


def test_rows_sum_to_one_for_random_logits():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(16, 50, generator=gen) * 3
    for cfg in (SamplingConfig(1.0), SamplingConfig(0.6, top_k=5), SamplingConfig(1.3, top_p=0.8),
                SamplingConfig(0.9, top_k=20, top_p=0.95), SamplingConfig(0)):
        probs = process_logits(logits, cfg)
        assert torch.allclose(probs.sum(-1), torch.ones(16), atol=1e-5) and (probs >= 0).all()


def test_sample_shapes_support_and_seed():
    probs = torch.tensor([[0.0, 0.5, 0.5], [1.0, 0.0, 0.0]])
    draws = torch.stack([sample(probs, torch.Generator().manual_seed(s)) for s in range(50)])  # [50, 2]
    assert draws.shape == (50, 2)
    assert set(draws[:, 0].tolist()) <= {1, 2} and set(draws[:, 1].tolist()) == {0}
    one = sample(torch.tensor([0.2, 0.8]), torch.Generator().manual_seed(1))
    assert one.shape == () and one.dtype == torch.long
    a = sample(probs.expand(3, 2, 3), torch.Generator().manual_seed(4))
    b = sample(probs.expand(3, 2, 3), torch.Generator().manual_seed(4))
    assert a.shape == (3, 2) and torch.equal(a, b)
    assert math.isclose(float(sample(torch.tensor([[0.0, 1.0]]), None)), 1.0)


# ----------------------------------------------------------------------------------- degenerate values (issue 41)
@pytest.mark.parametrize("t", [1e-310, 1e-320, 1e-45, 1e-38])
def test_a_temperature_whose_division_overflows_is_greedy(t):
    logits = torch.tensor([[0.0, 3.0, -2.0, 3.0], [1.0, -1.0, 0.5, 0.0]])  # a 0 logit: 0 / 0 is NaN
    probs = process_logits(logits, SamplingConfig(temperature=t))
    # the lowest argmax, as greedy (1e-38 divides without overflow: its exact tie is split, as softmax splits it)
    assert probs.tolist() == [[0, 0.5, 0, 0.5] if t == 1e-38 else [0, 1, 0, 0], [1, 0, 0, 0]]
    assert sample(probs, torch.Generator().manual_seed(0)).tolist()[1] == 0


def test_an_overflowing_row_does_not_change_the_other_rows():
    logits = torch.tensor([[1e37, 0.0, -1e37], [0.3, 0.2, 0.1]])
    probs = process_logits(logits, SamplingConfig(temperature=0.01))  # row 0 overflows float32, row 1 does not
    assert probs[0].tolist() == [1, 0, 0]
    assert torch.allclose(probs[1], torch.softmax(logits[1] / 0.01, -1))


@pytest.mark.parametrize("top_p", [1e-300, 1e-50, 1e-9])
def test_a_tiny_top_p_keeps_the_most_likely_token(top_p):
    logits = torch.tensor([[0.1, 2.0, 1.0], [5.0, 5.0, 0.0]])
    probs = process_logits(logits, SamplingConfig(temperature=1.0, top_p=top_p))
    assert probs.tolist() == [[0, 1, 0], [1, 0, 0]]  # a tie: the lowest index (stable order)


@pytest.mark.parametrize("greedy", [True, False])
def test_nan_logits_are_one_line_naming_the_cause(greedy):
    logits = torch.tensor([[0.1, float("nan"), 1.0]], dtype=torch.float16)
    with pytest.raises(MultispecError, match="logits are NaN.*float32 or bfloat16") as e:
        process_logits(logits, SamplingConfig(temperature=0.0 if greedy else 0.7))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("row,needle", [([float("nan"), 1.0], "logits are NaN"), ([0.0, 0.0], "no finite positive")])
def test_sample_rows_refuses_a_row_that_is_not_a_law(row, needle):
    with pytest.raises(MultispecError, match=needle):
        sample(torch.tensor([[0.5, 0.5], row]), torch.Generator().manual_seed(0))


@pytest.mark.parametrize("off", [0, -1])
def test_top_k_zero_and_minus_one_mean_off(off):
    config = SamplingConfig(temperature=1.0, top_k=off)
    assert config.top_k is None
    logits = torch.tensor([1.0, 2.0, 3.0])
    assert torch.allclose(process_logits(logits, config), torch.softmax(logits, -1))
