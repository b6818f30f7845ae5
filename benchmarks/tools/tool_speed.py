"""Tool calls under speculation, measured (issue 64): 40 tool-call requests of the shapes agents send, decoded by
constrained `ar` and by the speculative methods, greedy and T = 0.7, one thread.

The requests: 10 agent scenarios (weather, search, calculator, files, email, calendar, SQL, HTTP, unit conversion,
a shell command), each with 2-4 tools of OpenAI's shape, x 4 variants (other arguments; a second turn that carries
the first call and its tool result in the history; tool_choice "required" or the scenario's function named). Every
request is constrained by the calls' grammar (multispec.tools): the envelope `<tool_call>{"name": ..., "arguments":
{...}}</tool_call>` and the arguments follow the function's schema.

Per model and temperature, every method decodes every request in one run (methods interleaved per request): total
tokens/s end to end (prefill of the tool-laden prompt included) and decode-only, each as a ratio to constrained
`ar`, tokens per target call, the share of tokens the grammar forced; every call of an output that ended (not cut by
max tokens) parsed and its arguments validated with jsonschema; greedy outputs compared across methods (they must be
token-identical); and the streaming stall vLLM #49002 saw at the closing brace: for every streamed chunk that
carries a `}`, the gap since the previous chunk against the request's median gap between chunks (the largest ratio
is reported; the goal is at most 3).

Models: Qwen2.5-Coder-1.5B-Instruct with the 0.5B as draft (w4a8, as the real-pair speed run; its own chat
template renders the tools) and SmolLM2-135M-Instruct (float32, the shipped head, multispec's Hermes tool
template). Fetch them with `python scripts/fetch_models.py`.

    PYTHONPATH=src python benchmarks/tools/tool_speed.py --out benchmarks/results/tools/speed.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))  # real_models: where the fetched GGUF files are


def fn(name: str, description: str, properties: dict, required: list[str]) -> dict:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": required, "additionalProperties": False}}}


STR, INT = {"type": "string"}, {"type": "integer"}
SCENARIOS = [  # (tools, the function a request calls, user asks (4), arguments of a first call, its tool result)
    ([fn("get_weather", "Current weather in a city", {"city": STR, "unit": {"enum": ["celsius", "fahrenheit"]}},
         ["city"]), fn("get_forecast", "Forecast for the next days", {"city": STR, "days": {**INT, "minimum": 1,
                                                                                             "maximum": 7}},
                       ["city", "days"])],
     "get_weather", ["What is the weather in Paris?", "Is it cold in Oslo right now, in fahrenheit?",
                     "Tell me the weather in Lima.", "How warm is it in Cairo?"],
     {"city": "Rome"}, "sunny, 24 C"),
    ([fn("web_search", "Search the web", {"query": STR, "limit": {**INT, "minimum": 1, "maximum": 10}}, ["query"]),
      fn("open_url", "Fetch a page", {"url": STR}, ["url"])],
     "web_search", ["Find the latest Python release notes.", "Search for the tallest building in Europe.",
                    "Look up who wrote Dune, 3 results.", "Search recipes for lentil soup."],
     {"query": "speculative decoding"}, "1. Fast Inference from Transformers via Speculative Decoding"),
    ([fn("calculate", "Evaluate an arithmetic expression", {"expression": STR}, ["expression"]),
      fn("convert_currency", "Convert money", {"amount": {"type": "number"}, "from": STR, "to": STR},
         ["amount", "from", "to"])],
     "calculate", ["What is 17 times 23?", "Compute (4 + 9) * 12.", "What is 2 to the power 20?",
                   "Divide 1000 by 7."], {"expression": "3 * 4"}, "12"),
    ([fn("read_file", "Read a text file", {"path": STR}, ["path"]),
      fn("write_file", "Write a text file", {"path": STR, "content": STR}, ["path", "content"]),
      fn("list_dir", "List a folder", {"path": STR}, ["path"])],
     "read_file", ["Show me the contents of setup.py.", "Open README.md.", "What is in src/main.py?",
                   "Read the file config/settings.toml."], {"path": "notes.txt"}, "buy milk"),
    ([fn("send_email", "Send an email", {"to": STR, "subject": STR, "body": STR}, ["to", "subject", "body"])],
     "send_email", ["Email bob@example.com that the build is green.", "Tell alice@example.com I am late.",
                    "Send ops@example.com a note that the disk is full.",
                    "Write to team@example.com: standup moved to 10."],
     {"to": "x@example.com", "subject": "hi", "body": "hello"}, "sent"),
    ([fn("create_event", "Add a calendar event", {"title": STR, "date": {"type": "string",
                                                                       "pattern": "^2026-[01][0-9]-[0-3][0-9]$"},
                                                  "hours": {**INT, "minimum": 1, "maximum": 8}}, ["title", "date"]),
      fn("list_events", "List events on a day", {"date": STR}, ["date"])],
     "create_event", ["Book a dentist visit on 2026-12-09.", "Add 'team lunch' on 2026-12-11 for 2 hours.",
                      "Schedule a review on 2026-12-15.", "Put 'flight to Rome' on 2026-12-20."],
     {"title": "gym", "date": "2026-12-07"}, "created"),
    ([fn("run_sql", "Run a read-only SQL query", {"query": STR}, ["query"]),
      fn("describe_table", "Columns of a table", {"table": STR}, ["table"])],
     "run_sql", ["How many users signed up today?", "List the ten largest orders.",
                 "Count the rows of the invoices table.", "Which products are out of stock?"],
     {"query": "SELECT 1"}, "[[1]]"),
    ([fn("http_get", "GET a URL and return the body", {"url": STR, "timeout": {**INT, "minimum": 1, "maximum": 60}},
         ["url"])],
     "http_get", ["Fetch https://example.com/status.", "Get https://api.example.com/v1/items with a 5 s timeout.",
                  "Download https://example.org/robots.txt.", "Check https://example.net/health."],
     {"url": "https://example.com"}, "<html>ok</html>"),
    ([fn("convert_units", "Convert a quantity", {"value": {"type": "number"}, "from_unit": STR, "to_unit": STR},
         ["value", "from_unit", "to_unit"])],
     "convert_units", ["How many km is 26.2 miles?", "Convert 100 fahrenheit to celsius.",
                       "What is 5 pounds in kilograms?", "3 feet in meters?"],
     {"value": 1, "from_unit": "m", "to_unit": "cm"}, "100"),
    ([fn("run_shell", "Run a shell command", {"command": STR}, ["command"]),
      fn("read_file", "Read a text file", {"path": STR}, ["path"])],
     "run_shell", ["List the files in the current folder.", "Show the disk usage.", "Print the git log, last 3.",
                   "How many lines does main.py have?"], {"command": "pwd"}, "/home/user"),
]
SYSTEM = "You are a helpful assistant. Use the tools to answer."


def requests() -> list[dict]:
    """40 requests: each scenario's 4 asks; asks 0 and 2 name the function, 1 and 3 say "required"; asks 2 and 3
    come as a second turn, after an earlier call and its result."""
    out = []
    for s, (tools, name, asks, first_args, first_result) in enumerate(SCENARIOS):
        for v, ask in enumerate(asks):
            messages = [{"role": "system", "content": SYSTEM}]
            if v >= 2:
                call = {"id": f"call_{s}", "type": "function",
                        "function": {"name": name, "arguments": json.dumps(first_args)}}
                messages += [{"role": "user", "content": "Start with a quick check."},
                             {"role": "assistant", "content": None, "tool_calls": [call]},
                             {"role": "tool", "tool_call_id": f"call_{s}", "content": first_result}]
            messages.append({"role": "user", "content": ask})
            choice = {"type": "function", "function": {"name": name}} if v % 2 == 0 else "required"
            out.append({"id": f"{name}/{v}", "tools": tools, "tool_choice": choice, "messages": messages})
    return out


class Stream:
    """Arrival times of a request's streamed chunks and their text."""

    def __init__(self):
        self.times: list[float] = []
        self.texts: list[str] = []

    def __call__(self, delta: str) -> None:
        self.times.append(time.perf_counter())
        self.texts.append(delta)

    def brace_stall(self) -> float | None:
        """The largest gap before a chunk carrying '}' over the median gap between chunks (None: too few)."""
        gaps = [b - a for a, b in zip(self.times, self.times[1:])]
        if len(gaps) < 3:
            return None
        median = statistics.median(gaps)
        at = [g for g, text in zip(gaps, self.texts[1:]) if "}" in text]
        return max(at) / median if at and median > 0 else None


def valid_calls(calls, tools) -> bool:
    import jsonschema

    if not calls:
        return False
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    try:
        for c in calls:
            jsonschema.validate(json.loads(c["function"]["arguments"]), schemas[c["function"]["name"]])
    except (KeyError, ValueError, jsonschema.ValidationError):
        return False
    return True


def prepared(pair, reqs, chat_template) -> list[tuple]:
    """Each request as (token ids, grammar, the Tools)."""
    from multispec.api import tool_request
    from multispec.loading import vocab_rows
    from multispec.text import encode_chat

    out = []
    for r in reqs:
        calls, grammar = tool_request(pair, r["tools"], r["tool_choice"], {})
        ids = encode_chat(pair.tokenizer, vocab_rows(pair.target), r["messages"], chat_template,
                          calls.template_tools(), pair.target_path)
        out.append((ids, grammar, calls))
    return out


def run_model(name, pair, methods, reqs, chat_template, temperatures, max_new, say, profile=None,
              warm: bool = False, learning: bool = False) -> dict:
    import multispec
    from multispec.tool_calls import parse_tool_calls

    items = prepared(pair, reqs, chat_template)

    def decoder(m: str, profile):
        return multispec.Decoder(pair, m.split(":")[0], "fast", profile=profile, **_options(m))

    def make(profile) -> dict:  # each decoder built on what the ones before it measured: one profile for all
        out = {}
        for m in methods:
            out[m] = decoder(m, profile)
            profile = out[m].profile
        return out

    decoders = make(profile)
    for d in decoders.values():  # --profile server: each request plans from what the earlier ones observed
        d.machine.learning = learning
    costs = {}  # the cost model auto plans from (measured now under --profile fresh)
    for m, d in decoders.items():  # untimed warm-up: calibrations, first-call allocations, the grammar's tokenizer
        warm_up = d.generate(items[0][0], max_new_tokens=4, temperature=0, grammar=items[0][1])
        costs[m] = (warm_up.stats.get("auto") or {}).get("costs")
    measured = decoders[methods[-1]].profile  # with everything measured
    halves = [[i for i in range(len(items)) if (i // 4) % 2 == h] for h in (0, 1)]  # by scenario, alternating

    def learned(temperature: float) -> list[dict]:
        """--profile warm: per half of the scenarios, decoders planning from the profile that auto's untimed pass
        over the other half's requests left (their observations folded in, as a server's next session starts)."""
        sets = []
        for h in (0, 1):
            learner = decoder(next(m for m in methods if m.startswith("auto")), measured)
            for i in halves[1 - h]:
                learner.generate(items[i][0], max_new_tokens=max_new, temperature=temperature, seed=10_000 + i,
                                 grammar=items[i][1])
            sets.append(make(learner.updated_profile()))
        say(f"{name} T={temperature:g}: acceptance learned on the other half of the scenarios, untimed")
        return sets

    result = {}
    for temperature in temperatures:
        rows = {m: {"tokens": 0, "seconds": 0.0, "decode_seconds": 0.0, "target_calls": 0, "forced": 0, "valid": 0,
                    "cut_by_length": 0, "stalls": [], "plan_rounds": {}}
                for m in methods}
        identical = 0
        sets = learned(temperature) if warm else [decoders, decoders]
        for i, ((ids, grammar, calls), r) in enumerate(zip(items, reqs)):
            out = {}
            for m in methods:
                stream = Stream()
                res = sets[0 if i in halves[0] else 1][m].generate(ids, max_new_tokens=max_new, temperature=temperature, seed=i,
                                           grammar=grammar, stream=stream)
                row = rows[m]
                row["tokens"] += len(res.token_ids)
                row["seconds"] += res.stats["seconds"]
                row["decode_seconds"] += res.stats["seconds"] - (res.stats.get("prefill_s") or 0.0)
                row["target_calls"] += res.stats["target_calls"]
                row["forced"] += res.stats["structured"]["forced_tokens"]
                cut = res.finish_reason == "length"  # a small model repeating its call until max tokens
                row["cut_by_length"] += cut
                row["valid"] += not cut and valid_calls(parse_tool_calls(res.text, calls.forced)[1], r["tools"])
                row["stalls"].append(stream.brace_stall())
                for label, plan in ((res.stats.get("auto") or {}).get("plans") or {}).items():  # rounds per kind
                    kind = label.removesuffix(" (probe)").split(" ")[0]
                    row["plan_rounds"][kind] = row["plan_rounds"].get(kind, 0) + plan["rounds"]
                out[m] = res.token_ids
            same = len({tuple(v) for v in out.values()}) == 1
            identical += same
            say(f"{name} T={temperature:g} {i + 1}/{len(reqs)} {r['id']}: identical={same} "
                f"{pair.tokenizer.decode(out[methods[0]])[:80]!r}")
        base, base_dec = (rows[methods[0]]["tokens"] / rows[methods[0]][k] for k in ("seconds", "decode_seconds"))
        for m, row in rows.items():
            stalls = [s for s in row.pop("stalls") if s is not None]
            row.update(tokens_per_s=row["tokens"] / row["seconds"],
                       speedup_vs_ar=row["tokens"] / row["seconds"] / base,
                       decode_tokens_per_s=row["tokens"] / row["decode_seconds"],
                       decode_speedup_vs_ar=row["tokens"] / row["decode_seconds"] / base_dec,
                       tokens_per_target_call=row["tokens"] / max(1, row["target_calls"]),
                       forced_fraction=row["forced"] / max(1, row["tokens"]),
                       brace_stall_max=max(stalls, default=None),
                       brace_stall_p90=sorted(stalls)[int(0.9 * (len(stalls) - 1))] if stalls else None)
        result[f"T={temperature:g}"] = {"requests": len(reqs), "identical_across_methods": identical,
                                        "methods": rows, "auto_costs": {m: c for m, c in costs.items() if c}}
    return result


def _options(method: str) -> dict:
    out: dict = {}
    for part in method.split(":")[1:]:
        k, v = part.split("=")
        out[k] = int(v) if v.isdigit() else v
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=["qwen", "smollm2"])
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--temperatures", default="0,0.7")
    ap.add_argument("--qwen-dtype", default="w4a8")
    ap.add_argument("--profile", default="fresh", help="the machine profile auto plans from: server (fresh costs; "
                    "each request's acceptance folded into the profile the next ones plan from, as `multispec serve` "
                    "does by default), fresh (default: "
                    "none, so the costs are measured when the decoders are made, on this core, as on a first run, "
                    "and acceptance starts from the priors), warm (fresh costs; acceptance as an untimed pass of auto "
                    "over the other half of the scenarios left it: a server's second session) or a profile file")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    from multispec.paths import writable_file

    out = writable_file(args.out)
    torch.set_num_threads(1)
    import real_models

    import multispec
    from multispec.bench.runner import environment
    from multispec.tools import HERMES_TEMPLATE

    started = time.time()

    def say(line: str) -> None:
        print(f"[{time.time() - started:6.0f} s] {line}", file=sys.stderr, flush=True)

    reqs = requests()[:args.requests]
    temps = [float(t) for t in args.temperatures.split(",")]
    from multispec.profile import MachineProfile

    profile = MachineProfile() if args.profile in ("fresh", "warm", "server") else args.profile
    warm, learning = args.profile == "warm", args.profile == "server"
    result: dict = {"max_new_tokens": args.max_new_tokens, "requests": len(reqs), "profile": args.profile,
                    "models": {}}
    if args.only in (None, "smollm2"):
        pair = multispec.load_pair(target=str(real_models.smollm2()), dtype="float32", device="cpu")
        result["environment"] = environment(pair, sys.argv)
        result["models"]["SmolLM2-135M-Instruct"] = run_model(
            "smollm2", pair, ["ar", "auto:head=shipped", "eagle:head=shipped"], reqs,
            Path(HERMES_TEMPLATE).read_text(), temps, args.max_new_tokens, say, profile, warm, learning)
        out.write_text(json.dumps(result, indent=1) + "\n")
    if args.only in (None, "qwen"):
        target, draft = real_models.qwen_coder()
        t0 = time.perf_counter()
        pair = multispec.load_pair(target=str(target), draft=str(draft), dtype=args.qwen_dtype, device="cpu")
        say(f"Qwen2.5-Coder 1.5B + 0.5B loaded as {args.qwen_dtype} in {time.perf_counter() - t0:.0f} s")
        result.setdefault("environment", environment(pair, sys.argv))
        result["models"]["Qwen2.5-Coder-1.5B-Instruct + 0.5B"] = run_model(
            "qwen", pair, ["ar", "auto"], reqs, None, temps, args.max_new_tokens, say, profile, warm, learning)
        out.write_text(json.dumps(result, indent=1) + "\n")
    for name, model in result["models"].items():
        for t, r in model.items():
            print(f"\n{name} {t}: {r['identical_across_methods']}/{r['requests']} identical across methods")
            for m, row in r["methods"].items():
                print(f"  {m:22s} valid {row['valid']}/{r['requests']} (cut {row['cut_by_length']}) "
                      f"{row['tokens_per_s']:6.1f} tok/s "
                      f"{row['speedup_vs_ar']:.2f}x ar e2e, {row['decode_speedup_vs_ar']:.2f}x decode, "
                      f"{row['tokens_per_target_call']:.2f} tok/call, forced "
                      f"{row['forced_fraction']:.0%}, brace stall max {row['brace_stall_max']}")


if __name__ == "__main__":
    main()
