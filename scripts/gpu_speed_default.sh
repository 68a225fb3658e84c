#!/usr/bin/env bash
# The speed record of the shipped recipes on one GPU: the ResNet-50 step (what `+experiment=imagenet` runs) at
# per-GPU batch B, SCFS and DINO, eager (`bf16_cl`) and the default path (`bf16_cl_graphs`: compile + CUDA graphs,
# the losses as one more graph), profiled; then the default SCFS row once more in a fresh process, the compile
# cache now warm: its warm-up is what a second run of the recipe waits. The step record (with the targets met or
# missed) and a warm-up table are printed last.
#
#   OUT=/dir B=32 bash scripts/gpu_speed_default.sh        (device machine, repo root, wheels on PYTHONPATH)
set -uo pipefail
export PYTHONUNBUFFERED=1 WANDB_MODE=disabled TORCH_EXTENSIONS_DIR=/tmp/torch_ext
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/scfs-compile-cache}
OUT=${OUT:-/tmp/out}; B=${B:-32}; PY=${PY:-python3}; mkdir -p "$OUT"
t0=$(date +%s)
$PY -c "from scfs.search import cuda_backend as c; c.extension(); print('extension built')" 2>&1 | tail -n 1
timeout -k 15 "${FIRST_S:-420}" $PY -m scfs.bench.step --suite resnet50 --batch "$B" --setting bf16_cl \
  --setting bf16_cl_graphs --profile "${PROFILE:-2}" ${EXTRA:-} --out "$OUT/first" > "$OUT/first-b$B.log" 2>&1
echo "first rc=$? $(( $(date +%s) - t0 ))s"
timeout -k 15 "${SECOND_S:-150}" $PY -m scfs.bench.step --suite resnet50 --batch "$B" --setting bf16_cl_graphs \
  --method scfs --steps 10 ${EXTRA:-} --out "$OUT/second" > "$OUT/second-b$B.log" 2>&1
echo "second rc=$? $(( $(date +%s) - t0 ))s"
$PY - "$OUT" "$B" <<'PY'
import json, sys
from pathlib import Path
out, b = Path(sys.argv[1]), sys.argv[2]
rows = {}
for run in ("first", "second"):
    for f in sorted((out / run).glob("step-*.json")):
        for r in json.loads(f.read_text())["rows"]:
            if r["method"] == "scfs" and r["setting"] == "bf16_cl_graphs":
                rows[run] = r
print(f"\n| compile warm-up, SCFS B={b} default path | s | step ms |\n|---|---|---|")
for run, label in (("first", "first run (empty cache)"), ("second", "second run (cache warm)")):
    r = rows.get(run, {})
    print(f"| {label} | {r.get('warmup_s', float('nan')):.1f} | {r.get('step_ms', float('nan')):.1f} |"
          if "warmup_s" in r else f"| {label} | {r.get('error', 'missing')[:80]} | - |")
PY
cat "$OUT"/first/step-*.md 2>/dev/null | sed -n '1,200p'
