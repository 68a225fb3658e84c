#!/usr/bin/env bash
# Issue 8 long runs, after scripts/gpu_cifar10_tune.sh on the same (warm) machine: each method's best tuning variant
# (highest final kNN20 in runs/records/cifar10-tune-<method>-*.json from a tuning call on this machine, else in the
# committed benchmarks/results/cifar10-tune-*-<method>-*.json; the recipe as is when there is none) for
# SEEDS (default 0 1), all runs at once, two per GPU with SCFS and DINO mixed so both GPUs carry the same load.
# Chunks of CHUNK_MIN minutes: the first call picks the variants and writes runs/records/long-runs.txt; RESUME=1 in
# the next call reuses that file and continues every run exactly (scfs.sweep --resume); LINEAR=1 on the last.
#   OUT=/dir EPOCHS=100 CHUNK_MIN=8 LINEAR=0 bash scripts/gpu_cifar10_long.sh            (first chunk)
#   OUT=/dir EPOCHS=100 CHUNK_MIN=6 RESUME=1 bash scripts/gpu_cifar10_long.sh            (next chunks; linear probe)
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" runs/records
PY=${PY:-python3}
CHOICE=runs/records/long-runs.txt
if [ ! -s "$CHOICE" ]; then
  SEEDS="${SEEDS:-0 1}" $PY - > "$CHOICE" <<'PYEOF'
import glob, json, os
seeds = os.environ["SEEDS"].split()
best = {}
for m in ("scfs", "dino"):
    cands = []
    files = glob.glob(f"runs/records/cifar10-tune-{m}-*.json") or glob.glob(f"benchmarks/results/cifar10-tune-*-{m}-*.json")
    for f in files:
        for r in json.load(open(f))["runs"]:
            if any(o.startswith("method=") for o in r["overrides"].split()):
                continue  # a tuning variant never switches the method
            knn = ((r.get("summary") or {}).get("knn") or {}).get("top1_k20")
            if knn is not None:
                cands.append((knn, r["label"], r["overrides"]))
    best[m] = max(cands) if cands else (None, "base", "optim.lr=0.12")
runs = []
for i, s in enumerate(seeds):  # order scfs, dino, dino, scfs, ... so round robin puts one of each on every GPU
    pair = [("scfs", best["scfs"]), ("dino", best["dino"])]
    for m, (knn, label, ov) in (pair if i % 2 == 0 else pair[::-1]):
        runs.append(f"{m}-{label}-s{s}:method={m}|seed={s}|" + ov.replace(" ", "|"))
print(" ".join(runs))
PYEOF
fi
echo "runs: $(cat "$CHOICE")" | tee "$OUT/long-runs.txt"
RUNS="$(cat "$CHOICE")" TAG="e${EPOCHS:-100}-long" ROOT=runs/cifar10_long PARALLEL=$(wc -w < "$CHOICE") \
  EPOCHS=${EPOCHS:-100} CHUNK_MIN=${CHUNK_MIN:-8} LINEAR=${LINEAR:-0} OUT="$OUT" \
  EXTRA="eval.knn_every_n_epochs=${KNN_EVERY:-25} ${EXTRA:-}" bash "$(dirname "$0")/gpu_cifar10.sh"
