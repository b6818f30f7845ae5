#!/usr/bin/env bash
# Issue 8, the main table: every method on Spec-Bench (10 prompts of each of its six categories; the mt_bench
# category round-robin over MT-Bench's eight) and HumanEval (prompts 0-19), greedy and T=1, 128 new tokens, pycode-v1.
# specdecpp runs when an acceptance head exists ($HEADS/acceptance), dynamic uses a decision model when one exists
# ($HEADS/decision; without it, it is the fixed fork tree 4,1,1,1,1). Run on a quiet machine.
#
#   benchmarks/main_table.sh                       # writes benchmarks/results/main/
#   MULTISPEC_MODELS=... MULTISPEC_DATA=... MULTISPEC_HEADS=... THREADS=2 benchmarks/main_table.sh [--repeats 3]
set -euo pipefail
cd "$(dirname "$0")/.."
MODELS=${MULTISPEC_MODELS:-../shared/models/pycode-v1}
HEADS=${MULTISPEC_HEADS:-heads/pycode-v1}
export MULTISPEC_DATA=${MULTISPEC_DATA:-../shared/data}
PYTHON=${PYTHON:-.venv/bin/python}

METHODS='ar;sd:k=4;sd:heuristic=1;mcsd:tree=4-2-2-1;ti-mcsd'
if [ -d "$HEADS/decision" ]; then
  METHODS="$METHODS;dynamic:width=4,depth=5,decision_model=$HEADS/decision"
else
  echo "note: no decision model at $HEADS/decision; dynamic runs without early stopping" >&2
  METHODS="$METHODS;dynamic:width=4,depth=5"
fi
if [ -d "$HEADS/acceptance" ]; then
  METHODS="$METHODS;specdecpp:head=$HEADS/acceptance,threshold=0.7"
else
  echo "note: no acceptance head at $HEADS/acceptance; specdecpp is left out" >&2
fi
METHODS="$METHODS;hf-assisted;hf-assisted:best"

"$PYTHON" -m multispec bench \
  --target "$MODELS/target" --draft "$MODELS/draft" \
  --dataset spec-bench,humaneval --limit spec-bench=10,humaneval=20 --offset 0 \
  --max-new-tokens 128 --max-prompt-tokens 512 --temperatures 0,1 --seed 0 --warmup 1 --repeats 1 \
  --methods "$METHODS" \
  --threads "${THREADS:-2}" \
  --out benchmarks/results/main "$@"
