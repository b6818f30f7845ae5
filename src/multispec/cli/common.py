"""Options that `generate` and `chat` share, declared once: the models, and how to sample. Each decorator adds its
options to a command in the order they appear in --help."""
import dataclasses
import types
import typing

import click

from multispec.errors import MultispecError, check


def _apply(options: list):
    def decorate(f):
        for option in reversed(options):
            f = option(f)
        return f
    return decorate


model_options = _apply([
    click.option("--target", help="Target model: a local Hugging Face directory or a .gguf file (default: the "
                 "embedded default pair)."),
    click.option("--draft", help="Draft model: a directory or a .gguf file (another tokenizer: see --cross-vocab)."),
    click.option("--cross-vocab", type=click.Choice(["tli", "uag"]), help="A draft with another tokenizer: tli "
                 "(default) drafts the tokens both vocabularies share; uag re-encodes the draft's text with the "
                 "target's tokenizer (chains only). docs/cross_vocab.md"),
])

def _sampling_flag(f, tp):
    """One click option for SamplingParams field `f` of type `tp`, as its metadata says (params._setting)."""
    flag, help_text = "--" + f.name.replace("_", "-"), f.metadata.get("help")
    if f.metadata.get("cli") == "file":
        return click.option(flag, f.name, type=click.Path(exists=True, dir_okay=False), help=help_text)
    args = [a for a in typing.get_args(tp) if a is not type(None)] if typing.get_origin(tp) in (
        typing.Union, types.UnionType) else [tp]
    base = args[0] if len(args) == 1 else str
    if base is bool:
        optional = len(args) < len(typing.get_args(tp)) if typing.get_args(tp) else False
        if optional:  # None, True or False: --x / --no-x
            return click.option(f"{flag}/--no-{flag[2:]}", f.name, default=None, help=help_text)
        return click.option(flag, f.name, is_flag=True, default=None, help=help_text)
    if typing.get_origin(base) is tuple:  # repeatable
        element = typing.get_args(base)[0]
        return click.option(flag, f.name, multiple=True, type=element if element in (int, float, str) else str,
                            help=help_text)
    bounds = f.metadata.get("bounds")
    kind = click.IntRange(*bounds) if base is int and bounds else base if base in (int, float, str) else str
    return click.option(flag, f.name, type=kind, help=help_text)


def sampling_options(command):
    """Decorator: a flag for every SamplingParams field that has a command-line form (its metadata), in field
    order; the command receives them as keyword arguments (`sampling_settings` takes them back)."""
    from multispec.params import SamplingParams

    hints = typing.get_type_hints(SamplingParams)
    flags = [_sampling_flag(f, hints[f.name]) for f in dataclasses.fields(SamplingParams)
             if f.metadata.get("cli", True) is not False]
    return _apply(flags)(command)


def sampling_settings(kwargs: dict) -> dict:
    """Take the SamplingParams fields out of a command's keyword arguments: those given (a file flag's file read
    here; SamplingParams checks its content)."""
    from multispec.params import SamplingParams

    out: dict = {}
    for f in dataclasses.fields(SamplingParams):
        value = kwargs.pop(f.name, None)
        if value is None or value == ():
            continue
        if f.metadata.get("cli") == "file":
            try:
                with open(value, encoding="utf-8-sig") as fh:
                    value = fh.read()
            except (OSError, UnicodeDecodeError) as e:
                raise MultispecError(f"--{f.name.replace('_', '-')}: cannot read {value}: {e}") from None
        out[f.name] = value
    return out


device_options = _apply([
    click.option("--device", help="cpu, cuda or cuda:N (default: cuda when available, else cpu)."),
    click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16", "int8", "int4", "w4a8"]),
                 help="int8 (CPU): int8 weights and row-by-row int8 activations; int4: int4 weights, bfloat16 "
                      "rows; w4a8: int4 weights, row-by-row int8 activations (a C++ kernel built on first use); "
                      "each a different model from the float32 one, decoded exactly (docs/quantized.md)"),
    click.option("--backend", type=click.Choice(["hf", "fast", "compiled"]),
                 help="hf: any transformers causal LM; fast: static-cache Llama-family backend; compiled: the fast "
                      "backend with torch.compile'd steps (compiled at load: minutes the first time on a CPU). "
                      "Default: fast where the models have it, else hf."),
    click.option("--threads", type=click.IntRange(min=1), help="torch CPU threads (default: the free cores, at most "
                 "4; 1 on a busy machine, with a warning)."),
])

def method_option(f):
    """--method, one of the registry's methods (default auto): generate and chat."""
    from multispec.decoding.methods import DEFAULT_METHOD, method_names

    return click.option("--method", type=click.Choice(method_names()), default=DEFAULT_METHOD, show_default=True)(f)


chat_template_option = click.option(
    "--chat-template", type=click.Path(exists=True, dir_okay=False),
    help="A Jinja chat template file, instead of the tokenizer's own.")


def read_chat_template(path: str | None) -> str | None:
    """The template file's text (checked before any model loads)."""
    if path is None:
        return None
    with open(path, "rb") as fh:
        return decode_text(fh.read(), f"the chat template {path}")


def check_chat_template(target: str | None, chat_template: str | None) -> None:
    """Before any model loads (chat, generate --chat): a target whose files show no chat template, with no
    --chat-template given, is refused in one line naming it (a GGUF file: before its conversion)."""
    from multispec.loading import has_chat_template
    from multispec.text import no_chat_template

    if chat_template is None and has_chat_template(target) is False:
        raise MultispecError(no_chat_template(target or "the embedded default pair's target"))


def user_message(text: str, what: str) -> dict:
    """A user turn, refused when it holds no text."""
    check(text.strip() != "", f"{what} is empty")
    return {"role": "user", "content": text}


def decode_text(data: bytes, what: str) -> str:
    """bytes -> str: strict UTF-8, a leading BOM dropped; MultispecError naming `what` and the first bad byte."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise MultispecError(f"{what} is not valid UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}); "
                             "is it a binary file?") from None
    check("\x00" not in text, f"{what} contains NUL bytes; is it a binary file?")
    return text
