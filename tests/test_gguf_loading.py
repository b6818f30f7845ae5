"""GGUF files and models in memory as targets and drafts (issue 36, items 1 and 2): what `load_pair` refuses, each in
one line and before anything slow, with tiny files and models made here (the real models: test_real_models.py)."""
from __future__ import annotations

import hashlib
import importlib.util

import numpy as np
import pytest
import torch

import multispec
from helpers import assert_one_line_error, run_cli, tiny_llama
from multispec import gguf_files
from multispec.errors import MultispecError


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    """Every test has its own cache folder, and nothing may reach the slow dequantizing step."""
    monkeypatch.setenv("MULTISPEC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(gguf_files, "materialize", lambda source: pytest.fail("dequantized before the checks"))


def write_gguf(path, arch: str, kv: dict | None = None, tokenizer: bool = False):
    """A tiny GGUF file written by the gguf package: one float32 tensor and the metadata given."""
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    for key, value in (kv or {}).items():
        (w.add_uint32 if isinstance(value, int) else w.add_float32)(key, value)
    if tokenizer:
        w.add_tokenizer_model("gpt2")
        w.add_token_list([f"token{i}" for i in range(300)])  # metadata well past 1000 bytes
    w.add_tensor("token_embd.weight", np.arange(32, dtype=np.float32).reshape(4, 8))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


MAMBA = {"mamba.context_length": 64, "mamba.embedding_length": 8, "mamba.block_count": 1, "mamba.ssm.conv_kernel": 4,
         "mamba.ssm.inner_size": 16, "mamba.ssm.state_size": 4, "mamba.ssm.time_step_rank": 2,
         "mamba.attention.layer_norm_rms_epsilon": 1e-5}


def _bad_file(kind: str, tmp_path):
    path = tmp_path / "model.gguf"
    if kind == "head of a file":  # the first 1000 bytes of a GGUF file
        whole = write_gguf(tmp_path / "whole.gguf", "mamba", MAMBA, tokenizer=True).read_bytes()
        path.write_bytes(whole[:1000])
    elif kind == "tensor data cut":
        whole = write_gguf(tmp_path / "whole.gguf", "mamba", MAMBA, tokenizer=True).read_bytes()
        path.write_bytes(whole[:-16])
    elif kind == "random bytes":
        path.write_bytes(np.random.default_rng(0).bytes(5000))
    elif kind == "magic only":
        path.write_bytes(b"GGUF\x03\x00\x00\x00")
    elif kind == "missing":
        pass
    elif kind == "a folder":
        path.mkdir()
    elif kind == "unreadable architecture":
        write_gguf(path, "rwkv7", tokenizer=True)
    elif kind == "recurrent":
        write_gguf(path, "mamba", MAMBA, tokenizer=True)
    elif kind == "no tokenizer":
        write_gguf(path, "mamba", MAMBA)
    return path


pytestmark = pytest.mark.skipif(importlib.util.find_spec("gguf") is None, reason="needs the gguf package "
                                                                                   "(pip install -e '.[gguf]')")


@pytest.mark.parametrize("kind,needle", [
    ("head of a file", "is not a whole GGUF file (truncated or corrupt: the header runs past the end of the file (byte"),
    ("tensor data cut", "is not a whole GGUF file (truncated or corrupt: its tensors need"),
    ("random bytes", "is not a GGUF file (it does not start with the GGUF magic bytes)"),
    ("magic only", "is not a whole GGUF file (truncated or corrupt: 8 bytes)"),
    ("missing", "model path not found"),
    ("a folder", "is a folder, not a GGUF file"),
    ("unreadable architecture", "cannot read GGUF files of architecture 'rwkv7' (it reads"),
    ("recurrent", "unsupported model type 'mamba': its recurrent / linear-attention state"),
    ("no tokenizer", "holds no tokenizer"),
])
def test_bad_gguf_files_are_one_line_errors_before_any_dequantizing(tmp_path, kind, needle):
    path = _bad_file(kind, tmp_path)
    with pytest.raises(MultispecError, match=None) as e:
        multispec.load_pair(target=str(path))
    assert needle in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "cache" / "gguf").exists() or not any((tmp_path / "cache" / "gguf").iterdir())


def test_a_draft_file_is_checked_as_the_target_is(tmp_path, dirs):
    path = _bad_file("unreadable architecture", tmp_path)
    with pytest.raises(MultispecError, match="architecture 'rwkv7'"):
        multispec.load_pair(target=str(dirs["target"]), draft=str(path))


def test_a_missing_extra_names_it(tmp_path, monkeypatch):
    path = write_gguf(tmp_path / "m.gguf", "llama", tokenizer=True)
    find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "accelerate" else find(name, *a))
    with pytest.raises(MultispecError) as e:
        multispec.load_pair(target=str(path))
    assert str(e.value) == "loading GGUF files needs the accelerate package: pip install 'multispec[gguf]'"


def test_the_cli_says_it_in_one_line(capsys, tmp_path):
    path = _bad_file("random bytes", tmp_path)
    code, _, err = run_cli(capsys, "generate", "x", "--target", str(path), "--threads", "1")
    assert_one_line_error(code, err, "is not a GGUF file")


def test_an_interrupted_first_load_leaves_no_cache(tmp_path, monkeypatch):
    """The cache folder appears whole (renamed from a temporary one) or not at all."""
    from transformers import AutoModelForCausalLM

    monkeypatch.undo()  # the real materialize, with the cache below
    monkeypatch.setenv("MULTISPEC_CACHE_DIR", str(tmp_path / "cache"))
    path = write_gguf(tmp_path / "m.gguf", "llama", tokenizer=True)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    source = gguf_files.GgufSource(path, digest, tmp_path / "cache" / "gguf" / digest, None)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", interrupted)
    with pytest.raises(KeyboardInterrupt):
        gguf_files.materialize(source)
    assert list((tmp_path / "cache" / "gguf").iterdir()) == []


# ----------------------------------------------------------------------------------- models in memory
@pytest.fixture(scope="module")
def objects(dirs):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return {"target": AutoModelForCausalLM.from_pretrained(dirs["target"]),
            "draft": AutoModelForCausalLM.from_pretrained(dirs["draft"]),
            "other": AutoModelForCausalLM.from_pretrained(dirs["draft_other_vocab"]),
            "tokenizer": AutoTokenizer.from_pretrained(dirs["target"])}


def test_models_in_memory_decode_as_their_folders_do(dirs, objects):
    objects["target"].train()  # as a fine-tuning loop leaves it: load_pair puts it in eval mode
    pair = multispec.load_pair(target=objects["target"], tokenizer=objects["tokenizer"], draft=objects["draft"])
    assert pair.target is objects["target"] and not pair.target.training and pair.draft is objects["draft"]
    assert pair.target_path == "<LlamaForCausalLM in memory>"
    from_dirs = multispec.load_pair(target=str(dirs["target"]), draft=str(dirs["draft"]))
    for method in ("ar", "sd"):
        a = multispec.generate(pair, "def f(x):", method=method, max_new_tokens=8, temperature=0)
        b = multispec.generate(from_dirs, "def f(x):", method=method, max_new_tokens=8, temperature=0)
        assert a.token_ids == b.token_ids


def test_a_draft_object_with_another_vocabulary_drafts_through_its_tokenizer(dirs, objects):
    with pytest.raises(MultispecError, match="pass the draft's as draft_tokenizer="):
        multispec.load_pair(target=objects["target"], tokenizer=objects["tokenizer"], draft=objects["other"])
    pair = multispec.load_pair(target=objects["target"], tokenizer=objects["tokenizer"], draft=objects["other"],
                               draft_tokenizer=objects["tokenizer"])
    assert pair.cross_vocab == "tli" and pair.draft_tokenizer is objects["tokenizer"]
    plain = multispec.load_pair(target=objects["target"], tokenizer=objects["tokenizer"])
    a = multispec.generate(pair, "def f(x):", method="sd", max_new_tokens=8, temperature=0)
    assert a.token_ids == multispec.generate(plain, "def f(x):", method="ar", max_new_tokens=8, temperature=0).token_ids


def test_a_path_target_with_an_object_draft(dirs, objects):
    pair = multispec.load_pair(target=str(dirs["target"]), draft=objects["draft"])
    assert pair.draft is objects["draft"] and pair.draft_path == "<LlamaForCausalLM in memory>"


def _mamba():
    from transformers import MambaConfig, MambaForCausalLM

    return MambaForCausalLM(MambaConfig(vocab_size=300, hidden_size=16, num_hidden_layers=1, state_size=4,
                                        expand=2, conv_kernel=4))


def _base_llama():
    from transformers import LlamaModel

    return LlamaModel(tiny_llama(vocab=300).config)


@pytest.mark.parametrize("case,needle", [
    ("no tokenizer", "a target model object needs its tokenizer: load_pair(target=model, tokenizer=tokenizer)"),
    ("not a model", "target must be a model folder, a .gguf file or a transformers PreTrainedModel, got dict"),
    ("a plain module", "got Linear"),
    ("no head", "target <LlamaModel in memory> is not a causal language model (no language-model head)"),
    ("recurrent", "<MambaForCausalLM in memory>: unsupported model type 'mamba'"),
    ("a string tokenizer", "tokenizer must be a transformers tokenizer (AutoTokenizer.from_pretrained), got str"),
    ("tokenizer with a path", "tokenizer= goes with a target model object"),
    ("too many tokens", "tokens, more than the 16 output rows of <LlamaForCausalLM in memory>"),
    ("another dtype", "has dtype torch.float32, not bfloat16: convert it first"),
    ("draft on its own", "draft must be a model folder, a .gguf file or a transformers PreTrainedModel, got int"),
])
def test_wrong_objects_are_one_line_errors(dirs, objects, case, needle):
    tok = objects["tokenizer"]
    kwargs = {"no tokenizer": dict(target=objects["target"]),
              "not a model": dict(target={"weights": 1}, tokenizer=tok),
              "a plain module": dict(target=torch.nn.Linear(2, 2), tokenizer=tok),
              "no head": dict(target=_base_llama(), tokenizer=tok),
              "recurrent": dict(target=_mamba(), tokenizer=tok),
              "a string tokenizer": dict(target=objects["target"], tokenizer="gpt2"),
              "tokenizer with a path": dict(target=str(dirs["target"]), tokenizer=tok),
              "too many tokens": dict(target=tiny_llama(vocab=16), tokenizer=tok),
              "another dtype": dict(target=objects["target"], tokenizer=tok, dtype="bfloat16"),
              "draft on its own": dict(target=objects["target"], tokenizer=tok, draft=3)}[case]
    with pytest.raises(MultispecError) as e:
        multispec.load_pair(**kwargs)
    assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_a_second_load_skips_the_probe_until_the_model_changes(dirs, tmp_path, monkeypatch):
    """A passed probe is remembered for this folder's files, dtype and code; a changed file probes again."""
    import shutil

    import multispec.models.probe as probe

    target = tmp_path / "target"
    shutil.copytree(dirs["target"], target)
    calls = []
    real = probe.probe_model
    monkeypatch.setattr(probe, "probe_model", lambda model, name: (calls.append(name), real(model, name)))
    multispec.load_pair(target=str(target))
    multispec.load_pair(target=str(target))
    assert len(calls) == 1
    config = target / "config.json"
    config.write_text(config.read_text() + " ")  # same model, another size: probed again
    multispec.load_pair(target=str(target))
    multispec.load_pair(target=str(target), dtype="bfloat16")
    assert len(calls) == 3


def test_a_file_hash_is_remembered_per_path_size_and_time(tmp_path):
    from multispec.gguf_files import file_sha256

    f = tmp_path / "x.gguf"
    f.write_bytes(b"abc")
    first = file_sha256(f)
    assert first == hashlib.sha256(b"abc").hexdigest() and file_sha256(f) == first
    f.write_bytes(b"abcd")  # another size: hashed again
    assert file_sha256(f) == hashlib.sha256(b"abcd").hexdigest()
