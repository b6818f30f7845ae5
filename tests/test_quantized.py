"""int8 targets (issue 43): row-exact W8A8 linears (models/int8.py quantize_target) and the lossless claims on them.

- A row's output is the same bits in any company: one row alone or among 16 (the linear itself, then a whole
  model's k-row forward against k one-row forwards on both backends). The broken variant, torch's own dynamic int8
  (one activation scale per call), is caught by the same check.
- Greedy: every lossless method reproduces the int8 target's own greedy output (full forwards of the quantized
  model, no cache); T = 1: the joint law of the first two tokens through Decoder.run is the int8 target's exact
  law, and a mis-normalised draft law is caught by the same chi-square test.
- Labels and refusals: stats and the summary line name the int8 target; int8 off the CPU, on the compiled backend,
  or on a non-float32 model in memory is refused in one line, before any weights load where it can be.
"""
import warnings
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from engine_utils import chi_square_pvalue, exact_joint, greedy_reference, tiny_pair
from helpers import assert_one_line_error, forward_rows, run_cli, save_tiny_pair, tiny_llama
from multispec.decoding.decoder import Decoder
from multispec.drafting import grow
from multispec.errors import MultispecError
from multispec.loading import Pair, load_pair
from multispec.models import make_backend
from multispec.models.int8 import PackedInt4, PackedInt8, QuantLinear, quantize_draft, quantize_target, weights_dtype
from multispec.sampling import SamplingConfig

V = 8
PROMPT = [1, 5]
T1 = SamplingConfig(temperature=1.0)
SAMPLES = 1000  # the law tests' runs (2000 until the suite passed 15 minutes): the broken variant fails at 800


def rows_in_company(layer, x: torch.Tensor) -> bool:
    """Whether every prefix x[:n] gives, row for row, the bits of the full call."""
    full = layer(x)
    return all(torch.equal(layer(x[:n].clone()), full[:n]) for n in range(1, x.shape[0]))


@pytest.mark.parametrize("product", [PackedInt8, PackedInt4])
def test_a_row_is_the_same_bits_alone_or_among_sixteen(product):
    torch.manual_seed(0)
    linear = torch.nn.Linear(128, 208, bias=True).requires_grad_(False)
    x = torch.randn(16, 128) * torch.rand(16, 1) * 10
    x[3] *= 100  # an outlier row: with one scale per call it would coarsen every other row
    x[5] = 0.0  # an all-zero row
    packed = product([linear.weight], [linear.bias])
    layer = QuantLinear(packed, 0, 208, 128, last=True)
    assert rows_in_company(layer, x)
    close = 0.03 if product is PackedInt8 else 0.15  # 16 levels per group of 32 weights: coarser
    assert torch.allclose(layer(x), linear(x), rtol=0, atol=close * float(linear(x).abs().max()))
    assert torch.allclose(packed.dequantized(), linear.weight, atol=0.1 * float(linear.weight.abs().max()))
    assert torch.equal(layer(x[5:6]), linear.bias.detach()[None])  # zero in, the bias out


def test_torch_dynamic_int8_is_the_broken_variant_the_same_check_catches():
    """One activation scale per call: an outlier row changes its neighbours' rounding."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(96, 200))
    x = torch.randn(16, 96) * torch.rand(16, 1) * 10
    x[3] *= 100
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's deprecation notice for eager quantization
        from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

        dyn = quantize_dynamic(model, {torch.nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8)
    assert not rows_in_company(dyn, x)


def small_model(seed: int = 3) -> torch.nn.Module:
    return tiny_llama(vocab=256, hidden=128, layers=3, heads=4, kv_heads=2, seed=seed, scale=2.0)


@pytest.mark.parametrize("kind", ["fast", "hf"])
@pytest.mark.parametrize("dtype", ["int8", "int4"])
def test_a_k_row_forward_of_the_int8_model_is_k_one_row_forwards(kind, dtype):
    model = quantize_target(small_model(), dtype)
    assert weights_dtype(model) == dtype
    assert isinstance(model.model.layers[0].mlp.gate_proj.packed, PackedInt4 if dtype == "int4" else PackedInt8)
    assert all(not isinstance(m, torch.nn.Linear) for m in model.modules())
    backend = make_backend(model, kind)
    g = torch.Generator().manual_seed(1)
    for ctx, n in ((5, 16), (37, 3), (150, 8)):
        ids = torch.randint(0, 256, (ctx + n,), generator=g)
        many, one = forward_rows(backend, ids, ctx, n)
        assert torch.equal(many, one), (kind, ctx, n, float((many - one).abs().max()))


def test_shared_q_k_v_products_equal_separate_layers(monkeypatch):
    """q/k/v (and gate/up) share one packed product; the bits are those of three separate int8 layers."""
    import multispec.models.int8 as int8

    ids = torch.randint(0, 256, (40,), generator=torch.Generator().manual_seed(2))
    fused = quantize_target(small_model())
    monkeypatch.setattr(int8, "_FUSE", ())
    separate = quantize_target(small_model())
    assert fused.model.layers[0].self_attn.k_proj.packed is fused.model.layers[0].self_attn.q_proj.packed
    assert separate.model.layers[0].self_attn.k_proj.packed is not separate.model.layers[0].self_attn.q_proj.packed
    with torch.no_grad():
        assert torch.equal(fused(input_ids=ids[None]).logits, separate(input_ids=ids[None]).logits)


@pytest.fixture(scope="module")
def pair() -> Pair:
    target, draft = tiny_pair(vocab=V, seed=1, noise=0.5)
    quantize_target(target)
    tok = SimpleNamespace(eos_token_id=None, bos_token_id=None)
    return Pair(target=target, draft=draft, tokenizer=tok, target_path="t", draft_path="d")


@pytest.mark.parametrize("backend", ["fast", "hf"])
@pytest.mark.parametrize("method, options", [("ar", {}), ("sd", {"k": 3}), ("mcsd", {"tree": (2, 2, 1)}),
                                             ("lookup", {}), ("suffix", {}), ("auto", {})])
def test_greedy_on_an_int8_target_is_its_own_greedy_output(pair, backend, method, options):
    prompt = PROMPT + [4, 1, 5, 1, 5]
    ids, _ = Decoder(pair, method, backend, **options).run(prompt, SamplingConfig(temperature=0.0), 24, 0)
    assert ids == greedy_reference(pair.target, prompt, 24)


def first_two_counts(decoder: Decoder, samples: int = SAMPLES) -> np.ndarray:
    counts = np.zeros(V * V, dtype=np.int64)
    for seed in range(samples):
        ids, _ = decoder.run(PROMPT, T1, 3, seed)
        counts[ids[0] * V + ids[1]] += 1
    return counts


@pytest.fixture(scope="module")
def exact(pair) -> np.ndarray:
    return exact_joint(pair.target, PROMPT, T1, 2, V)  # the int8 model's own full forwards


@pytest.mark.slow
@pytest.mark.parametrize("method, options, backend", [("sd", {"k": 2}, "fast")])  # trees: eagle's test below
def test_the_law_at_t1_is_the_int8_targets(pair, exact, method, options, backend):
    p = chi_square_pvalue(first_two_counts(Decoder(pair, method, backend, **options)), exact)
    print(f"{method} {backend}: p = {p:.3g}")
    assert p > 1e-3


def test_a_mis_normalised_draft_law_is_caught_on_the_int8_target(pair, exact, monkeypatch):
    """The broken variant: drafts from half the vocabulary while the verifier reads the full softmax there."""
    inside = torch.zeros(V, dtype=torch.bool)
    inside[[1, 4, 5, 7]] = True
    right = grow._draft_dists
    monkeypatch.setattr(grow, "_draft_dists", lambda logits, sampling, history=None: right(logits, sampling) * inside)
    p = chi_square_pvalue(first_two_counts(Decoder(pair, "sd", "fast", k=2), samples=800), exact)
    print(f"broken: p = {p:.3g}")  # p ~ 1e-60 at 2,000 samples: 800 catch it with room
    assert p < 1e-6


def test_the_float_model_is_a_different_law(pair):
    """The int8 target is a different model: its law differs from the float32 source's (within rounding)."""
    source, _ = tiny_pair(vocab=V, seed=1, noise=0.5)
    with torch.no_grad():
        a = torch.softmax(source(input_ids=torch.tensor([PROMPT])).logits[0, -1], -1)
        b = torch.softmax(pair.target(input_ids=torch.tensor([PROMPT])).logits[0, -1], -1)
    assert not torch.equal(a, b) and float((a - b).abs().max()) < 0.05


def test_stats_and_summary_name_the_int8_target(tmp_path, capsys):
    paths = save_tiny_pair(tmp_path)
    capsys.readouterr()
    code, out, err = run_cli(capsys, "generate", "def f", "--target", str(paths["target"]), "--draft",
                             str(paths["draft"]), "--dtype", "int8", "--threads", "1", "--method", "sd", "--max-new-tokens", "8")
    assert code == 0, err
    assert "int8 target" in err.splitlines()[-1]
    pair = load_pair(target=str(paths["target"]), draft=str(paths["draft"]), dtype="int8")
    assert weights_dtype(pair.target) == weights_dtype(pair.draft) == "int8"
    result = Decoder(pair, "sd", k=2).generate("def f", max_new_tokens=4, temperature=0)
    assert result.stats["target_dtype"] == "int8"


def test_int8_is_refused_in_one_line_where_it_cannot_run(tmp_path, capsys, monkeypatch):
    paths = save_tiny_pair(tmp_path)
    capsys.readouterr()  # the shard-writing bars
    code, _, err = run_cli(capsys, "generate", "x", "--target", str(paths["target"]), "--dtype", "int8", "--threads", "1",
                           "--backend", "compiled")
    assert_one_line_error(code, err, "compiled backend does not run int8")
    code, _, err = run_cli(capsys, "generate", "x", "--target", str(paths["target"]), "--dtype", "int4", "--threads",
                           "1", "--backend", "compiled")
    assert_one_line_error(code, err, "compiled backend does not run int4")
    import multispec.loading as loading

    with monkeypatch.context() as m:  # a CUDA device, as on a GPU machine: refused before any weights load
        m.setattr(loading, "resolve_device", lambda device: torch.device("cuda"))
        m.setattr(loading, "_check_path", lambda *a, **k: pytest.fail("checked after the device"))
        with pytest.raises(MultispecError, match="CPU only"):
            load_pair(target=str(paths["target"]), dtype="int8", device="cuda")
    pair = load_pair(target=str(paths["target"]), dtype="int8")
    with pytest.raises(MultispecError, match="compiled backend does not run int8"):
        Decoder(pair, "ar", "compiled")
    bf16 = tiny_llama(vocab=300).to(torch.bfloat16)
    with pytest.raises(MultispecError, match="not int8|bfloat16"):
        load_pair(target=bf16, tokenizer=load_pair(target=str(paths["target"])).tokenizer, dtype="int8")


def test_a_model_in_memory_is_copied_not_changed(tmp_path):
    paths = save_tiny_pair(tmp_path)
    float_pair = load_pair(target=str(paths["target"]))
    pair = load_pair(target=float_pair.target, tokenizer=float_pair.tokenizer, dtype="int8")
    assert weights_dtype(pair.target) == "int8" and weights_dtype(float_pair.target) == "float32"
    assert isinstance(float_pair.target.lm_head, torch.nn.Linear)
    assert isinstance(pair.target.lm_head, QuantLinear)


def test_an_int8_draft_copy_of_an_int8_model_leaves_it_unchanged():
    """quantize_draft (dynamic int8, drafts only) on a model quantize_target already converted has no float linear
    left to convert: the copy computes the same logits."""
    model = quantize_target(small_model())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        copy = quantize_draft(model)
    ids = torch.arange(10)[None]
    with torch.no_grad():
        assert torch.equal(copy(input_ids=ids).logits, model(input_ids=ids).logits)


@pytest.fixture(scope="module")
def int8_head(tmp_path_factory):
    """An int8 tiny target (6 tokens) and an EAGLE head on 4 of them, saved for the float model it came from."""
    from multispec.models.eagle import new_head
    from multispec.models.eagle_io import save_head

    target = tiny_llama(vocab=6, hidden=32, layers=2, heads=4, kv_heads=2, seed=3, scale=3.0)
    torch.manual_seed(4)
    head = new_head(target)
    with torch.no_grad():
        head.fc.weight.mul_(3.0)
    head_dir = save_head(head, target, tmp_path_factory.mktemp("head") / "head", token_ids=torch.tensor([0, 1, 2, 4]))
    quantize_target(target)  # the head is found by the float model's fingerprint, which the int8 one keeps
    tok = SimpleNamespace(eos_token_id=None, bos_token_id=None)
    return Pair(target=target, draft=None, tokenizer=tok, target_path="t", draft_path=None), head_dir


@pytest.mark.parametrize("backend", ["fast", "hf"])
@pytest.mark.parametrize("options", [{"k": 3}, {"tree": (2, 2, 1)}])
def test_eagle_greedy_on_an_int8_target_with_an_int8_head(int8_head, backend, options):
    pair, head_dir = int8_head
    decoder = Decoder(pair, "eagle", backend, head=str(head_dir), **options)
    for prompt in ([1, 2, 3], [5, 0, 4, 4, 1]):
        ids, metrics = decoder.run(prompt, SamplingConfig(temperature=0.0), 24, 0)
        assert ids == greedy_reference(pair.target, prompt, 24) and metrics.drafted_tokens > 0
    assert isinstance(decoder.loaded["eagle_head"].transformer.mlp.down_proj, QuantLinear)
    assert decoder._draft.vocab_subset.packed is not None  # its output rows multiplied in int8


@pytest.mark.slow
def test_eagle_law_at_t1_on_an_int8_target(int8_head):
    pair, head_dir = int8_head
    exact6 = exact_joint(pair.target, PROMPT, T1, 2, 6)
    decoder = Decoder(pair, "eagle", "fast", head=str(head_dir), k=2)
    counts = np.zeros(36, dtype=np.int64)
    for seed in range(SAMPLES):
        ids, _ = decoder.run(PROMPT, T1, 3, seed)
        counts[ids[0] * 6 + ids[1]] += 1
    p = chi_square_pvalue(counts, exact6)
    print(f"eagle int8: p = {p:.3g}")
    assert p > 1e-3


def test_an_int8_layers_subset_rows_are_packed_and_extend_carries_them(monkeypatch):
    """A reduced output layer over an int8 target's layer multiplies in int8 (close to the float rows); rows added
    later are multiplied in float32 beside the packed ones, which carry over, until REPACK of them."""
    from multispec.models.reduced_vocab import RestrictedHead

    model = quantize_target(small_model())
    head = RestrictedHead(model.lm_head, torch.tensor([3, 7, 9, 100]), 256)
    hidden = torch.randn(5, 128)
    full = model.lm_head(hidden)
    got = head.compact(hidden)
    assert head.packed is not None and torch.allclose(got, full[:, [3, 7, 9, 100]], atol=0.05 * float(full.abs().max()))
    grown = head.extend(torch.tensor([7, 200, 5]))
    assert grown.packed is head.packed and grown.ids.tolist() == [3, 7, 9, 100, 5, 200]  # S's order, then the new
    assert torch.equal(grown.compact(hidden)[:, :4], got)
    rows = model.lm_head.float_weight()
    assert torch.allclose(grown.compact(hidden)[:, 4:], hidden @ rows[[5, 200]].T, atol=1e-4)
    # every column is its own token's logit once widened (the columns followed sorted ids, not the order they
    # were added in, before: an added id below S's largest got another token's logit)
    wide = grown.widen(grown.compact(hidden))
    assert torch.allclose(wide[:, [3, 7, 9, 100, 5, 200]], full[:, [3, 7, 9, 100, 5, 200]],
                          atol=0.05 * float(full.abs().max()))
    monkeypatch.setattr(RestrictedHead, "REPACK", 1)
    assert head.extend(torch.tensor([10, 11])).packed is not head.packed  # more than REPACK new rows: packed again


def test_a_float_layers_subset_rows_in_float16_and_extend_gathers_only_new_rows(monkeypatch):
    """half: a float layer's subset rows in float16 (close to the float32 logits); extend gathers the added rows
    alone (the base carries over) and keeps S's order, so every widened column is its own token's logit."""
    from multispec.models.reduced_vocab import HeadRows, RestrictedHead

    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 300, bias=False)
    hidden = torch.randn(3, 64)
    full = layer(hidden).detach()
    for half in (False, True):
        head = RestrictedHead(layer, torch.tensor([10, 40, 250]), 300, half=half)
        assert head.base.dtype == (torch.float16 if half else torch.float32)
        gathered = []
        real = HeadRows.gather
        monkeypatch.setattr(HeadRows, "gather", lambda self, ids: gathered.append(ids.tolist()) or real(self, ids))
        grown = head.extend([40, 7, 260])
        monkeypatch.setattr(HeadRows, "gather", real)
        assert gathered == [[7, 260]] and grown.base is head.base and grown.ids.tolist() == [10, 40, 250, 7, 260]
        wide = grown.widen(grown.compact(hidden))
        ids = [10, 40, 250, 7, 260]
        assert torch.allclose(wide[:, ids], full[:, ids], atol=1e-2 if half else 1e-5)
        assert torch.isinf(wide[:, 0]).all()


@pytest.mark.parametrize("method", ["ar", "sd", "suffix"])
def test_a_batch_on_an_int8_target_equals_each_sequence_alone(tmp_path, method):
    """Batched = alone on the int8 target: the batched fast backend attends in float64 too."""
    import multispec

    paths = save_tiny_pair(tmp_path)
    pair = load_pair(target=str(paths["target"]), draft=str(paths["draft"]), dtype="int8")
    prompts = [[1, 5, 9], [2, 2, 7, 30, 4], [11], [3, 40, 41, 42, 43, 44, 45]]
    kw = dict(method=method, max_new_tokens=16, temperature=0, backend="fast")
    batch = multispec.generate(pair, prompts, batch_size=4, **kw)
    alone = [multispec.generate(pair, p, **kw) for p in prompts]
    assert [r.token_ids for r in batch] == [r.token_ids for r in alone]


@pytest.fixture(scope="module")
def int4_pair() -> Pair:
    """An int4 target (hidden 64: every layer but the 8-row output layer in int4) and a float draft made from it."""
    target = tiny_llama(vocab=V, hidden=64, layers=1, heads=2, kv_heads=1, seed=5, scale=3.0)
    draft = tiny_llama(vocab=V, hidden=64, layers=1, heads=2, kv_heads=1, seed=5, scale=3.0)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for prm in draft.parameters():
            prm.add_(0.5 * prm.std() * torch.randn(prm.shape, generator=g))
    quantize_target(target, "int4")
    assert isinstance(target.model.layers[0].self_attn.q_proj.packed, PackedInt4)
    tok = SimpleNamespace(eos_token_id=None, bos_token_id=None)
    return Pair(target=target, draft=draft, tokenizer=tok, target_path="t", draft_path="d")


@pytest.mark.parametrize("backend", ["fast", "hf"])
@pytest.mark.parametrize("method, options", [("sd", {"k": 3}), ("mcsd", {"tree": (2, 2, 1)}), ("suffix", {}),
                                             ("auto", {})])
def test_greedy_on_an_int4_target_is_its_own_greedy_output(int4_pair, backend, method, options):
    prompt = PROMPT + [4, 1, 5, 1, 5]
    ids, _ = Decoder(int4_pair, method, backend, **options).run(prompt, SamplingConfig(temperature=0.0), 24, 0)
    assert ids == greedy_reference(int4_pair.target, prompt, 24)


@pytest.mark.slow
def test_the_law_at_t1_is_the_int4_targets(int4_pair):
    exact4 = exact_joint(int4_pair.target, PROMPT, T1, 2, V)
    p = chi_square_pvalue(first_two_counts(Decoder(int4_pair, "sd", "fast", k=2), samples=1200), exact4)
    print(f"int4 sd: p = {p:.3g}")
    assert p > 1e-3
