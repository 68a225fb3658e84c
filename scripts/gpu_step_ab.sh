#!/usr/bin/env bash
# One device call: the step benchmark of this tree against an older commit's tree, on the same machine, one run after
# the other (GPU 0, nothing else running), to tell a code regression from a slower host. Why: the same SCFS CIFAR
# step measured 67.1 ms at 95a21dd and 122.4 ms at 38636a0, on different machines; ops per step grew by only 9 %.
# Prepare here: git archive REF | tar -x -C .abref  (git-excluded; carried with the wheels).
# Usage (device, repo root, wheels on PYTHONPATH): OUT=/dir AB_S=300 bash scripts/gpu_step_ab.sh [extra HEAD rows...]
# Rows: cifar --quick (scfs, dino at B=512, bf16 + channels_last) and resnet50 --quick --batch 32 (bf16, bf16_cl) for
# both trees; HEAD also profiles its rows (--profile 3). EXTRA (a bench.step argument string) adds HEAD rows last,
# EXTRA_S seconds at most (each row is saved as it ends).
set -uo pipefail
export PYTHONUNBUFFERED=1 WANDB_MODE=disabled CUDA_VISIBLE_DEVICES=0
OUT=${OUT:-/tmp/out}; PY=${PY:-python3}; mkdir -p "$OUT/ab"
t0=$(date +%s); since() { echo "$(( $(date +%s) - t0 ))s"; }
head_tree=$PWD
bench() {  # tree tag args...
  local tree=$1 tag=$2; shift 2
  (cd "$tree" && PYTHONPATH=/tmp/site:$tree TORCH_EXTENSIONS_DIR=/tmp/torch_ext_$tag timeout -k 15 "${AB_S:-300}" \
    $PY -m scfs.bench.step "$@" --out "$OUT/ab/$tag" >> "$OUT/ab/$tag.log" 2>&1)
  echo "$tag $* rc=$? $(since)"
}
$PY -c "import torch; print(torch.__version__, torch.cuda.get_device_name())"
bench "$head_tree" head --suite cifar --quick --profile 3
bench .abref ref --suite cifar --quick
bench "$head_tree" head --suite resnet50 --quick --batch 32 --profile 3
bench .abref ref --suite resnet50 --quick --batch 32
# shellcheck disable=SC2086
[ -n "${EXTRA:-}" ] && AB_S=${EXTRA_S:-200} bench "$head_tree" extra $EXTRA
(cd "$OUT" && tar czf ab.tgz ab && rm -rf ab)
for f in $(tar tzf "$OUT/ab.tgz" | grep '\.md$'); do echo "== $f"; tar xzf "$OUT/ab.tgz" -O "$f" | grep -E "^\||Host"; done
