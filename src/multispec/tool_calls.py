"""The calls in a model's output (OpenAI function calling, Hermes-style envelopes; the request side and the grammar:
multispec/tools.py): `ToolCallParser`, the one parser, fed the text as it streams, and `parse_tool_calls` over a
whole output. Text only: the library, `multispec chat` and the server share it."""
from __future__ import annotations

import json
import re
import uuid
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"


def tool_call(name: str, arguments: str | dict) -> dict:
    """An OpenAI tool call object (a fresh id; arguments as JSON text, a dict's dumped)."""
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return {"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
            "function": {"name": name, "arguments": arguments}}


def _call(body: str) -> dict | None:
    """The call a <tool_call> body holds, or None where it is not {"name": str, "arguments": object}. Its arguments
    are the JSON text the model wrote for them (or the text of a JSON string holding them, as some models write)."""
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"]:
        return None
    args: Any = value.get("arguments", {})
    raw = _member_text(body, "arguments") if "arguments" in value else "{}"
    if isinstance(args, str):
        try:
            raw, args = args, json.loads(args)
        except ValueError:
            return None
    return tool_call(value["name"], raw) if isinstance(args, dict) else None


_WS = re.compile(r"[ \t\n\r]*")


def _member_text(text: str, key: str) -> str:
    """The text of the last `key` member's value in the JSON object `text` (which json.loads took)."""
    decoder, found, i = json.JSONDecoder(), "", _WS.match(text).end() + 1
    while True:
        i = _WS.match(text, i).end()
        if text[i] == "}":
            return found
        name, i = json.decoder.scanstring(text, i + 1)  # type: ignore[attr-defined]
        i = _WS.match(text, _WS.match(text, i).end() + 1).end()  # past ":"
        _, end = decoder.raw_decode(text, i)
        if name == key:
            found = text[i:end]
        i = _WS.match(text, end).end()
        i += text[i] == ","


# a forced call's start: its name, then its arguments' object begins
_HEAD = re.compile(r'[ \t\n\r]*\{[ \t\n\r]*"name"[ \t\n\r]*:[ \t\n\r]*"([A-Za-z0-9_.-]{1,64})"[ \t\n\r]*,[ \t\n\r]*'
                   r'"arguments"[ \t\n\r]*:[ \t\n\r]*(?=\{)')  # the names are NAME's


class ToolCallParser:
    """The one parser of the calls in an output, fed its text as it streams (`feed(delta)`, then `finish()`); each
    returns events: ("content", text), ("call", OpenAI tool call) and ("arguments", more of the last call's
    arguments). Text that may be the start of <tool_call> is held back; whitespace around the calls is dropped.

    A call's arguments are the JSON text the model wrote for them, verbatim (the text of a JSON string holding them
    where it wrote one), streamed or not. Where they come:
    - forced (the output is under Tools.grammar, `forced=True`) and the call begins the output or follows a call
      (the grammar then allows only calls): the call comes as soon as `{"name": "X", "arguments": {` is written, its
      arguments empty, then each piece of the arguments' text as it is written. Such a call cannot turn out
      malformed; one the output's end cuts off (max_tokens) stays a call, its arguments cut (`cut` is then True), as
      OpenAI returns it.
    - otherwise the call comes whole once its </tool_call> (or the output's end) shows its body is a call's JSON;
      a body that is not stays in the text (malformed output is shown, not lost), as does an unclosed call at the
      end whose JSON is not whole.
    The events do not depend on how the text is cut into deltas: parse_tool_calls is this parser fed the whole."""

    def __init__(self, forced: bool = False):
        self.buf = ""
        self.in_call = False
        self.held_space = ""  # trailing whitespace of the content, shown once more text follows
        self.space = ""  # the held whitespace before the call being read
        self.trim = True  # at the start or just after a call: leading whitespace is dropped
        self.calls = 0
        self.sure = forced  # the grammar still allows only calls here: nothing but calls and "\n" so far
        self.gap = ""  # the text since the start or the last call
        self.args: list | None = None  # a streamed call's arguments: [depth, in a string, after a backslash]
        self.tail = False  # a streamed call's arguments are whole; its "}" and </tool_call> are left
        self.cut = False

    def feed(self, delta: str) -> list[tuple[str, Any]]:
        self.buf += delta
        events: list[tuple[str, Any]] = []
        while True:
            if not self.in_call:
                i = self.buf.find(OPEN)
                if i < 0:
                    keep = _prefix_tail(self.buf, OPEN)
                    self._outside(self.buf[:len(self.buf) - keep], events)
                    self.buf = self.buf[len(self.buf) - keep:]
                    return events
                self._outside(self.buf[:i], events)
                self.sure = self.sure and self.gap == ("\n" if self.calls else "")
                self.buf, self.in_call, self.space, self.held_space = self.buf[i + len(OPEN):], True, \
                    self.held_space, ""
            elif self.args is not None:
                if not self._stream(events):
                    return events
            else:
                j = self.buf.find(CLOSE)
                if self.sure and (m := _HEAD.match(self.buf, 0, j if j >= 0 else len(self.buf))):
                    events.append(("call", tool_call(m.group(1), "")))
                    self.calls += 1
                    self.args, self.buf = [0, False, False], self.buf[m.end():]
                    continue
                if j < 0:
                    return events
                body, self.buf, self.in_call = self.buf[:j], self.buf[j + len(CLOSE):], False
                self._body(body, CLOSE, events)

    def finish(self) -> list[tuple[str, Any]]:
        events: list[tuple[str, Any]] = []
        if self.args is not None:  # feed passed on every argument character it had
            self.cut = not self.tail
            if self.tail:
                self._after(self.buf, events)
            self.args, self.tail = None, False
        elif self.in_call:
            self._body(self.buf, "", events)
        else:
            self._outside(self.buf, events)
        self.buf, self.in_call = "", False
        return events

    def _stream(self, events: list) -> bool:
        """Pass on the streamed call's arguments written so far; True once the call has ended."""
        if not self.tail:
            depth, quoted, escaped = self.args  # type: ignore[misc]
            n = 0
            for n, ch in enumerate(self.buf, 1):
                if escaped:
                    escaped = False
                elif quoted:
                    escaped, quoted = ch == "\\", ch != '"'
                elif ch == '"':
                    quoted = True
                elif ch in "{[":
                    depth += 1
                elif ch in "}]":
                    depth -= 1
                    if depth == 0:
                        self.tail = True
                        break
            self.args = [depth, quoted, escaped]
            if n:
                events.append(("arguments", self.buf[:n]))
            self.buf = self.buf[n:]
            if not self.tail:
                return False
        j = self.buf.find(CLOSE)
        if j < 0:
            return False
        self._after(self.buf[:j], events)
        self.buf, self.in_call, self.args, self.tail = self.buf[j + len(CLOSE):], False, None, False
        return True

    def _after(self, rest: str, events: list) -> None:
        """A streamed call's end: the grammar makes `rest` its closing brace; anything else is shown."""
        self.trim, self.held_space, self.gap = True, "", ""
        if rest.strip() != "}":
            self._text(rest, events)

    def _body(self, body: str, close: str, events: list) -> None:
        call = _call(body.strip())
        if call is None:  # shown as it was, with the space before it
            self.sure, self.held_space = False, self.space
            self._text(OPEN + body + close, events)
            return
        events.append(("call", call))
        self.calls += 1
        self.trim, self.held_space, self.gap = True, "", ""

    def _outside(self, text: str, events: list) -> None:
        self.gap += text
        self._text(text, events)

    def _text(self, text: str, events: list) -> None:
        if self.trim:
            text = text.lstrip()
        if not text:
            return
        text = self.held_space + text
        core = text.rstrip()
        self.held_space = text[len(core):]
        if core:
            self.trim = False
            events.append(("content", core))


def _prefix_tail(text: str, tag: str) -> int:
    """Length of the longest tail of text that is a proper prefix of tag."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def calls_of(events: list[tuple[str, Any]], calls: list[dict]) -> list[str]:
    """Add a parser's events up: the calls (their arguments' pieces joined) into `calls`; the content pieces."""
    content = []
    for kind, value in events:
        if kind == "content":
            content.append(value)
        elif kind == "call":
            calls.append(value)
        else:
            calls[-1]["function"]["arguments"] += value
    return content


def parse_tool_calls(text: str, forced: bool = False) -> tuple[str | None, list[dict]]:
    """(the text outside the calls, None if there is none; the calls, OpenAI tool call objects), as a streamed
    output's events add up (ToolCallParser; forced: the output is under Tools.grammar)."""
    parser = ToolCallParser(forced)
    calls: list[dict] = []
    content = "".join(calls_of(parser.feed(text) + parser.finish(), calls))
    return content or None, calls
