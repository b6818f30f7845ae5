"""`multispec profile show|measure|reset`: the machine profile (multispec/profile.py) as a file a person can pin.

    multispec profile measure --out my.json          # costs, the draft's cheapest form, acceptance on sample prompts
    multispec generate "def f(x):" --profile my.json   # plans from it; nothing written
    multispec profile show --profile my.json
    multispec profile reset                            # forget the cache folder's default profile
"""
from __future__ import annotations

import json
import sys

import click

from multispec.cli import cli
from multispec.cli.common import device_options, method_option, model_options
from multispec.errors import MultispecError, check

# What `measure` decodes to learn acceptance: short code and prose, as the project's data sets hold.
SAMPLE_PROMPTS = (
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "import json\n\n\ndef load_config(path):\n",
    "The three laws of thermodynamics are",
    "Write a short story about a lighthouse keeper.\n\n",
)


@cli.group("profile")
def profile_group() -> None:
    """The machine profile: measured costs and learned acceptance that auto plans from (docs/profile.md)."""


def _path(profile: str | None):
    from multispec.profile import MachineProfile

    return MachineProfile.default_path() if profile is None else profile


@profile_group.command("show")
@click.option("--profile", "profile", type=click.Path(dir_okay=False), help="A profile file (default: the cache "
              "folder's profile-v1.json).")
@click.option("--keys", is_flag=True, help="Also list every entry's key.")
def show_command(profile, keys) -> None:
    """Print the profile's digest, source and entries per section."""
    from multispec.profile import MachineProfile

    p = MachineProfile.load(profile) if profile is not None else MachineProfile.default()
    out = p.summary()
    if keys:
        out["keys"] = {name: sorted(entries) for name, entries in p.sections.items()}
    click.echo(json.dumps(out, indent=2))


@profile_group.command("measure")
@model_options
@method_option
@device_options
@click.option("--max-new-tokens", type=click.IntRange(1, 4096), default=96, show_default=True,
              help="Tokens per prompt and temperature.")
@click.option("--temperatures", default="0,0.7,1", show_default=True,
              help="Comma-separated: auto keeps acceptance per range (0, <= 0.5, <= 0.9, > 0.9).")
@click.option("--dataset", help="Learn acceptance on this data set's prompts (multispec bench's names, or a .jsonl "
              "file) instead of four built-in code and prose prompts; the chat template is not applied.")
@click.option("--data-dir", help="Folder holding the data files (default: $MULTISPEC_DATA).")
@click.option("--limit", type=click.IntRange(1, 1000), default=8, show_default=True, help="With --dataset: prompts.")
@click.option("--offset", type=click.IntRange(min=0), default=0, show_default=True, help="With --dataset.")
@click.option("--out", type=click.Path(dir_okay=False), help="Write the profile here (default: the cache folder's "
              "profile-v1.json, which runs without --profile read).")
@click.option("--profile", "base", type=click.Path(exists=True, dir_okay=False),
              help="Start from this profile file instead of the default one.")
def measure_command(target, draft, cross_vocab, method, device, dtype, backend, threads, max_new_tokens,
                    temperatures, dataset, data_dir, limit, offset, out, base) -> None:
    """Measure this machine's costs for a pair and method, learn acceptance on a few prompts, and save the
    profile."""
    from multispec.api import load_pair, resolve_device
    from multispec.decoding.decoder import Decoder
    from multispec.paths import writable_file
    from multispec.profile import MachineProfile
    from multispec.threads import set_threads

    dest = writable_file(_path(out), "--out")  # before any model loads
    start = MachineProfile.load(base) if base is not None else MachineProfile.default()
    try:
        temps = [float(t) for t in temperatures.split(",")]
    except ValueError:
        raise MultispecError(f"--temperatures: comma-separated numbers, got {temperatures!r}") from None
    check(all(t >= 0 for t in temps), f"--temperatures must be >= 0, got {temperatures!r}")
    if dataset is not None:
        from multispec.data import load_prompts

        prompts = [p.text for p in load_prompts(dataset, data_dir, limit=limit, offset=offset)]
    else:
        prompts = list(SAMPLE_PROMPTS)
    resolve_device(device)
    _, warning = set_threads(threads)
    if warning:
        click.echo(f"warning: {warning}", err=True)
    pair = load_pair(target=target, draft=draft, device=device, dtype=dtype, cross_vocab=cross_vocab)
    decoder = Decoder(pair, method, backend, profile=start)
    runs = [(p, t) for p in prompts for t in temps]
    with click.progressbar(runs, label="learning acceptance", file=sys.stderr) as bar:
        for i, (prompt, temperature) in enumerate(bar):
            decoder.generate(prompt, max_new_tokens=max_new_tokens, temperature=temperature, seed=i)
    new = decoder.updated_profile()
    new.save(dest)
    click.echo(json.dumps({**new.summary(), "source": str(dest)}, indent=2))


@profile_group.command("reset")
@click.option("--profile", "profile", type=click.Path(dir_okay=False), help="The profile file to delete (default: "
              "the cache folder's profile-v1.json).")
def reset_command(profile) -> None:
    """Delete the profile file: the next run measures again."""
    from pathlib import Path

    p = Path(_path(profile))
    check(not p.is_dir(), f"--profile {p}: is a folder, expected a profile file")
    if p.exists():
        p.unlink()
        click.echo(f"removed {p}")
    else:
        click.echo(f"no profile at {p}")
