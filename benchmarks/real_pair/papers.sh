#!/usr/bin/env bash
# The three papers' measurements on the Qwen2.5-Coder 1.5B/0.5B pair, int8, one thread (CPU only):
#   optimal  P3: optimal multi-draft acceptance vs each verifier (HumanEval 8 x 32 tokens, T 0.7/1.0, n 2-4;
#            tokens below 1e-6 in both p and q dropped: at 1e-9 a 151,936-token position takes seconds)
#   p1       P1: tree vs chain acceptance, Spec-Bench one prompt per category x 64 tokens, T 0.7, chat template
#   head     P2: the SpecDec++ acceptance head trained from the int8 pair (48 prompts x 96 tokens, T 1)
#   p2       P2: specdecpp against fixed k, HumanEval 100-107 x 96 tokens, T 1, top-k 50
#            (as the head was trained, as P2; the head trains on HumanEval 0-99)
#   p2-small the same at HumanEval 100-103 x 48 tokens without a warm-up run (the committed run)
# Usage: benchmarks/real_pair/papers.sh [STEP...]   (default: the first four, in this order). Results under
# benchmarks/results/real_pair/; the head under $HEAD_DIR (default ~/.cache/multispec/heads/qwen-coder-int8).
set -euo pipefail
cd "$(dirname "$0")/../.."
read -r T D < <(python -c "import sys; sys.path.insert(0, 'tests'); from real_models import find_qwen_coder as f; print(*f())")
OUT=benchmarks/results/real_pair
HEAD_DIR=${HEAD_DIR:-$HOME/.cache/multispec/heads/qwen-coder-int8}
export OMP_NUM_THREADS=1
for step in "${@:-optimal p1 head p2}"; do
  for s in $step; do
    echo "== $s $(date -u +%H:%M:%S)" >&2
    case $s in
      optimal) python -m multispec optimal --target "$T" --draft "$D" --dtype int8 --dataset humaneval --limit 8 \
                 --max-new-tokens 32 --temperatures 0.7,1.0 --drafts 2,3,4 --support-eps 1e-6 --out "$OUT/optimal.json" ;;
      p1) python -m multispec bench --target "$T" --draft "$D" --dtype int8 --threads 1 --dataset spec-bench \
            --chat-template on --limit 1 --max-new-tokens 64 --temperatures 0.7 --quiet \
            --methods 'sd:k=4,backend=fast;mcsd:tree=4-2-2-1,backend=fast;ti-mcsd:tree=2-4-3-1-1,backend=fast' \
            --out "$OUT/p1_tree_vs_chain" ;;
      head) python -m multispec heads train-acceptance --target "$T" --draft "$D" --dtype int8 --threads 1 \
              --dataset humaneval-train --n-prompts 48 --max-new-tokens 96 --temperature 1 \
              --cache "$HEAD_DIR-data" --out "$HEAD_DIR" ;;
      p2) python -m multispec bench --target "$T" --draft "$D" --dtype int8 --threads 1 --dataset humaneval \
            --offset 100 --limit 8 --max-new-tokens 96 --temperatures 1 --top-k 50 --quiet \
            --methods "ar:backend=fast;sd:k=2,backend=fast;sd:k=4,backend=fast;sd:k=6,backend=fast;specdecpp:head=$HEAD_DIR,threshold=0.7,backend=fast" \
            --out "$OUT/p2_specdecpp" ;;
      p2-small)  # what fitted the time box on a loaded machine: HumanEval 0-3 x 48 tokens, no warm-up run
        python -m multispec bench --target "$T" --draft "$D" --dtype int8 --threads 1 --dataset humaneval \
            --offset 100 --limit 4 --max-new-tokens 48 --warmup 0 --temperatures 1 --top-k 50 --quiet \
            --methods "ar:backend=fast;sd:k=2,backend=fast;sd:k=4,backend=fast;sd:k=6,backend=fast;specdecpp:head=$HEAD_DIR,threshold=0.7,backend=fast" \
            --out "$OUT/p2_specdecpp" ;;
      *) echo "unknown step $s" >&2; exit 2 ;;
    esac
  done
done
