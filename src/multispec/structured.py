"""Structured output: the target's law masked by a grammar (JSON schema, regular expression, choice, Lark/GBNF).

    generate(prompt, json_schema={...})      # or regex="...", choice=["yes", "no"], grammar="start: ..."

The constrained law of a token is the target's processed law restricted to the tokens the grammar allows after the
text so far, renormalised (vLLM's, SGLang's and llama.cpp's meaning). It is a history-dependent processor like the
penalties (decoding/node_history.py): in a drafted tree every node is masked by the grammar state *along its own
path* (the matcher advanced over the path's tokens, then rolled back), in verification and in drafting, so the
draft proposes what the grammar allows and every lossless verifier keeps the constrained law. Where the grammar
allows exactly one token, that token has probability 1: it is committed without asking the target and rides in
the next target forward (`forced`; SGLang's jump-forward), which is free speculation.

Masks come from llguidance (guidance-ai/llguidance, the engine of llama.cpp's and vLLM's grammars): no
dependencies, ~0.05 ms a mask on 49k and 262k vocabularies (benchmarks/structured/grammar_engines.py has the comparison with
xgrammar). Grammar text is checked when the request is built, before any model loads; a grammar is compiled once
per tokenizer.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch

from multispec.errors import MultispecError, check

KINDS = ("json_schema", "regex", "choice", "grammar")
MAX_FORCED = 64  # forced tokens committed in a row at most (each costs one mask)
# JSON as json.dumps(ensure_ascii=False) writes it: ", " and ": " between items, no other whitespace (a flexible
# layout lets a model pad with whitespace until max_tokens runs out, vLLM's `disable_any_whitespace`; a fixed one
# also forces more tokens), characters as themselves rather than \uXXXX escapes (a sampled model can spend a
# string's whole budget on six-token escapes of control characters)
JSON_LAYOUT: Any = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": ",
                    "json_allowed_escapes": "\"\\bfnrt"}


@dataclass(frozen=True)
class Constraint:
    """What the output must match: kind (one of KINDS) and its text (a JSON schema as JSON text, a regular
    expression, the choices as a JSON list, a Lark or GBNF grammar). `grammar`: llguidance's grammar text."""

    kind: str
    text: str
    grammar: str

    @classmethod
    def of(cls, json_schema=None, regex=None, choice=None, grammar=None) -> Constraint | None:
        """The one constraint given (or None), checked: errors name the field and the problem in one line."""
        given = {k: v for k, v in zip(KINDS, (json_schema, regex, choice, grammar)) if v is not None}
        check(len(given) <= 1, f"give at most one of json_schema, regex, choice and grammar (got "
                               f"{', '.join(given)})")
        if not given:
            return None
        kind, value = next(iter(given.items()))
        text = _text(kind, value)
        import llguidance

        try:
            compiled = llguidance.LLMatcher.grammar_from_json_schema(text, defaults=JSON_LAYOUT) \
                if kind == "json_schema" else llguidance.grammar_from(cast(Any, kind), text)
        except (ValueError, TypeError) as e:
            raise MultispecError(f"{kind}: {_one_line(str(e))}") from None
        problem = llguidance.LLMatcher.validate_grammar(compiled)
        check(not problem or problem.startswith("WARNING"), f"{kind}: {_one_line(problem)}")
        return cls(kind, text, compiled)


def _text(kind: str, value) -> str:
    if kind == "json_schema":
        if hasattr(value, "model_json_schema"):  # a pydantic model class, as openai's client takes
            value = value.model_json_schema()
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as e:
                raise MultispecError(f"json_schema: not valid JSON ({e})") from None
        check(isinstance(value, (dict, bool)), f"json_schema must be a JSON object (a dict or its JSON text), got "
                                               f"{type(value).__name__}")
        check(not _ref_loop(value), "json_schema: its root is a $ref that leads back to itself with nothing else (no "
                                    "value can match such a schema; give the schema itself)")
        return json.dumps(with_additional_properties(value, False))
    if kind == "choice":
        check(isinstance(value, (list, tuple)) and len(value) >= 1 and all(isinstance(c, str) and c for c in value),
              f"choice must be a non-empty list of non-empty strings, got {value!r}"[:200])
        return json.dumps(list(value))
    check(isinstance(value, str) and value.strip() != "", f"{kind} must be a non-empty string, got {value!r}"[:200])
    return value


# keywords whose value is a schema, a list of schemas or a name -> schema map (JSON Schema 2020-12 and draft 7)
_SUBSCHEMA = ("additionalProperties", "unevaluatedProperties", "items", "additionalItems", "unevaluatedItems",
              "contains", "propertyNames", "not", "if", "then", "else")
_SUBSCHEMAS = ("prefixItems", "anyOf", "oneOf", "allOf")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def with_additional_properties(schema, value: bool):
    """`schema` (a copy) with `additionalProperties: value` in every object schema that declares properties and does
    not say itself: at the root, nested, in $defs, items and anyOf/oneOf branches. value False is OpenAI's strict
    mode and vLLM's: the output has no keys but the declared ones. Left as they are: schemas that set
    additionalProperties or unevaluatedProperties, and those combined with others (allOf branches, a schema with
    allOf, a $ref with properties beside it), where closing one part would forbid the other's keys (the grammar
    engine intersects them); their parts are still visited."""
    return _walk(schema, value, True)


def _walk(schema, value: bool, close: bool):
    if isinstance(schema, list):
        return [_walk(s, value, close) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _SUBSCHEMA:
        if isinstance(out.get(key), (dict, list)):
            out[key] = _walk(out[key], value, True)
    for key in _SUBSCHEMAS:
        if isinstance(out.get(key), list):
            out[key] = [_walk(s, value, key != "allOf") for s in out[key]]
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: _walk(s, value, True) for name, s in out[key].items()}
    declares = "properties" in out or "patternProperties" in out
    combined = "allOf" in out or "$ref" in out
    if close and declares and not combined and "additionalProperties" not in out and \
            "unevaluatedProperties" not in out:
        out["additionalProperties"] = value
    return out


def _ref_loop(schema) -> bool:
    """Whether the root is a chain of bare $refs within the document that comes back to where it started
    ({"$ref": "#"}): a schema with no content, which the grammar engine compiles to an empty output."""
    seen: set[str] = set()
    node, ref = schema, "#"
    while isinstance(node, dict) and isinstance(node.get("$ref"), str) and \
            not (set(node) - {"$ref", "$schema", "$id", "$defs", "definitions", "title", "description"}):
        if ref in seen:
            return True
        seen.add(ref)
        ref = node["$ref"]
        if ref != "#" and not ref.startswith("#/"):
            return False
        node = schema
        for part in ref[2:].split("/") if ref != "#" else []:
            part = part.replace("~1", "/").replace("~0", "~")
            node = node.get(part) if isinstance(node, dict) else None
    return False


def _one_line(message: str) -> str:
    """llguidance's error messages span lines (a caret under the grammar): its first line and its 'error:' line."""
    lines = [ln.strip() for ln in str(message).splitlines() if ln.strip()]
    if not lines:
        return "invalid"
    extra = next((ln for ln in lines[1:] if ln.lower().startswith("error")), None)
    return lines[0] + (f" ({extra})" if extra else "")


_TOKENIZERS: dict = {}


def ll_tokenizer(tokenizer, vocab: int, eos_ids):
    """llguidance's view of a Hugging Face tokenizer (built once per tokenizer, vocabulary size and EOS set: ~0.3 s
    on 49k tokens, ~4 s on 262k)."""
    import llguidance.hf

    eos = sorted(eos_ids)
    key = (id(tokenizer), vocab, tuple(eos))
    hit = _TOKENIZERS.get(key)
    if hit is None or hit[0] is not tokenizer:
        check(bool(eos), "structured output needs an end-of-sequence token (the grammar ends the output with it)")
        try:
            ll = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab, eos_token=eos)
        except (ValueError, TypeError) as e:
            raise MultispecError(f"structured output: this tokenizer cannot be read by the grammar engine ({e})") \
                from None
        hit = _TOKENIZERS[key] = (tokenizer, ll)
    return hit[1]


@dataclass(frozen=True)
class Grammar:
    """A constraint bound to one tokenizer: what a generation's GrammarState is built from."""

    constraint: Constraint
    tokenizer: Any  # llguidance.LLTokenizer
    vocab: int
    eos: tuple[int, ...]

    def __post_init__(self) -> None:
        import llguidance

        # the matcher every state starts from, built once (~3 ms on SmolLM2's 49k tokens; a copy takes ~1 us)
        object.__setattr__(self, "_fresh", llguidance.LLMatcher(self.tokenizer, self.constraint.grammar,
                                                                log_level=0))

    def start(self) -> GrammarState:
        return GrammarState(self, self._fresh.deep_copy())  # type: ignore[attr-defined]


class GrammarState:
    """The grammar's state after the committed text (an llguidance matcher), with the masks of a tree's nodes
    along their own paths."""

    def __init__(self, grammar: Grammar, matcher=None):
        """matcher: an llguidance.LLMatcher at the grammar's start (Grammar.start gives a copy of its own); None:
        a new one."""
        import llguidance

        self.grammar = grammar
        self.m = matcher if matcher is not None else \
            llguidance.LLMatcher(grammar.tokenizer, grammar.constraint.grammar, log_level=0)
        check(not self.m.is_error(), f"{grammar.constraint.kind}: {_one_line(self.m.get_error())}")
        self.words = grammar.tokenizer.vocab_size
        self.eos = set(grammar.eos)
        self.ended = False  # an EOS was committed
        self._row = np.zeros(_words(self.words), dtype=np.int32)  # one packed mask, refilled by `forced`

    def commit(self, tokens: list[int]) -> None:
        """Advance over committed tokens. A round may commit tokens after an EOS (rows past the end allow anything;
        the engine cuts the output at the EOS): the grammar ignores them."""
        for t in tokens:
            if self.ended:
                return
            if not self.m.consume_token(int(t)):  # (a token drawn where the grammar had hit a dead end)
                raise MultispecError(f"{self.grammar.constraint.kind}: the grammar engine refused the output at "
                                     f"token {t}: {_one_line(self.m.get_error())[:300]}")
            self.ended = int(t) in self.eos

    @property
    def accepting(self) -> bool:
        """Whether the text so far is complete under the grammar."""
        return self.m.is_accepting()

    def completes(self, tokens: list[int]) -> bool:
        """Whether `tokens` (an output, with or without its final EOS) are allowed from here and end complete."""
        ids = [int(t) for t in tokens]
        if ids and ids[-1] in self.eos:
            ids.pop()  # try_consume_tokens takes text tokens only
        return self.m.try_consume_tokens(ids) == len(ids) and self.accepting

    def _fill(self, row: np.ndarray, vocab: int, m=None) -> np.ndarray:
        """row (int32 [W], C-contiguous), filled with the tokens the grammar allows next (after the committed text,
        or in matcher m: a copy advanced along a drafted path), packed as the engine packs them (token t: bit t % 32
        of word t // 32), the columns past `vocab` cleared. Returns row."""
        m = self.m if m is None else m
        m.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)  # (llguidance.numpy.fill_next_token_bitmask)
        if m.is_error():  # (in its error state the engine allows only an end: a silent, incomplete output)
            self.dead_end(m)
        word, bit = divmod(min(vocab, self.words), 32)
        if word < len(row):
            bits = row.view(np.uint32)
            bits[word] &= np.uint32((1 << bit) - 1)
            bits[word + 1:] = 0
        return row

    def mask(self, vocab: int) -> torch.Tensor:
        """bool [vocab]: the tokens the grammar allows next (columns past the tokenizer's words: none)."""
        return _unpack(self._fill(self._row, vocab)[None], vocab)[0]

    def single(self, vocab: int) -> int | None:
        """The one token the grammar allows next, or None when it allows none or several (read off the packed mask:
        no [vocab] array)."""
        bits = self._fill(self._row, vocab).view(np.uint32)
        words = np.flatnonzero(bits)
        if len(words) != 1:
            return None
        word = int(bits[words[0]])
        return None if word & (word - 1) else 32 * int(words[0]) + word.bit_length() - 1

    def node_masks(self, tree, tokens: list[int], rows, vocab: int) -> torch.Tensor:
        """bool [R, vocab]: node u's mask after the committed text and u's own path below the root (tokens[0] is
        the root, already committed), for u in rows; only their paths are walked. A node below a token the grammar
        refuses is unreachable (its parent's law gives it probability 0), as is one after the end: its row allows
        everything, so that it is a law at all. The masks are filled packed, one row per node, and unpacked at
        once.

        Each path is walked on a copy of the committed matcher (`deep_copy`, a few microseconds), never by consuming
        and rolling back the committed one: llguidance 1.9's `rollback` can leave a matcher whose later masks differ
        from a fresh one's over the same text (a drafted `read_file` call rolled back, then `write_file` committed,
        and the masks still closed the arguments after `path` alone: a refused token verified as allowed)."""
        want = list(rows)
        slot = {u: i for i, u in enumerate(dict.fromkeys(want))}  # each wanted node's packed row
        needed: set[int] = set()
        for u in slot:
            needed.update(tree.path_to(u))
        packed = np.zeros((len(slot), _words(self.words)), dtype=np.int32)
        everything = np.zeros(len(slot), dtype=bool)  # rows that allow every token

        def visit(u: int, m) -> None:  # m: the matcher after u's path (self.m at the root), None: unreachable
            if u in slot:
                i = slot[u]
                if m is None or not self._fill(packed[i], vocab, m).any():
                    if u == 0 and not self.ended:
                        self.dead_end()  # the committed text: the request ends here, its output so far kept
                    everything[i] = True
            kids = [c for c in tree.children[u] if c in needed]
            for j, c in enumerate(kids):
                if m is None:
                    visit(c, None)
                    continue
                # the last child may advance u's own copy (u's mask is filled); the committed matcher is never moved
                mc = m if j == len(kids) - 1 and m is not self.m else m.deep_copy()
                if mc.try_consume_tokens([int(tokens[c])]) == 1:
                    visit(c, mc)
                else:
                    if mc.is_error():  # the engine failed on a drafted token, not merely refused it
                        self.dead_end(mc)
                    visit(c, None)

        visit(0, self.m)
        masks = _unpack(packed, vocab)
        masks[torch.from_numpy(everything)] = True
        return masks if len(slot) == len(want) else masks[[slot[u] for u in want]]

    def refused(self, tree, tokens: list[int]) -> list[bool]:
        """Per node of a drafted tree (tokens[0] the root, committed): whether its path holds a token the grammar
        refuses after the committed text (such a node has probability 0 under the constrained law, so it is never
        accepted). Nodes past an EOS, and every node once the output has ended, are not refused. Walked on copies of
        the committed matcher, as `node_masks`."""
        out = [False] * len(tree)
        if self.ended:
            return out
        at: dict[int, object] = {0: self.m}  # node -> the matcher after its path; None: past an end
        for u in range(1, len(tree)):
            p = tree.parents[u]
            if out[p]:
                out[u] = True
            elif at[p] is None or int(tokens[u]) in self.eos:
                at[u] = None
            else:
                m = at[p].deep_copy()  # type: ignore[attr-defined]
                if m.try_consume_tokens([int(tokens[u])]) == 1:
                    at[u] = m
                else:
                    out[u] = True
        return out

    def dead_end(self, m=None) -> None:
        """The committed text can go no further under the grammar (the engine's limits, or a rule with no finite
        derivation): a clear error, raised in the sequence (which keeps its output so far). The grammar engine's
        own failure (a parser limit) is raised where it happens, on a drafted token too: the matcher cannot go on
        after it, and an output it then ended would be incomplete. m: the matcher that failed (the committed one if
        None)."""
        m = self.m if m is None else m
        kind, why = self.grammar.constraint.kind, m.get_error() if m.is_error() else ""
        raise MultispecError(f"{kind}: the grammar cannot go on from the output so far"
                             + (f": {_one_line(why)[:300]}" if why else " (no token and no end allowed)"))

    def probe(self, vocab: int) -> str | None:
        """What a fresh state hits within the tokens the grammar forces from its start (`forced`, MAX_FORCED at
        most): the grammar engine's refusal (a parser limit: a schema of thousands of properties; a rule with no
        finite derivation), or None. Checked when the constraint is bound, before any forward."""
        try:
            self.forced(vocab, MAX_FORCED)
        except MultispecError as e:  # (dead_end or commit: "<kind>: why")
            return str(e).split(": ", 1)[-1][:400]
        if not self.ended and not bool(self.mask(vocab).any()) and not self.accepting:
            return "it allows no output at all"
        return None

    def forced(self, vocab: int, limit: int) -> list[int]:
        """The tokens the grammar allows one at a time from here (each has probability 1 under the constrained
        law), at most `limit`; committed into the state."""
        out: list[int] = []
        while len(out) < min(limit, MAX_FORCED):
            tok = self.single(vocab)
            if tok is None:
                break
            self.commit([tok])
            out.append(tok)
            if self.ended:  # the forced token was an EOS
                break
        return out


def _words(tokens: int) -> int:
    """int32 words of a packed mask over `tokens` tokens."""
    return (tokens + 31) // 32


def _unpack(packed: np.ndarray, vocab: int) -> torch.Tensor:
    """bool [R, vocab] from packed masks int32 [R, W] (token t: bit t % 32 of word t // 32; columns past 32 W:
    none allowed)."""
    n = min(vocab, 32 * packed.shape[1])
    little = packed.astype("<i4", copy=False)  # (the bytes of each word, lowest first: a no-op on x86 and ARM)
    bits = np.unpackbits(little.view(np.uint8), axis=1, count=n, bitorder="little").view(bool)  # [R, n]
    if n == vocab:
        return torch.from_numpy(bits)
    out = np.zeros((packed.shape[0], vocab), dtype=bool)
    out[:, :n] = bits
    return torch.from_numpy(out)


def bind(constraint: Constraint | None, tokenizer, vocab: int, eos_ids) -> Grammar | None:
    """The constraint compiled for this tokenizer, or None; a grammar the tokenizer cannot express is refused."""
    if constraint is None:
        return None
    check(tokenizer is not None, "structured output needs the model's tokenizer")
    grammar = Grammar(constraint, ll_tokenizer(tokenizer, vocab, eos_ids), vocab, tuple(sorted(eos_ids)))
    problem = grammar.start().probe(vocab)  # a grammar error surfaces here, before any forward
    check(problem is None, f"{constraint.kind}: the grammar engine cannot serve it: {problem}")
    return grammar
