#!/usr/bin/env bash
# Issue 8 recipe tuning with the same effort for both methods, one device call on a 2-GPU machine: the same
# recipe variants for SCFS (GPU 0) and DINO (GPU 1), all runs of a method at once on its GPU, a short budget,
# two tables (kNN k=20/200 on the test split). The records also go to runs/records/ on the machine, where
# scripts/gpu_cifar10_long.sh picks each method's best variant in a later call.
#   OUT=/dir EPOCHS=10 bash scripts/gpu_cifar10_tune.sh   (device machine, repo root, wheels on PYTHONPATH)
# Variants (on top of +experiment=cifar10; '|' separates the overrides of one variant). The 2026-11-30 tuning
# (records benchmarks/results/cifar10-tune-h200x2-2026-11-30-*) ran base / lr0.3 / headbn / pub / out2048 on the
# recipe of that day (heads without BN); BN in the heads won for both methods and is now the recipe's default, so:
#   base     the recipe as is (SGD 0.12 per 256, wd 5e-4, teacher temperature 0.04, momentum 0.99, heads with BN)
#   lr0.3    2.5x the learning rate
#   nobn     heads without BN (the recipe before the tuning)
#   pub      the published SCFS CIFAR settings of ../shared/MEASUREMENTS.md: wd 1e-4, teacher temperature 0.04 -> 0.07
#   out2048  2048-way DINO and stage heads (lightly's head size)
EPOCHS=${EPOCHS:-10}; SEED=${SEED:-0}; OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
PY=${PY:-python3}
. "$(dirname "$0")/cifar10_data.sh"; cifar10_ready || exit 1  # once, before the two sweeps start
RUNS=${RUNS:-"base:optim.lr=0.12 lr0.3:optim.lr=0.3 nobn:method.head_bn=false \
pub:optim.weight_decay=1e-4|optim.weight_decay_end=1e-4|method.teacher_temp=0.07|method.warmup_teacher_temp_epochs=3 \
out2048:method.out_dim=2048|method.stage_out_dim=2048"}
NRUNS=$(wc -w <<< "$RUNS")
for m in scfs dino; do
  gpu=$([ $m = scfs ] && echo 0 || echo 1)
  EPOCHS=$EPOCHS SEED=$SEED TAG="tune-$m-e$EPOCHS-s$SEED" ROOT="runs/cifar10_tune_$m" PARALLEL=$NRUNS LINEAR=0 GPUS=$gpu \
    CHUNK_MIN=${CHUNK_MIN:-7} EXTRA="method=$m eval.knn_every_n_epochs=0 ${EXTRA:-}" RUNS="$RUNS" \
    OUT="$OUT" bash "$(dirname "$0")/gpu_cifar10.sh" > "/tmp/tune-$m.log" 2>&1 &
done
wait
tail -n 3 /tmp/tune-*.log
cat "$OUT"/cifar10-tune-*.md  # 7 files come back: gpu.txt + per method json, md, runs.tgz
