#!/usr/bin/env bash
# One device call on a 2-GPU machine: the step benchmark on 1 GPU, then under DDP on 2 GPUs (torchrun, NCCL),
# with the scaling efficiency img/s(2) / (2 x img/s(1)); then the 2-GPU DDP equivalence test with SyncBN.
# Usage (repo root): OUT=/some/dir bash scripts/gpu_step_ddp.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 WANDB_MODE=disabled NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/one" "$OUT/two"
PY=${PY:-python3}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
t0=$(date +%s)
for suite in resnet50 cifar; do
  timeout 150 $PY -m scfs.bench.step --suite $suite --quick --out "$OUT/one" 2>&1 | tee "$OUT/one-$suite.log" | grep -E '^\{|rror'
  one=$(ls -t "$OUT"/one/step-*.json | head -1)
  timeout 200 $PY -m scfs.bench.step --suite $suite --quick --devices 2 --compare "$one" --out "$OUT/two" 2>&1 | tee "$OUT/two-$suite.log" | grep -E '^\{|rror'
  echo "$suite done $(( $(date +%s) - t0 ))s"
done
timeout 180 $PY -m pytest -q -m gpu -p no:cacheprovider tests/test_ddp.py 2>&1 | tail -5 | tee "$OUT/pytest_ddp_gpu.log"
cat "$OUT"/two/step-*.md 2>/dev/null
