"""The model zoo: reproducible corpus, tokenizer and target/draft training recipes.

`corpus` collects Python source into train/held-out text, `tokenizer` trains a byte-level BPE,
`train` trains a Llama-architecture target or (distilled) draft, `evaluate` measures held-out loss and
draft/target agreement. `presets` holds the named model shapes and budgets. See docs/zoo.md.
"""
