#!/usr/bin/env bash
# Issue 8, one device call: SCFS and DINO pretrained side by side with identical settings (+experiment=cifar10,
# through scfs.sweep: one run per GPU on a 2-GPU machine, both sharing the GPU on a 1-GPU one), kNN k=20/200 on the CIFAR-10 test split at the end of
# each run, then the fast linear probe on each checkpoint; the records into $OUT.
#   OUT=/dir EPOCHS=30 SEED=0 bash scripts/gpu_cifar10.sh     (device machine, repo root, wheels on PYTHONPATH)
# The CIFAR-10 JPEG archive travels in .gpudata/ (git-excluded; copy ../shared/data/cifar10-jpeg.tar.xz there).
# CHUNK_MIN caps each run's training (chunk_minutes) so that the call ends inside the device limit: a capped run
# writes last.ckpt and its summary; RESUME=1 in the next call on the same (warm) machine continues every run
# exactly where it stopped (scfs.sweep --resume), so 100 epochs go in chunks of under 10 minutes.
# RUNS: runs separated by spaces, each label:overrides with '|' between the overrides of one run
# (e.g. "scfs:method=scfs dino-s1:method=dino|seed=1"; a run's overrides win over the common ones); PARALLEL, ROOT:
# see gpu_cifar10_ablation.sh.
set -uo pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 WANDB_MODE=disabled OMP_NUM_THREADS=4
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
PY=${PY:-python3}
GPUS=${GPUS:-$(nvidia-smi --query-gpu=index --format=csv,noheader | paste -sd, -)}  # runs spread round robin
NGPU=$(echo "$GPUS" | tr , "\n" | wc -l)
EPOCHS=${EPOCHS:-30}; SEED=${SEED:-0}; TAG=${TAG:-e${EPOCHS}-s${SEED}}; ROOT=${ROOT:-runs/cifar10}
CHUNK_MIN=${CHUNK_MIN:-7}
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/gpu.txt"
. "$(dirname "$0")/cifar10_data.sh"; cifar10_ready || exit 1  # decoded once, before the parallel runs start
COMMON="+experiment=cifar10 data.root=data/cifar10 logger=csv eval.figure=false trainer.max_epochs=$EPOCHS seed=$SEED \
chunk_minutes=$CHUNK_MIN ${EXTRA:-}"
RUNS=${RUNS:-"scfs:method=scfs dino:method=dino"}
read -ra SPECS <<< "$RUNS"; SPECS=("${SPECS[@]//|/ }")
$PY -m scfs.sweep ${RESUME:+--resume} --gpus "$GPUS" --parallel "${PARALLEL:-2}" --k 20,200 --root "$ROOT" \
  --out "$OUT/cifar10-$TAG.json" \
  --common "$COMMON" "${SPECS[@]}" 2>&1 | grep -v "^\[sweep\] start"
mkdir -p runs/records && cp "$OUT/cifar10-$TAG".{json,md} runs/records/ 2>/dev/null  # for later calls on this machine
if [ "${LINEAR:-1}" = 1 ]; then
  i=0
  # the latest folder of each run that holds a checkpoint (a resumed run gets a new folder per chunk,
  # <stamp>-<index>-<label>, and a chunk that only found the run finished writes none)
  LATEST=$(for d in $(ls -d "$ROOT"/*/ | sort); do [ -f "$d/checkpoints/last.ckpt" ] && echo "$d"; done \
    | awk -F/ '{n=$(NF-1); sub(/^[0-9]+-[0-9]+-/, "", n); last[n]=$0} END {for (k in last) print last[k]}')
  for d in $LATEST; do
    ck="$d/checkpoints/last.ckpt"; [ -f "$ck" ] || continue
    CUDA_VISIBLE_DEVICES=$(echo "$GPUS" | cut -d, -f$((i % NGPU + 1))) timeout ${LINEAR_LIMIT:-240} $PY -m scfs.eval.linear ckpt="$ck" \
      +experiment=cifar10 data.root=data/cifar10 fast=true logger.wandb=false \
      hydra.run.dir="$d/linear" > "$d/linear.log" 2>&1 &
    i=$((i + 1))
  done
  wait
  for d in $LATEST; do
    echo "== $(basename "$d") linear"; grep -h -i "top-1\|top1\|error" "$d/linear.log" | tail -n 3
    cp "$d/linear/metrics.json" "$OUT/$(basename "$d")-linear.json" 2>/dev/null
  done
fi
tar czf "$OUT/cifar10-$TAG-runs.tgz" "$ROOT"/*/summary.json "$ROOT"/*/knn_curve.json "$ROOT"/*/csv \
  "$ROOT"/*/stdout.log "$ROOT"/*/linear.log 2>/dev/null
ls -la "$OUT"
