"""Every output location checked before work starts (issue 66, build 3): each CLI option that names a file or folder
multispec writes (`--out`, `--json-out`, `--cache`) is refused in one line, exit 2, before any model loads, when it
cannot be written: a path under a regular file, a file where a folder is expected (or a folder where a file is),
a folder that cannot be written in. Model loading is made to fail the test if it starts."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from helpers import assert_one_line_error, run_cli


@pytest.fixture
def no_loading(monkeypatch):
    """Any model or tokenizer load fails the test."""
    import transformers

    import multispec.loading as loading

    def loaded(*args, **kwargs):
        pytest.fail("a model started loading before the output location was checked")

    monkeypatch.setattr(loading, "_load_as", loaded)
    monkeypatch.setattr(loading, "load_tokenizer", loaded)
    for cls in (transformers.AutoModelForCausalLM, transformers.AutoTokenizer):
        monkeypatch.setattr(cls, "from_pretrained", loaded)


@pytest.fixture
def inputs(dirs, tmp_path):
    """What the commands read: the tiny pair, a prompts file, a text file, a corpus folder, a source folder."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"def f{i}(x):"}) + "\n" for i in range(4)))
    text = tmp_path / "train.txt"
    text.write_text("def f(x):\n    return x\n" * 20)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "train.txt").write_text(text.read_text())
    (corpus / "heldout.txt").write_text(text.read_text())
    (corpus / "corpus.json").write_text("{}")
    source = tmp_path / "src"
    source.mkdir()
    (source / "a.py").write_text(text.read_text())
    return {"T": str(dirs["target"]), "D": str(dirs["draft"]), "P": str(prompts), "TXT": str(text),
            "C": str(corpus), "S": str(source)}


# (command, its output option's kind, arguments: X is the output location)
COMMANDS = {
    "bench --out": ("dir", "bench --target {T} --draft {D} --methods ar --dataset {P} --threads 1 --quiet --out X"),
    "bench --batch-size --out": ("dir", "bench --target {T} --draft {D} --methods ar --dataset {P} --batch-size 2 "
                                        "--threads 1 --quiet --out X"),
    "optimal --out": ("file", "optimal --target {T} --draft {D} --dataset {P} --limit 1 --out X"),
    "profile measure --out": ("file", "profile measure --target {T} --draft {D} --threads 1 --out X"),
    "zoo eval --json-out": ("file", "zoo eval --model {T} --heldout {TXT} --json-out X"),
    "zoo corpus --out": ("dir", "zoo corpus --source {S} --out X"),
    "zoo tokenizer --out": ("dir", "zoo tokenizer --corpus {C} --out X"),
    "zoo train --out": ("dir", "zoo train --role draft --preset tiny --corpus {C} --tokenizer {T} --out X"),
    "zoo export --out": ("dir", "zoo export --model {T} --out X"),
    "train-head --out": ("dir", "train-head --target {T} --data {TXT} --minutes 0.1 --out X"),
    "heads train-acceptance --out": ("dir", "heads train-acceptance --target {T} --draft {D} --prompts {P} "
                                            "--out X"),
    "heads train-acceptance --cache": ("dir", "heads train-acceptance --target {T} --draft {D} --prompts {P} "
                                              "--out {tmp}/head --cache X"),
    "heads train-decision --out": ("dir", "heads train-decision --type 1 --target {T} --draft {D} --prompts {P} "
                                          "--out X"),
    "heads train-decision --cache": ("dir", "heads train-decision --type 1 --target {T} --draft {D} --prompts {P} "
                                            "--out {tmp}/model --cache X"),
}


def _read_only_folder(tmp_path: Path) -> Path:
    """A folder this process cannot write in: a read-only one, or (as root, who writes anywhere) /sys."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    if os.access(folder, os.W_OK):
        folder = Path("/sys")
        try:
            (folder / "multispec-probe").mkdir()
        except OSError:
            return folder
        (folder / "multispec-probe").rmdir()
        pytest.skip("no folder this process cannot write in")
    return folder


def _location(kind: str, bad: str, tmp_path: Path) -> tuple[str, str]:
    """(the bad location, a word its error line must hold)."""
    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    if bad == "under a regular file":
        return str(plain / ("out" if kind == "dir" else "out.json")), "plain.txt"
    if bad == "the wrong kind":
        if kind == "dir":
            return str(plain), "not a folder"
        (tmp_path / "a-folder").mkdir()
        return str(tmp_path / "a-folder"), "folder"
    folder = _read_only_folder(tmp_path)
    return str(folder / ("out" if kind == "dir" else "out.json")), str(folder)


@pytest.mark.parametrize("bad", ["under a regular file", "the wrong kind", "read-only"])
@pytest.mark.parametrize("command", list(COMMANDS))
def test_an_unwritable_output_is_refused_before_any_model_loads(capsys, inputs, no_loading, tmp_path, command, bad):
    kind, args = COMMANDS[command]
    where, needle = _location(kind, bad, tmp_path)
    argv = [where if a == "X" else a.format(**inputs, tmp=tmp_path) for a in args.split()]
    code, _, err = run_cli(capsys, *argv)
    assert_one_line_error(code, err, needle)
    assert not (tmp_path / "head").exists() and not (tmp_path / "model").exists()


class LoadingStarted(BaseException):
    """Raised where a model starts loading (the broken variant's proof)."""


@pytest.mark.parametrize("command", ["bench --out", "bench --batch-size --out", "optimal --out",
                                     "profile measure --out", "zoo eval --json-out"])
def test_the_broken_variant_loads_a_model_first(capsys, inputs, monkeypatch, tmp_path, command):
    """With the location checks turned off (no-ops), the same commands start loading a model before they find
    they cannot write: what the test above catches."""
    import multispec.bench.batched as batched
    import multispec.bench.runner as runner
    import multispec.loading as loading
    import multispec.optimal.report as report
    import multispec.paths as paths
    from multispec.zoo import evaluate

    def started(*args, **kwargs):
        raise LoadingStarted

    for module in (paths, runner, batched, report):
        for name in ("writable_dir", "writable_file", "creatable_dir"):
            if hasattr(module, name):
                monkeypatch.setattr(module, name, lambda path, what="--out": Path(path))
    monkeypatch.setattr(loading, "_load_as", started)
    monkeypatch.setattr(evaluate, "load_model", started)
    kind, args = COMMANDS[command]
    where, _ = _location(kind, "under a regular file", tmp_path)
    with pytest.raises(LoadingStarted):
        run_cli(capsys, *[where if a == "X" else a.format(**inputs, tmp=tmp_path) for a in args.split()])


def test_a_batch_bench_that_fails_late_keeps_its_rows(pair, tmp_path, monkeypatch, capsys):
    """bench --batch-size: an error (or Ctrl-C) after some runs writes those runs, marked partial, then raises."""
    import multispec.bench.batched as batched

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"def f{i}(x):"}) + "\n" for i in range(2)))
    real, calls = batched._measure, []

    def measure(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(batched, "_measure", measure)
    with pytest.raises(KeyboardInterrupt):
        batched.run_batch_bench(pair, [str(prompts)], None, "ar;sd", [0.0], 2, 4, None, 0, tmp_path / "out",
                                progress=lambda line: None)
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [r["method"] for r in results["rows"]] == ["ar"] and "stopped after 1 of 2 runs" in results["partial"]
    assert "Partial" in (tmp_path / "out" / "results.md").read_text()
    assert "wrote the 1 runs done so far" in capsys.readouterr().err


def test_an_optimal_run_that_fails_late_keeps_its_temperatures(dirs, tmp_path, monkeypatch, capsys):
    """optimal: an error (or Ctrl-C) in the second temperature's rates writes the first's rows, marked partial."""
    import multispec.optimal.report as report

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "def f(x):"}\n')
    real, seen = report.position_rates, set()

    def rates(lt, ld, t, *args):
        seen.add(t)
        if len(seen) == 2:
            raise KeyboardInterrupt
        return real(lt, ld, t, *args)

    monkeypatch.setattr(report, "position_rates", rates)
    config = report.OptimalRunConfig(target=str(dirs["target"]), draft=str(dirs["draft"]), dataset=str(prompts),
                                     data_dir=None, limit=1, max_new_tokens=4, temperatures=(0.5, 1.0), drafts=(2,),
                                     mc_samples=4, out=str(tmp_path / "o.json"))
    with pytest.raises(KeyboardInterrupt):
        report.run_report(config)
    record = json.loads((tmp_path / "o.json").read_text())
    assert {r["temperature"] for r in record["rows"]} == {0.5} and "stopped after 1 of 2" in record["partial"]
    assert "Partial" in (tmp_path / "o.md").read_text()
