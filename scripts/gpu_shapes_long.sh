#!/usr/bin/env bash
# One device call: +experiment=shapes_long for SCFS and DINO side by side on one GPU (scfs.sweep, about 3-3.5 min),
# then the records into $OUT. Usage (device machine, repo root, wheels on PYTHONPATH): OUT=/dir bash scripts/gpu_shapes_long.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 WANDB_MODE=disabled OMP_NUM_THREADS=4
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
PY=${PY:-python3}
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/gpu.txt"
# the experiment's data (the default's spec at 64 px; tests/test_config.py checks they agree), generated once here
# so the two parallel runs do not both generate it
$PY -c "from scfs.data.shapes import ShapesSpec, ensure_shapes; ensure_shapes('data/shapes', ShapesSpec(image_size=64))"
COMMON="+experiment=shapes_long logger=csv eval.figure=false search.backend=reference ${EXTRA:-}"
timeout ${LIMIT:-450} $PY -m scfs.sweep --parallel 2 --root runs/shapes_long --out "$OUT/shapes_long.json" --common "$COMMON" \
  "scfs:method=scfs" "dino:method=dino" 2>&1 | grep -v "^\[sweep\] start"
for d in runs/shapes_long/*/; do
  [ -f "$d/summary.json" ] || { echo "== INCOMPLETE $d"; tail -n 5 "$d/stdout.log"; }
  cp "$d/knn_curve.json" "$OUT/$(basename "$d")-knn_curve.json" 2>/dev/null
done
tar czf "$OUT/shapes_long_runs.tgz" runs/shapes_long/*/summary.json runs/shapes_long/*/knn_curve.json runs/shapes_long/*/csv \
  runs/shapes_long/*/stdout.log 2>/dev/null
ls -la "$OUT"
