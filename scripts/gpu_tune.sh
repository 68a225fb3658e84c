#!/usr/bin/env bash
# One device call: tune the shapes recipes on one GPU with many small runs side by side (scfs.sweep).
# Usage (device machine, repo root, wheels installed on PYTHONPATH): OUT=/dir bash scripts/gpu_tune.sh SHORT_COMMON LONG_COMMON
set -uo pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 WANDB_MODE=disabled
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
PY=${PY:-python3}
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/gpu.txt"
$PY -c "import torch, lightning, timm, hydra, faiss; print(torch.__version__, lightning.__version__, timm.__version__)"
# generate the datasets once, before the parallel runs
$PY -c "
from scfs.data.shapes import ShapesSpec, ensure_shapes
ensure_shapes('data/shapes', ShapesSpec(image_size=32)); ensure_shapes('data/shapes', ShapesSpec(image_size=64))"
GPU="trainer=gpu trainer.precision=32-true logger=csv eval.figure=false search.backend=reference num_workers=0"
SHORT="$GPU backbone.stem_stride=2 trainer.max_epochs=10 eval.knn_every_n_epochs=2"
HB="method.head_bn=true"
timeout 520 $PY -m scfs.sweep --parallel 12 --root runs/tune --out "$OUT/tune_short.json" --common "$SHORT" \
  "base:method=scfs" "hb:$HB" "hb_adamw:$HB optim=adamw optim.lr=1e-3 optim.warmup_epochs=1" \
  "hb_lr05:$HB optim.lr=0.5" "hb_m95:$HB method.momentum_teacher=0.95" \
  "hb_k256:$HB method.out_dim=256 method.stage_out_dim=256" \
  "hb_tt02:$HB method.teacher_temp=0.02 method.warmup_teacher_temp=0.02" "hb_s1:$HB backbone.stem_stride=1" \
  "hb_w32:$HB backbone.channels=[32,64,128,256]" \
  "dino_base:method=dino" "dino_hb:method=dino $HB" \
  "dino_hb_adamw:method=dino $HB optim=adamw optim.lr=1e-3 optim.warmup_epochs=1" > "$OUT/short.log" 2>&1 &
P1=$!
timeout 520 $PY -m scfs.sweep --parallel 4 --root runs/tune --out "$OUT/tune_long.json" \
  --common "+experiment=shapes_long $GPU" \
  "long_scfs_hb:$HB" "long_dino_hb:method=dino $HB" "long_scfs:method=scfs" "long_dino:method=dino" \
  > "$OUT/long.log" 2>&1 &
P2=$!
wait $P1; wait $P2
cat "$OUT/short.log" "$OUT/long.log" | grep -v "^\[sweep\] start"
for d in runs/tune/*/; do
  if [ ! -f "$d/summary.json" ]; then echo "== FAILED $d"; tail -n 25 "$d/stdout.log"; fi
done
tar czf "$OUT/tune_runs.tgz" runs/tune/*/summary.json runs/tune/*/knn_curve.json runs/tune/*/csv 2>/dev/null
ls -la "$OUT"
