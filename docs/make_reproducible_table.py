"""Print the acceptance table of docs/reproducible.md and write its numbers to docs/reproducible_table.json:
the coupled (drafter-invariant) acceptance of `gumbel` (n = 1) and `gls` (n drafts) against standard SD's 1 - TV,
the optimum of P3 for n drafts (multispec.optimal), the rrs-wor verifier, the published GLS K-slot list (Monte
Carlo) and the worst-case bound (1 - TV)/(1 + TV). Usage: PYTHONPATH=src python docs/make_reproducible_table.py"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from multispec.optimal import optimal_acceptance, verifier_acceptance
from multispec.verify.gumbel import acceptance_mc, coupling_acceptance


def pairs() -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(label, p target, q draft): random and peaked pairs, seeded."""
    rng = np.random.default_rng(2408_07978)
    out = []
    for v, alpha, label in [(8, 1.0, "random"), (8, 0.3, "peaked"), (32, 0.5, "random"), (32, 0.1, "peaked")]:
        p, q = rng.dirichlet([alpha] * v), rng.dirichlet([alpha] * v)
        out.append((f"{label} V={v} a={alpha}", p, q))
        close = 0.7 * p + 0.3 * rng.dirichlet([alpha] * v)  # a draft that resembles the target
        out.append((f"{label} V={v} a={alpha}, q near p", p, close))
    return out


def main() -> None:
    rows = []
    for label, p, q in pairs():
        tv = 0.5 * float(np.abs(p - q).sum())
        row = {"pair": label, "TV": tv, "1-TV": 1 - tv, "bound": (1 - tv) / (1 + tv),
               "gumbel": coupling_acceptance(p, q, 1)}
        for n in (2, 4):
            row[f"gls n={n}"] = coupling_acceptance(p, q, n)
            row[f"slots n={n}"] = acceptance_mc(p, q, n, samples=200_000, seed=n, mode="slots")[0]
            row[f"rrs-wor n={n}"] = verifier_acceptance("rrs-wor", p, q, n, samples=20_000).value
            row[f"opt n={n}"] = optimal_acceptance(p, q, n, replacement=False)
        rows.append(row)
    cols = ["pair", "TV", "bound", "gumbel", "1-TV", "gls n=2", "slots n=2", "rrs-wor n=2", "opt n=2",
            "gls n=4", "slots n=4", "rrs-wor n=4", "opt n=4"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for row in rows:
        print("| " + " | ".join(row[c] if c == "pair" else f"{row[c]:.3f}" for c in cols) + " |")
    Path(__file__).with_name("reproducible_table.json").write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
