#!/usr/bin/env bash
# Issue 8 recipe tuning with the same effort for both methods, one device call on a 2-GPU machine: the same
# 4 recipe variants for SCFS (GPU 0) and DINO (GPU 1), 4 runs per GPU at once, a short budget, two tables.
#   OUT=/dir EPOCHS=10 bash scripts/gpu_cifar10_tune.sh   (device machine, repo root, wheels on PYTHONPATH)
# Variants (one override each, on top of +experiment=cifar10): the recipe as is, a 2.5x higher lr, BN in the head
# MLPs, a slower teacher (momentum 0.996). Pick the best per method by kNN20, then run it long (gpu_cifar10.sh).
EPOCHS=${EPOCHS:-10}; SEED=${SEED:-0}; OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
[ -d data/cifar10/train ] || python3 -m scfs.data.prepare cifar10 --archive "${ARCHIVE:-.gpudata/cifar10-jpeg.tar.xz}" \
  --out data/cifar10 || exit 1  # once, before the two sweeps start
RUNS="base:optim.lr=0.12 lr0.3:optim.lr=0.3 headbn:method.head_bn=true m0.996:method.momentum_teacher=0.996"
for m in scfs dino; do
  gpu=$([ $m = scfs ] && echo 0 || echo 1)
  EPOCHS=$EPOCHS SEED=$SEED TAG="tune-$m-e$EPOCHS-s$SEED" ROOT="runs/cifar10_tune_$m" PARALLEL=4 LINEAR=0 GPUS=$gpu \
    CHUNK_MIN=${CHUNK_MIN:-7} EXTRA="method=$m eval.knn_every_n_epochs=0 ${EXTRA:-}" RUNS="$RUNS" \
    OUT="$OUT" bash "$(dirname "$0")/gpu_cifar10.sh" > "/tmp/tune-$m.log" 2>&1 &
done
wait
tail -n 3 /tmp/tune-*.log
cat "$OUT"/cifar10-tune-*.md  # 7 files come back: gpu.txt + per method json, md, runs.tgz
