"""train-head's data cache (`--cache DIR`): the target's own text and its features kept between runs, so that a
rerun or a `--resume` spends its budget training, and an interrupted preparation goes on where it stopped.

    DIR/meta.json        the target's fingerprint and the recipe fields the data depends on (seq_len, seed);
                         a cache made for another target or recipe is refused in one line
    DIR/own-NAME.jsonl   one row {"ids": [...]} per prompt of an `own` source (NAME: `builtin`, or the prompt
                         file's stem), appended as each generation batch ends; a rerun starts at the next prompt
    DIR/features.pt      {"chunks": long [n, L], "feats": float16 [m, L, H]}: the features of the first m of the
                         run's n chunks, rewritten after each collection; a rerun with the same chunks collects
                         from chunk m on
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from multispec.errors import check


class DataCache:
    """One train-head data cache folder (module docstring)."""

    def __init__(self, path: str | Path, target: torch.nn.Module, seq_len: int, seed: int):
        from multispec.models.eagle_io import fingerprint

        self.path = Path(path)
        check(not self.path.exists() or self.path.is_dir(), f"--cache {self.path}: exists and is not a folder")
        self.path.mkdir(parents=True, exist_ok=True)
        meta = {"target_fingerprint": fingerprint(target), "seq_len": seq_len, "seed": seed}
        known = self.path / "meta.json"
        if known.is_file():
            old = json.loads(known.read_text())
            check(old == meta, f"--cache {self.path} holds data for another target or recipe ({old}; this run: "
                               f"{meta}): choose another folder")
        else:
            known.write_text(json.dumps(meta, indent=1) + "\n")

    # ---------------------------------------------------------------------------------------------- own text
    def own_rows(self, name: str) -> list[list[int]]:
        """The cached continuations of own source `name` (prompt + continuation ids, one per prompt, in the
        order the prompts were generated)."""
        f = self.path / f"own-{name}.jsonl"
        if not f.is_file():
            return []
        rows = []
        for line in f.read_text().splitlines():
            try:
                rows.append([int(t) for t in json.loads(line)["ids"]])
            except (ValueError, KeyError, TypeError):
                break  # a row cut by an interrupted write: generated again
        return rows

    def own_sink(self, name: str):
        """A function appending one prompt's row (ids) to own source `name`'s file, flushed at once."""
        f = self.path / f"own-{name}.jsonl"

        def append(ids: list[int]) -> None:
            with f.open("a") as out:
                out.write(json.dumps({"ids": ids}) + "\n")
        return append

    # ---------------------------------------------------------------------------------------------- features
    def features(self, chunks: torch.Tensor) -> torch.Tensor | None:
        """float16 [m, L, H]: the cached features of the first m of `chunks` (long [n, L]) when the cache was
        collected over these same chunks; else None."""
        f = self.path / "features.pt"
        if not f.is_file():
            return None
        saved = torch.load(f, map_location="cpu", weights_only=True)
        same = saved["chunks"].shape == chunks.shape and torch.equal(saved["chunks"], chunks.cpu())
        return saved["feats"] if same else None

    def save_features(self, chunks: torch.Tensor, feats: torch.Tensor) -> None:
        """Keep `feats` (float16 [m, L, H], the features of the first m of `chunks`, long [n, L])."""
        tmp = self.path / "features.pt.tmp"
        torch.save({"chunks": chunks.cpu(), "feats": feats.cpu()}, tmp)
        tmp.replace(self.path / "features.pt")
