"""Bad input gets a one-line error naming the problem (exit code 2 in the CLI), never a traceback."""
import json
import subprocess
import sys

import pytest

import multispec
from helpers import save_tiny_pair
from multispec.errors import MultispecError


@pytest.fixture(scope="module")
def pair_dirs(tmp_path_factory):
    return save_tiny_pair(tmp_path_factory.mktemp("pair"))


@pytest.fixture(scope="module")
def pair(pair_dirs):
    return multispec.load_pair(target=str(pair_dirs["target"]), draft=str(pair_dirs["draft"]))


def test_generate_api_returns_tokens_text_and_stats(pair):
    result = multispec.generate(pair, "def f(x):", method="mcsd", max_new_tokens=12, temperature=0.0)
    assert len(result.token_ids) <= 12 and isinstance(result.text, str)
    for key in ("new_tokens", "target_calls", "draft_calls", "tau", "draft_acceptance_rate", "seconds", "tokens_per_s",
                "method", "lossless"):
        assert key in result.stats
    assert result.stats["lossless"] is True and result.stats["method"] == "mcsd"


def test_sampling_defaults_come_from_the_generation_config(pair_dirs):
    """temperature=None: greedy unless the target's generation_config.json sets do_sample (then its settings)."""
    p = multispec.load_pair(target=str(pair_dirs["target"]), draft=str(pair_dirs["draft"]))
    greedy = multispec.generate(p, "def f(x):", method="sd", max_new_tokens=6)
    assert greedy.stats["temperature"] == 0.0
    gc = p.target.generation_config
    gc.do_sample, gc.temperature, gc.top_k, gc.top_p = True, 0.7, 5, 1.0
    r = multispec.generate(p, "def f(x):", method="sd", max_new_tokens=6, seed=0)
    assert (r.stats["temperature"], r.stats["top_k"], r.stats["top_p"]) == (0.7, 5, None)
    r = multispec.generate(p, "def f(x):", method="sd", max_new_tokens=6, top_k=3, seed=0)
    assert (r.stats["temperature"], r.stats["top_k"]) == (0.7, 3)
    assert multispec.generate(p, "def f(x):", method="sd", max_new_tokens=6, temperature=0.0).stats["temperature"] == 0


def test_stream_callback_reassembles_text(pair):
    pieces = []
    result = multispec.generate(pair, "for x in", method="sd", max_new_tokens=10, temperature=1.0, seed=3,
                                stream=pieces.append)
    assert "".join(pieces) == result.text


@pytest.mark.parametrize("kwargs,needle", [
    ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p"), ({"temperature": -1.0}, "temperature"),
    ({"top_k": -2}, "top_k"), ({"method": "mcsd", "tree": (4, 0)}, "tree shape"),
    ({"method": "mcsd", "verifier": "nope"}, "unknown verifier"), ({"method": "warp"}, "unknown method"),
    ({"method": "sd", "tree": (2, 2)}, "does not take"), ({"method": "mcsd", "verifier": "spechub"}, "spechub"),
    ({"max_new_tokens": 0}, "max_new_tokens"),
])
def test_bad_generation_arguments(pair, kwargs, needle):
    with pytest.raises(MultispecError, match=needle):
        multispec.generate(pair, "x = 1", **kwargs)


def test_empty_prompt(pair):
    with pytest.raises(MultispecError, match="empty"):
        multispec.generate(pair, "")
    with pytest.raises(MultispecError, match="empty"):
        multispec.generate(pair, [])


def test_bad_pairs(pair_dirs, tmp_path):
    with pytest.raises(MultispecError, match="vocabularies differ"):
        multispec.load_pair(target=str(pair_dirs["target"]), draft=str(pair_dirs["draft_other_vocab"]))
    with pytest.raises(MultispecError, match="not a causal language model"):
        multispec.load_pair(target=str(pair_dirs["not_causal"]), draft=str(pair_dirs["draft"]))
    with pytest.raises(MultispecError, match="not found"):
        multispec.load_pair(target=str(tmp_path / "missing"), draft=str(pair_dirs["draft"]))


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "multispec", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("extra,needle", [
    (["--top-p", "0"], "top_p"), (["--temperature", "-0.5"], "temperature"), (["--tree", "4,x"], "tree shape"),
    (["--method", "mcsd", "--verifier", "nope"], "unknown verifier"),
])
def test_cli_bad_input_is_one_line_exit_2(pair_dirs, extra, needle, capsys):
    """Run in this process (`multispec.cli.main`, what `python -m multispec` runs; the test below starts the
    process itself): an interpreter per case cost ~2 s."""
    from helpers import run_cli

    code, _, err = run_cli(capsys, "generate", "x = 1", "--target", str(pair_dirs["target"]), "--draft",
                           str(pair_dirs["draft"]), *extra)
    assert code == 2, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in err


@pytest.mark.slow
def test_cli_mismatched_vocab_and_missing_path(pair_dirs, tmp_path):
    r = _cli("generate", "x", "--target", str(pair_dirs["target"]), "--draft", str(pair_dirs["draft_other_vocab"]))
    assert r.returncode == 2 and "vocabularies differ" in r.stderr and "Traceback" not in r.stderr
    r = _cli("generate", "x", "--target", str(tmp_path / "nope"), "--draft", str(pair_dirs["draft"]))
    assert r.returncode == 2 and "not found" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow
def test_cli_json_and_lossy_warning(pair_dirs):
    r = _cli("generate", "def f(", "--target", str(pair_dirs["target"]), "--draft", str(pair_dirs["draft"]),
             "--method", "ti-mcsd", "--tree", "2,2,1", "--max-new-tokens", "8", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["lossless"] is False and "text" in out and out["method"] == "ti-mcsd"
    assert "LOSSY" in r.stderr


def test_cli_version_and_verifiers():
    r = _cli("--version")
    assert r.returncode == 0 and multispec.__version__ in r.stdout
    r = _cli("verifiers", "--json")
    rows = json.loads(r.stdout)
    assert [row["name"] for row in rows] == ["greedy", "sd", "mcns", "rrs", "rrs-wor", "kseq", "spechub", "greedy-md",
                                             "ot", "block", "naive", "traversal", "univer", "univer-ot", "gumbel", "gls"]
    assert {row["name"] for row in rows if not row["lossless"]} == {"mcns"}
    assert all(set(row) == {"name", "kind", "lossless", "drafts", "shapes", "draft_law", "description", "source"}
               for row in rows)
    by_name = {row["name"]: row for row in rows}
    assert by_name["block"]["shapes"] == "chain" and by_name["traversal"]["shapes"] == "tree"
    assert by_name["traversal"]["draft_law"] == by_name["rrs-wor"]["draft_law"]
    assert {row["name"] for row in rows if row["kind"] == "sequence"} == {"block", "naive", "traversal", "univer",
                                                                          "univer-ot", "gumbel", "gls"}
    assert by_name["univer"]["draft_law"] == by_name["greedy-md"]["draft_law"]


@pytest.mark.parametrize("kwargs, message", [
    ({"prompt": "a\ud800b"}, "not valid UTF-8 text"),
    ({"prompt": "x", "stop": "\udc80"}, "stop string"),
    ({"prompt": "x", "method": "auto", "max_nodes": 10**9}, "at most 64"),
    ({"prompt": "x", "method": "suffix", "max_nodes": 65}, "at most 64"),
    ({"prompt": "x", "draft_vocab": 0}, "draft_vocab"),
    ({"prompt": "x", "method": "sd", "draft_dtype": "int4"}, "draft_dtype"),
    ({"prompt": "x", "method": "lookup", "draft_vocab": 100}, "does not draft with one"),
    ({"prompt": "x", "method": "ti-mcsd", "temperature": 1.0, "reproducible": True}, "no reproducible mode"),
    ({"prompt": "x", "reproducible": "yes"}, "reproducible must be"),
])
def test_more_bad_inputs_are_one_line_errors(pair, kwargs, message):
    prompt = kwargs.pop("prompt")
    with pytest.raises(MultispecError, match=message):
        multispec.generate(pair, prompt, max_new_tokens=2, **kwargs)


def test_auto_with_only_the_draft_proposer_needs_a_draft(pair):
    from multispec.api import Pair

    no_draft = Pair(target=pair.target, draft=None, tokenizer=pair.tokenizer, target_path=pair.target_path,
                    draft_path=None)
    with pytest.raises(MultispecError, match="proposers=draft needs a draft model"):
        multispec.generate(no_draft, "x", method="auto", proposers="draft", max_new_tokens=2)


# ----------------------------------------------------------------------------------- degenerate sampling (issue 41)
@pytest.mark.parametrize("method", ["ar", "sd", "mcsd"])
@pytest.mark.parametrize("kwargs", [{"temperature": 1e-310}, {"temperature": 1e-320},
                                    {"temperature": 1.0, "top_p": 1e-300}, {"temperature": 0.7, "top_k": 0}])
def test_degenerate_sampling_values_act_as_their_limits(pair, method, kwargs):
    """A temperature that underflows is greedy, a tiny top_p keeps the top token: the greedy text, never an
    out-of-range id; top_k 0 is off (so the row above only checks that it runs)."""
    r = multispec.generate(pair, "def f(x):", method=method, max_new_tokens=8, seed=1, **kwargs)
    assert all(0 <= t < pair.target.config.vocab_size for t in r.token_ids)
    if "top_k" not in kwargs:
        greedy = multispec.generate(pair, "def f(x):", method=method, max_new_tokens=8, temperature=0.0)
        assert r.token_ids == greedy.token_ids


@pytest.mark.parametrize("method", ["ar", "sd"])
def test_nan_logits_are_a_one_line_error_naming_the_cause(pair, method):
    import copy
    from dataclasses import replace

    import torch

    target = copy.deepcopy(pair.target)
    with torch.no_grad():
        target.lm_head.weight[3].fill_(float("nan"))  # as a float16 forward that overflowed: one NaN logit a row
    with pytest.raises(MultispecError, match="logits are NaN.*float32 or bfloat16") as e:
        multispec.generate(replace(pair, target=target), "def f(x):", method=method, max_new_tokens=4,
                           temperature=0.7, seed=0)
    assert "\n" not in str(e.value) and e.value.partial.finish_reason == "abort"
