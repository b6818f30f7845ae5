"""Tools (OpenAI function calling): a request's `tools` and `tool_choice` checked once (`Tools.of`), the grammar
that makes a model call them (`Tools.grammar`), and the one parser of the calls it writes (`ToolCallParser`).
Tokenizers only, no models: `multispec.generate`, `multispec chat` and `multispec serve` all use these.

The calls are Hermes style, the envelope of Qwen2.5's chat template (and of the shipped `hermes_tools.jinja`):

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

one or more, with any text beside them. tool_choice: "auto" (the model may call; calls are parsed), "none" (tools
are rendered, nothing is parsed), "required" (one or more calls, each a tool's name and arguments under its
parameters schema, forced by the grammar), {"type": "function", "function": {"name": ...}} (one call of that
function, forced). Under "auto", a function with `strict: true` makes the output either text or calls whose
arguments follow their schemas. The grammar only masks the target's law (structured.py): every method stays exact.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from importlib.resources import files

from multispec.errors import MultispecError
from multispec.params import ParamError
from multispec.structured import JSON_LAYOUT, Constraint

from multispec.tool_calls import CLOSE, OPEN, ToolCallParser, calls_of, parse_tool_calls, tool_call  # noqa: F401

CHOICES = ("auto", "none", "required")
NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")  # OpenAI's function names (and a dot, which some clients use)
HERMES_TEMPLATE = str(files("multispec") / "templates" / "hermes_tools.jinja")  # --chat-template for such models


@dataclass(frozen=True)
class Tools:
    """A request's tools, checked. functions: each {"name", "parameters", "strict", ...} in order; choice: auto,
    none, required or function (then `name` is the function's); parallel: more than one call allowed."""

    functions: tuple[dict, ...]
    choice: str = "auto"
    name: str | None = None
    parallel: bool = True

    @classmethod
    def of(cls, tools, tool_choice=None, parallel_tool_calls=None) -> Tools | None:
        """The request's tools, or None (no tools, tool_choice absent or none). Errors are ParamError naming the
        field (tools.1.function.name, tool_choice)."""
        if tools is None or (isinstance(tools, list) and not tools):
            if tool_choice not in (None, "none", "auto"):
                raise ParamError("tool_choice needs tools", "tool_choice")
            return None
        if not isinstance(tools, (list, tuple)):
            raise ParamError(f"tools must be a list of tool objects, got {type(tools).__name__}", "tools")
        functions = tuple(_function(t, i) for i, t in enumerate(tools))
        names = [f["name"] for f in functions]
        for i, n in enumerate(names):
            if n in names[:i]:
                raise ParamError(f"two tools are named {n!r}", f"tools.{i}.function.name")
        choice, name = _choice(tool_choice, names)
        if parallel_tool_calls is not None and not isinstance(parallel_tool_calls, bool):
            raise ParamError("parallel_tool_calls must be a boolean", "parallel_tool_calls")
        return cls(functions, choice, name, parallel_tool_calls is not False)

    @property
    def parse(self) -> bool:
        """Whether the output's calls are parsed (not under tool_choice none)."""
        return self.choice != "none"

    @property
    def forced(self) -> bool:
        """Whether the output is under the calls' grammar (Tools.grammar is not None): its calls cannot be malformed,
        so they stream as they are written (ToolCallParser)."""
        return self.choice in ("required", "function") or (self.choice == "auto" and
                                                          any(f.get("strict") for f in self.functions))

    def template_tools(self) -> list[dict]:
        """The tools as chat templates take them (OpenAI's tool objects)."""
        return [{"type": "function", "function": {k: v for k, v in f.items() if k != "strict"}}
                for f in self.functions]

    def grammar(self, tokenizer) -> str | None:
        """The Lark grammar the output must follow, or None (unconstrained): one call of the named function, one or
        more calls of any tool under required, text or strict calls under auto with a strict function. The
        envelope tags are the tokenizer's own tokens where it has them (Qwen2.5's <tool_call> is one token)."""
        if not self.forced:
            return None
        chosen = [f for f in self.functions if f["name"] == self.name] if self.choice == "function" else \
            list(self.functions)
        open_, close = _literal(tokenizer, OPEN), _literal(tokenizer, CLOSE)
        rules = [f"call: {' | '.join(f'call_{i}' for i in range(len(chosen)))}"]
        for i, f in enumerate(chosen):
            args = f["parameters"] if self.choice != "auto" or f.get("strict") else {"type": "object"}
            body = {"type": "object", "properties": {"name": {"const": f["name"]}, "arguments": args},
                    "required": ["name", "arguments"], "additionalProperties": False, "x-guidance": JSON_LAYOUT}
            rules.append(f'call_{i}: {open_} "\\n" body_{i} "\\n" {close}')
            rules.append(f"body_{i}: %json {json.dumps(body)}")
        # the calls, then an optional newline: these models write one after their last call and then end (Qwen2.5-
        # Coder: P(newline) = 0.9998 after </tool_call>, then P(<|endoftext|>) = 1). Without it the newline that
        # separates parallel calls was the only way on, and the model was made to call again until max_tokens.
        calls = 'call ("\\n" call)* "\\n"?' if self.parallel and self.choice != "function" else 'call "\\n"?'
        if self.choice == "auto":  # text (not starting a call), or calls
            rules.insert(0, f"start: TEXT | {calls}\nTEXT: ~/{re.escape(OPEN)}(.|\\n)*/")
        else:
            rules.insert(0, f"start: {calls}")
        return "\n".join(rules) + "\n"


def _function(tool, i: int) -> dict:
    where = f"tools.{i}"
    if not isinstance(tool, dict):
        raise ParamError(f"{where} must be a tool object ({{'type': 'function', 'function': {{...}}}})", where)
    if tool.get("type", "function") != "function":
        raise ParamError(f"{where}.type must be 'function', got {tool.get('type')!r}", f"{where}.type")
    f = tool.get("function")
    if not isinstance(f, dict):
        raise ParamError(f"{where}.function must be an object with a name", f"{where}.function")
    name = f.get("name")
    if not isinstance(name, str) or not NAME.match(name):
        raise ParamError(f"{where}.function.name must be 1 to 64 letters, digits, '_', '-' or '.', got {name!r:.80}",
                         f"{where}.function.name")
    params = f.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(params, dict):
        raise ParamError(f"{where}.function.parameters must be a JSON schema object, got {type(params).__name__}",
                         f"{where}.function.parameters")
    problem = _schema_problem(params)
    if problem:
        raise ParamError(f"{where}.function.parameters is not a usable JSON schema: {problem}",
                         f"{where}.function.parameters")
    if "description" in f and not isinstance(f["description"], str):
        raise ParamError(f"{where}.function.description must be a string", f"{where}.function.description")
    strict = f.get("strict", tool.get("strict"))
    if strict is not None and not isinstance(strict, bool):
        raise ParamError(f"{where}.function.strict must be a boolean", f"{where}.function.strict")
    out = {k: f[k] for k in ("name", "description") if k in f}
    return {**out, "parameters": params, "strict": bool(strict)}


def _schema_problem(schema: dict) -> str | None:
    """Why the grammar engine cannot take `schema` (None: it can)."""
    try:
        Constraint.of(json_schema=schema)
    except MultispecError as e:
        return str(e).removeprefix("json_schema: ")
    return None


def _choice(tool_choice, names: list[str]) -> tuple[str, str | None]:
    if tool_choice is None:
        return "auto", None
    if isinstance(tool_choice, str):
        if tool_choice not in CHOICES:
            raise ParamError(f"tool_choice must be one of {', '.join(CHOICES)} or {{'type': 'function', 'function': "
                             f"{{'name': ...}}}}, got {tool_choice!r:.80}", "tool_choice")
        return tool_choice, None
    f = tool_choice.get("function") if isinstance(tool_choice, dict) else None
    name = f.get("name") if isinstance(f, dict) else None
    if not isinstance(name, str) or tool_choice.get("type", "function") != "function":
        raise ParamError("tool_choice must be auto, none, required or {'type': 'function', 'function': {'name': ...}}",
                         "tool_choice")
    if name not in names:
        raise ParamError(f"tool_choice names the function {name!r:.80}, which is not among the tools "
                         f"({', '.join(names)})", "tool_choice.function.name")
    return "function", name


def _literal(tokenizer, text: str) -> str:
    """A grammar literal for `text`: the tokenizer's own token (<[id]>) where `text` is one added token (the
    grammar engine reads added tokens as special, never as the text they spell), else the quoted text."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) == 1 and ids[0] in getattr(tokenizer, "added_tokens_decoder", {}):
        return f"<[{ids[0]}]>"
    return json.dumps(text)
