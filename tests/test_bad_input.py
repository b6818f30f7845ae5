"""Bad input through the API and the CLI: each case gives a one-line MultispecError (CLI: one stderr line, exit 2)
before any slow work, or the documented behaviour; never a traceback, a hang or a silent wrong result.

CLI cases run `multispec.cli.main` in-process (what the console script calls), with stdout/stderr captured; the
`--help` import check runs in a subprocess, since this process has torch loaded already."""
import json
import subprocess
import sys

import numpy as np
import pytest
import torch

import multispec
from helpers import assert_one_line_error, run_cli
from multispec import MultispecError

NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")


# ----------------------------------------------------------------------------------- API: prompts and numbers
def test_multispec_error_is_exported_and_is_a_value_error():
    assert multispec.MultispecError is MultispecError and issubclass(MultispecError, ValueError)


@pytest.mark.parametrize("prompt,needle", [
    (b"def f(x):", "bytes"), (None, "str or a list of token ids"), ([1.0, 2.0], "integers"), ([1, 2.5], "integers"),
    ([True, 1], "integers"), (torch.tensor([1.0, 2.0]), "integers"), (torch.ones(2, 3, dtype=torch.long), "1-D"),
    ([], "empty"), ("", "empty"), ([10**6], "token ids must be in"), ([-1], "token ids must be in"), (5, "str or"),
])
def test_bad_prompts(pair, prompt, needle):
    with pytest.raises(MultispecError, match=needle):
        multispec.generate(pair, prompt, max_new_tokens=2, temperature=0.0)


def test_token_id_prompts_of_every_integer_kind_agree(pair):
    ids = pair.tokenizer("def f(x):", add_special_tokens=False)["input_ids"]
    kinds = (ids, tuple(ids), np.array(ids), torch.tensor(ids), torch.tensor([ids]), [np.int64(t) for t in ids])
    outs = [multispec.generate(pair, p, method="sd", max_new_tokens=4, temperature=0.0).token_ids for p in kinds]
    assert all(o == outs[0] for o in outs)


@pytest.mark.parametrize("kwargs,needle", [
    ({"max_new_tokens": True}, "max_new_tokens"), ({"max_new_tokens": 2.0}, "max_new_tokens"),
    ({"max_new_tokens": -3}, "max_new_tokens"), ({"temperature": True}, "temperature"),
    ({"temperature": "0.5"}, "temperature"), ({"temperature": float("nan")}, "temperature"),
    ({"top_k": 2.5}, "top_k"), ({"top_k": True}, "top_k"), ({"top_p": "x"}, "top_p"),
    ({"seed": 2**64}, "seed"), ({"seed": 2**63}, "seed"), ({"seed": -1}, "seed"), ({"seed": "abc"}, "seed"),
    ({"seed": 1.5}, "seed"), ({"seed": True}, "seed"),
    ({"stop": ""}, "empty"), ({"stop": [""]}, "empty"), ({"stop": [None]}, "stop strings must be strings"),
    ({"stop": 5}, "stop must be"), ({"stream": "print"}, "stream"), ({"backend": "tpu"}, "backend"),
    ({"method": None}, "method"), ({"method": "mcsd", "tree": 5}, "tree"),
])
def test_bad_generation_arguments(pair, kwargs, needle):
    with pytest.raises(MultispecError, match=needle):
        multispec.generate(pair, "x = 1", **{"max_new_tokens": 2, **kwargs})


def test_numpy_scalars_are_numbers(pair):
    a = multispec.generate(pair, "x = 1", method="sd", max_new_tokens=np.int64(5), temperature=np.float32(0.7),
                           top_k=np.int32(5), top_p=np.float64(0.9), seed=np.uint32(3))
    b = multispec.generate(pair, "x = 1", method="sd", max_new_tokens=5, temperature=0.7, top_k=5, top_p=0.9, seed=3)
    assert a.token_ids == b.token_ids and a.stats["temperature"] == pytest.approx(0.7)
    assert isinstance(a.stats["temperature"], float) and a.stats["seed"] == 3


def test_no_seed_samples_afresh_and_reports_the_seed(pair):
    runs = [multispec.generate(pair, "for x in", method="sd", max_new_tokens=12, temperature=1.0) for _ in range(4)]
    seeds = [r.stats["seed"] for r in runs]
    assert len(set(seeds)) == 4 and all(isinstance(s, int) and 0 <= s < 2**63 for s in seeds)
    assert len({tuple(r.token_ids) for r in runs}) > 1  # fresh randomness, not seed 0 every time
    again = multispec.generate(pair, "for x in", method="sd", max_new_tokens=12, temperature=1.0, seed=seeds[0])
    assert again.token_ids == runs[0].token_ids  # the reported seed reproduces the run


def test_the_lossless_flag_follows_verifier_and_temperature(pair):
    """--verifier greedy decodes greedily: at T > 0 that is not the target's law, and the flag says so."""
    greedy_hot = multispec.generate(pair, "x", method="mcsd", verifier="greedy", max_new_tokens=3, temperature=1.0)
    greedy_cold = multispec.generate(pair, "x", method="mcsd", verifier="greedy", max_new_tokens=3, temperature=0.0)
    mcns_cold = multispec.generate(pair, "x", method="mcsd", verifier="mcns", max_new_tokens=3, temperature=0.0)
    assert greedy_hot.stats["lossless"] is False and greedy_cold.stats["lossless"] is True
    assert mcns_cold.stats["lossless"] is True  # at T = 0 every draft-initialized method verifies greedily


def test_partial_output_survives_a_late_failure(pair):
    """A failure part-way (here a stream callback that raises) keeps the committed tokens on the exception."""
    seen = []

    def fail_late(delta):
        seen.append(delta)
        if len("".join(seen)) > 5:
            raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full") as info:
        multispec.generate(pair, "def f(x):", method="sd", max_new_tokens=40, temperature=1.0, seed=1,
                           stream=fail_late)
    partial = info.value.partial
    assert partial.finish_reason == "abort" and len(partial.token_ids) >= 1
    assert partial.text.startswith("".join(seen)) and partial.stats["seed"] == 1


# ----------------------------------------------------------------------------------- API: loading
@pytest.mark.parametrize("device,needle", [("foo", "unknown device"), ("meta", "cannot run a model"),
                                           (3, "device must be")])
def test_bad_devices(dirs, device, needle):
    with pytest.raises(MultispecError, match=needle):
        multispec.load_pair(target=str(dirs["target"]), draft=str(dirs["draft"]), device=device)


@NO_CUDA
def test_cuda_without_cuda(dirs):
    with pytest.raises(MultispecError, match="CUDA is not available"):
        multispec.load_pair(target=str(dirs["target"]), device="cuda")


@pytest.fixture
def truncated(dirs, tmp_path):
    """A copy of the tiny target whose model.safetensors lost its second half."""
    import shutil

    path = tmp_path / "truncated"
    shutil.copytree(dirs["target"], path)
    weights = path / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    return path


def test_truncated_weights(truncated):
    with pytest.raises(MultispecError, match="cannot load"):
        multispec.load_pair(target=str(truncated))


# ----------------------------------------------------------------------------------- CLI
def test_help_and_version_do_not_import_torch():
    code = ("import sys; from multispec.cli import main\n"
            "for args in (['--help'], ['--version']):\n"
            "    try: main(args)\n"
            "    except SystemExit: pass\n"
            "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip().endswith("NO-TORCH"), r.stdout + r.stderr
    assert "generate" in r.stdout and multispec.__version__ in r.stdout


@pytest.mark.parametrize("args,needle", [
    (["generate", ""], "empty"),
    (["generate", "x", "--max-new-tokens", "0"], "--max-new-tokens"),
    (["generate", "x", "--max-new-tokens", "abc"], "--max-new-tokens"),
    (["generate", "x", "--device", "foo"], "unknown device"),
    (["generate", "x", "--device", "meta"], "cannot run a model"),
    (["generate", "x", "--seed", str(2**70)], "--seed"),
    (["generate", "x", "--seed", "-1"], "--seed"),
    (["generate", "x", "--seed", "abc"], "--seed"),
    (["generate", "x", "--seed", "1.5"], "--seed"),
    (["generate", "x", "--stop", ""], "empty"),
    (["generate", "x", "--temperature", "nan"], "temperature"),
    (["generate", "x", "--tree", "4,x"], "tree shape"),
    (["generate", "x", "--no-such-option"], "no-such-option"),
    (["generate"], "PROMPT"),
    (["no-such-command"], "no-such-command"),
])
def test_cli_bad_input_fails_before_loading(capsys, tmp_path, args, needle):
    """--target names a missing folder: any message but the expected one would mean loading was tried first."""
    code, out, err = run_cli(capsys, *args, *(["--target", str(tmp_path / "missing")] if len(args) > 1 else []))
    assert_one_line_error(code, err, needle)


@NO_CUDA
def test_cli_cuda_without_cuda(capsys, tmp_path):
    code, _, err = run_cli(capsys, "generate", "x", "--device", "cuda", "--target", str(tmp_path / "missing"))
    assert_one_line_error(code, err, "CUDA is not available")


def test_cli_truncated_weights(capsys, truncated):
    code, _, err = run_cli(capsys, "generate", "x", "--target", str(truncated), "--method", "ar", "--threads", "1")
    assert_one_line_error(code, err, "cannot load")


def test_cli_ctrl_c_during_start_up_exits_130(capsys, monkeypatch, dirs):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("multispec.api.load_pair", interrupted)
    code, _, err = run_cli(capsys, "generate", "x", "--target", str(dirs["target"]), "--draft", str(dirs["draft"]))
    assert code == 130 and "interrupted" in err and "Traceback" not in err


def test_cli_generate_plain_output_and_json(capsys, dirs):
    base = ["generate", "def f(x):", "--target", str(dirs["target"]), "--draft", str(dirs["draft"]),
            "--max-new-tokens", "6", "--threads", "1"]
    code, out, err = run_cli(capsys, *base, "--method", "sd", "--temperature", "0.8", "--baseline")
    assert code == 0 and out.startswith("def f(x):")
    summary = err.strip().splitlines()[-1]
    assert "[sd, lossless, T=0.8]" in summary and "tok/s" in summary and "x plain decoding" in summary
    assert "seed " in summary and "finished by" in summary
    code, out, err = run_cli(capsys, *base, "--json", "--seed", "5", "--temperature", "1")
    record = json.loads(out)
    assert code == 0 and record["seed"] == 5 and record["warnings"] == [] and "text" in record
    assert "Loading" not in err  # no weight-loading progress bars


def test_cli_verifier_greedy_at_positive_temperature_is_labelled_lossy(capsys, dirs):
    code, out, err = run_cli(capsys, "generate", "x", "--target", str(dirs["target"]), "--draft", str(dirs["draft"]),
                             "--method", "mcsd", "--verifier", "greedy", "--temperature", "1", "--max-new-tokens", "3", "--json")
    assert code == 0 and json.loads(out)["lossless"] is False and "LOSSY" in err


def _unwritable(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    return blocker / "out"  # a folder cannot be made inside a file, even as root


def test_cli_bench_checks_out_before_any_model(capsys, tmp_path):
    code, _, err = run_cli(capsys, "bench", "--target", str(tmp_path / "missing"), "--methods", "ar",
                           "--dataset", str(tmp_path / "missing.jsonl"), "--out", str(_unwritable(tmp_path)))
    assert_one_line_error(code, err, "--out")


def test_cli_optimal_checks_out_and_vocabularies_before_any_model(capsys, tmp_path, dirs):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "def f(x):"}) + "\n")
    common = ["optimal", "--target", str(dirs["target"]), "--dataset", str(prompts), "--limit", "1"]
    code, _, err = run_cli(capsys, *common, "--draft", str(dirs["draft"]), "--out", str(_unwritable(tmp_path) / "r.json"))
    assert_one_line_error(code, err, "--out")
    code, _, err = run_cli(capsys, *common, "--draft", str(dirs["draft_other_vocab"]), "--out",
                           str(tmp_path / "r.json"))
    assert_one_line_error(code, err, "vocabularies differ")


# ----------------------------------------------------------------------------------- the compiled backend's flags
def test_compile_flag_must_be_a_bool(dirs):
    with pytest.raises(MultispecError, match="compile must be True or False"):
        multispec.load_pair(target=str(dirs["target"]), compile="yes")


def test_hf_backend_on_a_compiled_pair_is_refused(pair):
    from dataclasses import replace

    with pytest.raises(MultispecError, match="compiling applies to the fast backend"):
        multispec.generate(replace(pair, compile=True), "def", backend="hf", max_new_tokens=2)


def test_cli_compile_with_another_backend_is_refused(capsys, dirs):
    code, _, err = run_cli(capsys, "generate", "def", "--target", str(dirs["target"]), "--compile", "--backend", "hf")
    assert_one_line_error(code, err, "--compile")
