"""Issue 41: an interrupted batch keeps its work. The API raises with `.partial` (one result per prompt, each with
its finish reason); `generate --json` writes each sequence's line as it finishes, so a SIGTERM mid-batch leaves
every finished sequence in the output; text output keeps the finished sequences; a terminal gets a progress line."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import multispec
from helpers import run_cli
from multispec.decoding.decoder import GenerationResult

SRC = str(Path(__file__).resolve().parents[1] / "src")
PROMPTS = ["def f(x):", "x = 1", "for n in range(2):", "if x:", "print(n)", "return x"]


def _interrupt_after(count: int, seen: list):
    """on_result that records each finished index and raises KeyboardInterrupt (as Ctrl-C in the waiting thread)
    once `count` have finished."""
    def on_result(i, result):
        seen.append((i, result.finish_reason))
        if len(seen) == count:
            raise KeyboardInterrupt
    return on_result


@pytest.mark.parametrize("backend", ["fast", "hf"])  # lanes on the batch loop; one sequence at a time, in this thread
def test_an_interrupted_batch_raises_with_one_result_per_prompt(pair, backend):
    seen = []
    with pytest.raises(KeyboardInterrupt) as e:
        multispec.generate(pair, PROMPTS, method="sd", max_new_tokens=40, temperature=0.0, batch_size=2,
                           ignore_eos=True, backend=backend, on_result=_interrupt_after(1, seen))
    partial = e.value.partial
    assert len(partial) == len(PROMPTS) and all(isinstance(r, GenerationResult) for r in partial)
    (first, reason), = seen
    assert partial[first].finish_reason == reason != "abort"  # the finished one is kept whole
    aborted = [r for r in partial if r.finish_reason == "abort"]  # cut short (tokens so far) or never started
    assert len(aborted) >= 2 and any(r.token_ids == [] for r in aborted)  # 6 prompts, 2 at a time
    assert all(len(r.token_ids) == 40 for r in partial if r.finish_reason != "abort")  # (another may finish with it)
    assert all("seed" in r.stats for r in partial)


def test_on_result_reports_every_sequence_once(pair):
    seen = []
    out = multispec.generate(pair, PROMPTS, method="ar", max_new_tokens=5, temperature=0.0, batch_size=3,
                             on_result=lambda i, r: seen.append((i, r.token_ids)))
    assert sorted(seen) == sorted(enumerate(r.token_ids for r in out))
    with pytest.raises(multispec.MultispecError, match="on_result applies to a list"):
        multispec.generate(pair, "x", max_new_tokens=2, on_result=print)


def _finished(i, text="tail", reason="length"):
    return GenerationResult([1, 2], text, {"seed": i, "warnings": []}, reason)


@pytest.mark.parametrize("as_json", [True, False])
def test_cli_prints_what_finished_before_an_interrupt(capsys, as_json):
    """Printed as the batch was stopped: the finished sequences and the one cut short; not the one never started."""
    from multispec.cli.generate_cmd import _generate_many

    partial = [_finished(0, "cut", "abort"), _finished(1), GenerationResult([], "", {"seed": 2}, "abort")]

    def run(on_result):
        on_result(1, partial[1])
        error = KeyboardInterrupt()
        error.partial = partial
        raise error

    with pytest.raises(KeyboardInterrupt):
        _generate_many(run, ["a", "b", "c"], as_json)
    out = capsys.readouterr().out
    if as_json:
        rows = [json.loads(line) for line in out.splitlines()]
        assert [(r["index"], r["finish_reason"], r["token_ids"]) for r in rows] == [(1, "length", [1, 2]),
                                                                                    (0, "abort", [1, 2])]
    else:
        assert out == "### 0 (interrupted)\nacut\n### 1\nbtail\n"


def test_cli_batch_json_lines_carry_token_ids_and_a_terminal_gets_progress(capsys, monkeypatch, dirs, tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS[:3]))
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    code, out, err = run_cli(capsys, "generate", "--prompt-file", str(f), "--target", str(dirs["target"]), "--draft",
                             str(dirs["draft"]), "--method", "sd", "--max-new-tokens", "4", "--temperature", "1",
                             "--seed", "3", "--json", "--threads", "1")
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert sorted(r["index"] for r in rows) == [0, 1, 2]
    assert all(isinstance(r["token_ids"], list) and r["text"] is not None for r in rows)
    assert "3/3 prompts done" in err and "tok/s" in err
    assert "seed 3 + index (prompt i used 3 + i)" in err  # not "3..5", which reads as a range


def test_sigterm_mid_batch_keeps_every_finished_sequence(tmp_path):
    """The embedded default pair, a prompt file and --json redirected: killed after a few sequences finished, the
    output holds each of them whole (and the sequences cut short, marked abort); exit 143."""
    data = tmp_path / "big.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"def f{i}(x):"}) + "\n" for i in range(400)))
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "multispec", "generate", "--prompt-file", str(data), "--batch-size",
                             "4", "--json", "--method", "ar", "--max-new-tokens", "48", "--temperature", "0",
                             "--threads", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    out = b""
    deadline = time.time() + 240
    while out.count(b"\n") < 3 and time.time() < deadline:
        chunk = os.read(proc.stdout.fileno(), 4096)
        if not chunk:
            break
        out += chunk
    proc.send_signal(signal.SIGTERM)
    rest, err = proc.communicate(timeout=120)
    out += rest
    assert proc.returncode == 143, err.decode()[-2000:]
    assert b"Traceback" not in err and b"terminated" in err
    rows = [json.loads(line) for line in out.decode().splitlines()]
    done = [r for r in rows if r["finish_reason"] != "abort"]
    assert len(done) >= 3 and len(rows) < 400
    assert len({r["index"] for r in rows}) == len(rows)
    assert all(len(r["token_ids"]) == r["new_tokens"] for r in done)
