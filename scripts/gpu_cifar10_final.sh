#!/usr/bin/env bash
# Issue 8, the last round on a 2-GPU machine, in calls of under 10 minutes: the long side-by-side runs
# (scripts/gpu_cifar10_long.sh: each method's best variant, one run per GPU) and the ablation
# (scripts/gpu_cifar10_ablation.sh, ABL_PARALLEL runs at once spread over both GPUs) at the same time. Why together:
# one CIFAR-10 run leaves an H200 partly idle (its steps are bound by the host: session 3 ran 2 runs per GPU at 12-13
# s/epoch each against about 10 s/epoch alone), so the ablation costs the long runs little wall-clock time.
# Every run is resumable: RESUME=1 (next call, same warm machine) continues each unfinished one from its last.ckpt;
# ABLATION=0 leaves the ablation out (done), LINEAR=1 adds the linear probes of the long runs (last call).
#   OUT=/dir EPOCHS=100 CHUNK_MIN=7 bash scripts/gpu_cifar10_final.sh                 (first call)
#   OUT=/dir EPOCHS=100 CHUNK_MIN=8 RESUME=1 ABLATION=0 bash scripts/gpu_cifar10_final.sh   (next calls)
# Everything lands in $OUT/final.tgz (few files come back from a device call); the tables are printed last.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/long" "$OUT/ablation"
PY=${PY:-python3}
t0=$(date +%s)
. "$(dirname "$0")/cifar10_data.sh"; cifar10_ready || exit 1  # before the two scripts below start together
echo "data ready in $(( $(date +%s) - t0 ))s"
OUT="$OUT/long" EPOCHS=${EPOCHS:-100} CHUNK_MIN=${CHUNK_MIN:-7} SEEDS="${SEEDS:-0}" LINEAR=${LINEAR:-0} \
  bash "$(dirname "$0")/gpu_cifar10_long.sh" > "$OUT/long.log" 2>&1 &
if [ "${ABLATION:-1}" = 1 ]; then
  OUT="$OUT/ablation" EPOCHS=${ABL_EPOCHS:-10} PARALLEL=${ABL_PARALLEL:-4} CHUNK_MIN=${CHUNK_MIN:-7} \
    bash "$(dirname "$0")/gpu_cifar10_ablation.sh" > "$OUT/ablation.log" 2>&1 &
fi
wait
echo "all done in $(( $(date +%s) - t0 ))s"
(cd "$OUT" && tar czf final.tgz long ablation && rm -rf long ablation)
for f in long ablation; do echo "== $f"; grep -v "^\[sweep\] start" "$OUT/$f.log" 2>/dev/null | grep -E "^\||sweep|linear|top|rror|Traceback" | tail -n 20; done
