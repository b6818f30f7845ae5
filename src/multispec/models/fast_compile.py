"""The fast backend's compiled steps: `torch.compile` of FastNet.run at a few fixed sizes.

A step of N <= 64 tokens is padded up to the next bucket size (1, 2, 4, ..., 64) so that a handful of compiled
graphs serve every round. Padding never touches results: padded tokens sit in cache rows past the real ones (rows a
real token never attends to: its mask column is False), each padded token attends only to itself (so no row of
softmax is empty and nothing non-finite reaches the cache), and the backend's cache length ends after the real
tokens, so the next step overwrites the padded rows.

CPU: the inductor C++ backend; the number of cache rows attended is a dynamic dimension, so one graph per bucket
serves every context length. CUDA: `mode="reduce-overhead"` (CUDA graphs), which needs static shapes and
addresses, so a step attends over every row of the cache (masked) and the cache tensors are marked static.
Compiled code is cached by torch on disk: $TORCHINDUCTOR_CACHE_DIR when the user set it, else
$MULTISPEC_CACHE_DIR/inductor (default ~/.cache/multispec/inductor, see multispec.paths.cache_root), also when
torch already filled the variable in with its own default (a temporary folder, lost at reboot). A second process
compiles much faster than the first. Progress lines name the model (its folder, e.g. target / draft) and count
the step sizes left.
"""
from __future__ import annotations

import os
import shutil
import sys

import torch

from multispec.errors import check

BUCKETS = (1, 2, 4, 8, 16, 32, 64)


def bucket(n: int) -> int:
    """The smallest bucket size >= n (n <= BUCKETS[-1])."""
    return next(b for b in BUCKETS if b >= n)


def compiled_step(net) -> "CompiledStep":
    """The net's compiled step for its device, made once and kept on the net."""
    key = net.device.type
    if key not in net.compiled:
        net.compiled[key] = CompiledStep(net)
    return net.compiled[key]


class CompiledStep:
    def __init__(self, net, full_width: bool | None = None):
        """full_width: attend over every cache row (static shapes, as CUDA graphs need); default on CUDA only."""
        _configure_torch()
        self.net = net
        on_cuda = net.device.type == "cuda"
        check(on_cuda or has_cpp_compiler(), "the compiled backend needs a C++ compiler on the CPU (torch inductor "
                                             "builds its kernels with g++ or clang++); install one or use the fast "
                                             "backend")
        self.full_width = on_cuda if full_width is None else full_width
        mode = "reduce-overhead" if on_cuda else None
        self.fn = torch.compile(net.run, fullgraph=True, dynamic=False, mode=mode)
        self.seen: set = set()  # buckets compiled so far
        self.label = model_label(net)

    def takes(self, n: int) -> bool:
        return n <= BUCKETS[-1]

    def prepare_cache(self, k_cache: list, v_cache: list) -> None:
        for t in (*k_cache, *v_cache):
            if self.full_width:
                torch._dynamo.mark_static_address(t)  # CUDA graphs replay in place on these buffers
            else:
                torch._dynamo.mark_dynamic(t, 1)  # cache rows differ from run to run: one graph for all

    def __call__(self, backend, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None,
                 start: int, want_hidden: bool):
        """Run N real tokens as a bucket-sized step. Returns (logits [N, V], hidden [N, H] or None)."""
        n = tokens.shape[0]
        b = bucket(n)
        total, dev = start + b, backend.device
        width = backend.k_cache[0].shape[1] if self.full_width else total
        # Fresh tensors every call (never the caller's): dynamo guards on how a tensor was made (inference mode or
        # not), and a caller's tensor of exactly bucket size would otherwise compile the bucket a second time.
        tok = torch.zeros(b, dtype=torch.long, device=dev)
        tok[:n] = tokens
        pos = torch.empty(b, dtype=torch.long, device=dev)
        pos[:n] = positions
        pos[n:] = positions[-1]  # padding at the last real position: a valid rotary angle, inside every window
        backend.pos[start:total] = pos
        full = self.padded_mask(mask, n, b, start, width, dev)
        masks = self.net.masks(full, pos, backend.pos[:width], start, b)
        if not self.full_width:
            for m in masks:
                torch._dynamo.mark_dynamic(m, 2)
        rows = torch.arange(start, total, device=dev)
        if b not in self.seen:
            self.seen.add(b)
            left = len(BUCKETS) - len(self.seen)
            print(f"multispec: compiling {self.label}: step size {b} ({len(self.seen)} of {len(BUCKETS)}, "
                  f"{left} to go{'' if left else ', done after this one'})", file=sys.stderr, flush=True)
        # hidden states always come out (one graph per bucket, not two); dropped here when not wanted
        logits, hidden = self.fn(tok, pos, rows, masks, backend.k_cache, backend.v_cache, None, True)
        hidden = hidden if want_hidden else None
        if self.full_width:  # a CUDA graph's outputs are overwritten by its next replay
            return logits[:n].clone(), (None if hidden is None else hidden[:n].clone())
        return logits[:n], (None if hidden is None else hidden[:n])

    @staticmethod
    def padded_mask(mask: torch.Tensor | None, n: int, b: int, start: int, width: int, dev) -> torch.Tensor:
        """bool [b, width]: the real tokens' mask (None: a causal chain after the cached rows) in the top-left
        corner, False over the padding's columns; each padded token sees only itself."""
        full = torch.zeros(b, width, dtype=torch.bool, device=dev)
        if mask is None:
            full[:n, :start] = True
            full[:n, start:start + n] = torch.ones(n, n, dtype=torch.bool, device=dev).tril()
        else:
            full[:n, :start + n] = mask.to(dev)
        full[n:, start + n:start + b] = torch.eye(b - n, dtype=torch.bool, device=dev)
        return full


def model_label(net) -> str:
    """How progress lines name a model: its folder (the default pair's are `target` and `draft`) and class."""
    from pathlib import Path

    path = getattr(getattr(getattr(net, "model_config", None), "_name_or_path", None), "strip", lambda: "")()
    folder = Path(path).name if path else ""
    return f"{folder} ({net.name})" if folder else net.name


def inductor_cache_dir() -> str:
    """Where compiled code goes: $TORCHINDUCTOR_CACHE_DIR if the user chose it, else multispec's cache folder.
    torch writes its own default (a temporary folder) into the variable the first time it looks: that value is
    not a user's choice and is replaced."""
    from multispec.paths import cache_root

    current = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if current:
        try:
            from torch._inductor.runtime.cache_dir_utils import default_cache_dir
            torch_default = os.path.abspath(default_cache_dir())
        except Exception:  # noqa: BLE001 - another torch version: trust the variable
            torch_default = None
        if os.path.abspath(current) != torch_default:
            return current
    return str(cache_root() / "inductor")


def has_cpp_compiler() -> bool:
    """Whether inductor's C++ backend can build kernels here ($CXX, else g++, c++ or clang++ on the PATH)."""
    return any(shutil.which(c) for c in (os.environ.get("CXX"), "g++", "c++", "clang++") if c)


_STEPS = 0  # compiled steps made in this process: every model of one class compiles the same function (its `run`)


def _configure_torch() -> None:
    """One graph per bucket, per model, per device: more than dynamo's default of 8 recompiles per function, and
    as many more for each model compiled in the process (dynamo counts a function's graphs across every model
    that runs it: a notebook, or the test suite in one process, that compiled several pairs ran past a limit sized
    for one model). Compiled artifacts go to a lasting folder unless the user chose one."""
    import torch._dynamo

    global _STEPS
    _STEPS += 1
    limit = 8 * len(BUCKETS) * 2 * _STEPS
    for name in ("recompile_limit", "cache_size_limit"):
        if getattr(torch._dynamo.config, name, limit) < limit:
            setattr(torch._dynamo.config, name, limit)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = inductor_cache_dir()
