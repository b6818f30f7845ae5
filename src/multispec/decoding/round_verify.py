"""A round's verification (decoding/rounds.py calls it after the target's forward): the accepted path and the next
token from the verification forward's logits, greedy (each row's argmax, taken by the batch where it can) or sampled
(the verifier the run and the proposal choose). A sampled chain on a device other than the CPU is handed to the
engine as a `ChainVerify` request, and verified with the step's other chains in tensor operations
(verify/batched.py, engine.verify_chains)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from multispec.decoding.state import Run, State, adjusted_logits, choose_verifier
from multispec.drafting.proposers import Proposal
from multispec.models.base import Steps
from multispec.sampling import greedy_argmax, process_logits, sample
from multispec.tree import Tree
from multispec.verify.keyed import node_keys
from multispec.verify.tree_walk import walk_tree_greedy


def verify_round(run: Run, state: State, proposal: Proposal, out, lt: int) -> Steps[tuple[list[int], int]]:
    """The accepted path (node indices from the root) and the next token; records logprobs when asked. A sampled
    chain (sd, naive, block; a plain step too) on a device other than the CPU is verified with the step's others
    in tensor operations (`ChainVerify`); on the CPU the per-sequence walk is faster (verify/batched.py)."""
    tree, tokens, sampling = proposal.tree, proposal.tokens, run.sampling
    rows_history = state.node_history(tree, tokens, range(len(tree)), out.logits)
    # the adjusted logits are read greedy and for logprobs; sampling, process_logits adjusts them itself
    adjusted = adjusted_logits(out.logits, sampling, rows_history) if sampling.greedy or state.logprobs is not None \
        else None
    p = None
    if sampling.greedy:  # each row's argmax is all the greedy walk needs: no p, no q
        best = out.argmax if adjusted is None and out.argmax is not None else \
            greedy_argmax(adjusted if adjusted is not None else out.logits)  # (taken by the batch, else here)
        path, nxt = walk_tree_greedy(tree, tokens.tolist(), best.tolist())
    else:
        p = process_logits(out.logits, sampling, rows_history)
        rng = node_keys(tree, run.key, lt) if run.key is not None else run.gen_verify
        verifier = run.verifier if run.key is not None or proposal.verifier is None else \
            choose_verifier(run.method, sampling, False, proposal.verifier)
        kind = _batch_kind(run, tree, verifier)
        if kind is not None and (p.device.type != "cpu" or BATCH_VERIFY_ON_CPU):
            # the engine answers a ChainVerify with (path, next token), not a ForwardOut
            outcome = yield ChainVerify(tree, tokens, p, proposal.q, kind, run.gen_verify)  # type: ignore[misc]
            path, nxt = outcome  # type: ignore[misc]
        elif len(tree) == 1 and run.key is None and verifier.lossless:  # a plain step: every lossless verifier
            path, nxt = (0,), int(sample(p[0], run.gen_verify))  # draws the next token from p (as walk_tree does at a leaf)
        else:
            q = torch.zeros_like(p) if proposal.q is None else proposal.q
            # verify/ runs on the CPU with its CPU generators (a no-op there; on a GPU one copy of the tree's rows)
            path, nxt = verifier.verify(tree, tokens.cpu(), p.cpu(), q.cpu(), rng)
    if state.logprobs is not None:  # committed token i is scored by the row of path[i], the node above it
        rows = list(path)
        lp = state.logprobs.rows(sampling, out.logits[rows], None if adjusted is None else adjusted[rows],
                                 None if p is None else p[rows])
        state.logprobs.add(lp, [int(tokens[u]) for u in path[1:]] + [nxt])
    return list(path), nxt


BATCH_VERIFY_ON_CPU = False  # tests set it: the batched kernels' exactness on the CPU


@dataclass(frozen=True)
class ChainVerify:
    """A sampled chain's verification, which the engine runs with the step's others (verify/batched.chain_batch):
    tree a chain (or the root alone), tokens long [N], p float [N, V] (processed), q float [N, V] or None (point
    masses: naive), kind "sd" | "naive" | "block", generator the sequence's own verification stream."""

    tree: Tree
    tokens: torch.Tensor
    p: torch.Tensor
    q: torch.Tensor | None
    kind: str
    generator: torch.Generator


def _batch_kind(run: Run, tree: Tree, verifier) -> str | None:
    """The batched kernel that verifies this round's tree (verify/batched.KINDS), or None: a chain under sd, naive
    or block, or the root alone under any lossless verifier (a plain step: one draw from p); never keyed."""
    if run.key is not None or any(len(c) > 1 for c in tree.children):
        return None
    if len(tree) == 1:
        return "naive" if verifier.lossless else None
    return verifier.name if verifier.name in ("sd", "naive", "block") else None
