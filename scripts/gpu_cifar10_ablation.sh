#!/usr/bin/env bash
# Issue 8 ablation, one device call (1 or 2 GPUs), one table: the search mode (none | roi | hard | softmax | soft)
# and the stages searched (layer4; layer3+4; layer2+3+4), plus DINO, at a short budget, all 8 runs at once
# (scripts/gpu_cifar10.sh with other RUNS; soft is the default search mode).
#   OUT=/dir EPOCHS=10 bash scripts/gpu_cifar10_ablation.sh   (device machine, repo root, wheels on PYTHONPATH)
EPOCHS=${EPOCHS:-10}; SEED=${SEED:-0}
export EPOCHS SEED TAG="ablation-e$EPOCHS-s$SEED" ROOT=runs/cifar10_ablation PARALLEL=${PARALLEL:-8} LINEAR=0 \
  CHUNK_MIN=${CHUNK_MIN:-7} EXTRA="eval.knn_every_n_epochs=0 ${EXTRA:-}" \
  RUNS="soft-234:search=soft none:search=none roi:search=roi hard:search=hard softmax:search=softmax \
soft-4:search.stages=[layer4] soft-34:search.stages=[layer3,layer4] dino:method=dino"
exec bash "$(dirname "$0")/gpu_cifar10.sh"
