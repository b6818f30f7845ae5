"""The `multispec` command line: one click group, one module per subcommand family.

Bad input raises MultispecError anywhere below; `main` prints it as one line and exits 2.
"""
import sys

import click

from multispec import __version__
from multispec.errors import MultispecError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="multispec")
def cli() -> None:
    """Lossless speculative decoding: token trees, adaptive draft lengths, optimal multi-draft verifiers."""


def _register() -> None:
    # Each module defines click commands and adds them to `cli`; imported here, not at package import,
    # so that `import multispec` stays light.
    from multispec.cli import generate_cmd, verifiers_cmd  # noqa: F401
    from multispec.cli import optimal_cmd  # noqa: F401
    from multispec.cli import zoo_cmd  # noqa: F401
    from multispec.cli import bench_cmd  # noqa: F401
    from multispec.cli import heads_cmd  # noqa: F401
    from multispec.cli import serve_cmd  # noqa: F401


def main(argv: list[str] | None = None) -> None:
    _register()
    try:
        cli.main(args=argv, prog_name="multispec", standalone_mode=False)
    except MultispecError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as e:
        e.show()
        sys.exit(2 if e.exit_code in (1, 2) else e.exit_code)
    except FileNotFoundError as e:
        click.echo(f"error: file not found: {e.filename or e}", err=True)
        sys.exit(2)
