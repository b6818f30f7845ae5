"""What the round-5 hostile sweep (benchmarks/hostile/hostile_round5.py) found and this change fixed, each with the
old behaviour as the failing variant:
- `--threads 100000` made torch start 100,000 OpenMP threads: a traceback from a shared object that could not be
  mapped. Now refused in one line above thread_limit() (4 x the machine's cores, at least 64), for every command.
- `generate --json` interrupted printed nothing (the text so far was kept only without --json).
- `cross_vocab` with no draft was ignored without a word (`--cross-vocab uag --target DIR`), while the same setting
  with a draft of the same vocabulary is refused: now refused in one line too, before any weights load."""
from __future__ import annotations

import pytest

import multispec
from helpers import assert_one_line_error, run_cli
from multispec import threads
from multispec.errors import MultispecError
from multispec.loading import DEFAULT_PAIR_DIR


def test_too_many_threads_are_refused_before_torch_sees_them(monkeypatch, capsys):
    started = []
    monkeypatch.setattr("torch.set_num_threads", started.append)
    code, _, err = run_cli(capsys, "generate", "x", "--max-new-tokens", "2", "--threads", "100000")
    assert_one_line_error(code, err, "--threads 100000")
    assert started == []  # the old behaviour handed 100000 to torch (and crashed there)
    with pytest.raises(MultispecError, match="at most"):
        threads.set_threads(threads.thread_limit() + 1)
    assert threads.set_threads(2)[0] == 2 and started == [2]  # a sane count still goes through


@pytest.mark.parametrize("command", [["serve", "--port", "0"], ["train-head", "--target", "T", "--out", "O"]])
def test_other_commands_refuse_it_too(command, monkeypatch, capsys, tmp_path):
    started = []
    monkeypatch.setattr("torch.set_num_threads", started.append)
    monkeypatch.setattr(threads, "thread_limit", lambda: 8)
    if command[0] == "train-head":
        command = ["train-head", "--target", str(DEFAULT_PAIR_DIR / "target"), "--out", str(tmp_path / "head")]
    code, _, err = run_cli(capsys, *command, "--threads", "9")
    assert_one_line_error(code, err, "--threads 9")
    assert 9 not in started


def test_the_limit_is_the_broken_variants_crash(monkeypatch):
    """The check is what stops it: with the limit lifted, the count reaches torch (where 100000 crashed)."""
    started = []
    monkeypatch.setattr("torch.set_num_threads", started.append)
    monkeypatch.setattr(threads, "thread_limit", lambda: 10**6)
    threads.set_threads(100000)
    assert started == [100000]


def test_cross_vocab_without_a_draft_is_refused(capsys):
    with pytest.raises(MultispecError, match="no draft was given"):
        multispec.load_pair(target=str(DEFAULT_PAIR_DIR / "target"), cross_vocab="uag")
    code, _, err = run_cli(capsys, "generate", "x", "--target", str(DEFAULT_PAIR_DIR / "target"), "--cross-vocab",
                           "uag", "--max-new-tokens", "2", "--threads", "1")
    assert_one_line_error(code, err, "no draft was given")
    pair = multispec.load_pair(target=str(DEFAULT_PAIR_DIR / "target"))  # without the setting: loads as before
    assert pair.draft is None and pair.cross_vocab is None


@pytest.mark.parametrize("keep", [True, False])
def test_an_interrupted_json_run_keeps_the_tokens_so_far(keep, capsys, monkeypatch):
    """`generate --json` interrupted (Ctrl-C, SIGTERM) printed nothing: the text so far was kept only without
    --json (the old code fails the keep=True case: no JSON at all). Now its JSON is printed with finish_reason
    "abort"; with no partial result (interrupted before any token) nothing is printed."""
    import json

    import multispec.api
    from multispec.api import GenerationResult

    def interrupted(*a, **k):
        error = KeyboardInterrupt()
        error.partial = GenerationResult([5, 6, 7], "abc", {"seed": 1, "warnings": []}, "abort") if keep else None
        raise error
    monkeypatch.setattr(multispec.api, "generate", interrupted)
    code, out, err = run_cli(capsys, "generate", "x", "--json", "--threads", "1", "--max-new-tokens", "4")
    assert code == 130 and "Traceback" not in err
    kept = json.loads(out) if out.strip() else {}
    if keep:
        assert kept["token_ids"] == [5, 6, 7] and kept["text"] == "abc" and kept["finish_reason"] == "abort"
    else:
        assert kept == {}


@pytest.mark.parametrize("sigterm", [True, False])
def test_sigterm_ends_chat_instead_of_ending_only_the_reply(sigterm, capsys, monkeypatch, tmp_path):
    """SIGTERM in the middle of a chat reply ended the reply, as Ctrl-C does, and chat went on waiting for the next
    message (exit 0 at EOF; at a terminal, never): `timeout` and `docker stop` could not end it. Now SIGTERM ends the
    program with 143, the reply so far shown; Ctrl-C (sigterm=False) still ends only the reply."""
    import multispec.cli as cli_module
    from multispec.api import GenerationResult
    from multispec.decoding.decoder import Decoder

    template = tmp_path / "plain.jinja"
    template.write_text("{% for m in messages %}{{ m['content'] }}\n{% endfor %}")
    lines = iter(["def f(x):", "def g(y):"])

    def read(prompt=""):
        try:
            return next(lines)
        except StopIteration:
            raise EOFError from None

    def interrupted(self, ids, params, stream=None):
        stream("so far")
        if sigterm:
            cli_module._TERMINATED.append(15)  # what the SIGTERM handler records before it raises
        error = KeyboardInterrupt()
        error.partial = GenerationResult([1], "so far", {"warnings": [], "new_tokens": 1}, "abort")
        raise error
    monkeypatch.setattr("builtins.input", read)
    monkeypatch.setattr(Decoder, "generate", interrupted)
    code, out, err = run_cli(capsys, "chat", "--chat-template", str(template), "--threads", "1")
    assert "Traceback" not in err and "so far" in out
    assert code == (143 if sigterm else 0)
    assert out.count("so far") == (1 if sigterm else 2)  # Ctrl-C: both messages answered (each cut)
