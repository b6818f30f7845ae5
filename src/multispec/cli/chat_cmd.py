"""`multispec chat`: a multi-turn conversation in the terminal. Each reply streams as it is committed and ends with
the one-line summary `generate` prints; Ctrl-C ends a reply (what was said so far stays in the conversation),
Ctrl-D (or /exit) leaves, /reset starts a new conversation. One Decoder serves every turn, so `auto` keeps what it
learned. With a head adapted online (adapt=on) and `--adapt-keep`, the adapted copy of the head and its optimiser
state go on from turn to turn of the conversation (within --adapt-keep-mb; /reset drops them); never another
Decoder's, and the shared head is never written (drafting/adapting.py)."""
import json
import sys

import click

from multispec.cli import cli, terminated
from multispec.cli.common import (chat_template_option, check_chat_template, device_options, method_option,
                                  model_options, read_chat_template, sampling_options, sampling_settings,
                                  user_message)
from multispec.cli.method_options import check_method_options, collect_method_options, method_options
from multispec.errors import MultispecError, check

PROMPT = ">>> "


@cli.command("chat")
@model_options
@method_option
@method_options
@sampling_options
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=512, show_default=True,
              help="The longest reply, in tokens.")
@click.option("--system", help="The system message.")
@chat_template_option
@click.option("--tools", "tools_file", type=click.Path(exists=True, dir_okay=False),
              help="A JSON file holding a list of OpenAI tool objects: the model may call them (its calls are shown; "
                   "the chat template must support tools, e.g. multispec's templates/hermes_tools.jinja).")
@click.option("--tool-choice", default=None, metavar="auto|none|required|NAME",
              help="With --tools: auto (default), none, required (one or more calls, forced) or a function's name "
                   "(one call of it, forced).")
@click.option("--adapt-keep", is_flag=True, help="With adapt=on (eagle, or auto with a head): keep the head's "
              "adapted copy from turn to turn of the conversation (/reset drops it), not per reply.")
@click.option("--adapt-keep-mb", type=click.FloatRange(min=0, min_open=True), default=256.0, show_default=True,
              help="--adapt-keep's bound: the kept copy and its optimiser state, in MiB (refused at the start when "
                   "over; dropped at a reply's end when over).")
@device_options
def chat_command(target, draft, cross_vocab, method, max_new_tokens, system, chat_template, tools_file, tool_choice,
                 adapt_keep, adapt_keep_mb, device, dtype, backend, threads, **flags):
    """Chat with the target model: type a message, read the streamed reply (Ctrl-C ends a reply, Ctrl-D leaves)."""
    from multispec.api import load_pair, resolve_device
    from multispec.cli.generate_cmd import _check_proposers, _summary
    from multispec.decoding.decoder import Decoder
    from multispec.loading import vocab_rows
    from multispec.params import SamplingParams
    from multispec.text import encode_chat
    from multispec.threads import set_threads

    # every check that needs no model first
    params = SamplingParams(max_new_tokens=max_new_tokens, **sampling_settings(flags))  # the rest: method options
    options = collect_method_options(flags)
    config = check_method_options(method, options)
    template = read_chat_template(chat_template)
    check_chat_template(target, template)
    tools = read_tools(tools_file, tool_choice)
    check(system is None or system.strip() != "", "--system is empty")
    check(not adapt_keep or bool(config.options.get("adapt")), "--adapt-keep keeps a head adapted online: give "
                                                              "adapt=on (--adapt on; eagle, or auto with --head)")
    resolve_device(device)
    _check_proposers(config, target, draft)
    _, warning = set_threads(threads)
    if warning:
        click.echo(f"warning: {warning}", err=True)

    pair = load_pair(target=target, draft=draft, device=device, dtype=dtype, cross_vocab=cross_vocab,
                     compile=backend == "compiled")
    messages = [{"role": "system", "content": system}] if system is not None else []
    listed = tools.template_tools() if tools is not None else None
    encode_chat(pair.tokenizer, vocab_rows(pair.target), messages + [user_message("hi", "")], template,
                listed, target)  # a template (with tools)?
    if tools is not None and tools.grammar(pair.tokenizer) is not None:
        params = params.replace(grammar=tools.grammar(pair.tokenizer))
    decoder = Decoder(pair, method, backend, **options)
    if adapt_keep:
        keep_adapted_head(decoder, adapt_keep_mb)
    click.echo("Type a message and press Enter. Ctrl-C ends a reply, Ctrl-D leaves, /reset starts over.", err=True)
    start = list(messages)
    turn = 0
    while True:
        try:
            line = input(PROMPT)
        except EOFError:  # Ctrl-D
            click.echo()
            return
        except KeyboardInterrupt:  # Ctrl-C at the prompt: a fresh line, as a shell does (SIGTERM: the end)
            click.echo()
            if terminated():
                raise
            continue
        if line.strip() in ("/exit", "/quit"):
            return
        if line.strip() == "/reset":  # a new conversation: its text and the head adapted in it dropped
            messages, turn = list(start), 0
            drop_adapted_head(decoder)
            click.echo("[a new conversation]", err=True)
            continue
        try:
            turn_messages = messages + [user_message(line, "the message")]
            ids = encode_chat(pair.tokenizer, vocab_rows(pair.target), turn_messages, template, listed)
            reply = _reply(decoder, ids, params.replace(seed=None if params.seed is None else params.seed + turn))
        except MultispecError as e:
            click.echo(f"error: {e}", err=True)
            continue
        except KeyboardInterrupt:  # Ctrl-C before the reply began: the message is dropped (SIGTERM: the end)
            click.echo()
            if terminated():
                raise
            continue
        messages = turn_messages + [_assistant(reply.text, tools)]
        turn += 1
        line = _summary(reply.stats, reply.finish_reason) if reply.stats.get("method") else \
            f"[reply stopped after {reply.stats['new_tokens']} tokens]"
        used = len(ids) + len(reply.token_ids)
        click.echo(line + f"; conversation {used} tokens" + (f" of {decoder.context}" if decoder.context else ""),
                   err=True)
        dropped = ((reply.stats.get(reply.stats.get("method")) or {}).get("adapt") or {}).get("dropped")
        if dropped:
            click.echo(f"warning: the adapted head was dropped ({dropped}); the next reply starts from the "
                       "shared head", err=True)


def keep_adapted_head(decoder, max_mib: float) -> None:
    """`--adapt-keep`: the decoder's adapted head goes on across its requests (this chat's turns), within
    `max_mib` MiB; refused in one line when the method does not adapt a head or the copy cannot fit."""
    from multispec.drafting.adapting import AdaptingPolicy

    policy = decoder.policy
    check(isinstance(policy, AdaptingPolicy), "--adapt-keep keeps a head adapted online: give adapt=on (eagle, "
                                              "or auto with --head)")
    bound = int(max_mib * 2**20)
    need = policy.keep_estimate()
    check(need <= bound, f"--adapt-keep: the adapted head and its optimiser state need about {need / 2**20:.1f} "
                         f"MiB, over --adapt-keep-mb {max_mib:g}")
    policy.keep_across_requests(bound)


def drop_adapted_head(decoder) -> None:
    """/reset: the next request starts from the shared head (a no-op when no adapted head is kept)."""
    drop = getattr(decoder.policy, "drop_kept", None)
    if drop is not None:
        drop()


def read_tools(path: str | None, tool_choice: str | None):
    """--tools FILE and --tool-choice as a checked multispec.tools.Tools (None without --tools)."""
    from multispec.cli.common import decode_text
    from multispec.tools import CHOICES, Tools

    if path is None:
        check(tool_choice is None, "--tool-choice goes with --tools FILE")
        return None
    with open(path, "rb") as fh:
        text = decode_text(fh.read(), f"the tools file {path}")
    try:
        listed = json.loads(text)
    except ValueError as e:
        raise MultispecError(f"the tools file {path} is not JSON: {e}") from None
    choice = tool_choice if tool_choice in (None, *CHOICES) else {"type": "function", "function": {"name": tool_choice}}
    try:
        return Tools.of(listed, choice)
    except MultispecError as e:
        raise MultispecError(f"the tools file {path}: {e}") from None


def _assistant(text: str, tools) -> dict:
    """The reply as the conversation keeps it: its calls as tool_calls, each shown on stderr."""
    if tools is None or not tools.parse:
        return {"role": "assistant", "content": text}
    from multispec.tool_calls import parse_tool_calls

    content, calls = parse_tool_calls(text, tools.forced)
    for c in calls:
        click.echo(f"[tool call {c['id']}] {c['function']['name']}({c['function']['arguments']})", err=True)
    if not calls:
        return {"role": "assistant", "content": text}
    return {"role": "assistant", "content": content, "tool_calls": calls}


def _reply(decoder, ids: list[int], params):
    """Stream one reply to stdout; Ctrl-C ends it and returns what was said (finish_reason "abort")."""
    def write(delta: str) -> None:
        sys.stdout.write(delta)
        sys.stdout.flush()

    try:
        result = decoder.generate(ids, params, stream=write)
    except KeyboardInterrupt as e:
        partial = getattr(e, "partial", None)
        if partial is None:
            raise
        if terminated():  # SIGTERM ends the program (exit 143), the reply so far already shown
            click.echo()
            raise
        result = partial
    click.echo()
    for w in result.stats.get("warnings", []):
        click.echo(f"warning: {w}", err=True)
    return result
