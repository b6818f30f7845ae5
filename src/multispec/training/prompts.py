"""The built-in prompt set a feature head's on-policy data is generated from (`multispec train-head`'s default
`--data own`): never the HumanEval / Spec-Bench prompts used for measurement.

- Code: the opening of functions of this interpreter's standard library (signature and docstring, as a HumanEval
  prompt looks), to be continued as raw text.
- Instructions: short requests of the kinds chat models are asked (writing, explaining, reasoning, coding), sent
  as one user message through the tokenizer's chat template when it has one (else as raw text).
"""
from __future__ import annotations

import ast
import random
import sysconfig
from pathlib import Path

TOPICS = ("a binary search tree", "photosynthesis", "the French Revolution", "compound interest", "a hash map",
          "black holes", "the water cycle", "recursion", "supply and demand", "vaccines", "TCP handshakes",
          "the Pythagorean theorem", "climate change", "a linked list", "inflation", "plate tectonics",
          "public-key cryptography", "the immune system", "sorting algorithms", "renewable energy")
TASKS = ("Explain {t} to a twelve-year-old.", "Write a short poem about {t}.", "Give three facts about {t}.",
         "What are the pros and cons of {t}?", "Summarize what {t} is in two sentences.",
         "Write a Python function related to {t}, with a docstring.", "Write a short story that involves {t}.",
         "Compare {t} with something similar and explain the differences.", "List common misconceptions about {t}.",
         "Write an email to a colleague explaining {t}.")
MATH = ("If a train travels {a} km in {b} hours, what is its average speed?",
        "A shop sells pens at {a} cents each. How much do {b} pens cost in dollars?",
        "What is {a} multiplied by {b}? Show your steps.",
        "Tom has {a} apples and gives away {b}. How many are left? Explain.")


def instructions(n: int, seed: int = 0) -> list[str]:
    """n instructions (topics x tasks, and small word problems), in a seeded order."""
    rng = random.Random(seed)
    out = [task.format(t=t) for t in TOPICS for task in TASKS]
    out += [m.format(a=rng.randint(12, 480), b=rng.randint(2, 11)) for m in MATH for _ in range(10)]
    rng.shuffle(out)
    return out[:n]


def code_prompts(n: int, seed: int = 0) -> list[str]:
    """n function openings (`def name(args):` and its docstring) from this interpreter's standard library."""
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    random.Random(seed).shuffle(files)
    out: list[str] = []
    for f in files:
        try:
            source = f.read_text(encoding="utf-8")
            tree = ast.parse(source)
        except (OSError, UnicodeError, SyntaxError, ValueError):
            continue
        lines = source.splitlines()
        for node in ast.walk(tree):
            doc = ast.get_docstring(node) if isinstance(node, ast.FunctionDef) else None
            if doc and node.col_offset == 0 and len(doc) < 600 and node.body[0].end_lineno is not None:
                out.append("\n".join(lines[node.lineno - 1:node.body[0].end_lineno]) + "\n")
                if len(out) >= n:
                    return out
    return out
