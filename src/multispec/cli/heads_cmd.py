"""`multispec heads`: train the heads that adaptive methods read (see docs/specdecpp.md)."""
import click

from multispec.cli import cli


@cli.group("heads")
def heads() -> None:
    """Train the trained stop models: the SpecDec++ acceptance head (and P1 decision models)."""


@heads.command("train-acceptance")
@click.option("--target", required=True, type=click.Path(), help="Target model (Hugging Face directory or GGUF file).")
@click.option("--draft", required=True, type=click.Path(),
              help="Draft model (Hugging Face directory or GGUF file); the head reads its hidden states.")
@click.option("--prompts", "prompt_files", multiple=True, type=click.Path(),
              help="JSONL file of prompts (field `prompt`, else `text`); repeatable.")
@click.option("--dataset", "datasets", multiple=True, type=click.Choice(["humaneval-train", "stdlib", "gsm8k"]),
              help="Built-in prompt source (repeatable): humaneval-train = HumanEval 0-99 (100-163 are evaluation "
                   "prompts), stdlib = standard-library snippets, gsm8k = GSM8K questions as Python comments.")
@click.option("--data-dir", type=click.Path(), help="Folder holding humaneval.jsonl.gz / gsm8k_test.jsonl "
              "(default: $MULTISPEC_DATA).")
@click.option("--n-prompts", default=200, show_default=True, help="Prompts in all, split evenly over the sources.")
@click.option("--max-new-tokens", default=128, show_default=True, help="Target response length.")
@click.option("--temperature", default=1.0, show_default=True, help="Logit processing of responses and labels.")
@click.option("--top-k", default=50, show_default=True, help="Logit processing of responses and labels (0: none).")
@click.option("--mix", default=0.15, show_default=True, help="Token-mixing rate r (positions keeping X_t).")
@click.option("--cache", type=click.Path(), help="Directory to cache the features in (reused when settings match).")
@click.option("--out", required=True, type=click.Path(), help="Output head directory.")
@click.option("--epochs", default=30, show_default=True)
@click.option("--lr", default=1e-3, show_default=True)
@click.option("--batch-size", default=256, show_default=True)
@click.option("--w-rej", default=6.0, show_default=True, help="Loss weight of the rejection class.")
@click.option("--depth", default=3, show_default=True, help="Residual blocks D.")
@click.option("--share-blocks", is_flag=True, help="One block applied D times (the released SpecDec++ code).")
@click.option("--seed", default=0, show_default=True)
@click.option("--gen-batch", default=16, show_default=True, help="Prompts per batched target-sampling call.")
@click.option("--threads", type=int, help="torch CPU threads (default: torch's choice).")
@click.option("--dtype", default="float32", show_default=True, type=click.Choice(["float32", "int8", "int4"]),
              help="Weights of both models while the data is built (int8/int4: a quantized pair, e.g. from GGUF "
                   "files; train the head with the dtype it will serve).")
def train_acceptance_command(target, draft, prompt_files, datasets, data_dir, n_prompts, max_new_tokens, temperature,
                             top_k, mix, cache, out, epochs, lr, batch_size, w_rej, depth, share_blocks, seed,
                             gen_batch, threads, dtype) -> None:
    """Generate training data with the target, label it with both models, train the acceptance head."""
    from multispec.paths import creatable_dir

    creatable_dir(out)  # before any slow work
    if cache:
        creatable_dir(cache, "--cache")
    import torch

    from multispec.training.acceptance_data import DataConfig
    from multispec.training.train_acceptance import TrainConfig, train_acceptance

    data_config = DataConfig(target=str(target), draft=str(draft), sources=tuple(datasets) + tuple(prompt_files),
                             n_prompts=n_prompts, max_new_tokens=max_new_tokens, temperature=temperature,
                             top_k=top_k or None, mix=mix, seed=seed, dtype=dtype)
    train_config = TrainConfig(out=str(out), epochs=epochs, lr=lr, batch_size=batch_size, w_rej=w_rej, depth=depth,
                               share_blocks=share_blocks, seed=seed)
    if threads:
        from multispec.threads import check_thread_count

        torch.set_num_threads(check_thread_count(threads))
    train_acceptance(data_config, train_config, data_dir=data_dir, cache=cache, gen_batch=gen_batch,
                     log=lambda s: click.echo(s, err=True))


@heads.command("train-decision")
@click.option("--type", "kind", required=True, type=click.Choice(["1", "2"]),
              help="1: MLP on the draft's hidden state, soft labels; 2: MLP on entropy + top-10 of q, hard labels.")
@click.option("--target", required=True, type=click.Path(), help="Target model directory (Hugging Face format).")
@click.option("--draft", required=True, type=click.Path(), help="Draft model directory.")
@click.option("--dataset", "datasets", multiple=True, type=click.Choice(["humaneval-train", "alpaca-train"]),
              help="Built-in prompt source (repeatable; default both): humaneval-train = HumanEval 100-163, "
                   "alpaca-train = alpaca_eval 100-299 (records 0-39 are evaluation prompts).")
@click.option("--prompts", "prompt_files", multiple=True, type=click.Path(),
              help="JSONL file of prompts (field `prompt`); repeatable.")
@click.option("--data-dir", type=click.Path(), help="Folder holding humaneval.jsonl.gz / alpaca_eval.jsonl "
              "(default: $MULTISPEC_DATA).")
@click.option("--n-prompts", default=264, show_default=True, help="Prompts in all, split evenly over the sources.")
@click.option("--max-new-tokens", default=128, show_default=True, help="Target response length.")
@click.option("--temperature", default=1.0, show_default=True, help="Sampling and labelling temperature (P1: 1).")
@click.option("--cache", type=click.Path(), help="Directory to cache the data in (shared by both types).")
@click.option("--out", required=True, type=click.Path(), help="Output model directory.")
@click.option("--epochs", default=10, show_default=True)
@click.option("--lr", default=1e-3, show_default=True)
@click.option("--batch-size", default=50, show_default=True)
@click.option("--seed", default=0, show_default=True)
@click.option("--gen-batch", default=16, show_default=True, help="Prompts per batched target-sampling call.")
@click.option("--threads", type=int, help="torch CPU threads (default: torch's choice).")
def train_decision_command(kind, target, draft, datasets, prompt_files, data_dir, n_prompts, max_new_tokens,
                           temperature, cache, out, epochs, lr, batch_size, seed, gen_batch, threads) -> None:
    """Generate data with the target and draft, train a P1 decision model (design §6.3), save the best epoch."""
    from multispec.paths import creatable_dir

    creatable_dir(out)  # before any slow work
    if cache:
        creatable_dir(cache, "--cache")
    import torch

    from multispec.training.decision_data import DataConfig
    from multispec.training.train_decision import TrainConfig, train_decision

    sources = tuple(datasets) + tuple(prompt_files) or ("humaneval-train", "alpaca-train")
    data_config = DataConfig(target=str(target), draft=str(draft), sources=sources, n_prompts=n_prompts,
                             max_new_tokens=max_new_tokens, temperature=temperature, seed=seed)
    train_config = TrainConfig(kind=int(kind), out=str(out), epochs=epochs, lr=lr, batch_size=batch_size, seed=seed)
    if threads:
        from multispec.threads import check_thread_count

        torch.set_num_threads(check_thread_count(threads))
    train_decision(data_config, train_config, data_dir=data_dir, cache=cache, gen_batch=gen_batch,
                   log=lambda s: click.echo(s, err=True))
