"""Train a byte-level BPE tokenizer on a corpus and save it as a transformers tokenizer directory.

`<|endoftext|>` is id 0 and serves as BOS, EOS and padding; the tokenizer's post-processor puts it in front of every
encoded text (`tokenizer(text)` gives [0, ...], as Llama's and the shared pycode-v1 tokenizers do), so
transformers, vLLM and multispec all feed the models the BOS they were trained after. The directory holds tokenizer.json and
tokenizer_config.json, so `transformers.AutoTokenizer.from_pretrained(dir)` loads a PreTrainedTokenizerFast.
"""
import json
from pathlib import Path

from multispec.errors import MultispecError
from multispec.zoo.corpus import EOT, read_documents

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def train_tokenizer(corpus: str | Path, vocab_size: int, out: str | Path) -> Path:
    """Train on corpus/train.txt; returns the output directory."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < 257 or vocab_size > 65535:
        raise MultispecError(f"tokenizer: --vocab-size must be in [257, 65535] (byte alphabet + 1, uint16 ids), "
                             f"got {vocab_size}")
    docs = read_documents(Path(corpus) / "train.txt")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT],  # first special token -> id 0
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=True,
    )
    tok.train_from_iterator(docs, trainer=trainer, length=len(docs))
    if tok.token_to_id(EOT) != 0:
        raise MultispecError("tokenizer: <|endoftext|> did not get id 0")
    add_bos(tok)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=EOT, eos_token=EOT, pad_token=EOT, unk_token=None)
    fast.model_max_length = 1 << 20
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out)
    (out / "tokenizer_meta.json").write_text(json.dumps({"corpus": str(corpus), "vocab_size": tok.get_vocab_size(),
                                                         "type": "byte-level BPE", "eot_id": 0}, indent=1) + "\n")
    return out


def add_bos(tok) -> None:
    """Make a `tokenizers.Tokenizer` put <|endoftext|> (id 0) before every encoded text (add_special_tokens=True;
    corpora are encoded with add_special_tokens=False and keep their own separators)."""
    from tokenizers import processors

    tok.post_processor = processors.TemplateProcessing(single=f"{EOT} $A", pair=f"{EOT} $A $B:1",
                                                       special_tokens=[(EOT, 0)])


def load_tokenizer(path: str | Path):
    """The raw `tokenizers.Tokenizer` of a tokenizer (or model) directory."""
    from tokenizers import Tokenizer

    f = Path(path) / "tokenizer.json"
    if not f.is_file():
        raise MultispecError(f"tokenizer not found: {f}")
    return Tokenizer.from_file(str(f))
