"""w4a8 targets (models/w4a8.py): 4-bit weights, rows quantized to int8 group by group, a C++ kernel.

- A row's output is the same bits in any company: M rows against M one-row products (M = 1..17, random shapes,
  shapes padded to whole blocks); a broken variant (one activation scale per call) is caught by the same check.
- The kernel computes the quantized arithmetic it claims: dequantized weights times dequantized rows, in float64.
- A whole model: a k-row forward equals k one-row forwards on both backends; greedy methods reproduce the w4a8
  target's own greedy output; on SmolLM2, 16 rows against 16 one-row forwards and greedy `sd` against `ar`.
- A compiler that is missing or fails is refused in one line, with no half-built library left behind.
"""
from types import SimpleNamespace

import pytest
import torch

from engine_utils import greedy_reference, tiny_pair
from helpers import forward_rows, tiny_llama
from multispec.decoding.decoder import Decoder
from multispec.errors import MultispecError
from multispec.loading import Pair
from multispec.models import make_backend
from multispec.models.int8 import QuantLinear, quantize_target, weights_dtype
from multispec.models.w4a8 import PackedW4A8, build, load_kernel, pack, quantize_weights, unpack
from multispec.sampling import SamplingConfig

SHAPES = [(208, 128), (8, 32), (37, 70), (1000, 96), (24, 1000)]


def rows(m: int, k: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.rand(m, 1, generator=g) * 10
    x[m // 2] *= 100  # an outlier row: with one scale per call it would coarsen every other row
    if m > 3:
        x[3] = 0.0  # an all-zero row
    return x


def product(n: int, k: int, seed: int, bias: bool = True) -> tuple[PackedW4A8, torch.nn.Linear]:
    torch.manual_seed(seed)
    linear = torch.nn.Linear(k, n, bias=bias).requires_grad_(False)
    return PackedW4A8([linear.weight], [linear.bias]), linear


@pytest.mark.parametrize("n, k", SHAPES)
def test_m_rows_are_m_one_row_products_bit_for_bit(n, k):
    packed, _ = product(n, k, seed=n + k)
    for m in range(1, 18):
        x = rows(m, k, seed=m)
        full = packed.apply(x)
        assert full.shape == (m, n)
        alone = torch.cat([packed.apply(x[i:i + 1].clone()) for i in range(m)])
        assert torch.equal(full, alone), (n, k, m)


def one_scale_per_call(packed: PackedW4A8, x: torch.Tensor) -> torch.Tensor:
    """The broken variant: every row quantized with the call's max |x| (one scale for all), as torch's dynamic int8
    does."""
    ops, kp = load_kernel(), packed.packed.shape[1] * 32
    scale = x.abs().max().clamp_min(1e-30) / 127
    xq = torch.nn.functional.pad(torch.round(x / scale), (0, kp - x.shape[1])).to(torch.int8)
    xs = scale.expand(x.shape[0], kp // 32).contiguous()
    xsum = xq.reshape(x.shape[0], -1, 32).sum(-1).float() * scale
    return ops.mm_quantized(xq, xs, xsum, packed.packed, packed.shape[0], packed.bias)


def test_one_scale_per_call_is_the_broken_variant_the_same_check_catches():
    packed, _ = product(208, 128, seed=0)
    x = rows(16, 128, seed=1)
    full = one_scale_per_call(packed, x)
    assert not all(torch.equal(one_scale_per_call(packed, x[i:i + 1]), full[i:i + 1]) for i in range(16))
    # and with the row scales the kernel itself computes, the same entry point is row-exact
    ops = load_kernel()
    xq, xs, xsum = ops.quantize_rows(x, 128)
    assert torch.equal(ops.mm_quantized(xq, xs, xsum, packed.packed, 208, packed.bias), packed.apply(x))


@pytest.mark.parametrize("n, k", SHAPES)
def test_the_kernel_is_the_quantized_arithmetic_it_claims(n, k):
    packed, linear = product(n, k, seed=2 * n + k)
    x = rows(9, k, seed=3)
    xq, xs, _ = load_kernel().quantize_rows(x, packed.packed.shape[1] * 32)
    assert int(xq.abs().max()) == 127 and torch.equal(xq[:, k:], torch.zeros_like(xq[:, k:]))  # 8 bits, padding 0
    assert xs.shape == (9, xq.shape[1] // 32)  # a scale per group of 32 of each row
    xd = (xq.double().reshape(9, -1, 32) * xs.double()[..., None]).reshape(9, -1)[:, :k]
    reference = xd @ packed.dequantized().double().t() + linear.bias.double()
    got = packed.apply(x).double()
    scale = float(reference.abs().max())
    assert float((got - reference).abs().max()) < 1e-5 * scale  # float32 sums of exact int32 group sums
    # the quantization itself: within a step of the float layer (4-bit groups of 32, 8-bit rows)
    assert torch.allclose(packed.dequantized(), linear.weight, atol=0.1 * float(linear.weight.abs().max()))
    assert torch.allclose(got.float(), linear(x), rtol=0, atol=0.15 * float(linear(x).abs().max()))
    assert torch.equal(packed.apply(torch.zeros(1, k)), linear.bias[None])  # zero in, the bias out


def test_pack_and_unpack_are_inverse_and_the_weights_span_their_groups():
    w = torch.randn(40, 96)
    q, s, o = quantize_weights(w)
    assert q.shape == (40, 96) and int(q.max()) <= 15 and s.dtype == torch.float16
    back = unpack(pack(q, s, o))
    assert torch.equal(back[0], q) and torch.equal(back[1], s) and torch.equal(back[2], o)
    assert int(q.amax()) == 15 and int(q.amin()) == 0


def test_the_int16_sums_cannot_saturate():
    """The worst case the kernel's int16 lanes see: all weights 15, all rows +127 or -127 (16 products per lane:
    16 * 15 * 127 = 30480 < 32767). The group sum is then 32 * 15 * 127 exactly."""
    q = torch.full((8, 64), 15, dtype=torch.uint8)
    one = torch.ones(8, 2, dtype=torch.float16)
    packed = pack(q, one, torch.zeros(8, 2, dtype=torch.float16))
    ops = load_kernel()
    for sign in (1, -1):
        xq = torch.full((1, 64), 127 * sign, dtype=torch.int8)
        y = ops.mm_quantized(xq, torch.ones(1, 2), torch.full((1, 2), 32.0 * 127 * sign), packed, 8, None)
        assert torch.equal(y, torch.full((1, 8), 2 * 32 * 15 * 127.0 * sign))


@pytest.mark.parametrize("kind", ["fast", "hf"])
def test_a_k_row_forward_of_the_w4a8_model_is_k_one_row_forwards(kind):
    model = quantize_target(tiny_llama(vocab=256, hidden=128, layers=3, heads=4, kv_heads=2, seed=3, scale=2.0),
                            "w4a8")
    assert weights_dtype(model) == "w4a8"
    assert isinstance(model.model.layers[0].mlp.gate_proj.packed, PackedW4A8)
    assert "row-exact int8 rows" in repr(model.model.layers[0].mlp.gate_proj)
    backend = make_backend(model, kind)
    g = torch.Generator().manual_seed(1)
    for ctx, n in ((5, 16), (37, 3), (150, 8)):
        ids = torch.randint(0, 256, (ctx + n,), generator=g)
        many, one = forward_rows(backend, ids, ctx, n)
        assert torch.equal(many, one), (kind, ctx, n, float((many - one).abs().max()))


@pytest.fixture(scope="module")
def pair() -> Pair:
    target, draft = tiny_pair(vocab=8, seed=1, noise=0.5)
    quantize_target(target, "w4a8")
    tok = SimpleNamespace(eos_token_id=None, bos_token_id=None)
    return Pair(target=target, draft=draft, tokenizer=tok, target_path="t", draft_path="d")


@pytest.mark.parametrize("backend", ["fast", "hf"])
@pytest.mark.parametrize("method, options", [("ar", {}), ("sd", {"k": 3}), ("mcsd", {"tree": (2, 2, 1)}),
                                             ("suffix", {}), ("auto", {})])
def test_greedy_on_a_w4a8_target_is_its_own_greedy_output(pair, backend, method, options):
    prompt = [1, 5, 4, 1, 5, 1, 5]
    ids, _ = Decoder(pair, method, backend, **options).run(prompt, SamplingConfig(temperature=0.0), 24, 0)
    assert ids == greedy_reference(pair.target, prompt, 24)


def test_a_compiler_that_is_missing_or_fails_is_refused_in_one_line(tmp_path):
    with pytest.raises(MultispecError, match="could not run the compiler") as e:
        build(tmp_path / "a", str(tmp_path / "no-such-c++"), avx2=False)
    assert "\n" not in str(e.value)
    with pytest.raises(MultispecError, match="did not compile") as e:
        build(tmp_path / "b", "false", avx2=False)
    assert "\n" not in str(e.value)
    assert list((tmp_path / "a").iterdir()) == [] and list((tmp_path / "b").iterdir()) == []  # no half library


@pytest.mark.slow
@pytest.mark.shared
def test_smollm2_w4a8_sixteen_rows_are_sixteen_one_row_forwards_and_sd_is_ar():
    import multispec
    import real_models

    pair = multispec.load_pair(target=str(real_models.smollm2()), draft=str(real_models.smollm2()), device="cpu",
                               dtype="w4a8")
    assert weights_dtype(pair.target) == "w4a8" and isinstance(pair.target.lm_head, QuantLinear)
    prompt = pair.tokenizer("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n").input_ids
    for kind in ("fast", "hf"):
        backend = make_backend(pair.target, kind)
        ids = torch.tensor(prompt + list(range(100, 116)))
        many, one = forward_rows(backend, ids, len(prompt), 16)
        assert torch.equal(many, one), (kind, float((many - one).abs().max()))
        ar = multispec.generate(pair, prompt, method="ar", backend=kind, max_new_tokens=32, temperature=0)
        sd = multispec.generate(pair, prompt, method="sd", backend=kind, max_new_tokens=32, temperature=0, k=4)
        assert sd.token_ids == ar.token_ids, kind
