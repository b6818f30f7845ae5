"""The GGUF cache folder verified, not trusted (issue 66, defect 4; gguf_cache.py): a damaged conversion (truncated
weights, a garbage config.json, no manifest), float32 or int8, is made again with one line on stderr saying why and
the model loads as it did; a file-hash memo that disagrees with the file is ignored, so the file given is the model
that runs; a conversion that cannot be removed is refused in one line; every result's stats name the file and its
hash. Each damage test runs twice: with the checks, and with them turned off (`verify=False`: any folder and any
memo trusted, as before), where the same test must see the defect.

The models are tiny random Llamas written here as GGUF files, with the embedded default pair's tokenizer (a
byte-level BPE) in their metadata, so that they load as targets."""
from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import multispec
from helpers import assert_one_line_error, run_cli
from multispec import gguf_cache
from multispec.errors import MultispecError
from multispec.loading import DEFAULT_PAIR_DIR, Pair

pytestmark = pytest.mark.skipif(importlib.util.find_spec("gguf") is None or importlib.util.find_spec("accelerate")
                                is None, reason="needs the gguf and accelerate packages (pip install -e '.[gguf]')")
IDS = torch.tensor([[1, 17, 3, 42, 7, 90, 11, 64]])


def write_model(path: Path, seed: int, hidden: int = 64, layers: int = 2) -> Path:
    """A random Llama (Q8_0 matrices, float32 norms) with the default pair's tokenizer, as a GGUF file."""
    import gguf

    tok = json.loads((DEFAULT_PAIR_DIR / "target" / "tokenizer.json").read_text())["model"]
    tokens = sorted(tok["vocab"], key=tok["vocab"].get)
    rng = np.random.default_rng(seed)
    heads, kv, ffn = 4, 2, 128
    w = gguf.GGUFWriter(str(path), "llama")
    for key, value in {"context_length": 256, "embedding_length": hidden, "block_count": layers,
                       "feed_forward_length": ffn, "attention.head_count": heads, "attention.head_count_kv": kv,
                       "vocab_size": len(tokens)}.items():
        w.add_uint32(f"llama.{key}", value)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_float32("llama.rope.freq_base", 10000.0)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tok["merges"]])
    w.add_bos_token_id(0)
    w.add_eos_token_id(0)

    def add(name, *shape):
        values = rng.standard_normal(shape).astype(np.float32) * 0.3
        if len(shape) == 1:
            w.add_tensor(name, values / 3 + 1)
        else:
            q8 = gguf.GGMLQuantizationType.Q8_0
            w.add_tensor(name, gguf.quants.quantize(values, q8), raw_dtype=q8)

    add("token_embd.weight", len(tokens), hidden)
    kv_rows = kv * hidden // heads
    for i in range(layers):
        add(f"blk.{i}.attn_norm.weight", hidden)
        add(f"blk.{i}.ffn_norm.weight", hidden)
        for name, rows, cols in (("attn_q", hidden, hidden), ("attn_k", kv_rows, hidden), ("attn_v", kv_rows, hidden),
                                 ("attn_output", hidden, hidden), ("ffn_gate", ffn, hidden), ("ffn_up", ffn, hidden),
                                 ("ffn_down", hidden, ffn)):
            add(f"blk.{i}.{name}.weight", rows, cols)
    add("output_norm.weight", hidden)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def logits(pair) -> torch.Tensor:
    with torch.inference_mode():
        return pair.target(IDS).logits


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Two tiny models (a: the one given; b: another), a's logits, and a cache folder holding their conversions
    (a: float32 and int8; b: float32), copied into each test's own cache (`cache`)."""
    root = tmp_path_factory.mktemp("gguf_cache")
    a, b = write_model(root / "a.gguf", seed=0), write_model(root / "b.gguf", seed=1)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MULTISPEC_CACHE_DIR", str(root / "cache"))
        reference = {dtype: logits(multispec.load_pair(target=str(a), dtype=dtype)) for dtype in ("float32", "int8")}
        multispec.load_pair(target=str(b))
    return a, b, reference


@pytest.fixture
def cache(files, tmp_path, monkeypatch):
    """This test's cache folder: a copy of the module's (files and their modification times)."""
    shutil.copytree(files[0].parent / "cache", tmp_path / "cache")
    monkeypatch.setenv("MULTISPEC_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def turn_off_checks(monkeypatch) -> None:
    """The broken variant: any conversion folder and any memo's hash trusted (what multispec did before)."""
    monkeypatch.setattr(gguf_cache, "check", lambda folder, source: None)
    monkeypatch.setattr(gguf_cache, "memo_agrees", lambda known, *a: isinstance(known, dict)
                        and isinstance(known.get("sha256"), str) and len(known["sha256"]) == 64)


def folder_of(cache: Path, path: Path, dtype: str) -> Path:
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return cache / "gguf" / (digest if dtype == "float32" else f"{digest}-{dtype}")


def load_again(path: Path, dtype: str, capsys) -> tuple[object, list[str]]:
    """(the pair, or the exception the load raised; the lines it wrote on stderr)."""
    capsys.readouterr()
    try:
        outcome: object = multispec.load_pair(target=str(path), dtype=dtype)
    except Exception as e:  # noqa: BLE001 - the broken variant's failures are what the test looks at
        outcome = e
    return outcome, [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("multispec: the cached")]


def test_a_conversion_writes_its_manifest_last_and_the_stats_name_the_file(files, cache):
    a, _, reference = files
    pair = multispec.load_pair(target=str(a))
    folder = folder_of(cache, a, "float32")
    manifest = json.loads((folder / gguf_cache.MANIFEST).read_text())
    listed = {f.name for f in folder.iterdir() if f.name != gguf_cache.MANIFEST}
    assert set(manifest["files"]) == listed and "model.safetensors" in listed and "config.json" in listed
    for name, entry in manifest["files"].items():
        assert entry["size"] == (folder / name).stat().st_size
        assert entry["sha256"] == hashlib.sha256((folder / name).read_bytes()).hexdigest()
    assert manifest["source"]["sha256"] == hashlib.sha256(a.read_bytes()).hexdigest()
    assert manifest["source"]["size"] == a.stat().st_size
    stats = multispec.generate(pair, "def f(x):", method="ar", max_new_tokens=2).stats
    assert stats["model"] == {"target": {"path": str(a), "file": "a.gguf", "sha256": manifest["source"]["sha256"],
                                         "conversion": gguf_cache.conversion_id(folder)}, "draft": None}
    assert torch.equal(logits(pair), reference["float32"])


def _truncate(folder: Path, name: str) -> None:
    data = (folder / name).read_bytes()
    (folder / name).write_bytes(data[:len(data) // 2])


DAMAGE = {  # what is done to the conversion, and the reason the line gives
    "truncated weights": (lambda f, w: _truncate(f, w), "has {n} bytes"),
    "garbage config.json": (lambda f, w: (f / "config.json").write_bytes(b"\x00garbage{"), "config.json has"),
    "config.json edited, same size": (lambda f, w: (f / "config.json").write_text(
        (f / "config.json").read_text().replace('"silu"', '"gelu"')), "config.json is not the file that was written"),
    "no manifest": (lambda f, w: (f / gguf_cache.MANIFEST).unlink(), "it has no manifest"),
}


@pytest.mark.parametrize("verify", [True, False], ids=["checked", "broken"])
@pytest.mark.parametrize("dtype", ["float32", "int8"])
@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_conversion_is_made_again_with_one_line(files, cache, capsys, monkeypatch, damage, dtype, verify):
    """Checked: one line naming the folder and what is wrong, then the same model as before. Broken (the checks
    off): the damage reaches the load (an error blaming the .gguf file, a transformers exception, or nothing said)."""
    a, _, reference = files
    multispec.load_pair(target=str(a), dtype=dtype)
    folder = folder_of(cache, a, dtype)
    weights = "model.safetensors" if dtype == "float32" else "weights.safetensors"
    size = (folder / weights).stat().st_size
    act, reason = DAMAGE[damage]
    act(folder, weights)
    if not verify:
        turn_off_checks(monkeypatch)
    pair, lines = load_again(a, dtype, capsys)
    good = isinstance(pair, Pair) and len(lines) == 1 and str(folder) in lines[0] \
        and reason.format(n=size // 2) in lines[0] and torch.equal(logits(pair), reference[dtype])
    assert good is verify, (pair, lines)
    if verify:  # made again whole: the next load says nothing
        assert load_again(a, dtype, capsys)[1] == [] and gguf_cache.check(folder, gguf_cache.identify(a)) is None


def test_a_copied_weights_file_is_hashed_once_when_its_time_changed(files, cache, capsys, monkeypatch):
    """A weights file past HASH_ALWAYS is hashed only when its modification time is not the one recorded: same
    bytes (a copy), its new time is recorded; other bytes of the same size, it is made again."""
    a, _, reference = files
    monkeypatch.setattr(gguf_cache, "HASH_ALWAYS", 0)
    multispec.load_pair(target=str(a))
    weights = folder_of(cache, a, "float32") / "model.safetensors"
    data = bytearray(weights.read_bytes())
    weights.write_bytes(bytes(data))  # the same bytes, a new time
    assert load_again(a, "float32", capsys)[1] == []
    recorded = json.loads((weights.parent / gguf_cache.MANIFEST).read_text())["files"]["model.safetensors"]
    assert recorded["mtime_ns"] == weights.stat().st_mtime_ns
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))  # one byte flipped, the same size
    pair, lines = load_again(a, "float32", capsys)
    assert len(lines) == 1 and "model.safetensors is not the file that was written" in lines[0]
    assert torch.equal(logits(pair), reference["float32"])


def _memo(path: Path) -> Path:
    st = path.stat()
    return gguf_cache.memo_path(path, st.st_size, st.st_mtime_ns)


MEMOS = {  # what a's memo is made to say, from b's memo and b's hash
    "only the hash edited": lambda memo_a, memo_b, b_hash: {**memo_a, "sha256": b_hash},
    "another file's record": lambda memo_a, memo_b, b_hash: memo_b,
    "a bare hash (older format)": lambda memo_a, memo_b, b_hash: b_hash,
    "not JSON": lambda memo_a, memo_b, b_hash: "\x00\x01",
}


@pytest.mark.parametrize("verify", [True, False], ids=["checked", "broken"])
@pytest.mark.parametrize("memo", list(MEMOS))
def test_a_memo_that_names_another_file_is_ignored(files, cache, capsys, monkeypatch, memo, verify):
    """a's memo made to name b's hash, b converted: the file given (a) is the model that loads, and the stats say
    a's hash. Broken (memos trusted, folders not checked): b runs as a, silently (for the memos it can read)."""
    a, b, reference = files
    multispec.load_pair(target=str(b))
    multispec.load_pair(target=str(a))
    b_hash = hashlib.sha256(b.read_bytes()).hexdigest()
    said = MEMOS[memo](json.loads(_memo(a).read_text()), json.loads(_memo(b).read_text()), b_hash)
    _memo(a).write_text(said if isinstance(said, str) else json.dumps(said))
    if not verify:
        turn_off_checks(monkeypatch)
    pair, _ = load_again(a, "float32", capsys)
    assert isinstance(pair, Pair)
    trusted = memo in ("only the hash edited", "another file's record")  # what the broken variant can read
    assert torch.equal(logits(pair), reference["float32"]) is (verify or not trusted)
    stats = multispec.generate(pair, "x", method="ar", max_new_tokens=1).stats["model"]["target"]
    assert (stats["sha256"] == hashlib.sha256(a.read_bytes()).hexdigest()) is (verify or not trusted)
    if verify:  # the memo was written again, right
        assert json.loads(_memo(a).read_text())["sha256"] == stats["sha256"]


def test_a_conversion_that_cannot_be_removed_is_refused_in_one_line(files, cache, capsys, monkeypatch):
    a, _, _ = files
    multispec.load_pair(target=str(a))
    folder = folder_of(cache, a, "float32")
    _truncate(folder, "model.safetensors")
    real = Path.rename

    def read_only(self, target):
        if self == folder:
            raise PermissionError(13, "Permission denied")
        return real(self, target)

    monkeypatch.setattr(Path, "rename", read_only)
    with pytest.raises(MultispecError, match="cannot be used .*model.safetensors has .* and cannot be removed "
                                             r"\(Permission denied\); delete it, or set MULTISPEC_CACHE_DIR"):
        multispec.load_pair(target=str(a))
    capsys.readouterr()
    code, _, err = run_cli(capsys, "generate", "x", "--target", str(a), "--method", "ar", "--max-new-tokens", "1",
                           "--threads", "1")
    assert_one_line_error(code, err, "cannot be removed")
