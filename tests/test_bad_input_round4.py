"""Issue 41, a hostile user for the fourth time: the CLI, library and sampling items. Each case is a one-line
refusal (CLI: exit 2, before any model loads where the check needs none), a warning line, or the documented
behaviour; never a traceback, a library's message cut mid-sentence or a slow retry loop. (Interrupted batches:
test_interrupted_batch.py; degenerate sampling values: test_sampling.py and test_api_errors.py.)"""
import json
import shutil

import pytest
import torch

import multispec
from helpers import assert_one_line_error, run_cli, save_tiny_pair
from multispec import MultispecError


# ----------------------------------------------------------------------------------- CLI, before loading
@pytest.mark.parametrize("args,needle", [
    (["--method", "sd"], "--method sd needs a draft model: give --draft, or use a method that needs none (auto, ar"),
    (["--method", "mcsd", "--verifier", "gls"], "--verifier gls is the keyed verifier of the reproducible mode, "
                                                "chosen by --reproducible --seed N"),
    (["--method", "sd", "--verifier", "gumbel", "--draft", "d"], "--reproducible"),
    (["--top-k", "-3"], "top_k must be an integer >= 1 (0 or -1: off), got -3"),
])
def test_cli_refuses_before_loading(capsys, tmp_path, args, needle):
    """--target names a missing folder: any message but the expected one would mean loading was tried first."""
    code, _, err = run_cli(capsys, "generate", "x", "--target", str(tmp_path / "missing"), *args)
    assert_one_line_error(code, err, needle)


@pytest.mark.parametrize("top_k", ["0", "-1"])
def test_cli_top_k_zero_and_minus_one_are_off(capsys, dirs, top_k):
    code, out, err = run_cli(capsys, "generate", "x", "--target", str(dirs["target"]), "--method", "ar",
                             "--max-new-tokens", "2", "--temperature", "1", "--top-k", top_k, "--json",
                             "--threads", "1")
    assert code == 0, err
    assert json.loads(out)["top_k"] is None


@pytest.mark.parametrize("method,temperature", [("sd", "0.7"), ("sd", "0"), ("ar", "0")])
def test_cli_nan_logits_are_one_line(capsys, tmp_path, method, temperature):
    """A target whose forward gives NaN logits (as float16 Gemma 3 does): one line naming the cause, greedy too
    (argmax would take the NaN for the largest and print a token silently)."""
    from transformers import AutoModelForCausalLM

    paths = save_tiny_pair(tmp_path)
    target = AutoModelForCausalLM.from_pretrained(paths["target"])
    with torch.no_grad():
        target.lm_head.weight[3].fill_(float("nan"))
    target.save_pretrained(paths["target"])
    capsys.readouterr()  # the progress bars of saving and loading above
    code, _, err = run_cli(capsys, "generate", "def f(x):", "--target", str(paths["target"]), "--draft",
                           str(paths["draft"]), "--method", method, "--temperature", temperature, "--threads", "1")
    assert_one_line_error(code, err, "logits are NaN (its forward overflowed, as float16 does for some models); "
                                     "load the pair in float32 or bfloat16 (--dtype)")


def test_cli_warns_when_threads_pass_the_cores(capsys, monkeypatch, dirs):
    monkeypatch.setattr("multispec.threads.available_cores", lambda: 1)
    code, _, err = run_cli(capsys, "generate", "x", "--target", str(dirs["target"]), "--method", "ar",
                           "--max-new-tokens", "2", "--threads", "2")
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert code == 0 and len(warnings) == 1 and "2 torch threads on 1 cores" in warnings[0]


def test_cli_says_when_auto_measures_the_machine(capsys, monkeypatch, tmp_path):
    """The first auto run on a model calibrates its cost model (slower): one note; the next run does not."""
    monkeypatch.setenv("MULTISPEC_CACHE_DIR", str(tmp_path / "cache"))
    paths = save_tiny_pair(tmp_path / "fresh")  # a model no cost table in this process knows
    args = ("generate", "def f(x):", "--target", str(paths["target"]), "--draft", str(paths["draft"]),
            "--max-new-tokens", "4", "--temperature", "0", "--threads", "1")
    notes = []
    for _ in range(2):
        code, _, err = run_cli(capsys, *args)
        assert code == 0, err
        notes.append([line for line in err.splitlines() if "measured this model's forward costs" in line])
    assert len(notes[0]) == 1 and notes[1] == []


def test_baseline_repeats_until_stable_or_reports_the_spread():
    from multispec.cli.generate_cmd import _speedup, _speedup_text

    steady = _speedup(lambda: 100.0, lambda: 50.0, 100.0)
    assert steady == {"speedup_this_run": 2.0, "speedup": 2.0, "speedup_min": 2.0, "speedup_max": 2.0,
                      "baseline_runs": 3, "baseline_tokens_per_s": 50.0, "baseline_this_run_tokens_per_s": 50.0}
    rates = iter([60.0, 100.0, 90.0, 110.0])
    noisy = _speedup(lambda: next(rates), lambda: 100.0, 80.0)  # 0.8, 0.6, 1.0, 0.9, 1.1: never within 10 %
    assert noisy["baseline_runs"] == 5 and (noisy["speedup_min"], noisy["speedup_max"]) == (0.6, 1.1)
    assert noisy["speedup"] == 0.9
    assert _speedup_text({**noisy}) == (", 0.80x plain decoding at 100.0 tok/s (this run and its ar run; median "
                                        "over 5 pairs 0.90x, 0.60-1.10x)")


# ----------------------------------------------------------------------------------- bench
def _prompts(tmp_path):
    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"prompt": "def f(x):"}) + "\n")
    return data


def test_bench_without_a_draft_names_the_methods_that_need_one_and_leaves_no_folder(capsys, dirs, tmp_path):
    out = tmp_path / "out"
    code, _, err = run_cli(capsys, "bench", "--target", str(dirs["target"]), "--dataset", str(_prompts(tmp_path)),
                           "--out", str(out))
    assert_one_line_error(code, err, "sd:k=4, mcsd:tree=4-2-2-1 need a draft model: pass --draft, or bench methods "
                                     "that need none (auto, ar, lookup, suffix")
    assert not out.exists()
    code, _, err = run_cli(capsys, "bench", "--target", str(dirs["target"]), "--methods", "ar;lookup", "--dataset",
                           str(tmp_path / "missing.jsonl"), "--out", str(out), "--threads", "1")
    assert_one_line_error(code, err, "missing.jsonl")
    assert not out.exists()  # created by the --out check, removed again: nothing was written


def test_bench_writes_to_a_dated_folder_without_out(capsys, monkeypatch, dirs, tmp_path):
    data = _prompts(tmp_path)
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(capsys, "bench", "--target", str(dirs["target"]), "--methods", "ar;lookup",
                             "--dataset", str(data), "--max-new-tokens", "2", "--warmup", "0", "--quiet",
                             "--threads", "1")
    assert code == 0, err
    folder, = tmp_path.glob("bench-*")
    assert (folder / "results.json").is_file() and f"wrote {folder.name}/results.json" in out


# ----------------------------------------------------------------------------------- loading
def _not_a_model(kind, dirs, tmp_path):
    if kind == "gguf":  # read by the GGUF reader, which needs the extra (without it: its own one-line refusal)
        pytest.importorskip("gguf", reason="needs the gguf package (pip install -e '.[gguf]')")
        path = tmp_path / "model.gguf"
        path.write_bytes(b"GGUF\x03\x00\x00\x00")
    elif kind == "a file":
        path = tmp_path / "model.bin"
        path.write_bytes(b"\x00" * 8)
    elif kind == "no config":
        path = tmp_path / "weights"
        path.mkdir()
        shutil.copy(dirs["target"] / "model.safetensors", path)
    else:
        path = tmp_path / "no_tokenizer"
        shutil.copytree(dirs["target"], path)
        for f in path.glob("tokenizer*"):
            f.unlink()
    return path


@pytest.mark.parametrize("kind,needle", [
    ("gguf", r"is not a whole GGUF file \(truncated or corrupt"), ("a file", "is a file; give a Hugging Face model "
                                                                          r"folder \(config.json and safetensors "
                                                                          r"weights\) or a .gguf file"),
    ("no config", "has no config.json"),
    ("no tokenizer", "has no tokenizer files"),
])
def test_paths_that_are_not_model_folders_are_one_line(monkeypatch, dirs, tmp_path, kind, needle):
    path = _not_a_model(kind, dirs, tmp_path)
    monkeypatch.setattr("multispec.loading._load_model", lambda *a: pytest.fail("checked only after loading"))
    with pytest.raises(MultispecError, match=needle) as e:
        multispec.load_pair(target=str(path))
    assert "\n" not in str(e.value)


def test_cli_gguf_is_one_line(capsys, dirs, tmp_path):
    code, _, err = run_cli(capsys, "generate", "x", "--target", str(_not_a_model("gguf", dirs, tmp_path)), "--threads",
                           "1")
    assert_one_line_error(code, err, "is not a whole GGUF file")


@pytest.mark.parametrize("offline", ["env", "unreachable"])
def test_a_hub_id_offline_loads_from_the_cache_only_and_fails_at_once(monkeypatch, tmp_path, offline):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))  # an empty cache
    if offline == "env":
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("multispec.loading._hub_reachable", lambda: offline == "env")  # env: offline though reachable
    with pytest.raises(MultispecError, match="someorg/somemodel is not a local folder, the Hugging Face hub cannot "
                                             "be reached") as e:
        multispec.load_pair(target="someorg/somemodel")
    assert "\n" not in str(e.value)


# ----------------------------------------------------------------------------------- library threads
@pytest.fixture
def untouched_threads(monkeypatch):
    """A process whose torch threads nobody chose: torch's own default, no environment variable, no set_threads."""
    monkeypatch.setattr("multispec.threads._CHOSEN", [])
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr("multispec.threads.torch_default_threads", torch.get_num_threads)
    monkeypatch.setattr("multispec.threads.default_threads", lambda: (3, None))


def test_load_pair_sets_the_cli_thread_default(untouched_threads, dirs):
    multispec.load_pair(target=str(dirs["target"]))
    assert torch.get_num_threads() == 3


@pytest.mark.parametrize("chosen", ["env", "torch"])
def test_load_pair_leaves_threads_the_user_chose(untouched_threads, monkeypatch, dirs, chosen):
    from multispec import threads

    if chosen == "env":
        monkeypatch.setenv("OMP_NUM_THREADS", "2")
    else:
        monkeypatch.setattr(threads, "torch_default_threads", lambda: torch.get_num_threads() + 1)
    before = torch.get_num_threads()
    assert threads.apply_library_default() is None
    multispec.load_pair(target=str(dirs["target"]))
    assert torch.get_num_threads() == before


# ----------------------------------------------------------------------------------- API names
@pytest.mark.parametrize("kwargs,needle", [
    ({"max_tokens": 5}, "no argument 'max_tokens'; did you mean max_new_tokens (OpenAI's max_tokens)?"),
    ({"max_length": 5}, "did you mean max_new_tokens"),
    ({"temprature": 0.5}, "no argument 'temprature'; did you mean temperature?"),
    ({"method": "mcsd", "verifier": "gls"}, "ask for the mode instead (reproducible=True with a seed"),
])
def test_api_names_from_other_libraries_get_a_did_you_mean(pair, kwargs, needle):
    with pytest.raises(MultispecError) as e:
        multispec.generate(pair, "x", **kwargs)
    assert needle in str(e.value)


@pytest.mark.parametrize("method,verifier", [("mcsd", "gls"), ("mcsd", "gumbel"), ("dynamic", "gls")])
def test_keyed_verifiers_are_refused_where_every_method_is_built(method, verifier):
    """build_method is where the API, the Decoder, bench specs and the server's method options all pass: the keyed
    verifiers are refused there, pointing to the reproducible mode."""
    from multispec.decoding.methods import build_method

    with pytest.raises(MultispecError, match="keyed verifier of the reproducible mode"):
        build_method(method, verifier=verifier)
