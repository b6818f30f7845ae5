#!/usr/bin/env bash
# The batch loop on a lent GPU, the embedded pair (it travels with the code) in fp32 on CUDA, one call:
# batched = alone greedy (benchmarks/batching/batch_identity.py) and offline throughput (benchmarks/batching/batch_throughput.py).
# On the device machine, from the repo root, with transformers' wheel in .whl/ and HumanEval in .gpu/data/:
#   bash benchmarks/batching/gpu_batch.sh OUT_DIR COMMIT      (PARTS=identity or PARTS=throughput: one of the two)
set -u
out=${1:?output folder}
commit=${2:-unknown}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:src PYTHONUNBUFFERED=1 MULTISPEC_CACHE_DIR=/tmp/multispec-cache
{ echo "commit $commit"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
} | tee "$out/device.txt"
common=(--embedded --device cuda --data-dir .gpu/data)
parts=${PARTS:-identity throughput}
[[ $parts == *identity* ]] && timeout "${IDENTITY_S:-200}" python3 benchmarks/batching/batch_identity.py "${common[@]}" --methods ar,sd,mcsd,lookup,suffix,auto \
    --batch-sizes 4,16,32 --out "$out/identity" 2>&1 | tee "$out/identity.log"
[[ $parts == *throughput* ]] && timeout "${THROUGHPUT_S:-240}" python3 benchmarks/batching/batch_throughput.py "${common[@]}" --threads 1 \
    --out "$out/throughput" 2>&1 | tee "$out/throughput.log"
