"""Held-out acceptance of feature heads against training minutes, from their training.json files (train-head).

    python benchmarks/eagle/plot_curve.py OUT.png LABEL=HEAD_DIR/training.json [LABEL=...]
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main() -> None:
    out, runs = sys.argv[1], [a.split("=", 1) for a in sys.argv[2:]]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for label, path in runs:
        curve = json.load(open(path))["curve"]
        minutes = [c["minutes"] for c in curve]
        ax.plot(minutes, [c["alpha"] for c in curve], marker=".", label=f"{label}: alpha (T = 1)")
        ax.plot(minutes, [c["greedy_agree"] for c in curve], linestyle="--", label=f"{label}: greedy agreement")
    ax.set_xlabel("training minutes (after data and features)")
    ax.set_ylabel("held-out, one drafted token")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("Feature heads for SmolLM2-135M-Instruct (multispec train-head)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
