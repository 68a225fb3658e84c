#!/usr/bin/env bash
# Issue 8 ablation, one device call (1 or 2 GPUs), one table: the search mode (none | roi | hard | softmax |
# soft) and the stages searched (layer4; layer3+4; layer2+3+4), plus DINO, at a short budget, 4 runs per GPU at once.
#   OUT=/dir EPOCHS=10 bash scripts/gpu_cifar10_ablation.sh   (device machine, repo root, wheels on PYTHONPATH)
set -uo pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 WANDB_MODE=disabled OMP_NUM_THREADS=2
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
PY=${PY:-python3}
GPUS=${GPUS:-$(nvidia-smi --query-gpu=index --format=csv,noheader | paste -sd, -)}  # runs spread round robin
NGPU=$(echo "$GPUS" | tr , "\n" | wc -l)
EPOCHS=${EPOCHS:-10}; SEED=${SEED:-0}
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/gpu.txt"
[ -d data/cifar10/train ] || $PY -m scfs.data.prepare cifar10 --archive "${ARCHIVE:-.gpudata/cifar10-jpeg.tar.xz}" \
  --out data/cifar10 || exit 1
COMMON="+experiment=cifar10 data.root=data/cifar10 logger=csv eval.figure=false eval.knn_every_n_epochs=0 \
trainer.max_epochs=$EPOCHS seed=$SEED +trainer.max_time=${MAX_TIME:-00:00:08:00} ${EXTRA:-}"
$PY -m scfs.sweep --gpus "$GPUS" --parallel ${PARALLEL:-8} --k 20,200 --root runs/cifar10_ablation \
  --out "$OUT/cifar10-ablation-e$EPOCHS-s$SEED.json" --common "$COMMON" \
  "soft-234:search=soft" "none:search=none" "roi:search=roi" "hard:search=hard" "softmax:search=softmax" \
  "soft-4:search=soft search.stages=[layer4]" "soft-34:search=soft search.stages=[layer3,layer4]" \
  "dino:method=dino" 2>&1 | grep -v "^\[sweep\] start"
tar czf "$OUT/cifar10-ablation-runs.tgz" runs/cifar10_ablation/*/summary.json runs/cifar10_ablation/*/stdout.log 2>/dev/null
ls -la "$OUT"
