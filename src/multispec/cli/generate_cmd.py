"""`multispec generate`: the main job."""
import json
import sys

import click

from multispec.cli import cli
from multispec.methods import METHODS


@cli.command("generate")
@click.argument("prompt")
@click.option("--target", help="Target model: local Hugging Face directory (default: the embedded default pair).")
@click.option("--draft", help="Draft model sharing the target's vocabulary.")
@click.option("--method", type=click.Choice(METHODS), default="mcsd", show_default=True)
@click.option("--k", type=int, help="sd: draft tokens per round (default 4).")
@click.option("--heuristic", is_flag=True, default=None, help="sd: adjust k like transformers (+2 / -1).")
@click.option("--tree", help="mcsd / ti-mcsd: tree shape, e.g. 4,2,2,1 (ti-mcsd: 2,4,3,1,1).")
@click.option("--verifier", help="sd / specdecpp: sd or block; mcsd / dynamic: verifier name, e.g. traversal (see `multispec verifiers`).")
@click.option("--width", type=int, help="ti-mcsd / dynamic: first-level width W.")
@click.option("--depth", type=int, help="dynamic: maximum draft depth.")
@click.option("--target-init", is_flag=True, default=None, help="dynamic: level 1 from the target (lossy if W>=2).")
@click.option("--decision-model", type=click.Path(), help="dynamic: decision-model directory.")
@click.option("--beta", type=float, help="dynamic: stop when every chain's predicted acceptance < beta (0.4).")
@click.option("--head", type=click.Path(), help="specdecpp: acceptance-head directory.")
@click.option("--threshold", type=float, help="specdecpp: stop when P(some rejection) > h (0.7).")
@click.option("--k-min", type=int, help="specdecpp: minimum draft length (2).")
@click.option("--k-max", type=int, help="specdecpp: maximum draft length (20).")
@click.option("--temperature", type=float, help="0 means greedy. Default: the target's generation_config.json "
              "(its temperature/top-k/top-p if it sets do_sample, else greedy).")
@click.option("--top-k", type=int)
@click.option("--top-p", type=float)
@click.option("--seed", type=int)
@click.option("--max-new-tokens", type=int, default=128, show_default=True)
@click.option("--stop", multiple=True, help="Stop string (repeatable).")
@click.option("--device")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]))
@click.option("--backend", type=click.Choice(["hf", "fast"]), default="hf", show_default=True,
              help="hf: any transformers causal LM; fast: static-cache Llama-family backend.")
@click.option("--threads", type=click.IntRange(min=1), help="torch CPU threads (default: torch's choice). On a busy "
              "machine, 1 avoids oversubscription stalls.")
@click.option("--stream", is_flag=True, help="Print text as it is committed.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: the stats plus `text`.")
def generate_command(prompt, target, draft, method, k, heuristic, tree, verifier, width, depth, target_init,
                     decision_model, beta, head, threshold, k_min, k_max, temperature, top_k, top_p, seed,
                     max_new_tokens, stop, device, dtype, backend, threads, stream, as_json):
    """Generate a continuation of PROMPT with speculative decoding."""
    from multispec.api import generate, load_pair
    from multispec.methods import build_method
    from multispec.sampling import SamplingConfig
    from multispec.tree import parse_shape

    options = dict(k=k, heuristic=heuristic, tree=parse_shape(tree) if tree else None, verifier=verifier,
                   width=width, depth=depth, target_init=target_init, decision_model=decision_model, beta=beta,
                   head=head, threshold=threshold, k_min=k_min, k_max=k_max)
    options = {key: v for key, v in options.items() if v is not None}
    SamplingConfig(temperature=1.0 if temperature is None else temperature, top_k=top_k, top_p=top_p)  # fail fast
    config = build_method(method, **options)
    if not config.lossless:
        click.echo(f"warning: {method} with these settings is LOSSY: its output distribution differs from the "
                   "target's (a speed/quality trade-off)", err=True)
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    pair = load_pair(target=target, draft=draft, device=device, dtype=dtype)
    on_text = (lambda s: (sys.stdout.write(s), sys.stdout.flush())) if stream and not as_json else None
    result = generate(pair, prompt, method=method, max_new_tokens=max_new_tokens, temperature=temperature,
                      top_k=top_k, top_p=top_p, seed=seed, stop=list(stop) or None, stream=on_text, backend=backend,
                      **options)
    if as_json:
        click.echo(json.dumps({**result.stats, "text": result.text}, indent=2))
        return
    if stream:
        click.echo()
    else:
        click.echo(prompt + result.text)
    s = result.stats
    acc = "n/a" if s["acceptance_rate"] is None else f"{s['acceptance_rate']:.2f}"
    click.echo(f"[{s['method']}{'' if s['lossless'] else ' (LOSSY)'}] {s['new_tokens']} tokens in {s['seconds']:.2f}s "
               f"({s['tokens_per_s']:.1f} tok/s), tau {s['tau']:.2f}, acceptance {acc}, "
               f"target calls {s['target_calls']}, draft calls {s['draft_calls']}", err=True)
