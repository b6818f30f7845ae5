"""`multispec verifiers`: every verifier the engine can run (node walks, then the sequence verifiers)."""
import json

import click

from multispec.cli import cli


@cli.command("verifiers")
@click.option("--json", "as_json", is_flag=True, help="Print the registry as a JSON list.")
def verifiers_command(as_json: bool) -> None:
    """List the verifiers: name, kind (node walk or sequence), lossless or not, drafts per node, tree shapes
    accepted, the draft law they need, description and source."""
    from multispec.verify.sequence import all_verifiers

    rows = [spec.describe() for spec in all_verifiers()]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    for row in rows:
        flag = "lossless" if row["lossless"] else "LOSSY"
        click.echo(f"{row['name']:<10} {row['kind']:<8} {flag:<9} drafts={row['drafts']!s:<4} "
                   f"shapes={row['shapes']:<5} {row['description']} [draft law: {row['draft_law']}]")
