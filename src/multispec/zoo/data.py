"""Token data for training: tokenize a corpus text once and cache it as a uint16 memmap beside it."""
import hashlib
from pathlib import Path

import numpy as np
import torch

from multispec.errors import MultispecError
from multispec.zoo.corpus import read_documents
from multispec.zoo.tokenizer import load_tokenizer

EOT_ID = 0


def tokenizer_hash(tokenizer_dir: str | Path) -> str:
    f = Path(tokenizer_dir) / "tokenizer.json"
    if not f.is_file():
        raise MultispecError(f"tokenizer not found: {f}")
    return hashlib.sha256(f.read_bytes()).hexdigest()[:12]


def token_file(corpus: str | Path, split: str, tokenizer_dir: str | Path) -> np.ndarray:
    """uint16 [N] token ids of corpus/<split>.txt: EOT, file, EOT, file, ... (cached as <split>.<hash>.bin)."""
    corpus = Path(corpus)
    cache = corpus / f"{split}.{tokenizer_hash(tokenizer_dir)}.bin"
    if not cache.is_file():
        tok = load_tokenizer(tokenizer_dir)
        if tok.get_vocab_size() > 65535:
            raise MultispecError(f"tokenizer vocabulary {tok.get_vocab_size()} does not fit uint16")
        docs = read_documents(corpus / f"{split}.txt")
        chunks = []
        for i in range(0, len(docs), 256):
            for enc in tok.encode_batch(docs[i:i + 256], add_special_tokens=False):
                chunks.append(np.array([EOT_ID], dtype=np.uint16))
                chunks.append(np.asarray(enc.ids, dtype=np.uint16))
        ids = np.concatenate(chunks)
        tmp = cache.with_suffix(".tmp")
        ids.tofile(tmp)
        tmp.rename(cache)  # atomic: a half-written cache is never read
    return np.memmap(cache, dtype=np.uint16, mode="r")


def get_batch(data: np.ndarray, batch_size: int, block_size: int,
              gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random windows of the token stream: x, y int64 [B, T] with y shifted by one (CPU tensors)."""
    if len(data) <= block_size + 1:
        raise MultispecError(f"token data has {len(data)} tokens, fewer than block_size + 2 = {block_size + 2}")
    ix = torch.randint(len(data) - block_size - 1, (batch_size,), generator=gen).tolist()
    x = torch.stack([torch.from_numpy(data[i:i + block_size].astype(np.int64)) for i in ix])  # [B, T]
    y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + block_size].astype(np.int64)) for i in ix])  # [B, T]
    return x, y
