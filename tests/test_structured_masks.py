"""The grammar's masks, filled packed (structured.GrammarState): the same tokens as llguidance's own mask bytes.

GrammarState fills each mask into an int32 buffer (one bit a token), reads a forced token off the packed words
(`single`, `forced`) and unpacks a tree's node masks at once (`node_masks`). Here every one of them is checked
against a reference built only from llguidance's `compute_bitmask` bytes, token by token, on an independent matcher
advanced over the same text: a JSON schema, a tool call's grammar, a regex and a choice on the default pair's
tokenizer, and a regex over a four-token vocabulary (its tokens share one word), along seeded walks of allowed
tokens, at the model's vocabulary, a smaller one (a draft's rows), a larger one (rows past the tokenizer's words)
and one that ends just past the first allowed token. Broken variants must fail the same check: columns past a
smaller vocabulary left in the mask, and a forced token read from a word that holds several allowed tokens.
"""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch

import multispec
from multispec import structured
from multispec.tree import Tree
from test_structured_exact import EOS, REGEX, V, tiny_tokenizer

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 99},
                                           "kind": {"enum": ["alpha", "beta"]}},
          "required": ["name", "n", "kind"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city"], "additionalProperties": False}}}]
TREE = Tree((-1, 0, 0, 1, 1, 2, 3))  # two branches, one of them three deep


@pytest.fixture(scope="module")
def grammars():
    from multispec.tools import Tools

    pair = multispec.load_pair()
    vocab, eos = pair.target.config.vocab_size, {pair.tokenizer.eos_token_id}
    texts = {"json_schema": SCHEMA, "grammar": Tools.of(TOOLS, "required").grammar(pair.tokenizer),
             "regex": r"(0|[1-9][0-9]{0,3})( [a-z]+){2}", "choice": ["return x", "return None", "pass"]}
    tiny = structured.bind(structured.Constraint.of(regex=REGEX), tiny_tokenizer(), V, {EOS})  # a, b, c: one word
    return [structured.bind(structured.Constraint.of(**{k: v}), pair.tokenizer, vocab, eos)
            for k, v in texts.items()] + [tiny]


def reference_mask(matcher, words: int, vocab: int) -> torch.Tensor:
    """bool [vocab] from llguidance's mask bytes, as the grammar code read them before it filled packed words."""
    bits = np.unpackbits(np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8), bitorder="little")
    out = torch.zeros(vocab, dtype=torch.bool)
    n = min(vocab, words)
    out[:n] = torch.from_numpy(bits[:n].astype(bool))
    return out


def reference_nodes(matcher, words: int, tokens: list[int], vocab: int) -> torch.Tensor:
    """Each node's mask along its own path of TREE (tokens[0] the root): a copy of the matcher fed the path's
    tokens one at a time; every token after a refused one (or none allowed) gives a row that allows everything."""
    rows = []
    for u in range(len(TREE)):
        m = matcher.deep_copy()
        path = TREE.path_to(u)[1:]
        if all(m.try_consume_tokens([tokens[c]]) == 1 for c in path):
            mask = reference_mask(m, words, vocab)
            rows.append(mask if bool(mask.any()) else torch.ones(vocab, dtype=torch.bool))
        else:
            rows.append(torch.ones(vocab, dtype=torch.bool))
    return torch.stack(rows)


def reference_forced(matcher, words: int, vocab: int, limit: int, eos) -> list[int]:
    """Tokens allowed one at a time (one nonzero in the reference mask), on a copy of the matcher."""
    m, out = matcher.deep_copy(), []
    while len(out) < limit:
        allowed = reference_mask(m, words, vocab).nonzero()
        if len(allowed) != 1:
            break
        out.append(int(allowed[0]))
        assert m.consume_token(out[-1])
        if out[-1] in eos:
            break
    return out


def check_walks(grammars, walks: int = 3, steps: int = 40) -> None:
    import llguidance

    for g in grammars:
        vocabs = (g.vocab, g.vocab + 64) + ((g.vocab - 37,) if g.vocab > 64 else ())  # (tiny: EOS is its last)
        for seed in range(walks):
            rng = random.Random(seed)
            state = g.start()
            ref = llguidance.LLMatcher(g.tokenizer, g.constraint.grammar, log_level=0)  # independent of start()
            for _ in range(steps):
                allowed = reference_mask(ref, state.words, g.vocab).nonzero().flatten().tolist()
                if not allowed or state.ended:
                    break
                cut = vocabs + ((allowed[0] + 1,) if len(allowed) > 1 else ())  # the first allowed token alone
                for vocab in cut:
                    want = reference_mask(ref, state.words, vocab)
                    assert torch.equal(state.mask(vocab), want), (g.constraint.kind, vocab)
                    only = int(want.nonzero()[0]) if int(want.sum()) == 1 else None
                    assert state.single(vocab) == only, (g.constraint.kind, vocab)
                tokens = [0] + [rng.choice(allowed) if rng.random() < 0.7 else rng.randrange(g.vocab)
                                for _ in range(len(TREE) - 1)]
                for vocab in cut:
                    want = reference_nodes(ref, state.words, tokens, vocab)
                    got = state.node_masks(TREE, tokens, range(len(TREE)), vocab)
                    assert torch.equal(got, want), (g.constraint.kind, vocab, tokens)
                    assert torch.equal(state.node_masks(TREE, tokens, [5, 0, 5], vocab), want[[5, 0, 5]])
                forced = state.forced(g.vocab, 64)
                assert forced == reference_forced(ref, state.words, g.vocab, 64, state.eos), g.constraint.kind
                for t in forced:
                    assert ref.consume_token(t)
                if state.ended or not (allowed := reference_mask(ref, state.words, g.vocab).nonzero().flatten()
                                       .tolist()):
                    break
                t = rng.choice(allowed)
                state.commit([t])
                assert ref.consume_token(t)


def test_packed_masks_are_llguidances_own_token_by_token(grammars):
    check_walks(grammars)


@pytest.mark.parametrize("mutant", ["columns_past_vocab", "several_in_one_word"])
def test_broken_packed_masks_are_caught(grammars, monkeypatch, mutant):
    if mutant == "columns_past_vocab":  # the fill leaves the bits of tokens past a smaller vocabulary set
        def fill(self, row, vocab, m=None):
            (self.m if m is None else m).unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)
            return row

        monkeypatch.setattr(structured.GrammarState, "_fill", fill)
    else:  # a forced token read as the lowest bit of the one nonzero word, however many bits it holds
        def single(self, vocab):
            bits = self._fill(self._row, vocab).view(np.uint32)
            words = np.flatnonzero(bits)
            if len(words) != 1:
                return None
            word = int(bits[words[0]])
            return 32 * int(words[0]) + (word & -word).bit_length() - 1

        monkeypatch.setattr(structured.GrammarState, "single", single)
    with pytest.raises(AssertionError):
        check_walks(grammars)


def fn(name: str, required: list[str]) -> dict:
    return {"type": "function", "function": {"name": name, "description": "", "parameters": {
        "type": "object", "properties": {p: {"type": "string"} for p in required}, "required": required,
        "additionalProperties": False}}}


def walked_then_committed(pair, node_masks=None) -> tuple[torch.Tensor, torch.Tensor]:
    """A tool call's grammar (read_file(path) | write_file(path, content)): the masks of a drafted `read_file` call
    are walked, then the target's `write_file` call is committed. Returns (the state's mask, a fresh state's mask
    over the same text); they must be equal (after `"path": "a` the call must go on to `content`)."""
    from multispec.tools import Tools

    tok = pair.tokenizer
    vocab = pair.target.config.vocab_size
    text = Tools.of([fn("read_file", ["path"]), fn("write_file", ["path", "content"])], "required").grammar(tok)
    g = structured.bind(structured.Constraint.of(grammar=text), tok, vocab, {tok.eos_token_id})
    state = g.start()
    head = state.forced(vocab, 64)  # <tool_call>\n{"name": "
    drafted = tok.encode('read_file", "arguments": {"path": "a', add_special_tokens=False)
    chain = Tree(tuple(range(-1, len(drafted))))
    (node_masks or structured.GrammarState.node_masks)(state, chain, [0] + drafted, range(len(chain)), vocab)
    actual = tok.encode('write_file", "arguments": {"path": "a', add_special_tokens=False)
    state.commit(actual)
    fresh = g.start()
    fresh.commit(head + actual)
    return state.mask(vocab), fresh.mask(vocab)


def rollback_walk(self, tree, tokens, rows, vocab):
    """The walk before the fix: each path consumed on the committed matcher and rolled back (llguidance 1.9's
    rollback then leaves later masks that differ from a fresh matcher's)."""
    out = []
    for u in rows:
        path = tree.path_to(u)[1:]
        n = 0
        while n < len(path) and self.m.try_consume_tokens([int(tokens[path[n]])]) == 1:
            n += 1
        row = np.zeros(structured._words(self.words), dtype=np.int32)
        out.append(self._fill(row, vocab) if n == len(path) else row)
        if n:
            self.m.rollback(n)
    return out


def test_walking_a_drafted_call_leaves_the_committed_grammar_as_a_fresh_one():
    """Qwen2.5-Coder's tool-call run (benchmarks/tools/tool_speed.py) drafted a suffix copy of an earlier read_file
    call inside a write_file call; after the walk the committed state allowed `"}}` after `path` alone, the
    verifier accepted it and the grammar refused the commit. The walk now works on copies."""
    got, want = walked_then_committed(multispec.load_pair())
    assert torch.equal(got, want)


def test_the_rollback_walk_is_caught():
    got, want = walked_then_committed(multispec.load_pair(), rollback_walk)
    assert not torch.equal(got, want)
