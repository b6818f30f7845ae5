#!/usr/bin/env bash
# Issue 3: multispec's sd and mcsd against target-only decoding and transformers' assisted generation, on pycode-v1.
# HumanEval prompts 0-19, 128 new tokens, greedy and T=1; hf-assisted at its defaults and at its best fixed
# num_assistant_tokens (swept over 1,2,3,4,6,8 on the first 3 prompts); multispec's methods on both backends
# (transformers `hf` and the static-cache `fast`). Run on a quiet machine.
#
#   benchmarks/methods/issue3_humaneval.sh                 # writes benchmarks/results/issue3/
#   MULTISPEC_MODELS=/path/to/pycode-v1 MULTISPEC_DATA=/path/to/data THREADS=2 benchmarks/methods/issue3_humaneval.sh
# Extra arguments are passed to `multispec bench` (e.g. --repeats 3, --device cuda).
set -euo pipefail
cd "$(dirname "$0")/../.."
MODELS=${MULTISPEC_MODELS:-../shared/models/pycode-v1}
export MULTISPEC_DATA=${MULTISPEC_DATA:-../shared/data}
PYTHON=${PYTHON:-.venv/bin/python}

"$PYTHON" -m multispec bench \
  --target "$MODELS/target" --draft "$MODELS/draft" \
  --dataset humaneval --offset 0 --limit 20 \
  --max-new-tokens 128 --temperatures 0,1 --seed 0 --warmup 1 --repeats 1 \
  --methods 'ar;sd:k=4;mcsd:tree=4-2-2-1;ar:backend=fast;sd:k=4,backend=fast;mcsd:tree=4-2-2-1,backend=fast;hf-assisted;hf-assisted:best' \
  --threads "${THREADS:-2}" \
  --out benchmarks/results/issue3 "$@"
