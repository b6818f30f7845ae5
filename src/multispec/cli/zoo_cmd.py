"""`multispec zoo`: corpus, tokenizer, train, eval and presets for the model zoo (see docs/zoo.md)."""
import json
from pathlib import Path

import click

from multispec.cli import cli
from multispec.errors import MultispecError


@cli.group("zoo")
def zoo() -> None:
    """Reproducible corpus, tokenizer and target/draft training; evaluation of a model or a pair."""


@zoo.command("presets")
@click.option("--json", "as_json", is_flag=True, help="Print the preset table as JSON.")
def presets_command(as_json: bool) -> None:
    """List the training presets with shapes and parameter counts."""
    from multispec.zoo.presets import PRESETS

    if as_json:
        click.echo(json.dumps([p.describe() for p in PRESETS.values()], indent=1))
        return
    for p in PRESETS.values():
        for role in ("target", "draft"):
            r = p.role(role)
            budget = f"{r.steps} steps" if r.steps else f"{r.minutes} min"
            params = r.shape.n_params(p.vocab_size) / 1e6
            click.echo(f"{p.name:<10} {role:<7} shape={r.shape!s:<18} params={params:7.2f}M "
                       f"(vocab {p.vocab_size})  batch={r.batch_size}x{r.block_size}  {budget}")


@zoo.command("corpus")
@click.option("--source", "sources", multiple=True, type=click.Path(), help="Directory of .py files (repeatable). "
              "Default: the standard library and site-packages of this interpreter.")
@click.option("--out", required=True, type=click.Path(), help="Output directory (train.txt, heldout.txt, corpus.json).")
@click.option("--max-mb", default=40.0, show_default=True, help="Stop collecting at this many MB of text.")
@click.option("--heldout-frac", default=0.02, show_default=True, help="Fraction of files held out.")
@click.option("--max-file-kb", default=256.0, show_default=True, help="Skip files larger than this.")
@click.option("--seed", default=0, show_default=True, help="Shuffle seed.")
def corpus_command(sources, out, max_mb, heldout_frac, max_file_kb, seed) -> None:
    """Collect .py files, deduplicate by content, shuffle, split train/held-out by file."""
    from multispec.paths import creatable_dir

    creatable_dir(out)  # before any slow work
    from multispec.zoo.corpus import CorpusConfig, build_corpus, default_sources

    srcs = tuple(sources) or tuple(str(p) for p in default_sources())
    cfg = CorpusConfig(sources=srcs, out=out, max_mb=max_mb, heldout_frac=heldout_frac, seed=seed,
                       max_file_kb=max_file_kb)
    m = build_corpus(cfg)
    click.echo(f"train: {m.files_train} files, {m.mb_train} MB; held-out: {m.files_heldout} files, {m.mb_heldout} MB "
               f"-> {Path(out) / 'corpus.json'}")


@zoo.command("tokenizer")
@click.option("--corpus", required=True, type=click.Path(), help="Corpus directory (from `zoo corpus`).")
@click.option("--vocab-size", default=4096, show_default=True)
@click.option("--out", required=True, type=click.Path())
def tokenizer_command(corpus, vocab_size, out) -> None:
    """Train a byte-level BPE tokenizer; <|endoftext|> is id 0 (bos/eos/pad)."""
    from multispec.paths import creatable_dir

    creatable_dir(out)  # before any slow work
    from multispec.zoo.tokenizer import train_tokenizer

    if not (Path(corpus) / "train.txt").is_file():
        raise MultispecError(f"tokenizer: {corpus} has no train.txt (run `multispec zoo corpus` first)")
    click.echo(f"saved {train_tokenizer(corpus, vocab_size, out)}")


@zoo.command("train")
@click.option("--role", type=click.Choice(["target", "draft"]), required=True)
@click.option("--preset", required=True, help="tiny, default or bench-gpu (`multispec zoo presets`).")
@click.option("--corpus", type=click.Path(), help="Corpus directory (from `zoo corpus`).")
@click.option("--tokenizer", type=click.Path(), help="Tokenizer directory (from `zoo tokenizer`).")
@click.option("--out", required=True, type=click.Path(), help="Output directory: HF model + training.json + ckpt.pt.")
@click.option("--teacher", type=click.Path(), default=None, help="Target directory to distil a draft from (KL + CE).")
@click.option("--resume", is_flag=True, help="Continue from OUT/ckpt.pt with the checkpoint's own configuration.")
@click.option("--max-minutes", type=float, default=None,
              help="Wall-clock budget (steps planned from measured throughput).")
@click.option("--steps", type=int, default=None, help="Fixed number of steps (overrides the preset budget).")
@click.option("--seed", default=1337, show_default=True)
@click.option("--eval-interval", default=250, show_default=True, help="Steps between held-out evals.")
@click.option("--threads", type=int, default=None, help="torch CPU threads (default: torch's default).")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
def train_command(role, preset, corpus, tokenizer, out, teacher, resume, max_minutes, steps, seed, eval_interval,
                  threads, device) -> None:
    """Train a target or a draft from scratch and save a Hugging Face directory."""
    from multispec.paths import creatable_dir

    creatable_dir(out)  # before any slow work
    from multispec.zoo.train import CKPT, TrainConfig, train

    if resume:
        # the checkpoint's own configuration is used; nothing else is read from the command line
        if not (Path(out) / CKPT).is_file():
            raise MultispecError(f"train: --resume but no checkpoint at {Path(out) / CKPT}")
        import torch

        cfg = TrainConfig.from_dict(torch.load(Path(out) / CKPT, map_location="cpu", weights_only=False)["config"])
    else:
        if corpus is None or tokenizer is None:
            raise MultispecError("train: --corpus and --tokenizer are required (unless --resume)")
        cfg = TrainConfig(role=role, preset=preset, corpus=corpus, tokenizer=tokenizer, out=out, teacher=teacher,
                          steps=steps, max_minutes=max_minutes, seed=seed, eval_interval=eval_interval,
                          threads=threads, device=device)
    rec = train(cfg, resume=resume)
    click.echo(f"{rec['role']} {rec['preset']}: {rec['params'] / 1e6:.2f}M params, {rec['steps']} steps, "
               f"{rec['tokens'] / 1e6:.2f}M tokens in {rec['wall_seconds'] / 60:.1f} min "
               f"({rec['tokens_per_second']:.0f} tokens/s); train loss {rec['final_train_loss']:.3f}, "
               f"held-out {rec['final_heldout_loss']:.3f} -> {out}")


@zoo.command("export")
@click.option("--model", required=True, type=click.Path(), help="A trained model directory (from `zoo train`).")
@click.option("--out", required=True, type=click.Path(), help="Destination: the HF files and training.json only.")
@click.option("--sample-temperature", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Write sampling defaults (do_sample, this temperature) into generation_config.json: what "
                   "`multispec generate` and transformers' `generate` use when no temperature is given.")
@click.option("--sample-top-k", type=click.IntRange(min=1), default=None, help="With --sample-temperature: top-k.")
def export_command(model, out, sample_temperature, sample_top_k) -> None:
    """Copy a trained model without its checkpoint (e.g. into src/multispec/default_pair/target)."""
    from multispec.paths import creatable_dir

    creatable_dir(out)  # before any slow work
    import shutil

    if sample_top_k is not None and sample_temperature is None:
        raise MultispecError("export: --sample-top-k needs --sample-temperature")
    from multispec.zoo.train import EXPORT_FILES

    src = Path(model)
    if not (src / "config.json").is_file() or not (src / "model.safetensors").is_file():
        raise MultispecError(f"export: {src} is not a trained model directory (config.json, model.safetensors)")
    Path(out).mkdir(parents=True, exist_ok=True)
    for name in EXPORT_FILES:
        if (src / name).is_file():
            shutil.copy(src / name, Path(out) / name)
    if sample_temperature is not None:
        from transformers import GenerationConfig

        gc = GenerationConfig.from_pretrained(out)
        gc.do_sample, gc.temperature, gc.top_k = True, sample_temperature, sample_top_k or 0
        gc.save_pretrained(out)
    size = sum(f.stat().st_size for f in Path(out).iterdir() if f.is_file())
    click.echo(f"exported {src} -> {out} ({size / 1e6:.2f} MB)")


@zoo.command("eval")
@click.option("--model", required=True, type=click.Path(), help="Model directory (the target when --draft is given).")
@click.option("--draft", type=click.Path(), default=None, help="Draft directory: also measure agreement with --model.")
@click.option("--heldout", type=click.Path(), default=None, help="Held-out text (heldout.txt of a corpus).")
@click.option("--dataset", type=click.Choice(["humaneval"]), default=None,
              help="Prompts for the agreement measurement.")
@click.option("--data-dir", type=click.Path(), default=None,
              help="Folder with humaneval.jsonl.gz (or env MULTISPEC_DATA).")
@click.option("--new-tokens", default=64, show_default=True, help="Greedy target tokens scored per prompt.")
@click.option("--limit", type=int, default=None, help="Use only the first N prompts.")
@click.option("--max-windows", default=64, show_default=True, help="Held-out windows of 256 tokens for agreement.")
@click.option("--json-out", type=click.Path(), default=None, help="Also write the result to this JSON file.")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="torch CPU threads (default: torch's default).")
def eval_command(model, draft, heldout, dataset, data_dir, new_tokens, limit, max_windows, json_out, threads) -> None:
    """Held-out loss (nats/token) of a model; with --draft, greedy agreement and mean sum min(p, q) at T=1."""
    from multispec.paths import writable_file

    if json_out:
        writable_file(json_out, "--json-out")  # before any model loads
    import torch

    from multispec.zoo import evaluate as ev

    if threads is not None:
        from multispec.threads import check_thread_count

        torch.set_num_threads(check_thread_count(threads))

    if heldout is None and dataset is None:
        raise MultispecError("eval: give --heldout FILE and/or --dataset humaneval")
    if heldout is not None and not Path(heldout).is_file():
        raise MultispecError(f"eval: --heldout file not found: {heldout}")
    prompts = ev.humaneval_prompts(data_dir)[:limit] if dataset == "humaneval" else None  # fail before loading models
    target, tok = ev.load_model(model)
    result: dict = {"model": str(model), "params": target.num_parameters()}
    if heldout is not None:
        ids = ev.encode_documents(tok, ev.read_documents(Path(heldout)))
        result["heldout"] = {"file": str(heldout), **ev.heldout_loss(target, ids)}
    if draft is not None:
        dmodel, _ = ev.load_model(draft)
        if dmodel.config.vocab_size != target.config.vocab_size:
            raise MultispecError(f"eval: draft vocabulary {dmodel.config.vocab_size} "
                                 f"!= target {target.config.vocab_size}")
        result["draft"] = {"model": str(draft), "params": dmodel.num_parameters()}
        if heldout is not None:
            result["draft"]["heldout_loss"] = ev.heldout_loss(dmodel, ids)["loss"]
            result["agreement_heldout"] = ev.agreement(target, dmodel, ev.heldout_windows(ids, 256, max_windows))
        if prompts is not None:
            seqs = ev.greedy_continuations(target, tok, prompts, new_tokens)
            result["agreement_humaneval"] = {"prompts": len(prompts), "new_tokens": new_tokens,
                                             **ev.agreement(target, dmodel, seqs)}
    text = json.dumps(result, indent=1)
    click.echo(text)
    if json_out:
        Path(json_out).write_text(text + "\n")
