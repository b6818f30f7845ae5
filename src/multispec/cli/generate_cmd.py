"""`multispec generate`: the main job."""
import json
import re
import statistics
import sys
import time

import click

from multispec.cli import cli
from multispec.cli.common import (chat_template_option, check_chat_template, decode_text, device_options,
                                  method_option, model_options, read_chat_template, sampling_options,
                                  sampling_settings, user_message)
from multispec.cli.method_options import check_method_options, collect_method_options, method_options
from multispec.decoding.methods import REGISTRY
from multispec.errors import MultispecError, check
from multispec.models.int8 import QUANT_DTYPES


@cli.command("generate")
@click.argument("prompt", required=False)
@click.option("--prompt-file", type=click.Path(exists=True, dir_okay=False), multiple=True,
              help="Read the prompt from this UTF-8 file, a leading BOM dropped (PROMPT '-' reads it from stdin). "
              "Repeat it, or give a .jsonl file (one JSON string or {\"prompt\": ...} per line; other keys are "
              "refused: settings are options, for every line), for several prompts decoded as one batch.")
@click.option("--lines", "per_line", is_flag=True, help="Each non-empty line of the prompt text is one prompt.")
@click.option("--batch-size", type=click.IntRange(1, 256), help="Several prompts: how many decode at once "
              "(default: all, at most 256).")
@model_options
@method_option
@method_options
@sampling_options
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=128, show_default=True,
              help="Capped, with a warning, where prompt + new tokens would pass the model's positions.")
@click.option("--chat", "chat", metavar="MESSAGE", help="A user message instead of PROMPT: the prompt is the "
              "conversation rendered by the target's chat template (with --system); prints the reply.")
@click.option("--system", help="With --chat: the system message.")
@chat_template_option
@click.option("--compile", "compile_", is_flag=True, help="Same as --backend compiled.")
@device_options
@click.option("--stream", is_flag=True, help="Print text as it is committed.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: the stats plus `text` and `token_ids` "
              "(several prompts: one line per prompt, with its `index`, written as its sequence finishes).")
@click.option("--profile", "profile", type=click.Path(exists=True, dir_okay=False), help="Plan from this machine "
              "profile file (multispec profile measure), read only; default: the cache folder's.")
@click.option("--baseline", is_flag=True, help="Also run plain decoding (ar) on the same settings and report the "
              "speedup over it: this run's over the ar run paired with it (both rates shown), then the median of "
              "3 to 5 alternating pairs, with its min-max spread.")
def generate_command(prompt, prompt_file, per_line, batch_size, target, draft, cross_vocab, method, max_new_tokens,
                     chat, system, chat_template, compile_, device, dtype, backend, threads, stream, as_json, profile,
                     baseline,
                     **flags):
    """Generate a continuation of PROMPT with speculative decoding ('-': read it from stdin)."""
    from multispec.api import generate, load_pair, resolve_device
    from multispec.params import SamplingParams
    from multispec.threads import set_threads

    # every check that needs no model first (style §2.9)
    if chat is None:
        check(system is None and chat_template is None, "--system and --chat-template go with --chat MESSAGE")
        sources = _read_prompts(prompt, prompt_file, per_line)
        prompts, where = [t for _, t in sources], [w for w, _ in sources]
        source: dict = {}
    else:
        check(prompt is None and not prompt_file and not per_line,
              "--chat MESSAGE is the prompt: give no PROMPT, --prompt-file or --lines with it")
        check(system is None or system.strip() != "", "--system is empty")
        messages = ([{"role": "system", "content": system}] if system is not None else []) + \
            [user_message(chat, "the --chat message")]
        source = dict(messages=messages, chat_template=read_chat_template(chat_template))
        check_chat_template(target, source["chat_template"])
        prompts = [""]  # what is printed before the reply
    many = len(prompts) > 1 or per_line or any(f.endswith(".jsonl") for f in prompt_file)
    check(many or batch_size is None, "--batch-size applies to several prompts (--prompt-file repeated, a .jsonl "
                                      "file, or --lines)")
    check(not (many and (baseline or stream)), "--baseline and --stream take one prompt")
    prompt = prompts[0]
    settings = sampling_settings(flags)  # the sampling flags; the rest are the method's options
    options = collect_method_options(flags)
    params = SamplingParams(max_new_tokens=max_new_tokens, **settings)  # the request, checked once
    temperature = params.temperature
    config = check_method_options(method, options)
    if profile is not None:
        from multispec.profile import MachineProfile

        options["profile"] = MachineProfile.load(profile)  # checked before any model loads
    resolve_device(device)
    check(not (compile_ and backend not in (None, "compiled")),
          f"--compile runs the compiled fast backend; it cannot be combined with --backend {backend}")
    backend = "compiled" if compile_ else backend  # None: the fast backend where the models have it, else hf
    # warn before loading when the flag is known: an explicit temperature, or lossy at every temperature
    warned = not config.lossless_at(temperature) if temperature is not None else \
        not (config.lossless_at(0.0) or config.lossless_at(1.0))
    if warned:
        _lossy_warning(method, temperature)
    _check_proposers(config, target, draft)
    _, warning = set_threads(threads)
    if warning:
        click.echo(f"warning: {warning}", err=True)

    pair = load_pair(target=target, draft=draft, device=device, dtype=dtype, cross_vocab=cross_vocab, compile=backend == "compiled")
    kw = dict(method=method, params=params, backend=backend, **options)
    if many:
        try:
            results = _generate_many(lambda on_result: generate(pair, prompts, batch_size=batch_size,
                                                                on_result=on_result, **kw), prompts, as_json)
        except MultispecError as e:
            raise _named_by_source(e, where) from None
        _report_many(results, warned, method)
        return
    if baseline:  # untimed first calls, so that neither timed run pays the one-off start-up costs
        for m in (method, "ar"):
            generate(pair, prompt or None, method=m, params=params.replace(max_new_tokens=2, seed=0),
                     backend=backend, **source, **(options if m == method else {}))
    on_text = (lambda s: (sys.stdout.write(s), sys.stdout.flush())) if stream and not as_json else None
    if stream and not as_json:
        sys.stdout.write(prompt)
    try:
        result = generate(pair, prompt or None, stream=on_text, **source, **kw)
    except BaseException as e:  # show what was committed before the failure (streaming showed it already)
        partial = getattr(e, "partial", None)
        if partial is not None and not on_text and not as_json and partial.text:
            click.echo(prompt + partial.text)
        if partial is not None and as_json and partial.token_ids:  # --json keeps the work done too, as JSON
            click.echo(json.dumps({**partial.stats, "finish_reason": partial.finish_reason, "text": partial.text,
                                   "token_ids": partial.token_ids}, indent=2))
        if on_text:
            click.echo()
        raise
    s = result.stats
    if not warned and not s["lossless"]:
        _lossy_warning(method, s["temperature"])
    for w in s["warnings"]:
        click.echo(f"warning: {w}", err=True)
    _calibration_note(s)
    if baseline:
        same = dict(kw, params=params.replace(temperature=s["temperature"], top_k=s["top_k"], top_p=s["top_p"],
                                              seed=s["seed"], reproducible=s["reproducible"]))
        ar = {k: v for k, v in same.items() if k not in options} | {"backend": s["backend"]}  # like with like
        s.update(_speedup(lambda: generate(pair, prompt or None, **source, **same).stats["tokens_per_s"],
                          lambda: generate(pair, prompt or None, **source, **dict(ar, method="ar")).stats["tokens_per_s"],
                          s["tokens_per_s"]))
    if as_json:
        click.echo(json.dumps({**s, "text": result.text, "token_ids": result.token_ids}, indent=2))
        return
    click.echo() if stream else click.echo(prompt + result.text)
    click.echo(_summary(s, result.finish_reason), err=True)


BASELINE_RUNS = (3, 5)  # --baseline: at least, at most this many runs of each method
BASELINE_SPREAD = 0.10  # ... stopping once (max - min) / median of the speedups is below this


def _speedup(run_method, run_ar, first_rate: float | None) -> dict:
    """--baseline: alternate ar and the method (its first run already done: first_rate tokens/s) until the speedups
    agree within BASELINE_SPREAD or BASELINE_RUNS[1] pairs ran. This run's own figures (its tokens/s over the ar
    run paired with it: `speedup_this_run`, `baseline_this_run_tokens_per_s`) and, apart, the median speedup over
    the pairs with its min and max and ar's median tokens/s (`speedup`, `baseline_tokens_per_s`)."""
    rates, bases = [first_rate], []
    while True:
        bases.append(run_ar())
        ratios = [r / b for r, b in zip(rates, bases) if r and b]
        if len(ratios) < len(bases):  # no tokens in some run: no speedup to report
            return {"speedup": None, "baseline_tokens_per_s": bases[-1], "baseline_runs": len(bases)}
        mid = statistics.median(ratios)
        if len(ratios) >= BASELINE_RUNS[1] or (len(ratios) >= BASELINE_RUNS[0]
                                               and (max(ratios) - min(ratios)) / mid <= BASELINE_SPREAD):
            return {"speedup_this_run": ratios[0], "baseline_this_run_tokens_per_s": bases[0],
                    "speedup": mid, "speedup_min": min(ratios), "speedup_max": max(ratios),
                    "baseline_runs": len(ratios), "baseline_tokens_per_s": statistics.median(bases)}
        rates.append(run_method())


def _calibration_note(s: dict) -> None:
    """One stderr line when `auto` measured the machine's forward costs before this run (its first on this model
    and settings), which made the start slower than later runs'."""
    costs = (s.get("auto") or {}).get("costs") or {}
    if costs.get("source") == "calibrated":
        took = f" ({costs['calibration_s']:.1f}s)" if costs.get("calibration_s") else ""
        click.echo(f"note: auto measured this model's forward costs on this machine before decoding{took}, once: "
                   "kept in the machine profile (multispec profile show), so later runs skip it", err=True)


def _generate_many(run, prompts: list[str], as_json: bool) -> list:
    """Decode a batch with run(on_result) and print it: --json writes each sequence's line as it finishes (flushed,
    so a killed run keeps them); text keeps every prompt in order, printed at the end. Interrupted, what finished
    (and the tokens of the sequences cut short) is printed before the interrupt goes on."""
    printer = _BatchPrinter(prompts, as_json)
    try:
        results = run(printer.finished)
    except BaseException as e:
        printer.rest(getattr(e, "partial", None) or [])
        raise
    printer.rest(results)
    return results


class _BatchPrinter:
    """Prints a batch's results to stdout as `_generate_many` says, and a progress line on stderr when it is a
    terminal (sequences done / total, tokens/s so far)."""

    def __init__(self, prompts: list[str], as_json: bool):
        self.prompts, self.as_json = prompts, as_json
        self.printed: set[int] = set()
        self.done = self.tokens = 0
        self.start = time.perf_counter()
        self.progress = sys.stderr.isatty()

    def finished(self, i: int, r) -> None:
        if self.as_json:
            self._print(i, r)
        self.done += 1
        self.tokens += len(r.token_ids)
        if self.progress:
            secs = time.perf_counter() - self.start
            sys.stderr.write(f"\r{self.done}/{len(self.prompts)} prompts done, "
                             f"{self.tokens / secs if secs > 0 else 0:.1f} tok/s")
            sys.stderr.flush()

    def rest(self, results: list) -> None:
        """Everything not printed yet, in order; a sequence that never started (no tokens, aborted) is left out."""
        if self.progress and self.done:
            sys.stderr.write("\r\033[K")
        for i, r in enumerate(results):
            if i not in self.printed and (r.finish_reason != "abort" or r.token_ids):
                self._print(i, r)

    def _print(self, i: int, r) -> None:
        self.printed.add(i)
        if self.as_json:
            click.echo(json.dumps({"index": i, **{k: v for k, v in r.stats.items() if k != "batch"},
                                   "finish_reason": r.finish_reason, "text": r.text, "token_ids": r.token_ids}))
        else:
            cut = " (interrupted)" if r.finish_reason == "abort" else ""
            click.echo(f"### {i}{cut}\n{self.prompts[i]}{r.text}")
        sys.stdout.flush()


def _report_many(results, warned: bool, method: str) -> None:
    """A finished batch's stderr lines: the lossy warning, each distinct warning once, and one summary."""
    s0 = results[0].stats
    if not warned and not s0["lossless"]:
        _lossy_warning(method, s0["temperature"])
    for w in dict.fromkeys(w for r in results for w in r.stats["warnings"]):
        click.echo(f"warning: {w}", err=True)
    _calibration_note(s0)
    b = s0["batch"]
    flag = "lossless" if s0["lossless"] else "LOSSY"
    mode = "greedy" if s0["temperature"] == 0 else f"T={s0['temperature']:g}"
    mode += f", {s0['target_dtype']} target" if s0.get("target_dtype") in QUANT_DTYPES else ""
    line = (f"[{s0['method']}, {flag}, {mode}] {b['prompts']} prompts, batch size {b['size']}: "
            f"{b['new_tokens']} tokens in {b['seconds']:.2f}s ({b['tokens_per_s'] or 0:.1f} tok/s)")
    click.echo(line + ("" if s0["temperature"] == 0 else f"; {_seeds(results)}"), err=True)


def _seeds(results) -> str:
    """The batch's seeds, unambiguously: `seed S + index` when prompt i used S + i (--seed), else the first few."""
    seeds = [r.stats["seed"] for r in results]
    if len(seeds) == 1:
        return f"seed {seeds[0]}"
    if seeds == list(range(seeds[0], seeds[0] + len(seeds))):
        return f"seed {seeds[0]} + index (prompt i used {seeds[0]} + i)"
    shown = ", ".join(str(x) for x in seeds[:3]) + (", ..." if len(seeds) > 3 else "")
    return f"fresh seeds, one per prompt: {shown} (--json lists each)"


def _read_prompts(prompt: str | None, prompt_files: tuple[str, ...], per_line: bool) -> list[tuple[str, str]]:
    """(where, prompt) for each prompt: PROMPT / stdin / each --prompt-file (a .jsonl file: one prompt per line),
    split into lines with --lines. Each checked non-empty; an empty one is named by its source (file, line), and
    `where` names it in a later error (`_named_by_source`)."""
    files = tuple(prompt_files or ())
    if len(files) <= 1 and not (files and files[0].endswith(".jsonl")):
        sources = [("the prompt", _read_prompt(prompt, files))]
    else:
        check(prompt is None, "give the prompts as PROMPT or --prompt-file, not both")
        sources = []
        for f in files:
            with open(f, "rb") as fh:
                text = decode_text(fh.read(), f"the prompt file {f}")
            sources.extend(_jsonl_prompts(text, f) if f.endswith(".jsonl") else [(f"the prompt file {f}", text)])
    if per_line:
        sources = [(f"{label} line {n}", line) for label, t in sources
                   for n, line in enumerate(t.splitlines(), start=1) if line.strip()]
    check(len(sources) >= 1, "no prompts: the prompt files hold no non-empty line")
    for label, t in sources:
        check(t != "", f"{label}: the prompt is empty" if re.search(r" line \d+$", label) else f"{label} is empty")
    return sources


def _named_by_source(e: MultispecError, where: list[str]) -> MultispecError:
    """A batch's error about one prompt (`prompts[i]: ...`, the library's name for it) named by where the prompt
    came from instead (`p.jsonl line 2: ...`)."""
    m = re.match(r"prompts\[(\d+)\]: ", str(e))
    if m is None or int(m.group(1)) >= len(where):
        return e
    renamed = MultispecError(f"{where[int(m.group(1))]}: {str(e)[m.end():]}")
    renamed.partial = getattr(e, "partial", None)  # type: ignore[attr-defined]
    return renamed


def _jsonl_prompts(text: str, path: str) -> list[tuple[str, str]]:
    """(where, prompt) for each non-blank line of a .jsonl prompt file; where: `PATH line N` (1-based). A line is a
    JSON string or {"prompt": ...}: any other key (a setting such as max_tokens, which would be ignored) is refused
    by name, before anything runs; settings are options, for every line."""
    out = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError:
            raise MultispecError(f"{path} line {n} is not JSON; a .jsonl prompt file holds one JSON string or "
                                 "{\"prompt\": ...} object per line") from None
        other = sorted(set(item) - {"prompt"}) if isinstance(item, dict) else []
        check(not other, f"{path} line {n}: unknown key{'s' * (len(other) > 1)} {', '.join(map(repr, other))[:200]} "
                         "(a line holds a JSON string or {\"prompt\": ...}; settings such as max_tokens are options "
                         "for every line: --max-new-tokens, --temperature, ...)")
        item = item.get("prompt") if isinstance(item, dict) else item
        check(isinstance(item, str), f"{path} line {n}: expected a JSON string or an object with a string "
                                     "\"prompt\"")
        out.append((f"{path} line {n}", item))
    return out


def _lossy_warning(method: str, temperature: float | None) -> None:
    at = "" if temperature is None else f" at temperature {temperature:g}"
    click.echo(f"warning: {method} with these settings{at} is LOSSY: its output distribution differs from the "
               "target's (a speed/quality trade-off)", err=True)


def _summary(s: dict, finish_reason: str) -> str:
    """One stderr line a person can read: what ran, how fast, how well the drafts did, and how to repeat it."""
    flag = "lossless" if s["lossless"] else "LOSSY"
    mode = "greedy" if s["temperature"] == 0 else f"T={s['temperature']:g}"
    mode += f", {s['target_dtype']} target" if s.get("target_dtype") in QUANT_DTYPES else ""
    line = (f"[{s['method']}, {flag}, {mode}] {s['new_tokens']} tokens in {s['seconds']:.2f}s "
            f"({s['tokens_per_s'] or 0:.1f} tok/s)")
    line += _speedup_text(s)
    if s["method"] != "ar":
        acc = "n/a" if s["draft_acceptance_rate"] is None else f"{s['draft_acceptance_rate']:.2f}"
        line += f"; {s['tau']:.2f} tokens per target call, draft acceptance {acc}"
    if s.get("structured"):
        g = s["structured"]
        line += f"; {g['kind']}: {g['forced_tokens']} tokens forced, {'complete' if g['complete'] else 'INCOMPLETE'}"
    line += f"; finished by {finish_reason}"
    if s["temperature"] != 0:
        line += f"; seed {s['seed']}" + (" (reproducible)" if s.get("reproducible") else "")
    return line


def _speedup_text(s: dict) -> str:
    """--baseline's part of the summary, after this run's tok/s: this run's speedup over the ar run paired with it
    and that run's rate (the two figures it is the ratio of), then the median over the pairs, labelled as such."""
    if s.get("speedup") is None:
        return ""
    return (f", {s['speedup_this_run']:.2f}x plain decoding at {s['baseline_this_run_tokens_per_s']:.1f} tok/s "
            f"(this run and its ar run; median over {s['baseline_runs']} pairs {s['speedup']:.2f}x, "
            f"{s['speedup_min']:.2f}-{s['speedup_max']:.2f}x)")


def _check_proposers(config, target: str | None, draft: str | None) -> None:
    """Before loading (generate and serve): a method that needs a draft model gets one (only --target without
    --draft loads no draft; no arguments load the default pair, which has one), and so does auto restricted to the
    draft proposer, which without one would silently decode without speculation."""
    if target is None or draft is not None:
        return
    if REGISTRY[config.name].needs_draft:
        free = ", ".join(name for name, entry in REGISTRY.items() if not entry.needs_draft)
        raise MultispecError(f"--method {config.name} needs a draft model: give --draft, or use a method that needs "
                             f"none ({free})")
    if config.name == "auto" and config.proposers == ("draft",):
        raise MultispecError("--proposers draft needs a draft model: give --draft, or use --proposers lookup "
                             "(or draft,lookup)")


def _read_prompt(prompt: str | None, prompt_file: tuple[str, ...] | str | None) -> str:
    """PROMPT, or stdin for '-', or the file's text: exactly one source, valid UTF-8 (a leading BOM dropped)."""
    files = (prompt_file,) if isinstance(prompt_file, str) else tuple(prompt_file or ())
    check(len(files) <= 1, f"--prompt-file given {len(files)} times; give it once")
    check((prompt is None) != (not files), "give the prompt as PROMPT, '-' (stdin) or --prompt-file, "
          "exactly one of them")
    if files:
        with open(files[0], "rb") as fh:
            return decode_text(fh.read(), f"the prompt file {files[0]}")
    if prompt == "-":
        data = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read()
        return decode_text(data, "the prompt on stdin") if isinstance(data, bytes) else data.lstrip("\ufeff")
    from multispec.validate import check_text

    check_text(prompt, "the PROMPT argument")  # argv bytes that were not UTF-8 reach Python as lone surrogates
    return prompt
