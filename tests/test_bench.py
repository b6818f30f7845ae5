"""`multispec bench`: method-spec parsing, a 2-prompt run on a tiny in-process pair, output writing. No timing
assertions (style §2.11)."""
import json

import pytest
import torch

from helpers import tiny_llama
from multispec.bench import parse_method_spec, parse_method_specs, run_bench, write_outputs
from multispec.bench.report import swept_knobs
from multispec.cli import main
from multispec.errors import MultispecError

VOCAB = 32
CHARS = "abcdefghijklmnopqrstuvwxyz :\n()"  # 31 characters + <s> = 32 ids


def tiny_tokenizer():
    """A character-level tokenizer of VOCAB ids (<s> = 0 is BOS and unknown; its post-processor puts <s> first, as
    Llama's do), built in-process."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"<s>": 0, **{c: i + 1 for i, c in enumerate(CHARS)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<s>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", unk_token="<s>")


def tiny_pair():
    from multispec.api import Pair

    target = tiny_llama(vocab=VOCAB, hidden=32, layers=2, seed=0, scale=3.0)
    draft = tiny_llama(vocab=VOCAB, hidden=32, layers=2, seed=0, scale=3.0)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for prm in draft.parameters():
            prm.add_(0.3 * prm.std() * torch.randn(prm.shape, generator=g))
    return Pair(target=target, draft=draft, tokenizer=tiny_tokenizer(), target_path="tiny-target",
                draft_path="tiny-draft")


# ---------------------------------------------------------------------------------------------------------------
# method specs

def test_spec_parsing():
    s = parse_method_spec("mcsd:tree=4-2-2-1,verifier=rrs-wor")
    assert (s.name, s.config.tree, s.config.verifier, s.label) == ("mcsd", (4, 2, 2, 1), "rrs-wor",
                                                                   "mcsd:tree=4-2-2-1,verifier=rrs-wor")
    assert parse_method_spec("sd:k=4").config.tree == (1, 1, 1, 1)
    assert parse_method_spec("sd:heuristic=1").config.heuristic
    assert parse_method_spec("ti-mcsd:tree=2-4-3-1-1").config.target_init
    assert parse_method_spec("specdecpp:threshold=0.5").config.threshold == 0.5
    assert parse_method_spec("ar").config.name == "ar"
    hf = parse_method_spec("hf-assisted")
    assert (hf.config, hf.hf_tokens, hf.hf_best, hf.lossless) == (None, None, False, True)
    assert parse_method_spec("hf-assisted:num_assistant_tokens=6").hf_tokens == 6
    assert parse_method_spec("hf-assisted:best").hf_best
    assert [s.label for s in parse_method_specs(" ar ; sd:k=2;hf-assisted:best ")] == ["ar", "sd:k=2",
                                                                                       "hf-assisted:best"]
    assert not parse_method_spec("ti-mcsd").lossless


@pytest.mark.parametrize("text, message", [
    ("nope", "unknown method 'nope'"),
    ("sd:tree=4-2", "does not take option"),
    ("sd:k=0", "k must be an integer >= 1"),
    ("mcsd:tree=4-x", "invalid tree shape"),
    ("mcsd:verifier=nope", "nope"),
    ("sd:k", "need a value"),
    ("sd:k=2,k=3", "given twice"),
    ("specdecpp:head=/no/such/dir", "acceptance head not found"),
    ("dynamic:decision_model=/no/such/dir", "decision model not found"),
    ("hf-assisted:k=3", "does not take"),
    ("hf-assisted:num_assistant_tokens=0", ">= 1"),
    ("hf-assisted:best,num_assistant_tokens=3", "no other option"),
    ("hf-assisted:fast", "unknown flag"),
])
def test_spec_errors(text, message):
    with pytest.raises(MultispecError, match=message):
        parse_method_spec(text)


def test_duplicate_and_empty_specs():
    with pytest.raises(MultispecError, match="given twice"):
        parse_method_specs("ar;sd:k=4;ar")
    with pytest.raises(MultispecError, match="no methods"):
        parse_method_specs(" ; ")


def test_cli_bad_spec_fails_before_loading(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench", "--target", str(tmp_path / "missing"), "--draft", str(tmp_path / "missing"),
              "--methods", "ar;mcsd:tree=0", "--out", str(tmp_path / "out")])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "mcsd:tree=0" in err and "model" not in err.split("mcsd:tree=0")[0]


def test_cli_missing_data_fails_before_loading(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("MULTISPEC_DATA", raising=False)
    with pytest.raises(SystemExit) as e:
        main(["bench", "--target", str(tmp_path / "missing"), "--dataset", "gsm8k", "--methods", "ar",
              "--out", str(tmp_path / "out")])
    assert e.value.code == 2
    assert "gsm8k_test.jsonl" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------------------
# a run on a tiny pair

def test_tiny_run_writes_outputs_and_lossless_methods_match_ar(tmp_path):
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"id": f"p{i}", "prompt": t}) + "\n"
                            for i, t in enumerate(["def f(x):\n", "abc abc abc", "zzz"])))
    methods = "ar;sd:k=3;sd:k=2;mcsd:tree=2-2-1;ti-mcsd:tree=1-2-1;hf-assisted:num_assistant_tokens=3;hf-assisted:best"
    out = tmp_path / "out"
    res = run_bench(pair=tiny_pair(), datasets=str(data), methods=methods, temperatures=(0, 1), max_new_tokens=10,
                    limit=2, warmup=1, best_probe=1, out=out, progress=False, max_prompt_tokens=11,
                    command=["test"])
    for name in ("results.json", "results.md", "speedup.png", "pareto.png"):  # sd:k=2 / sd:k=3 sweep k
        assert (out / name).is_file(), name
    saved = json.loads((out / "results.json").read_text())
    assert saved["settings"]["methods"] == methods.split(";")
    assert saved["meta"]["command"] == ["test"] and saved["meta"]["torch"] == torch.__version__
    assert saved["settings"]["truncated_prompts"] == {str(data): 1}  # "abc abc abc" + BOS is 12 tokens > 11
    assert saved["cost"]["cost_ratio"] > 0
    assert len(saved["records"]) == 2 * 2 * 7  # temperatures x prompts x methods
    assert {b["temperature"] for b in saved["hf_best"]} == {0.0, 1.0}
    top = {(r["method"], r["temperature"]): r for r in res["summary"] if r["category"] is None}
    for label in methods.split(";"):
        greedy = top[(label, 0.0)]
        assert greedy["new_tokens"] == 20  # no EOS in the tiny tokenizer: 10 tokens per prompt
        assert greedy["greedy_identical"] == 1.0, label  # lossless (ti-mcsd with W=1 is lossless too)
        assert top[(label, 1.0)]["greedy_identical"] is None
        assert greedy["speedup"] is not None and greedy["tau"] >= 1.0
    assert top[("sd:k=3", 0.0)]["acceptance_rate"] is not None and top[("ar", 0.0)]["acceptance_rate"] is None
    assert "| sd:k=3 |" in (out / "results.md").read_text()


def test_the_warm_up_leaves_nothing_in_a_suffix_store(tmp_path, monkeypatch):
    """The untimed warm-up runs the first prompt; its output must not sit in the suffix store that the timed run of
    that same prompt reads (greedy, it copied it whole). The timed first prompt makes the same calls with a warm-up
    as without one; the broken variant (no clearing) copies, in fewer calls."""
    from multispec.drafting.suffix import SuffixStore

    data = tmp_path / "prompts.jsonl"
    data.write_text(json.dumps({"id": "p0", "prompt": "def f(x):\n"}) + "\n")

    def calls(warmup: int) -> int:
        res = run_bench(pair=tiny_pair(), datasets=str(data), methods="suffix", temperatures=(0,),
                        max_new_tokens=24, warmup=warmup, progress=False, command=["test"])
        return res["records"][0]["target_calls"]

    cold = calls(0)
    assert calls(1) == cold
    monkeypatch.setattr(SuffixStore, "clear", lambda self: None)  # the broken variant
    assert calls(1) < cold


def test_write_outputs_reusable_without_models(tmp_path):
    """Another script (a threshold sweep) writes records in the same schema and reuses the writers."""
    records = []
    for label, h, tps in (("ar", None, 10.0), ("specdecpp:threshold=0.3", 0.3, 14.0),
                          ("specdecpp:threshold=0.7", 0.7, 15.0)):
        for cat in ("qa", "rag"):
            records.append({"method": label, "method_name": label.split(":")[0],
                            "options": {} if h is None else {"threshold": h}, "dataset": "spec-bench",
                            "category": cat, "prompt_id": cat, "temperature": 0.0, "new_tokens": 20,
                            "seconds": 20 / tps, "target_calls": 20 if h is None else 8, "accepted": 0 if h is None
                            else 12, "drafted_depth": 0 if h is None else 24, "same_as_ar": True})
    res = write_outputs(tmp_path, {"meta": {"command": "sweep.py"}, "settings": {}, "records": records})
    assert swept_knobs(records) == [("specdecpp", "threshold", {"specdecpp:threshold=0.3": 0.3,
                                                               "specdecpp:threshold=0.7": 0.7})]
    assert (tmp_path / "pareto.png").is_file() and (tmp_path / "speedup.png").is_file()
    row = next(r for r in res["summary"] if r["method"] == "specdecpp:threshold=0.7" and r["category"] is None)
    assert row["speedup"] == pytest.approx(1.5) and row["tau"] == pytest.approx(2.5)
    assert row["acceptance_rate"] == pytest.approx(0.5) and row["greedy_identical"] == 1.0
    assert {r["category"] for r in res["summary"]} == {None, "qa", "rag"}


def test_limit_per_dataset():
    from multispec.bench.runner import _limits

    assert _limits(None, ["a", "b"]) == {"a": None, "b": None}
    assert _limits("3", ["a", "b"]) == {"a": 3, "b": 3}
    assert _limits("a=10,b=20", ["a", "b"]) == {"a": 10, "b": 20}
    assert _limits({"a": 2}, ["a", "b"]) == {"a": 2, "b": None}
    with pytest.raises(MultispecError, match="not benchmarked"):
        _limits("c=1", ["a"])
    with pytest.raises(MultispecError, match="dataset=N"):
        _limits("a=x", ["a"])


def test_interrupted_run_writes_the_records_so_far_and_memory_is_measured(tmp_path, monkeypatch):
    """Ctrl-C (or an error) part-way through the timed loop keeps what was measured: results.json is written,
    marked partial, before the interrupt goes on. Peak memory is the process's resident peak (never 0.0)."""
    import multispec.bench.runner as runner

    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"id": f"p{i}", "prompt": t}) + "\n" for i, t in enumerate(["ab", "cd"])))
    real, calls = runner._timed, []

    def interrupt_third(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(runner, "_timed", interrupt_third)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        run_bench(pair=tiny_pair(), datasets=str(data), methods="ar;sd:k=2", max_new_tokens=4, warmup=0,
                  out=out, progress=False, command=["test"])
    saved = json.loads((out / "results.json").read_text())
    assert len(saved["records"]) == 2 and saved["partial"].startswith("stopped after 2 of 4 generations")
    assert all(r["peak_mem_mb"] > 10 for r in saved["records"])  # a Python process with torch: well above 10 MB
    assert (out / "results.md").is_file()


def test_mean_acceptance_length_and_per_position_acceptance_are_pooled_over_records():
    from multispec.bench.report import markdown, summarize

    base = {"method_name": "sd", "options": {}, "dataset": "d", "category": None, "temperature": 1.0,
            "new_tokens": 40, "seconds": 1.0, "target_calls": 15, "drafted_depth": 45}
    records = [{**base, "method": "sd:k=3", "prompt_id": "a", "accepted": 15, "num_drafts": 10,
                "accepted_per_pos": [8, 5, 2]},
               {**base, "method": "sd:k=3", "prompt_id": "b", "accepted": 10, "num_drafts": 20,
                "accepted_per_pos": [6, 3, 1]},
               {**base, "method": "ar", "method_name": "ar", "prompt_id": "a", "accepted": 0, "num_drafts": 0,
                "accepted_per_pos": []}]
    rows = {r["method"]: r for r in summarize(records)}
    assert rows["sd:k=3"]["mean_acceptance_length"] == pytest.approx(1 + 25 / 30)
    assert rows["sd:k=3"]["accepted_per_position"] == pytest.approx([14 / 30, 8 / 30, 3 / 30])
    assert rows["ar"]["mean_acceptance_length"] is None and rows["ar"]["accepted_per_position"] is None
    table = markdown({"records": records}, summarize(records))
    assert "| mean acc. len |" in table and "| 1.833 | 0.47 0.27 0.10 |" in table


def test_chat_datasets_go_through_the_targets_chat_template(tmp_path):
    """--chat-template auto (default): a chat data set's prompts are one user message rendered by the target's
    chat template (no BOS added: the template places its own), a code data set stays raw text (BOS first); off:
    raw text everywhere; on: a target without a template is refused in one line. The mode and what it applied are
    in the results' settings."""
    import gzip

    from multispec.data import load_prompts

    (tmp_path / "spec_bench_question.jsonl").write_text(
        json.dumps({"question_id": 161, "category": "translation", "turns": ["abc", "second turn"]}) + "\n")
    with gzip.open(tmp_path / "humaneval.jsonl.gz", "wt") as f:
        f.write(json.dumps({"task_id": "HumanEval/0", "prompt": "def f(x):\n"}) + "\n")
    (tmp_path / "alpaca_eval.jsonl").write_text(json.dumps({"instruction": "say hi"}) + "\n")
    alpaca = load_prompts("alpaca", tmp_path)[0]
    assert alpaca.message == "say hi" and alpaca.text.startswith("### Instruction:")
    assert load_prompts("humaneval", tmp_path)[0].message is None

    pair = tiny_pair()
    pair.tokenizer.chat_template = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant:"

    def prompt_tokens(mode, p=pair):
        res = run_bench(pair=p, datasets="spec-bench,humaneval", data_dir=str(tmp_path), methods="ar",
                        max_new_tokens=2, warmup=0, progress=False, chat_template=mode)
        return res["settings"], {r["dataset"]: r["prompt_tokens"] for r in res["records"]}

    settings, tokens = prompt_tokens("auto")
    assert settings["chat_template"] == "auto"
    assert settings["chat_template_applied"] == {"spec-bench": True, "humaneval": False}
    assert tokens == {"spec-bench": len("user: abc\nassistant:"), "humaneval": 1 + len("def f(x):")}
    assert prompt_tokens("on")[1] == tokens
    settings, tokens = prompt_tokens("off")
    assert settings["chat_template_applied"] == {"spec-bench": False, "humaneval": False}
    assert tokens == {"spec-bench": 1 + len("abc"), "humaneval": 1 + len("def f(x):")}

    plain = tiny_pair()  # no template: auto falls back to raw text, on is refused
    assert prompt_tokens("auto", plain)[0]["chat_template_applied"] == {"spec-bench": False, "humaneval": False}
    with pytest.raises(MultispecError, match="no chat template") as e:
        prompt_tokens("on", plain)
    assert "\n" not in str(e.value)
    with pytest.raises(MultispecError, match="chat_template must be one of"):
        prompt_tokens("yes")
