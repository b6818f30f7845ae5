#!/usr/bin/env bash
# Issue 8, the main table: every method on Spec-Bench (10 prompts of each of its six categories; the mt_bench
# category round-robin over MT-Bench's eight) and HumanEval (prompts 0-19), greedy and T=1, 64 new tokens
# (MAX_NEW=128 for longer outputs), pycode-v1. specdecpp runs when an acceptance head exists ($HEADS/acceptance).
# Run on a quiet machine.
#
#   benchmarks/methods/main_table.sh                       # writes benchmarks/results/main/
#   MULTISPEC_MODELS=... MULTISPEC_DATA=... MULTISPEC_HEADS=... THREADS=2 benchmarks/methods/main_table.sh [--repeats 3]
set -euo pipefail
cd "$(dirname "$0")/../.."
MODELS=${MULTISPEC_MODELS:-../shared/models/pycode-v1}
HEADS=${MULTISPEC_HEADS:-heads/pycode-v1}
export MULTISPEC_DATA=${MULTISPEC_DATA:-../shared/data}
PYTHON=${PYTHON:-.venv/bin/python}

# Lossless methods on both backends, plus transformers' assisted generation (defaults and best fixed N).
# ti-mcsd (lossy) and dynamic are compared in the ablation (benchmarks/methods/ablation_mcsd.py).
METHODS='ar;sd:k=4;mcsd:tree=4-2-2-1'
if [ -d "$HEADS/acceptance" ]; then
  METHODS="$METHODS;specdecpp:head=$HEADS/acceptance,threshold=0.9"
else
  echo "note: no acceptance head at $HEADS/acceptance; specdecpp is left out" >&2
fi
METHODS="$METHODS;ar:backend=fast;sd:k=4,backend=fast"
if [ -d "$HEADS/acceptance" ]; then
  METHODS="$METHODS;specdecpp:head=$HEADS/acceptance,threshold=0.9,backend=fast"
fi
METHODS="$METHODS;hf-assisted;hf-assisted:best"

"$PYTHON" -m multispec bench \
  --target "$MODELS/target" --draft "$MODELS/draft" \
  --dataset spec-bench,humaneval --limit spec-bench=10,humaneval=20 --offset 0 \
  --max-new-tokens ${MAX_NEW:-64} --max-prompt-tokens 512 --temperatures 0,1 --seed 0 --warmup 1 --repeats 1 \
  --methods "$METHODS" \
  --threads "${THREADS:-2}" \
  --out benchmarks/results/main "$@"
