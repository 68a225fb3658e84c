#!/usr/bin/env bash
# One device call on a 1-GPU machine: the whole-training-step benchmark (ResNet-50 suite, then CIFAR suite),
# results to $OUT. Usage (repo root): OUT=/some/dir bash scripts/gpu_step.sh [--quick]
set -uo pipefail
export PYTHONUNBUFFERED=1 WANDB_MODE=disabled
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
PY=${PY:-python3}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
t0=$(date +%s)
timeout 330 $PY -m scfs.bench.step --suite resnet50 --out "$OUT" "$@" 2>&1 | tee "$OUT/step.log" | grep -v '^|' | grep -E '^\{|rror' ; echo "resnet50 rc=${PIPESTATUS[0]} $(( $(date +%s) - t0 ))s"
timeout 200 $PY -m scfs.bench.step --suite cifar --out "$OUT" "$@" 2>&1 | tee "$OUT/step_cifar.log" | grep -v '^|' | grep -E '^\{|rror' ; echo "cifar rc=${PIPESTATUS[0]} $(( $(date +%s) - t0 ))s"
if [ -d data/cifar10 ]; then  # the real data path (prepared tree carried along): is it the bottleneck?
  timeout 120 $PY -m scfs.bench.step --suite cifar --quick --data real --data-root data/cifar10 --out "$OUT/real" 2>&1 | tail -8
fi
cat "$OUT"/step-*.md 2>/dev/null
