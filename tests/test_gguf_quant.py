"""GGUF files straight to int8 / int4 (gguf_quant.py): the model quantized tensor by tensor as the file is read is
the model quantize_target makes from the float32 one, bit for bit (every packed weight, scale, float parameter and
buffer, and the logits), on its first load and when read back from its cache; on tiny random files written here
(Llama with tied embeddings, Qwen2 with q/k/v biases) and on SmolLM2 (tests/real_models.py; skipped when absent)."""
from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest
import torch

from multispec import gguf_files, gguf_quant
from multispec.errors import MultispecError
from multispec.gguf_files import materialize, open_gguf
from multispec.gguf_quant import load_quantized
from multispec.loading import _load_model
from multispec.models.int8 import PackedInt4, QuantLinear, quantize_target, weights_dtype

pytestmark = pytest.mark.skipif(importlib.util.find_spec("gguf") is None or importlib.util.find_spec("accelerate")
                                is None, reason="needs the gguf and accelerate packages (pip install -e '.[gguf]')")
IDS = torch.tensor([[1, 17, 3, 42, 7, 90, 11, 64]])


def write_tiny_gguf(path, arch: str, tied: bool, vocab: int = 4160, hidden: int = 64, layers: int = 2, seed: int = 0):
    """A random `arch` ("llama" or "qwen2") model as a GGUF file: the embedding in Q8_0, linears in Q4_0, Q4_1,
    Q5_0 and F16, norms and biases in F32; `vocab` past 4096 rows, so the largest tensors are read in parts."""
    import gguf

    Q = gguf.GGMLQuantizationType
    rng = np.random.default_rng(seed)
    heads, kv, ffn = 4, 2, 128
    w = gguf.GGUFWriter(str(path), arch)
    for key, value in {"context_length": 256, "embedding_length": hidden, "block_count": layers,
                       "feed_forward_length": ffn, "attention.head_count": heads, "attention.head_count_kv": kv,
                       "vocab_size": vocab}.items():
        w.add_uint32(f"{arch}.{key}", value)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_float32(f"{arch}.rope.freq_base", 10000.0)

    def add(name, shape, kind):
        values = rng.standard_normal(shape).astype(np.float32) * (0.3 if len(shape) > 1 else 0.1)
        if len(shape) == 1 and name.endswith("norm.weight"):
            values += 1
        w.add_tensor(name, gguf.quants.quantize(values, kind), raw_dtype=kind)

    add("token_embd.weight", (vocab, hidden), Q.Q8_0)
    head_dim = hidden // heads
    kinds = [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.F16]
    for i in range(layers):
        add(f"blk.{i}.attn_norm.weight", (hidden,), Q.F32)
        add(f"blk.{i}.ffn_norm.weight", (hidden,), Q.F32)
        for j, (name, rows) in enumerate((("attn_q", hidden), ("attn_k", kv * head_dim), ("attn_v", kv * head_dim))):
            add(f"blk.{i}.{name}.weight", (rows, hidden), kinds[(i + j) % 4])
            if arch == "qwen2":
                add(f"blk.{i}.{name}.bias", (rows,), Q.F32)
        add(f"blk.{i}.attn_output.weight", (hidden, hidden), kinds[(i + 3) % 4])
        add(f"blk.{i}.ffn_gate.weight", (ffn, hidden), kinds[i % 4])
        add(f"blk.{i}.ffn_up.weight", (ffn, hidden), kinds[(i + 1) % 4])
        add(f"blk.{i}.ffn_down.weight", (hidden, ffn), kinds[(i + 2) % 4])
    add("output_norm.weight", (hidden,), Q.F32)
    if not tied:
        add("output.weight", (vocab, hidden), Q.Q4_1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def everything(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every tensor that decides the model's outputs: each quantized layer's place in its product and the product's
    saved state (packed weights, scales, bias, first rows), every parameter and buffer."""
    out = {}
    for name, module in model.named_modules():
        if isinstance(module, QuantLinear):
            out[f"{name}.range"] = torch.tensor([module.start, module.stop, module.in_features, int(module.last)])
            out[f"{name}.kind"] = torch.tensor(int(isinstance(module.packed, PackedInt4)))
            out.update({f"{name}.{k}": v for k, v in module.packed.state().items()})
            if module.packed.first_rows is not None:
                out[f"{name}.first_rows"] = module.packed.first_rows
    out.update({f"param {n}": p for n, p in model.named_parameters()})
    out.update({f"buffer {n}": b for n, b in model.named_buffers()})
    return out


def assert_same(reference: torch.nn.Module, model: torch.nn.Module) -> None:
    a, b = everything(reference), everything(model)
    assert sorted(a) == sorted(b)
    differ = [k for k in a if a[k].dtype != b[k].dtype or a[k].shape != b[k].shape or not torch.equal(a[k], b[k])]
    assert not differ, differ[:5]
    assert model.config._attn_implementation == reference.config._attn_implementation
    assert model.generation_config.to_dict() == reference.generation_config.to_dict()
    assert weights_dtype(model) == weights_dtype(reference)
    with torch.inference_mode():
        assert torch.equal(model(IDS).logits, reference(IDS).logits)


def float32_then_quantized(source, dtype: str) -> torch.nn.Module:
    """What load_pair made before: the file dequantized to a float32 folder, loaded, then quantize_target."""
    folder = materialize(source)
    return quantize_target(_load_model(str(folder), torch.device("cpu"), torch.float32, {}, str(source.path)), dtype)


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MULTISPEC_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.mark.parametrize("dtype", ["int4", "int8", "w4a8"])
@pytest.mark.parametrize("arch,tied", [("llama", True), ("qwen2", False)])
def test_a_tiny_file_quantized_as_read_is_quantize_target_bit_for_bit(tmp_path, own_cache, arch, tied, dtype):
    source = open_gguf(str(write_tiny_gguf(tmp_path / "tiny.gguf", arch, tied)), need_tokenizer=False)
    folder = gguf_files.quant_folder(source.sha256, dtype)
    first = load_quantized(source, dtype)
    assert (folder / gguf_quant.MANIFEST).is_file()
    again = load_quantized(source, dtype)  # read from the cache
    reference = float32_then_quantized(source, dtype)
    assert_same(reference, first)
    assert_same(reference, again)
    head = first.get_output_embeddings()
    assert isinstance(head, QuantLinear) and head.packed.first_rows is not None
    assert isinstance(first.get_input_embeddings().weight, torch.nn.Parameter)  # the embedding stays float
    if dtype == "int4":
        assert isinstance(head.packed, PackedInt4)


def test_a_cache_from_another_layout_is_made_again(tmp_path, own_cache, monkeypatch):
    source = open_gguf(str(write_tiny_gguf(tmp_path / "tiny.gguf", "qwen2", False, vocab=96)), need_tokenizer=False)
    load_quantized(source, "int4")
    manifest = gguf_files.quant_folder(source.sha256, "int4") / gguf_quant.MANIFEST
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "layout": "torch 0.1, another CPU"}))
    built = []
    real = gguf_quant._build
    monkeypatch.setattr(gguf_quant, "_build", lambda *a: built.append(1) or real(*a))
    model = load_quantized(source, "int4")
    assert built and json.loads(manifest.read_text())["layout"] == PackedInt4.layout()
    assert_same(load_quantized(source, "int4"), model)
    assert len(built) == 1  # the third load read the cache made again


def test_a_cache_that_cannot_be_written_is_one_line_and_leaves_nothing(tmp_path, own_cache, monkeypatch):
    source = open_gguf(str(write_tiny_gguf(tmp_path / "tiny.gguf", "llama", True, vocab=96)), need_tokenizer=False)

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(gguf_quant, "_save", full)
    with pytest.raises(MultispecError, match="cannot write the GGUF cache in .*No space left on device"):
        load_quantized(source, "int8")
    assert [p.name for p in (own_cache / "gguf").iterdir()] == []


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["int4", "int8"])
def test_smollm2_quantized_as_read_is_quantize_target_bit_for_bit(tmp_path, dtype):
    import real_models

    source = open_gguf(str(real_models.smollm2()), need_tokenizer=True)
    first = load_quantized(source, dtype, folder=tmp_path / dtype)
    again = load_quantized(source, dtype, folder=tmp_path / dtype)
    reference = float32_then_quantized(source, dtype)
    assert_same(reference, first)
    assert_same(reference, again)


@pytest.mark.slow
def test_load_pair_reads_a_gguf_file_as_int4_without_its_float32_form(tmp_path, monkeypatch):
    """A new user's int4 load: no float32 folder is made or read (the tokenizer comes from the quantized cache),
    and the second load reads the cache alone."""
    import multispec
    import real_models

    path = str(real_models.smollm2())
    monkeypatch.setenv("MULTISPEC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(gguf_files, "materialize", lambda source: pytest.fail("the float32 form was made"))
    pair = multispec.load_pair(target=path, draft=path, dtype="int4")
    assert weights_dtype(pair.target) == "int4" and pair.sidecar(pair.target).weights_dtype == "int4"
    assert pair.tokenizer("def f(x):").input_ids
    monkeypatch.setattr(gguf_quant, "_build", lambda *a: pytest.fail("built again"))
    again = multispec.load_pair(target=path, draft=path, dtype="int4")
    assert again.tokenizer.get_vocab() == pair.tokenizer.get_vocab()
    with torch.inference_mode():
        assert torch.equal(again.target(IDS).logits, pair.target(IDS).logits)
    text = [multispec.generate(p, "def add(a, b):", max_new_tokens=8, method="ar").text for p in (pair, again)]
    assert text[0] == text[1]
