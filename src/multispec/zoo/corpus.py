"""Collect Python source into a train/held-out text corpus, split by file.

Files are listed in a sorted, deterministic order, shuffled with a seed, deduplicated by content hash and
taken until the size budget is met; the last `heldout_frac` of the kept files is held out. Files are joined by
`<|endoftext|>` (files that contain that string themselves are skipped, so the separator is unambiguous).
"""
import hashlib
import json
import os
import random
import site
import sysconfig
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tqdm import tqdm

from multispec.errors import MultispecError

EOT = "<|endoftext|>"


def default_sources() -> list[Path]:
    """The Python standard library and the site-packages of the running interpreter."""
    paths = [Path(sysconfig.get_paths()["stdlib"])] + [Path(p) for p in site.getsitepackages()]
    return [p for p in paths if p.is_dir()]


@dataclass(frozen=True)
class CorpusConfig:
    sources: tuple[str, ...]
    out: str
    max_mb: float = 40.0
    heldout_frac: float = 0.02
    seed: int = 0
    max_file_kb: float = 256.0  # very large files are mostly generated tables; skip them

    def __post_init__(self) -> None:
        if not self.sources:
            raise MultispecError("corpus: no source directories given")
        for s in self.sources:
            if not Path(s).is_dir():
                raise MultispecError(f"corpus: source is not a directory: {s}")
        if not 0.0 < self.heldout_frac < 0.5:
            raise MultispecError(f"corpus: --heldout-frac must be in (0, 0.5), got {self.heldout_frac}")
        if self.max_mb <= 0 or self.max_file_kb <= 0:
            raise MultispecError("corpus: --max-mb and --max-file-kb must be positive")


@dataclass
class CorpusManifest:
    config: dict
    files_seen: int = 0
    files_train: int = 0
    files_heldout: int = 0
    mb_train: float = 0.0
    mb_heldout: float = 0.0
    skipped: dict = field(default_factory=dict)
    sha256: dict = field(default_factory=dict)  # of train.txt and heldout.txt, to check a reproduction


def list_py_files(sources: tuple[str, ...]) -> list[Path]:
    """Every .py file under the sources, in a sorted (deterministic) order; symlinks are not followed."""
    files = []
    for src in sources:
        for root, dirs, names in os.walk(src):
            dirs.sort()
            files += [Path(root) / n for n in sorted(names) if n.endswith(".py")]
    return files


def build_corpus(cfg: CorpusConfig) -> CorpusManifest:
    """Write train.txt, heldout.txt and corpus.json under cfg.out; returns the manifest."""
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    files = list_py_files(cfg.sources)
    random.Random(cfg.seed).shuffle(files)
    budget = int(cfg.max_mb * 1e6)
    seen_hashes: set[str] = set()
    kept: list[str] = []
    skipped = {"duplicate": 0, "not_utf8": 0, "too_large": 0, "empty": 0, "contains_separator": 0}
    total = 0
    with tqdm(total=budget, unit="B", unit_scale=True, desc="corpus") as bar:
        for path in files:
            if total >= budget:
                break
            try:
                raw = path.read_bytes()
            except OSError:
                continue
            if len(raw) > cfg.max_file_kb * 1e3:
                skipped["too_large"] += 1
                continue
            digest = hashlib.sha256(raw).hexdigest()
            if digest in seen_hashes:
                skipped["duplicate"] += 1
                continue
            seen_hashes.add(digest)
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                skipped["not_utf8"] += 1
                continue
            if not text.strip():
                skipped["empty"] += 1
                continue
            if EOT in text:
                skipped["contains_separator"] += 1
                continue
            kept.append(text)
            size = len(text.encode("utf-8"))
            total += size
            bar.update(size)
    if len(kept) < 2:
        raise MultispecError(f"corpus: found {len(kept)} usable .py files in {', '.join(cfg.sources)}; need at least 2")
    n_held = max(1, round(len(kept) * cfg.heldout_frac))
    train, held = kept[:-n_held], kept[-n_held:]
    sha = {}
    for name, docs in (("train.txt", train), ("heldout.txt", held)):
        data = EOT.join(docs).encode("utf-8")
        (out / name).write_bytes(data)
        sha[name] = hashlib.sha256(data).hexdigest()
    manifest = CorpusManifest(
        config=asdict(cfg),
        files_seen=len(files),
        files_train=len(train),
        files_heldout=len(held),
        mb_train=round(sum(len(t.encode()) for t in train) / 1e6, 3),
        mb_heldout=round(sum(len(t.encode()) for t in held) / 1e6, 3),
        skipped=skipped,
        sha256=sha,
    )
    (out / "corpus.json").write_text(json.dumps(asdict(manifest), indent=1) + "\n")
    return manifest


def read_documents(path: Path) -> list[str]:
    """The files of a corpus text (train.txt / heldout.txt), split on the separator."""
    if not path.is_file():
        raise MultispecError(f"corpus text not found: {path}")
    return path.read_text(encoding="utf-8").split(EOT)
