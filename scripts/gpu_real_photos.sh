#!/usr/bin/env bash
# The real-photo searched-regions figure (docs/searched_regions_photos.png): SCFS and DINO pretrained on CIFAR-10
# for EPOCHS (15) side by side on one GPU with the README's commands, then
# `python -m scfs.workbench.docs_figures photos` on the 100 sample photos at 64 px. Prints both runs' summary
# lines; writes the figure, a JSON record (kNN at init and at the end, epochs reached, seconds, commands) and the
# logs (photos-logs.tgz) under OUT. MINUTES caps the training (chunk_minutes: a clean stop, checkpoint written).
#
#   OUT=/dir EPOCHS=15 [MINUTES=4] bash scripts/gpu_real_photos.sh   (device machine, repo root; archives in .gpudata/)
set -uo pipefail
export PYTHONUNBUFFERED=1 WANDB_MODE=offline
OUT=${OUT:-/tmp/photos}; EPOCHS=${EPOCHS:-15}; PY=${PY:-python3}; mkdir -p "$OUT"
ARCHIVE=.gpudata/cifar10-jpeg.tar.xz; . "$(dirname "$0")/cifar10_data.sh"
cifar10_ready > "$OUT/data.log" 2>&1 || { echo "CIFAR-10 preparation failed"; tail -3 "$OUT/data.log"; exit 1; }
[ -d data/imagenet-samples ] || $PY -m scfs.data.prepare imagenet-samples \
  --archive .gpudata/imagenet-samples-100.tar.xz --out data/imagenet-samples >> "$OUT/data.log" 2>&1
# compile=false: 15 short epochs do not pay back the compile wait of the recipe's default path
COMMON="trainer.max_epochs=$EPOCHS compile=false eval.knn_every_n_epochs=0 eval.figure=false trainer.enable_progress_bar=false"
[ -n "${MINUTES:-}" ] && COMMON="$COMMON chunk_minutes=$MINUTES"
for m in scfs dino; do
  timeout "${LIMIT:-400}" $PY -m scfs.train +experiment=cifar10 method=$m $COMMON name=photos-$m \
    hydra.run.dir=runs/photos-$m > "$OUT/train-$m.log" 2>&1 &
done
wait
for m in scfs dino; do grep -E "done in|error" "$OUT/train-$m.log" | tail -n 2; done
$PY -m scfs.workbench.docs_figures photos SCFS=runs/photos-scfs/checkpoints/last.ckpt \
  DINO=runs/photos-dino/checkpoints/last.ckpt --folder data/imagenet-samples --size 64 \
  --out "$OUT/searched_regions_photos.png" > "$OUT/figure.log" 2>&1 || tail -n 3 "$OUT/figure.log"
$PY - "$OUT" "$EPOCHS" <<'PY'
import json, sys
from pathlib import Path
out, epochs = Path(sys.argv[1]), int(sys.argv[2])
runs = []
for m in ("scfs", "dino"):
    f = Path(f"runs/photos-{m}/summary.json")
    s = json.loads(f.read_text()) if f.is_file() else {}
    runs.append({"method": m, "epochs": s.get("epochs"), "max_epochs": epochs, "knn_init": s.get("knn_init"),
                 "knn": s.get("knn"), "stopped_by_time_budget": s.get("stopped_by_chunk_budget", False),
                 "seconds": s.get("seconds"),
                 "command": f"python -m scfs.train +experiment=cifar10 method={m} trainer.max_epochs={epochs} compile=false"})
(out / "real-photos.json").write_text(json.dumps({"runs": runs}, indent=2))
print(json.dumps(runs))
PY
(cd "$OUT" && tar czf photos-logs.tgz ./*.log && rm ./*.log)
