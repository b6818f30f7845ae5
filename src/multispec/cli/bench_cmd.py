"""`multispec bench`: every method on one prompt set, with the same token ids and seeds (docs/bench.md)."""
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import click

from multispec.cli import cli


def _floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated numbers such as 0,1, got {text!r}") from None


@cli.command("bench")
@click.option("--target", help="Target model: a Hugging Face folder or a .gguf file (default: the embedded default "
              "pair).")
@click.option("--draft", help="Draft model: a folder or a .gguf file (needed by every method but ar, auto, lookup and "
              "suffix).")
@click.option("--cross-vocab", type=click.Choice(["tli", "uag"]), help="A draft with another tokenizer: tli "
              "(default) drafts the tokens both vocabularies share; uag re-encodes the draft's text with the target's "
              "tokenizer (chains only). docs/cross_vocab.md")
@click.option("--dataset", "datasets", default="humaneval", show_default=True,
              help="Data set(s), comma-separated: humaneval, gsm8k, mt-bench, spec-bench, alpaca, or a .jsonl path.")
@click.option("--data-dir", help="Folder holding the data files (default: $MULTISPEC_DATA).")
@click.option("--prompt-field", default="prompt", show_default=True, help="Field of a .jsonl path data set.")
@click.option("--chat-template", "chat_template", type=click.Choice(["auto", "on", "off"]), default="auto",
              show_default=True, help="Chat data sets (spec-bench, mt-bench, alpaca) as one user message through the "
              "target's chat template: auto = when the target has one (as the Spec-Bench paper does), on = refuse a "
              "target without one, off = raw text. Code data sets stay raw text. Recorded in results.json. (--batch-size "
              "runs raw text.)")
@click.option("--methods", default="ar;sd:k=4;mcsd:tree=4-2-2-1", show_default=True,
              help="Method specs separated by ';', e.g. 'ar;sd:k=4;mcsd:tree=4-2-2-1,verifier=rrs-wor;"
                   "hf-assisted;hf-assisted:best'.")
@click.option("--temperatures", default="0", show_default=True, help="Comma-separated, 0 = greedy, e.g. 0,1.")
@click.option("--top-k", type=int, help="Keep the k most likely tokens (0 or -1: off).")
@click.option("--top-p", type=float)
@click.option("--max-new-tokens", type=int, default=128, show_default=True)
@click.option("--max-prompt-tokens", type=int, default=512, show_default=True,
              help="Longer prompts keep BOS and their last tokens (0: no truncation).")
@click.option("--limit", help="Prompts per data set (per category for spec-bench): N, or per data set as "
                             "'spec-bench=10,humaneval=20'.")
@click.option("--offset", type=int, default=0, show_default=True)
@click.option("--repeats", type=int, default=1, show_default=True, help="Timed runs per prompt and method.")
@click.option("--warmup", type=int, default=1, show_default=True, help="Untimed runs per method and temperature.")
@click.option("--best-probe", type=int, default=3, show_default=True,
              help="hf-assisted:best: prompts used to pick num_assistant_tokens.")
@click.option("--seed", type=click.IntRange(0, 2**63 - 1), default=0, show_default=True)
@click.option("--out", type=click.Path(), help="Output folder (results.json, results.md, *.png); default: "
              "bench-DATE-TIME in the current folder.")
@click.option("--threads", type=click.IntRange(min=1), help="torch CPU threads (default: the free cores, at most 4).")
@click.option("--device")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16", "int8", "int4", "w4a8"]))
@click.option("--shadow-target", metavar="LAYERSxHIDDEN",
              help="Cost-faithful regime: beside every target forward run a random-weight Llama of this shape "
                   "(e.g. 12x768, ~100M parameters) over the same tokens, so step costs are a larger model's while "
                   "acceptance stays the pair's. Labelled in every output.")
@click.option("--batch-size", type=click.IntRange(1, 256), help="Measure batched throughput instead: each method "
              "decodes every prompt, N sequences at a time; total tokens/s (hf-assisted specs become transformers' "
              "batched generate). Fast backend.")
@click.option("--profile", "profile", type=click.Path(exists=True, dir_okay=False), help="Plan from this machine "
              "profile file (multispec profile measure), read only: runs then depend on it, not on the cache folder.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def bench_command(target, draft, cross_vocab, datasets, data_dir, prompt_field, chat_template, methods, temperatures,
                  top_k, top_p, max_new_tokens, max_prompt_tokens, limit, offset, repeats, warmup, best_probe, seed,
                  out, threads, device, dtype, shadow_target, batch_size, profile, quiet):
    """Benchmark methods on a prompt set; writes results.json, results.md and plots to --out."""
    from multispec.bench import run_bench
    from multispec.bench.report import shadow_label_of, summarize
    from multispec.bench.specs import check_draft_given, parse_method_specs
    from multispec.paths import writable_dir
    from multispec.threads import set_threads

    out = out or f"bench-{time.strftime('%Y%m%d-%H%M%S')}"
    check_draft_given(parse_method_specs(methods), target is None or draft is not None,
                      hf_assisted_drafts=batch_size is None)
    if profile is not None:
        from multispec.profile import MachineProfile

        profile = MachineProfile.load(profile)  # before anything slow
    with _removed_if_left_empty(out):
        writable_dir(out)  # before anything slow
        threads, warning = set_threads(threads)
        if warning:
            click.echo(f"warning: {warning}", err=True)
        if batch_size is not None:
            _batch_bench(target, draft, cross_vocab, datasets, data_dir, methods, temperatures, batch_size,
                         max_new_tokens, limit, seed, out, device, dtype, shadow_target, quiet, chat_template,
                         profile)
            return
        results = run_bench(target=target, draft=draft, datasets=datasets, data_dir=data_dir, methods=methods,
                            temperatures=_floats(temperatures), top_k=top_k, top_p=top_p,
                            max_new_tokens=max_new_tokens, limit=limit, offset=offset, repeats=repeats, warmup=warmup,
                            seed=seed, out=out, threads=threads, device=device, dtype=dtype,
                            max_prompt_tokens=max_prompt_tokens or None, prompt_field=prompt_field,
                            best_probe=best_probe, progress=not quiet, command=["multispec", *sys.argv[1:]],
                            shadow_target=shadow_target, cross_vocab=cross_vocab, chat_template=chat_template,
                            profile=profile)
    label = shadow_label_of(results)
    if label:
        click.echo(label)
    for r in results.get("summary") or summarize(results["records"]):
        if r["category"] is not None:
            continue
        sp = "–" if r["speedup"] is None else f"{r['speedup']:.2f}x"
        tau = "–" if r["tau"] is None else f"{r['tau']:.2f}"
        same = "" if r["greedy_identical"] is None else f"  greedy=ar {r['greedy_identical']:.0%}"
        name = r["method"] + ("" if r["lossless"] else " (LOSSY)")
        click.echo(f"{r['dataset']:>12} T={r['temperature']:<4g} {name:<36} {r['tokens_per_s']:8.1f} tok/s "
                   f"{sp:>7}  tau {tau}{same}")
    click.echo(f"wrote {out}/results.json, results.md, speedup.png" + (f"  ({label})" if label else ""))


@contextmanager
def _removed_if_left_empty(out: str):
    """An --out folder this run creates is removed again when the run fails before writing anything into it."""
    folder = Path(out)
    created = not folder.exists()
    try:
        yield
    except BaseException:
        if created and folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
        raise


def _batch_bench(target, draft, cross_vocab, datasets, data_dir, methods, temperatures, batch_size, max_new_tokens, limit, seed,
                 out, device, dtype, shadow_target, quiet, chat_template="auto", profile=None) -> None:
    from multispec.bench.batched import run_batch_bench
    from multispec.errors import check
    from multispec.loading import load_pair

    check(shadow_target is None, "--shadow-target measures one sequence at a time; it cannot be combined with "
                                 "--batch-size")
    check(limit is None or limit.isdigit(), "with --batch-size, --limit is one number of prompts per data set")
    temps = _floats(temperatures)
    pair = load_pair(target=target, draft=draft, device=device, dtype=dtype, cross_vocab=cross_vocab)
    results = run_batch_bench(pair, [d.strip() for d in datasets.split(",")], data_dir, methods, temps, batch_size,
                              max_new_tokens, int(limit) if limit else None, seed, out,
                              command=["multispec", *sys.argv[1:]],
                              progress=(lambda line: None) if quiet else (lambda line: click.echo(line, err=True)),
                              chat_template=chat_template, profile=profile)
    for r in results["rows"]:
        sp = "" if r["speedup_vs_batched_ar"] is None else f"  {r['speedup_vs_batched_ar']:.2f}x batched ar"
        click.echo(f"{r['dataset']:>12} T={r['temperature']:<4g} {r['method']:<28} {r['tokens_per_s']:8.1f} tok/s{sp}")
    click.echo(f"wrote {out}/results.json, results.md")
