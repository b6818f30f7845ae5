"""`multispec train-head`: train a feature head (EAGLE-style) for a target on this machine (training/eagle.py)."""
import click

from multispec.cli import cli


@cli.command("train-head")
@click.option("--target", required=True, type=click.Path(), help="Target model: a directory or a .gguf file.")
@click.option("--out", required=True, type=click.Path(), help="Output head directory (config.json, "
              "model.safetensors, training.json).")
@click.option("--data", type=click.Path(), multiple=True, help="Training text, repeatable: a .txt, a .jsonl (field "
              "ids: token ids; or text; or prompt + response), 'own': the target's own continuations of a built-in "
              "prompt set (code openings, instructions), own:FILE.jsonl: its own continuations of FILE's prompts (field "
              "prompt: raw text; or message: through the chat template), or 'python': this interpreter's Python "
              "source. Default: own and python (never the evaluation prompts).")
@click.option("--minutes", default=10.0, show_default=True, help="Time budget, feature collection included.")
@click.option("--vocab", type=int, help="Restrict the head's output layer to the N most frequent training tokens.")
@click.option("--unroll", default=1, show_default=True, help="Steps of the training-time test (1: none).")
@click.option("--seq-len", default=256, show_default=True, help="Tokens per training chunk.")
@click.option("--batch", default=4, show_default=True, help="Chunks per step.")
@click.option("--lr", default=1e-3, show_default=True)
@click.option("--seed", default=0, show_default=True)
@click.option("--max-tokens", default=400_000, show_default=True, help="Training tokens at most (features are "
              "kept in memory: 2 x hidden size bytes per token).")
@click.option("--device", default="cpu", show_default=True, help="Where the target and the head run while training "
              "(cuda: train on a GPU; the head decodes on any device).")
@click.option("--threads", default=1, show_default=True, help="torch CPU threads.")
@click.option("--overwrite", is_flag=True, help="Replace an existing --out folder's head.")
@click.option("--resume", is_flag=True, help="Go on training the head in --out (its best weights so far).")
@click.option("--cache", type=click.Path(), help="A folder that keeps the generated own text and the features between "
              "runs: a rerun goes on generating where the last stopped, a --resume run trains on what is there.")
def train_head_command(target, out, data, minutes, vocab, unroll, seq_len, batch, lr, seed, max_tokens, device,
                       threads, overwrite, resume, cache) -> None:
    """Train a head that drafts from TARGET's hidden states; use it with --method eagle --head OUT."""
    import torch

    from multispec.training.eagle import HeadTrainConfig, train_head

    cfg = HeadTrainConfig(target=target, out=out, data=tuple(data), minutes=minutes, vocab=vocab, unroll=unroll,
                          seq_len=seq_len, batch=batch, lr=lr, seed=seed, max_tokens=max_tokens, device=device,
                          overwrite=overwrite, resume=resume, cache=cache)
    cfg.check()  # before the model loads
    from multispec.threads import check_thread_count

    torch.set_num_threads(check_thread_count(threads))
    summary = train_head(cfg)
    click.echo(f"head saved to {out}: held-out alpha {summary['alpha']:.3f}, greedy agreement "
               f"{summary['greedy_agree']:.3f} ({summary['train_tokens']} training tokens, "
               f"{summary['minutes']:.1f} min)")
