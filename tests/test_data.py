"""multispec.data: formatting per data set, selection, spec-bench categories, and the missing-file error."""
import gzip
import json

import pytest

from multispec.data import DATA_ENV, SPEC_BENCH_CATEGORIES, load_prompts, truncate_ids
from multispec.errors import MultispecError


def write_jsonl(path, rows, gz=False):
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if gz:
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        path.write_text(text)


@pytest.fixture
def data_dir(tmp_path):
    write_jsonl(tmp_path / "humaneval.jsonl.gz", [
        {"task_id": f"HumanEval/{i}", "prompt": f"def f{i}(x):\n    \"\"\"doc\"\"\"\n", "test": ""} for i in range(5)],
        gz=True)
    write_jsonl(tmp_path / "gsm8k_test.jsonl", [{"question": f"What is {i}+1?", "answer": "#### 1"} for i in range(3)])
    write_jsonl(tmp_path / "mt_bench_question.jsonl", [
        {"question_id": 81 + i, "category": "writing", "turns": [f"first {i}", "second"]} for i in range(3)])
    write_jsonl(tmp_path / "alpaca_eval.jsonl", [{"dataset": "x", "instruction": "Say hi.", "output": "hi"}])
    mt = [{"question_id": 81 + 10 * c + j, "category": cat, "turns": [f"{cat} {j}", "t2"]}
          for c, cat in enumerate(["writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem",
                                   "humanities"]) for j in range(3)]
    rest = [{"question_id": 161 + 80 * c + j, "category": cat, "turns": [f"{cat} {j}"]}
            for c, cat in enumerate(SPEC_BENCH_CATEGORIES[1:]) for j in range(4)]
    write_jsonl(tmp_path / "spec_bench_question.jsonl", mt + rest)
    return tmp_path


def test_formatting_per_dataset(data_dir):
    he = load_prompts("humaneval", data_dir)
    assert [p.id for p in he] == [f"HumanEval/{i}" for i in range(5)]
    assert he[0].text == 'def f0(x):\n    """doc"""'  # trailing whitespace stripped (docs/bench.md)
    gsm = load_prompts("gsm8k", data_dir)
    assert gsm[1].text == "Question: What is 1+1?\nAnswer: Let's think step by step.\n"
    mt = load_prompts("mt-bench", data_dir)
    assert (mt[0].id, mt[0].category, mt[0].text) == ("81", "writing", "first 0")
    al = load_prompts("alpaca", data_dir)
    assert al[0].text == "### Instruction:\nSay hi.\n\n### Response:\n"


def test_offset_and_limit(data_dir):
    assert [p.id for p in load_prompts("humaneval", data_dir, limit=2, offset=1)] == ["HumanEval/1", "HumanEval/2"]
    assert load_prompts("humaneval", data_dir, offset=9) == []
    with pytest.raises(MultispecError, match="limit"):
        load_prompts("humaneval", data_dir, limit=0)


def test_spec_bench_categories_and_per_category_limit(data_dir):
    all_ = load_prompts("spec-bench", data_dir)
    assert {p.category for p in all_} == set(SPEC_BENCH_CATEGORIES)
    assert sum(p.category == "mt_bench" for p in all_) == 24  # the 8 MT-Bench categories, grouped
    two = load_prompts("spec-bench", data_dir, limit=2)
    assert [p.category for p in two] == [c for c in SPEC_BENCH_CATEGORIES for _ in range(2)]
    # mt_bench is taken round-robin over its sub-categories: writing 0, roleplay 0, ...
    assert [p.text for p in two[:2]] == ["writing 0", "roleplay 0"]
    assert [p.text for p in load_prompts("spec-bench", data_dir, limit=1, offset=8)][:1] == ["writing 1"]


def test_missing_file_names_file_and_both_ways(tmp_path, monkeypatch):
    monkeypatch.delenv(DATA_ENV, raising=False)
    with pytest.raises(MultispecError) as e:
        load_prompts("gsm8k")
    assert "gsm8k_test.jsonl" in str(e.value) and "--data-dir" in str(e.value) and DATA_ENV in str(e.value)
    with pytest.raises(MultispecError) as e:
        load_prompts("humaneval", tmp_path)
    assert str(tmp_path / "humaneval.jsonl.gz") in str(e.value) and DATA_ENV in str(e.value)


def test_env_var_points_at_data(data_dir, monkeypatch):
    monkeypatch.setenv(DATA_ENV, str(data_dir))
    assert len(load_prompts("gsm8k")) == 3


def test_custom_jsonl_and_prompt_field(tmp_path):
    f = tmp_path / "mine.jsonl"
    write_jsonl(f, [{"id": "a", "prompt": "x = 1", "code": "y = 2"}, {"id": "b", "prompt": "z", "code": "w"}])
    assert [(p.id, p.text) for p in load_prompts(str(f))] == [("a", "x = 1"), ("b", "z")]
    assert load_prompts(str(f), prompt_field="code")[0].text == "y = 2"
    with pytest.raises(MultispecError, match="no field 'nope'"):
        load_prompts(str(f), prompt_field="nope")
    with pytest.raises(MultispecError, match="unknown dataset"):
        load_prompts("squad")
    with pytest.raises(MultispecError, match="not found"):
        load_prompts(str(tmp_path / "missing.jsonl"))


def test_bad_json_line_is_named(tmp_path):
    f = tmp_path / "bad.jsonl"
    f.write_text('{"prompt": "a"}\n{oops\n')
    with pytest.raises(MultispecError, match="line 2"):
        load_prompts(str(f))


def test_truncate_keeps_bos_and_last_tokens():
    ids = [0] + list(range(10, 30))
    out, cut = truncate_ids(ids, 5, bos=0)
    assert (out, cut) == ([0, 26, 27, 28, 29], True)
    assert truncate_ids(ids, 100, bos=0) == (ids, False)
    assert truncate_ids([5, 6, 7], 2, bos=None) == ([6, 7], True)
