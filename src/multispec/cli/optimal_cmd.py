"""`multispec optimal`: parse the options, run the P3 report (multispec.optimal.report), print its table."""
from __future__ import annotations

from pathlib import Path

import click

from multispec.cli import cli


def print_table(rows: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    from multispec.optimal.report import COLUMNS, cell

    table = Table(title="acceptance (gap to own optimum)")
    for name in ["T", "n"] + [label for _, label in COLUMNS]:
        table.add_column(name, justify="right")
    for r in rows:
        table.add_row(f"{r['temperature']:g}", str(r["n"]), *[cell(r, k) for k, _ in COLUMNS])
    Console(width=220).print(table)


@cli.command("optimal")
@click.option("--target", required=True, help="The target model: a Hugging Face directory or a .gguf file.")
@click.option("--draft", default=None, help="The draft model: a Hugging Face directory or a .gguf file.")
@click.option("--head", default=None, help="A feature head (multispec train-head, or 'shipped') as the draft, "
              "instead of --draft.")
@click.option("--dataset", default="humaneval", show_default=True, help="humaneval, alpaca or PATH.jsonl.")
@click.option("--data-dir", default=None, help="Directory of the data files (default: $MULTISPEC_DATA).")
@click.option("--limit", default=20, show_default=True, help="Number of prompts.")
@click.option("--max-new-tokens", default=64, show_default=True, help="Target tokens generated per prompt.")
@click.option("--temperatures", default="0.5,0.7,1.0", show_default=True, help="Comma-separated, each > 0.")
@click.option("--drafts", default="2,3,4", show_default=True, help="Comma-separated numbers of drafts n.")
@click.option("--greedy-generation", is_flag=True, help="Let the target generate greedily (default: T = 1).")
@click.option("--seed", type=click.IntRange(0, 2**63 - 1), default=0, show_default=True)
@click.option("--support-eps", default=1e-9, show_default=True,
              help="Drop tokens with p < eps and q < eps (the dropped mass is reported; 0 keeps all).")
@click.option("--mc-samples", default=32, show_default=True, help="RRS-wor draft tuples per position.")
@click.option("--dtype", type=click.Choice(["float32", "int8", "int4"]), default=None,
              help="Load the pair as this (default float32; int8 / int4: quantized, CPU).")
@click.option("--out", default="optimal_results.json", show_default=True,
              help="JSON output; the .png plot and .md table are written next to it.")
def optimal_command(target, draft, head, dataset, data_dir, limit, max_new_tokens, temperatures, drafts,
                    greedy_generation, seed, support_eps, mc_samples, dtype, out) -> None:
    """Optimal multi-draft acceptance vs each verifier's acceptance on a target/draft pair (P3 Table 1)."""
    from multispec.optimal.report import OptimalRunConfig, parse_list, run_report

    config = OptimalRunConfig(
        target=target, draft=draft, head=head, dataset=dataset, data_dir=data_dir, limit=limit, max_new_tokens=max_new_tokens,
        temperatures=parse_list(temperatures, float, "temperatures"), drafts=parse_list(drafts, int, "drafts"),
        sample=not greedy_generation, seed=seed, support_eps=support_eps, mc_samples=mc_samples, out=out,
        dtype=dtype)
    record = run_report(config)
    print_table(record["rows"])
    out = Path(config.out)
    click.echo(f"wrote {out}, {out.with_suffix('.md')}, {out.with_suffix('.png')}")
