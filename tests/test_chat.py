"""Chat: generate(messages=...), `multispec generate --chat`, and `multispec chat` driven through a pseudo-terminal
(two turns, the second carrying the first; Ctrl-C ends a reply and the conversation goes on; Ctrl-D leaves)."""
import os
import pty
import re
import select
import subprocess
import sys
import time

import pytest

from multispec import MultispecError, generate
from multispec.text import encode_chat

TEMPLATE = "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}<assistant>"


def test_messages_are_the_rendered_template(pair):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "def f(x):"}]
    ids = encode_chat(pair.tokenizer, 10**9, messages, TEMPLATE)
    text = "<system>be brief\n<user>def f(x):\n<assistant>"
    assert ids == pair.tokenizer(text, add_special_tokens=False)["input_ids"]
    by_messages = generate(pair, messages=messages, chat_template=TEMPLATE, max_new_tokens=8, temperature=0)
    assert by_messages.token_ids == generate(pair, ids, max_new_tokens=8, temperature=0).token_ids


@pytest.mark.parametrize("kwargs,words", [
    (dict(messages=[{"role": "user", "content": "hi"}]), "no chat template"),
    (dict(messages=[], chat_template=TEMPLATE), "non-empty list"),
    (dict(messages=[{"role": "user"}], chat_template=TEMPLATE), "messages[0]"),
    (dict(messages=[{"role": "user", "content": 3}], chat_template=TEMPLATE), "messages[0]"),
    (dict(prompt="x", messages=[{"role": "user", "content": "hi"}], chat_template=TEMPLATE), "not both"),
    (dict(messages=[{"role": "user", "content": "hi"}], chat_template="{{ raise_exception('no users') }}"),
     "refused these messages: no users"),
])
def test_bad_conversations_are_one_line(pair, kwargs, words):
    with pytest.raises(MultispecError, match=re.escape(words)) as e:
        generate(pair, max_new_tokens=4, **kwargs)
    assert "\n" not in str(e.value)


def _cli(*args, stdin=None):
    return subprocess.run([sys.executable, "-m", "multispec", *args, "--threads", "1"], capture_output=True,
                          text=True, input=stdin, timeout=300)


@pytest.mark.slow
def test_generate_chat_prints_the_reply(tmp_path, capsys):
    """`multispec generate --chat` in a process of its own; its bad uses refused with exit 2 and one line, run
    in this process (`multispec.cli.main`, what `python -m multispec` runs: five more interpreters cost ~10 s)."""
    from helpers import run_cli

    template = tmp_path / "t.jinja"
    template.write_text(TEMPLATE)
    r = _cli("generate", "--chat", "def f(x):", "--system", "code", "--chat-template", str(template),
             "--max-new-tokens", "8", "--temperature", "0", "--json")
    assert r.returncode == 0, r.stderr
    for args, words in [(("--chat", "  ", "--chat-template", str(template)), "the --chat message is empty"),
                        (("x", "--chat", "y", "--chat-template", str(template)), "--chat MESSAGE is the prompt"),
                        (("x", "--system", "s"), "--system and --chat-template go with --chat"),
                        (("--chat", "hi", "--system", " ", "--chat-template", str(template)), "--system is empty"),
                        (("--chat", "hi"), "no chat template")]:
        code, _, err = run_cli(capsys, "generate", *args, "--max-new-tokens", "4", "--threads", "1")
        assert code == 2 and words in err and len(err.strip().splitlines()) == 1, err


class Terminal:
    """A child process on a pseudo-terminal (its controlling terminal: Ctrl-C there is SIGINT to it)."""

    def __init__(self, argv):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child
            os.execv(sys.executable, [sys.executable, *argv, "--threads", "1"])
        self.seen = ""

    def expect(self, pattern: str, timeout: float = 120) -> re.Match:
        end = time.time() + timeout
        while True:
            m = re.search(pattern, self.seen)
            if m:
                self.seen = self.seen[m.end():]
                return m
            left = end - time.time()
            assert left > 0, f"timed out waiting for {pattern!r}; got {self.seen[-500:]!r}"
            if select.select([self.fd], [], [], left)[0]:
                try:
                    self.seen += os.read(self.fd, 4096).decode("utf-8", "replace").replace("\r\n", "\n")
                except OSError:  # the child closed the terminal
                    raise AssertionError(f"the chat ended waiting for {pattern!r}; got {self.seen[-500:]!r}")

    def send(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def wait(self, timeout: float = 30) -> int:
        end = time.time() + timeout
        while time.time() < end:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
            try:
                os.read(self.fd, 4096)
            except OSError:
                pass
            time.sleep(0.05)
        os.kill(self.pid, 9)
        raise AssertionError("the chat did not exit")


@pytest.mark.slow
def test_chat_in_a_terminal(tmp_path):
    template = tmp_path / "t.jinja"
    template.write_text(TEMPLATE)
    term = Terminal(["-m", "multispec", "chat", "--chat-template", str(template), "--max-new-tokens", "8",
                     "--temperature", "0"])
    term.expect(r">>> ")
    term.send("def add(a, b):\n")
    first = int(term.expect(r"conversation (\d+) tokens").group(1))
    term.expect(r">>> ")
    term.send("   \n")
    term.expect(r"error: the message is empty")
    term.expect(r">>> ")
    term.send("and now subtract\n")
    second = int(term.expect(r"conversation (\d+) tokens").group(1))
    assert second > first + 8  # the second turn's prompt holds the first turn and its reply
    term.expect(r">>> ")
    term.send("\x04")  # Ctrl-D
    assert term.wait() == 0


@pytest.mark.slow
def test_ctrl_c_ends_a_reply_not_the_chat(tmp_path):
    template = tmp_path / "t.jinja"
    template.write_text(TEMPLATE)
    term = Terminal(["-m", "multispec", "chat", "--chat-template", str(template), "--max-new-tokens", "200",
                     "--temperature", "1", "--method", "ar", "--seed", "0"])
    for message in ("tell me everything", "again"):
        term.expect(r">>> ")
        term.send(message + "\n")
        time.sleep(0.3)
        term.send("\x03")  # Ctrl-C: mid-reply, or at the prompt if the reply (<= 200 tokens) was quicker
        term.expect(r"reply stopped after \d+ tokens|conversation \d+ tokens|>>> ")
    term.send("\n\x04")
    assert term.wait() == 0


def test_ctrl_c_keeps_the_reply_so_far(capsys):
    """The reply cut by Ctrl-C is what was committed (the partial result), and the chat goes on."""
    from multispec.cli.chat_cmd import _reply
    from multispec.decoding.result import GenerationResult

    class Interrupted:
        def generate(self, ids, params, stream):
            stream("half a ")
            e = KeyboardInterrupt()
            e.partial = GenerationResult(token_ids=[1, 2], text="half a ", stats={"new_tokens": 2, "warnings": []},
                                         finish_reason="abort")
            raise e

    result = _reply(Interrupted(), [1], None)
    assert result.text == "half a " and result.finish_reason == "abort"
    assert capsys.readouterr().out == "half a \n"


@pytest.mark.slow
def test_chat_with_smollm2_remembers_the_first_turn():
    """`multispec chat` on SmolLM2-135M-Instruct (its own chat template, greedy): the second turn refers to the
    first, and the reply uses it."""
    from real_models import smollm2

    term = Terminal(["-m", "multispec", "chat", "--target", str(smollm2()), "--max-new-tokens", "24",
                     "--temperature", "0"])
    term.expect(r">>> ", timeout=300)
    term.send("I live in Paris.\n")
    first = int(term.expect(r"conversation (\d+) tokens").group(1))
    term.expect(r">>> ")
    term.send("Which city do I live in?\n")
    reply = term.expect(r"(.*?)\n.*conversation (\d+) tokens", timeout=300)
    assert "Paris" in reply.group(1), reply.group(0)  # a 135M model: names slip, cities stay
    assert int(reply.group(2)) > first
    term.expect(r">>> ")
    term.send("\x04")
    assert term.wait() == 0
