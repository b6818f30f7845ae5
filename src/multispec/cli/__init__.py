"""The `multispec` command line: one click group, one module per subcommand family.

Bad input raises MultispecError anywhere below; `main` prints it as one line and exits 2. SIGTERM (what `timeout`,
`docker stop` and job schedulers send) is handled like Ctrl-C: it raises KeyboardInterrupt where the program is, so
every command keeps its partial work (bench writes the records so far, generate prints the text so far), and the
process exits 143 (128 + SIGTERM) instead of 130. Subcommand modules are
imported only when their command runs (or its own --help is asked for), so `multispec --help` and `--version`
never import torch.
"""
import importlib
import signal
import sys
import threading
import warnings

import click

from multispec import __version__
from multispec.errors import MultispecError, MultispecWarning

# name -> (module that defines it with @cli.command / @cli.group, one-line help shown by `multispec --help`)
COMMANDS = {
    "generate": ("multispec.cli.generate_cmd", "Generate a continuation of PROMPT with speculative decoding."),
    "chat": ("multispec.cli.chat_cmd", "Chat with the target model in the terminal (streamed replies)."),
    "bench": ("multispec.cli.bench_cmd", "Benchmark methods on a prompt set (JSON, markdown, plots)."),
    "optimal": ("multispec.cli.optimal_cmd", "Optimal multi-draft acceptance vs each verifier's (P3 Table 1)."),
    "verifiers": ("multispec.cli.verifiers_cmd", "List the node verifiers: lossless or not, drafts supported."),
    "train-head": ("multispec.cli.train_head_cmd", "Train a feature head (EAGLE-style) for a target: --method eagle."),
    "heads": ("multispec.cli.heads_cmd", "Train the SpecDec++ acceptance head and P1 decision models."),
    "zoo": ("multispec.cli.zoo_cmd", "Corpus, tokenizer, target/draft training and evaluation."),
    "serve": ("multispec.cli.serve_cmd", "OpenAI-compatible HTTP server with speculative decoding and metrics."),
    "profile": ("multispec.cli.profile_cmd", "The machine profile auto plans from: show, measure, reset."),
}


class LazyGroup(click.Group):
    """A group whose subcommands are imported on first use (see COMMANDS)."""

    def list_commands(self, ctx):
        return sorted(set(COMMANDS) | set(self.commands))

    def get_command(self, ctx, name):
        if name not in self.commands and name in COMMANDS:
            importlib.import_module(COMMANDS[name][0])  # its decorator adds the command to `cli`
        return self.commands.get(name)

    def format_commands(self, ctx, formatter):
        rows = [(name, COMMANDS[name][1] if name in COMMANDS else self.commands[name].get_short_help_str())
                for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="multispec")
def cli() -> None:
    """Lossless speculative decoding: token trees, adaptive draft lengths, optimal multi-draft verifiers."""


def _register() -> None:
    """Import every subcommand module now (tests that invoke `cli` through click's CliRunner use this)."""
    for module, _ in COMMANDS.values():
        importlib.import_module(module)


_TERMINATED = []  # set by the SIGTERM handler: the interrupt came from SIGTERM (exit 143), not Ctrl-C (130)


def terminated() -> bool:
    """Whether the interrupt now unwinding came from SIGTERM (end the program, 143), not Ctrl-C (130): a command
    that catches Ctrl-C to go on (chat ends a reply and waits for the next message) re-raises it then."""
    return bool(_TERMINATED)


def _on_sigterm(signum, frame) -> None:
    _TERMINATED.append(signum)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the process at once
    raise KeyboardInterrupt


def install_sigterm_handler() -> bool:
    """Make SIGTERM raise KeyboardInterrupt (like Ctrl-C) in the main thread, unless something else already handles
    it. True if installed. (`multispec serve` hands signals to uvicorn once the models are loaded.)"""
    if threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None):
        return False
    signal.signal(signal.SIGTERM, _on_sigterm)
    return True


def _interrupted() -> None:
    if _TERMINATED:
        click.echo("terminated", err=True)
        sys.exit(128 + signal.SIGTERM)
    click.echo("interrupted", err=True)
    sys.exit(130)


def main(argv: list[str] | None = None) -> None:
    """Run the CLI: one stderr line and exit 2 for bad input, exit 130 on Ctrl-C and 143 on SIGTERM (also during
    start-up), partial work kept in both cases."""
    _TERMINATED.clear()
    previous = signal.getsignal(signal.SIGTERM)
    installed = install_sigterm_handler()
    shown = warnings.showwarning
    warnings.showwarning = _one_line_warning(shown)
    try:
        cli.main(args=argv, prog_name="multispec", standalone_mode=False)
    except MultispecError as e:
        _fail(str(e))
    except (click.exceptions.Abort, KeyboardInterrupt):
        _interrupted()
    except click.UsageError as e:
        hint = f" (see `{e.ctx.command_path} --help`)" if e.ctx is not None else ""
        _fail(e.format_message().replace("\n", " ") + hint)
    except click.ClickException as e:
        _fail(e.format_message().replace("\n", " "), 2 if e.exit_code in (1, 2) else e.exit_code)
    except FileNotFoundError as e:
        _fail(f"file not found: {e.filename or e}")
    except PermissionError as e:
        _fail(f"permission denied: {e.filename or e}")
    except UnicodeError as e:  # text that is not valid UTF-8 (or a lone surrogate) anywhere it was not checked
        _fail(f"text that is not valid UTF-8 ({type(e).__name__}: {getattr(e, 'reason', e)})")
    finally:
        warnings.showwarning = shown
        if installed:  # leave the process as found (main is also called in-process, by tests)
            signal.signal(signal.SIGTERM, previous)


def _one_line_warning(shown):
    """warnings.showwarning for the CLI: multispec's own warnings as one `warning:` line on stderr (not Python's
    file:line: category: message and the source line); any other warning as Python shows it."""
    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, MultispecWarning):
            click.echo(f"warning: {message}", err=True)
        else:
            shown(message, category, filename, lineno, file, line)
    return show


def _fail(message: str, code: int = 2) -> None:
    message = message.encode("utf-8", "backslashreplace").decode("utf-8")  # a lone surrogate must not crash this
    click.echo(f"error: {message}", err=True)
    sys.exit(code)
