"""The embedded default pair: shipped inside the package, under 12 MB, loads with no arguments, and generates."""
from pathlib import Path

import multispec

PAIR_DIR = Path(multispec.__file__).parent / "default_pair"


def test_default_pair_is_small_and_complete():
    files = [f for f in PAIR_DIR.rglob("*") if f.is_file()]
    assert sum(f.stat().st_size for f in files) <= 12 * 1024 * 1024
    for role in ("target", "draft"):
        for name in ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json"):
            assert (PAIR_DIR / role / name).is_file(), f"{role}/{name}"
        assert not (PAIR_DIR / role / "ckpt.pt").exists()


def test_default_pair_generates_losslessly():
    pair = multispec.load_pair()
    sampled = multispec.generate(pair, "def fibonacci(n):", max_new_tokens=16, seed=0)
    assert sampled.stats["temperature"] == 0.7 and sampled.stats["top_k"] == 50  # its generation_config.json
    assert sampled.stats["lossless"] and sampled.stats["new_tokens"] == 16
    ar = multispec.generate(pair, "def fibonacci(n):", method="ar", max_new_tokens=24, temperature=0.0)
    for method in ("sd", "mcsd"):
        out = multispec.generate(pair, "def fibonacci(n):", method=method, max_new_tokens=24, temperature=0.0)
        assert out.token_ids == ar.token_ids
