"""Tiny random-init models built in-process, for tests that must not depend on ../shared."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

# Trained models and data sets live outside the repository: $MULTISPEC_MODELS (a folder holding pycode-v1/) and
# $MULTISPEC_DATA (the data folder, as for `multispec bench`), by default ../shared/models and ../shared/data.
SHARED = Path(__file__).resolve().parents[2] / "shared"
MODELS = Path(os.environ.get("MULTISPEC_MODELS") or SHARED / "models")
PYCODE = MODELS / "pycode-v1"
DATA = Path(os.environ.get("MULTISPEC_DATA") or SHARED / "data")

needs_pycode = pytest.mark.skipif(not (PYCODE / "target").is_dir(),
                                  reason=f"needs {PYCODE} (not present; set MULTISPEC_MODELS to the folder holding "
                                         "pycode-v1/)")
needs_data = pytest.mark.skipif(not DATA.is_dir(),
                                reason=f"needs {DATA} (not present; set MULTISPEC_DATA to the data folder)")


def tiny_llama(vocab: int = 16, hidden: int = 32, layers: int = 2, heads: int = 4, kv_heads: int = 2,
               seed: int = 0, scale: float = 1.0) -> torch.nn.Module:
    """A random Llama (grouped-query attention when kv_heads < heads) in fp32. `scale` multiplies the output
    embedding so that distributions are peaked enough to make drafts agree sometimes."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=256,
                      bos_token_id=0, eos_token_id=None, pad_token_id=None, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).float().eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    return model


def save_tiny_pair(root: Path, vocab_text: str = "def return if else for in range print ( ) : = + - 0 1 2 n x\n",
                   bos: bool = True) -> dict:
    """Write a tiny target/draft pair with a real byte-level BPE tokenizer to `root`; returns their paths.
    Also writes `draft_other_vocab` (a different vocabulary size) and `not_causal` (a vision config).
    bos: the tokenizer's post-processor puts <|endoftext|> (id 0) before every text, as the zoo's do; False: a
    GPT-2-style tokenizer that adds nothing."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from multispec.zoo.tokenizer import add_bos
    from transformers import PreTrainedTokenizerFast, ViTConfig

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([vocab_text * 20], trainer)
    if bos:
        add_bos(tok)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                                   pad_token="<|endoftext|>")
    vocab = tok.get_vocab_size()
    paths = {}
    for name, seed, v in (("target", 0, vocab), ("draft", 1, vocab), ("draft_other_vocab", 2, vocab + 7)):
        model = tiny_llama(vocab=v, hidden=32, layers=1, heads=2, kv_heads=1, seed=seed)
        model.generation_config.eos_token_id = 0
        path = root / name
        model.save_pretrained(path)
        if name == "target":
            fast.save_pretrained(path)
        paths[name] = path
    not_causal = root / "not_causal"
    ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64).save_pretrained(
        not_causal)
    paths["not_causal"] = not_causal
    return paths


def forward_rows(backend, ids: torch.Tensor, ctx: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits of an n-row forward after ctx cached tokens, logits of the same rows as n one-row forwards)."""
    from multispec.models import causal_mask

    backend.reset()
    backend.forward(ids[:ctx], torch.arange(ctx), causal_mask(0, ctx))
    many = backend.forward(ids[ctx:ctx + n], torch.arange(ctx, ctx + n), causal_mask(ctx, n)).logits[-n:]
    backend.keep(torch.arange(ctx))
    one = [backend.forward(ids[ctx + i:ctx + i + 1], torch.tensor([ctx + i]), causal_mask(ctx + i, 1)).logits[-1]
           for i in range(n)]
    return many, torch.stack(one)


def run_cli(capsys, *args) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `multispec ARGS`, run in-process."""
    from multispec.cli import main

    try:
        main(list(args))
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 0
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code, err, needle):
    """The CLI's bad-input contract: exit 2, one `error:` line on stderr naming the problem, no traceback."""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], err
    assert "Traceback" not in err
