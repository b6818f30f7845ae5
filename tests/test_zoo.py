"""The zoo recipe end to end on the `tiny` preset: corpus -> tokenizer -> target -> distilled draft -> reload."""
import json

import pytest
import torch

from multispec.errors import MultispecError
from multispec.zoo import train as zoo_train
from multispec.zoo.corpus import CorpusConfig, build_corpus
from multispec.zoo.tokenizer import train_tokenizer
from multispec.zoo.train import TrainConfig, get_lr, train


def _write_sources(root):
    """Forty small, repetitive Python files: enough structure for a 30-step model to learn something."""
    root.mkdir()
    for i in range(40):
        body = "\n".join(f"def f{i}_{j}(x, y):\n    return x * {j} + y - {i}\n" for j in range(30))
        (root / f"m{i}.py").write_text(f"import os\n\n\n{body}\n")
    (root / "dup.py").write_text((root / "m0.py").read_text())  # a duplicate, dropped by content hash


@pytest.fixture(scope="module")
def zoo_dirs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("zoo")
    _write_sources(tmp / "src")
    manifest = build_corpus(CorpusConfig(sources=(str(tmp / "src"),), out=str(tmp / "corpus"), heldout_frac=0.1))
    train_tokenizer(tmp / "corpus", 300, tmp / "tok")
    return tmp, manifest


def test_corpus_split_by_file_and_dedup(zoo_dirs):
    tmp, m = zoo_dirs
    assert m.skipped["duplicate"] == 1
    assert (m.files_train, m.files_heldout) == (36, 4)
    assert json.loads((tmp / "corpus" / "corpus.json").read_text())["files_train"] == 36


@pytest.fixture(scope="module")
def tiny_trained(zoo_dirs):
    """The tiny target and its distilled draft, trained once per worker: (dir, target record, draft record)."""
    tmp, _ = zoo_dirs
    common = dict(preset="tiny", corpus=str(tmp / "corpus"), tokenizer=str(tmp / "tok"), eval_interval=10, eval_iters=2)
    rec = train(TrainConfig(role="target", out=str(tmp / "target"), **common))
    drec = train(TrainConfig(role="draft", out=str(tmp / "draft"), teacher=str(tmp / "target"), **common))
    return tmp, rec, drec


def test_tiny_target_and_draft_train_and_reload(tiny_trained):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp, rec, drec = tiny_trained
    assert rec["steps"] == 30 and rec["tokens"] == 30 * 8 * 32
    assert rec["history"][-1]["val_loss"] < rec["history"][0]["val_loss"] - 0.5  # the held-out loss drops
    saved = json.loads((tmp / "target" / "training.json").read_text())
    assert saved["shape"] == "2,32,2,64" and saved["final_heldout_loss"] == rec["final_heldout_loss"]

    assert drec["distill_alpha"] > 0 and drec["history"][-1]["val_loss"] < drec["history"][0]["val_loss"]

    model = AutoModelForCausalLM.from_pretrained(tmp / "target", dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(tmp / "target")
    assert tok.eos_token_id == tok.bos_token_id == tok.pad_token_id == 0
    ids = tok("def f(x):\n    return x\n", return_tensors="pt")["input_ids"]
    assert ids[0, 0] == 0  # the post-processor's BOS, as generate encodes a prompt
    assert tok.decode(ids[0, 1:]) == "def f(x):\n    return x\n"
    assert model(input_ids=ids).logits.shape == (1, ids.shape[1], len(tok))

    from multispec import api

    pair = api.load_pair(target=str(tmp / "target"), draft=str(tmp / "draft"))
    assert pair.draft is not None and pair.tokenizer.eos_token_id == 0
    assert api.generate(pair, "def f(x):", max_new_tokens=4).stats["temperature"] == 0.0  # greedy by default


def test_export_drops_the_checkpoint_and_can_set_sampling_defaults(tiny_trained):
    from multispec.api import generate, load_pair
    from multispec.cli import main

    tmp = tiny_trained[0]
    for role, extra in (("target", ["--sample-temperature", "0.7", "--sample-top-k", "20"]), ("draft", [])):
        main(["zoo", "export", "--model", str(tmp / role), "--out", str(tmp / "exported" / role), *extra])
    assert not (tmp / "exported" / "target" / "ckpt.pt").exists()
    pair = load_pair(target=str(tmp / "exported" / "target"), draft=str(tmp / "exported" / "draft"))
    stats = generate(pair, "def f(x):", max_new_tokens=4, seed=0).stats
    assert (stats["temperature"], stats["top_k"]) == (0.7, 20)


def test_resume_continues_exactly(zoo_dirs, monkeypatch):
    tmp, _ = zoo_dirs
    common = dict(role="target", preset="tiny", corpus=str(tmp / "corpus"), tokenizer=str(tmp / "tok"),
                  steps=12, eval_interval=5, eval_iters=1, checkpoint_minutes=0.0)
    train(TrainConfig(out=str(tmp / "full"), **common))

    real_loss, calls = zoo_train.model_loss, []

    def crash_on_7th_training_step(*args, **kwargs):
        if torch.is_grad_enabled():  # eval runs under no_grad
            calls.append(1)
            if len(calls) == 7:
                raise KeyboardInterrupt  # the checkpoint written before step 6 survives
        return real_loss(*args, **kwargs)

    monkeypatch.setattr(zoo_train, "model_loss", crash_on_7th_training_step)
    with pytest.raises(KeyboardInterrupt):
        train(TrainConfig(out=str(tmp / "cut"), **common))
    monkeypatch.setattr(zoo_train, "model_loss", real_loss)
    assert torch.load(tmp / "cut" / "ckpt.pt", weights_only=False)["step"] == 6
    train(TrainConfig(out=str(tmp / "cut"), **common), resume=True)

    a = torch.load(tmp / "full" / "ckpt.pt", weights_only=False)["model"]
    b = torch.load(tmp / "cut" / "ckpt.pt", weights_only=False)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_lr_schedule():
    assert get_lr(0, 100, 1.0, 0.1, 10) == pytest.approx(0.1)
    assert get_lr(9, 100, 1.0, 0.1, 10) == pytest.approx(1.0)
    assert get_lr(100, 100, 1.0, 0.1, 10) == pytest.approx(0.1)
    assert get_lr(55, 100, 1.0, 0.1, 10) == pytest.approx(0.55)


def test_bad_input_is_one_line_error(tmp_path, capsys):
    from multispec.cli import main

    with pytest.raises(MultispecError, match="unknown preset"):
        TrainConfig(role="target", preset="huge", corpus=str(tmp_path), tokenizer=str(tmp_path), out=str(tmp_path))
    with pytest.raises(SystemExit) as e:
        main(["zoo", "eval", "--model", str(tmp_path / "missing"), "--dataset", "humaneval",
              "--data-dir", str(tmp_path)])
    assert e.value.code == 2
    assert "humaneval.jsonl.gz not found" in capsys.readouterr().err
