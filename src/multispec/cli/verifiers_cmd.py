"""`multispec verifiers`: the verifier registry."""
import json

import click

from multispec.cli import cli


@cli.command("verifiers")
@click.option("--json", "as_json", is_flag=True, help="Print the registry as a JSON list.")
def verifiers_command(as_json: bool) -> None:
    """List the node verifiers: name, lossless or not, drafts supported, description."""
    from multispec.verify import REGISTRY

    rows = [spec.describe() for spec in REGISTRY.values()]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    for row in rows:
        flag = "lossless" if row["lossless"] else "LOSSY"
        click.echo(f"{row['name']:<10} {flag:<9} drafts={row['drafts']!s:<5} {row['description']}")
