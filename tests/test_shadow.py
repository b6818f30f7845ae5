"""--shadow-target: the shadow model never changes outputs, and its cache stays in step with the target's."""
import json

import pytest
import torch

from engine_utils import tiny_pair
from multispec.bench.hf_assisted import hf_assisted_generate
from multispec.decoding.engine import generate_ids
from multispec.errors import MultispecError
from multispec.decoding.methods import build_method
from multispec.models import forward_chain, make_backend
from multispec.models.shadow import (ShadowBackend, make_shadow_backend, parse_shadow_shape, shadow_hook,
                                     shadow_label, shadow_model)
from multispec.sampling import SamplingConfig

VOCAB = 8
PROMPT = [1, 3, 5, 2, 7]


def test_shape_parsing_and_label():
    assert parse_shadow_shape("12x768") == (12, 768)
    assert parse_shadow_shape(" 2X64 ") == (2, 64)
    assert shadow_label("12x768").startswith("SHADOW TARGET 12x768: step costs of a larger model")
    for bad in ("12", "12x700", "0x64", "x64", "12x768x2", "ax64"):
        with pytest.raises(MultispecError, match="shadow target"):
            parse_shadow_shape(bad)


def test_shadow_model_shape_and_rng_untouched():
    state = torch.random.get_rng_state()
    model = shadow_model("2x128", VOCAB)
    assert torch.equal(state, torch.random.get_rng_state())  # building it leaves the global RNG alone
    cfg = model.config
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.intermediate_size,
            cfg.vocab_size) == (2, 128, 2, 320, VOCAB)


def _fresh_rows(model, ids: list[int]) -> torch.Tensor:
    """float [L, H, len(ids), D]: the shadow's K rows after feeding `ids` as one plain chain."""
    b = make_shadow_backend(model, max_len=256)
    forward_chain(b, torch.tensor(ids))
    return torch.stack(b.k_cache)[:, :, :len(ids)].clone()


@pytest.mark.parametrize("method,options", [("sd", {"k": 3}), ("mcsd", {"tree": "2,2,1"}), ("ar", {}),
                                            ("ti-mcsd", {"tree": "2,2,1"})])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_engine_outputs_unchanged_and_cache_in_step(method, options, temperature):
    target, draft = tiny_pair(vocab=VOCAB)
    config = build_method(method, **options)
    sampling = SamplingConfig(temperature=temperature)
    model = shadow_model("2x64", VOCAB)
    outs = []
    for shadowed in (False, True):
        t = make_backend(target)
        if shadowed:
            shadow = make_shadow_backend(model, max_len=256)
            t = ShadowBackend(t, shadow)
        d = make_backend(draft) if config.name != "ar" else None
        new, c = generate_ids(t, d, PROMPT, config, sampling, 12, 5, set())
        outs.append(new)
        if shadowed:
            assert shadow.cache_len == t.inner.cache_len  # keep() applied to both
            seq = (PROMPT + new)[:shadow.cache_len]  # the last round may run past max_new: compare what is known
            assert torch.allclose(torch.stack(shadow.k_cache)[:, :, :len(seq)], _fresh_rows(model, seq), atol=1e-5)
            t.reset()
            assert shadow.cache_len == 0 == t.cache_len
    assert outs[0] == outs[1]


def test_broken_keep_is_caught():
    """The in-step check above can fail: a wrapper that crops the shadow instead of gathering the accepted tree
    path keeps the right number of rows but the wrong ones."""
    class Cropping(ShadowBackend):
        def keep(self, indices):
            self.shadow.keep(torch.arange(len(indices)))
            self.inner.keep(indices)

    target, draft = tiny_pair(vocab=VOCAB)
    model = shadow_model("2x64", VOCAB)
    shadow = make_shadow_backend(model, max_len=256)
    t = Cropping(make_backend(target), shadow)
    new, _ = generate_ids(t, make_backend(draft), PROMPT, build_method("mcsd", tree="3,2,1"),
                             SamplingConfig(temperature=1.0), 12, 0, set())
    seq = (PROMPT + new)[:shadow.cache_len]
    assert shadow.cache_len == t.inner.cache_len
    assert not torch.allclose(torch.stack(shadow.k_cache)[:, :, :len(seq)], _fresh_rows(model, seq), atol=1e-5)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_hf_assisted_hook_outputs_unchanged(temperature):
    target, draft = tiny_pair(vocab=VOCAB)
    model = shadow_model("2x64", VOCAB)
    shadow = make_shadow_backend(model, max_len=256)
    sampling = SamplingConfig(temperature=temperature)
    plain, _ = hf_assisted_generate(target, draft, PROMPT, sampling, 12, 3, set(), 3)
    handle = shadow_hook(target, shadow)
    try:
        shadowed, _ = hf_assisted_generate(target, draft, PROMPT, sampling, 12, 3, set(), 3)
    finally:
        handle.remove()
    assert plain == shadowed
    n = shadow.cache_len  # the rows transformers kept, fed in order: the prompt and the committed tokens
    assert len(PROMPT) <= n <= len(PROMPT) + len(shadowed)
    assert torch.allclose(torch.stack(shadow.k_cache)[:, :, :n], _fresh_rows(model, (PROMPT + shadowed)[:n]), atol=1e-5)


def test_bench_run_is_labelled_and_lossless(tmp_path):
    from test_bench import tiny_pair as bench_pair

    from multispec.bench import run_bench

    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"id": f"p{i}", "prompt": t}) + "\n" for i, t in enumerate(["def f(x):\n",
                                                                                                  "abc abc"])))
    out = tmp_path / "out"
    methods = "ar;sd:k=3;ar:backend=fast;hf-assisted:num_assistant_tokens=2"
    res = run_bench(pair=bench_pair(), datasets=str(data), methods=methods, temperatures=(0,), max_new_tokens=8,
                    warmup=0, out=out, progress=False, command=["test"], shadow_target="2x64")
    sh = res["settings"]["shadow_target"]
    assert sh["shape"] == "2x64" and sh["params"] > 0 and sh["label"] == shadow_label("2x64")
    assert res["cost"]["shadow_target"] == "2x64"
    assert (out / "results.md").read_text().startswith("# Benchmark results — SHADOW TARGET 2x64")
    top = [r for r in res["summary"] if r["category"] is None]
    assert {r["method"] for r in top} == set(methods.split(";"))
    assert all(r["greedy_identical"] == 1.0 for r in top)


def test_cli_bad_shadow_shape_fails_before_loading(tmp_path, capsys):
    from multispec.cli import main

    with pytest.raises(SystemExit) as e:
        main(["bench", "--target", str(tmp_path / "missing"), "--methods", "ar", "--shadow-target", "12x700",
              "--out", str(tmp_path / "out")])
    assert e.value.code == 2
    assert "shadow target '12x700'" in capsys.readouterr().err


def test_cli_summary_carries_the_label(tmp_path, capsys):
    from helpers import save_tiny_pair

    from multispec.cli import main

    paths = save_tiny_pair(tmp_path / "pair")
    data = tmp_path / "prompts.jsonl"
    data.write_text(json.dumps({"id": "p0", "prompt": "def f(x):"}) + "\n")
    main(["bench", "--target", str(paths["target"]), "--draft", str(paths["draft"]), "--dataset", str(data),
          "--methods", "ar;sd:k=2", "--max-new-tokens", "4", "--warmup", "0", "--threads", "1", "--quiet",
          "--shadow-target", "1x64", "--out", str(tmp_path / "out")])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == shadow_label("1x64") and shadow_label("1x64") in lines[-1]
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    assert saved["settings"]["shadow_target"]["label"] == shadow_label("1x64")
