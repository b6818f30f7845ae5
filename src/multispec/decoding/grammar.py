"""A request's structured-output constraint, compiled for a Decoder's pair (structured.py has the grammar itself)."""
from __future__ import annotations

from dataclasses import replace

from multispec.drafting.proposers import Proposal
from multispec.drafting.suffix import first_child_law
from multispec.errors import MultispecError, check
from multispec.params import ParamError, SamplingParams
from multispec.structured import Grammar, GrammarState, bind
from multispec.tree import Tree


def request_grammar(params: SamplingParams, decoder) -> Grammar | None:
    """params.constraint compiled for the decoder's tokenizer, or None; an error names the field (ParamError), before
    any forward. A draft with another tokenizer cannot be masked by the grammar: refused."""
    constraint = params.constraint
    if constraint is None:
        return None
    try:
        check(decoder.pair.cross_vocab is None or not decoder.uses_draft,
              "structured output needs a draft of the target's own vocabulary (a draft with another tokenizer cannot "
              "be masked by the grammar); use a method without that draft")
        return bind(constraint, decoder.pair.tokenizer, decoder.vocab_size, decoder.eos_ids)
    except MultispecError as e:
        raise ParamError(str(e), constraint.kind) from None


def grammar_stats(grammar: Grammar | None, new_ids: list[int], metrics, warnings: list[str]) -> dict:
    """{"structured": ...} for a generation's stats ({} without a grammar): the constraint's kind, the tokens the
    grammar forced, and whether the output is complete under it (a warning when max_new_tokens or the context ran
    out first)."""
    if grammar is None:
        return {}
    complete = grammar.start().completes(new_ids)
    if not complete and metrics.finish_reason == "length":
        warnings.append(f"the output is incomplete under the {grammar.constraint.kind}: it ran out of tokens "
                        "(max_new_tokens or the context) before the grammar could end; raise max_new_tokens")
    forced = metrics.forced_tokens
    if forced and metrics.finish_reason == "stop" and not (new_ids and new_ids[-1] in grammar.eos):
        forced = min(forced, _forced_positions(grammar, new_ids))  # a stop string cut the output: the kept ones
    return {"structured": {"kind": grammar.constraint.kind, "complete": complete, "forced_tokens": forced,
                           "forced_fraction": forced / max(1, len(new_ids))}}


def _forced_positions(grammar: Grammar, ids: list[int]) -> int:
    """How many of `ids` the grammar allowed alone (the tokens it can have forced): the forced tokens counted
    during a generation include those a stop string then cut away, which are not in its output."""
    state, n = grammar.start(), 0
    for t in ids:
        n += state.single(grammar.vocab) is not None
        state.commit([t])
    return n


def without_refused(proposal: Proposal, grammar: GrammarState) -> Proposal:
    """A model-free proposal (lookup, suffix: deterministic, no draft law of its own) without the nodes whose path
    holds a token the grammar refuses: those have probability 0 under the constrained law, so no verifier accepts
    them, and the target need not score them. (On a tool call, half the rows lookup and suffix drafted on
    Qwen2.5-Coder were such tokens: a copy of the tool's schema or of an earlier call.) Lossless: the kept tree is
    itself a deterministic draft, verified with its own point-mass law (`first_child_law`, as the proposers give
    it; None where the run is greedy). A model's drafts are drawn from its masked law and never refused."""
    refused = grammar.refused(proposal.tree, proposal.tokens.tolist())
    if not any(refused):
        return proposal
    kept = [u for u, r in enumerate(refused) if not r]
    index = {u: i for i, u in enumerate(kept)}
    tree = Tree(tuple(-1 if u == 0 else index[proposal.tree.parents[u]] for u in kept))
    tokens = proposal.tokens[kept]
    q = None if proposal.q is None else first_child_law(tree, tokens, proposal.q.shape[-1]).to(proposal.q)
    return replace(proposal, tree=tree, max_tree=tree, tokens=tokens, q=q)
