"""Sequence verifiers: verify a whole drafted chain or tree in one call (design §4.7 and issue 13).

A sequence verifier is a pure function of the drafted tree (topology and tokens), the target p and the draft q
at every node (q[u] = the law u's children were drawn from) and an explicit torch.Generator; it returns the
accepted path (node indices from the root 0) and the token that ends the round. Each has an exact-law twin
(`law`) for enumeration tests. Three kinds are registered:

- the node walk (`tree_walk`) of any node verifier, under that verifier's name (sd, rrs-wor, kseq, ...);
- `naive`: SpecInfer's naive sampling, one draw from p per visited node (what deterministic drafts use: prompt
  lookup's chains, suffix trees);
- `block`: block verification of a chain (Sun et al., ICLR 2025), drafts one per level from q;
- `traversal`: traversal verification of a tree (Weng et al., NeurIPS 2025), siblings drafted without
  replacement;
- `univer` / `univer-ot`: local optimal-transport plans composed under prefix acceptance, in post-order (UniVer,
  arXiv 2605.04543, as reconstructed in verify/univer.py), siblings drafted as `greedy-md` / i.i.d.;
- `gumbel` (chains) and `gls` (trees): drafter-invariant verification (issue 26, `verify.gumbel`). These are
  *keyed*: their last argument is a `keyed.PositionKeys` (seed and the absolute position each node draws), not
  a torch.Generator, and their drafts come from `drafting.coupled.coupled_draw` with the same keys.

`draft` is the node verifier whose `draw` is the draft law the sequence verifier needs; the engine drafts with it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from multispec.errors import MultispecError, check
from multispec.tree import Tree
from multispec.verify import REGISTRY, get_verifier
from multispec.verify.base import VerifierSpec
from multispec.verify.block import block_law, verify_block
from multispec.verify.gumbel import gumbel_chain_law, verify_gumbel
from multispec.verify.keyed import PositionKeys
from multispec.verify.rrs_wor import law_wor
from multispec.verify.naive import naive_law, verify_naive
from multispec.verify.traversal import traversal_law, verify_traversal
from multispec.verify.univer import ot_plan, univer_law, verify_univer
from multispec.verify.tree_walk import walk_tree, walk_tree_law

Outcome = tuple[tuple[int, ...], int]
# the last argument: a torch.Generator (or None), or a keyed.PositionKeys for a keyed verifier (`keyed`): which one
# a given function takes is its spec's `keyed` flag, not its type, so it is typed Any here
VerifyFn = Callable[[Tree, torch.Tensor, torch.Tensor, torch.Tensor, Any], Outcome]
LawFn = Callable[[Tree, torch.Tensor, torch.Tensor, torch.Tensor], "dict[Outcome, float]"]


@dataclass(frozen=True)
class SequenceVerifierSpec:
    """A verifier of a whole drafted tree.

    shapes: "chain" (every node has at most one child) or "tree".
    draft: the node verifier whose draw is the draft law (and, for a node walk, the verifier walked).
    verify_fn(tree, tokens long [N], p float [N, V], q float [N, V], generator) -> (path, next_token).
    law_fn(tree, tokens, p, q) -> {(path, next_token): probability}, the exact law of verify_fn.
    keyed: verify_fn's last argument is a keyed.PositionKeys instead of a generator, and `draw` cannot be used:
        the engine drafts with drafting.coupled.coupled_draw(q, n, keys) (issue 26).
    """

    name: str
    description: str
    lossless: bool
    shapes: str
    draft: VerifierSpec
    verify_fn: VerifyFn
    law_fn: LawFn
    source: str = ""
    keyed: bool = False

    @property
    def draw(self):
        """The draft law (the `draft` node verifier's draw): draw(q [B, V], n, generator) -> long [B, n]."""
        return self.draft.draw

    @property
    def draft_law(self) -> str:
        return self.draft.draft_law

    def check_widths(self, widths) -> None:
        """Raise MultispecError unless this verifier accepts trees whose nodes have these numbers of children."""
        widths = set(widths)
        if self.shapes == "chain":
            check(widths <= {1}, f"verifier {self.name!r} verifies chains only (width 1 at every level), "
                                 f"got widths {sorted(widths)}")
        for width in widths:
            self.draft.check_drafts(width)

    def verify(self, tree: Tree, tokens: torch.Tensor, p: torch.Tensor, q: torch.Tensor,
               generator: torch.Generator | PositionKeys | None) -> Outcome:
        """Verify one drafted tree (B = 1). Shapes as in the class docstring. A keyed verifier takes a
        keyed.PositionKeys in place of the generator (MultispecError otherwise)."""
        check(p.shape == q.shape and p.shape[0] == len(tree) == tokens.shape[0],
              f"tree of {len(tree)} nodes needs tokens [N], p and q [N, V]; got {tuple(tokens.shape)}, "
              f"{tuple(p.shape)}, {tuple(q.shape)}")
        return self.verify_fn(tree, tokens, p, q, generator)

    def law(self, tree: Tree, tokens: torch.Tensor, p: torch.Tensor, q: torch.Tensor) -> dict[Outcome, float]:
        """Exact law of `verify` for this drafted tree."""
        return self.law_fn(tree, tokens, p, q)

    def describe(self) -> dict:
        """A row of `multispec verifiers`."""
        kind = "node" if self.name in REGISTRY else "sequence"
        return {"name": self.name, "kind": kind, "lossless": self.lossless,
                "drafts": "1" if self.shapes == "chain" else self.draft.drafts, "shapes": self.shapes,
                "draft_law": self.draft_law, "description": self.description, "source": self.source}


def node_walk(spec: VerifierSpec) -> SequenceVerifierSpec:
    """The root-to-leaf walk (tree_walk) of a node verifier, as a sequence verifier."""
    return SequenceVerifierSpec(
        name=spec.name, description=spec.description, lossless=spec.lossless,
        shapes="chain" if spec.drafts == 1 else "tree", draft=spec,
        verify_fn=lambda tree, tokens, p, q, gen: walk_tree(tree, tokens, p, q, spec, gen),
        law_fn=lambda tree, tokens, p, q: walk_tree_law(tree, tokens, p, q, spec),
        source="node by node from the root (docs/design.md §4.7)")


def _keyed_only(q, n, generator):
    raise MultispecError("the gumbel/gls verifiers draft with the noise of each position, which draw(q, n, "
                         "generator) does not know: call multispec.drafting.coupled.coupled_draw(q, n, keys) "
                         "(the engine does not pass position keys yet, issue 26; docs/reproducible.md §5)")


def _no_plan(p, q, drafts):
    raise MultispecError("the gumbel/gls verifiers are sequence verifiers with position keys: no node plan")


def _coupled_draft(name: str, drafts: int | str) -> VerifierSpec:
    """The draft law of a keyed verifier. law_fn is its marginal (top-n Gumbel: n draws from q without
    replacement); draw refuses to run without position keys."""
    return VerifierSpec(
        name=name, description="coupled drafts: top-n of log q + G(seed, position)", lossless=True,
        drafts=drafts, draw_fn=_keyed_only, plan_fn=_no_plan, law_fn=law_wor,
        draft_law="coupled: top-n of log q + G(seed, position) (drafting.coupled.coupled_draw; marginally "
                  "without replacement from q)")


def _gls_law(tree, tokens, p, q):
    raise MultispecError("gls has no exact law for a fixed drafted tree (cousins share their depth's noise); "
                         "use multispec.verify.gumbel.round_law")


SEQUENCE_REGISTRY: dict[str, SequenceVerifierSpec] = {
    "block": SequenceVerifierSpec(
        name="block",
        description="block verification: the drafted chain is verified jointly (last stop wins), optimal "
                    "expected accepted length among chain verifiers",
        lossless=True, shapes="chain", draft=REGISTRY["sd"], verify_fn=verify_block, law_fn=block_law,
        source="Sun et al., ICLR 2025, arXiv 2403.10444, Algorithm 2"),
    "naive": SequenceVerifierSpec(
        name="naive",
        description="naive sampling: each visited node's token drawn from p, descending while it is a child's; "
                    "lossless for any drafts, optimal for point masses (lookup chains, suffix trees)",
        lossless=True, shapes="tree", draft=REGISTRY["rrs-wor"], verify_fn=verify_naive, law_fn=naive_law,
        source="SpecInfer (Miao et al., ASPLOS 2024) §4.2"),
    "traversal": SequenceVerifierSpec(
        name="traversal",
        description="traversal verification: leaf to root in post-order with sequence-level acceptance; "
                    "equals block on a chain",
        lossless=True, shapes="tree", draft=REGISTRY["rrs-wor"], verify_fn=verify_traversal,
        law_fn=traversal_law, source="Weng et al., NeurIPS 2025, arXiv 2505.12398"),
    "univer": SequenceVerifierSpec(
        name="univer",
        description="UniVer-style: greedy-md drafts (top k-1 + one sampled); each node's optimal plan towards its "
                    "prefix-scaled target, post-order as traversal; equals block on a chain",
        lossless=True, shapes="tree", draft=REGISTRY["greedy-md"], verify_fn=verify_univer, law_fn=univer_law,
        source="Weng, Hu, Yairi, arXiv 2605.04543 (reconstructed from its abstract; verify/univer.py)"),
    "univer-ot": SequenceVerifierSpec(
        name="univer-ot",
        description="UniVer-style with i.i.d. drafts: each node's exact ot plan towards its prefix-scaled target, "
                    "post-order; equals block on a chain",
        lossless=True, shapes="tree", draft=REGISTRY["ot"],
        verify_fn=lambda tree, tokens, p, q, gen: verify_univer(tree, tokens, p, q, gen, ot_plan),
        law_fn=lambda tree, tokens, p, q: univer_law(tree, tokens, p, q, ot_plan),
        source="as univer, with verify/ot.py's plan (ours)"),
    "gumbel": SequenceVerifierSpec(
        name="gumbel",
        description="drafter-invariant: accept a draft iff it is the target's Gumbel-max token under the "
                    "position's keyed noise; the text is fixed by the seed whatever the draft",
        lossless=True, shapes="chain", draft=_coupled_draft("gumbel", 1), verify_fn=verify_gumbel,
        law_fn=gumbel_chain_law, keyed=True,
        source="Daliri, Musco, Suresh, arXiv 2408.07978 (issue 26)"),
    "gls": SequenceVerifierSpec(
        name="gls",
        description="drafter-invariant trees: siblings are the top-n of log q + G under the position's noise; "
                    "the committed token is the target's Gumbel-max token whatever the tree",
        lossless=True, shapes="tree", draft=_coupled_draft("gls", "any"), verify_fn=verify_gumbel,
        law_fn=_gls_law, keyed=True,
        source="Gumbel-max list sampling (NeurIPS 2025), target on one noise slot (issue 26)"),
}


def get_sequence_verifier(name: str) -> SequenceVerifierSpec:
    """`block`, `traversal`, or the node walk of the node verifier called `name`; MultispecError otherwise."""
    if name in SEQUENCE_REGISTRY:
        return SEQUENCE_REGISTRY[name]
    try:
        return node_walk(get_verifier(name))
    except MultispecError:
        raise MultispecError(f"unknown verifier {name!r}; valid names: "
                             f"{', '.join([*REGISTRY, *SEQUENCE_REGISTRY])}") from None


def all_verifiers() -> list[SequenceVerifierSpec]:
    """Every verifier the engine can run: node walks in REGISTRY order, then the sequence verifiers."""
    return [node_walk(spec) for spec in REGISTRY.values()] + list(SEQUENCE_REGISTRY.values())
