#!/usr/bin/env bash
# The CIFAR-10 quality study in one GPU window (a device machine held for about 25 minutes, commands of at most
# 10 minutes each): `start` prepares the data and starts scripts/cifar10_study.py under setsid in a copy of the
# tree outside the one each command re-copies, so the runs outlive the command; `watch SECONDS` prints progress and
# copies what finished into $OUT; `collect` waits for the study to end and copies everything back.
#
#   COMMIT=$(git rev-parse --short HEAD) OUT=$OUT MINUTES=25 PARALLEL=4 bash scripts/gpu_cifar10_study.sh start
#   OUT=$OUT bash scripts/gpu_cifar10_study.sh watch 540
#   OUT=$OUT bash scripts/gpu_cifar10_study.sh collect 540
#
# MINUTES: from `start` until every run's linear probe has ended (runs that would not make it are left for the next
# window). 25 fits a 30-minute lease: about 90 s to start the machine, 30 s of data, 25 min, a last `collect`.
# Side-by-side counts measured in committed records are not ramped again: those runs start together. RAMP=1 (default) measures 1, 2, ... runs side by side first. FIGURE=1 draws the searched-regions
# figure on the 100 sample photos from the seed-0 SCFS and DINO checkpoints as soon as both exist, and keeps their
# teachers (fp16, in parts of 15 MiB) so that the figures can be redrawn after the window. AFTER_RAMP='<commands>'
# runs in the study's tree once the ramp has measured (the GPU gate, say: `COMMIT=.. OUT=$S/smoke bash
# scripts/gpu_smoke.sh`); whatever it writes under $S/extra comes back with `watch` and `collect`.
# AFTER_STUDY='<commands>' runs in the study's tree the moment the study has ended (its last probe recorded), so the
# window's next work needs no command from outside in time (a machine goes back 30 s after a command returns); `$S`
# is the study folder there, and what it writes under $S/extra comes back. `collect SECONDS` waits for both, at most
# SECONDS (default 540), then copies back what there is. ONLY='<run keys>' limits the window to those runs (say, the
# shorter of two long runs when the GPU gate shares the window).
set -uo pipefail
W=${STUDY_TREE:-/tmp/study-tree}; S=${STUDY_DIR:-/tmp/study}; OUT=${OUT:-/tmp/out}; PY=${PY:-python3}
mkdir -p "$OUT"
alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
study_alive() { alive "$S/study.pid"; }
copy_back() {
  [ -d "$S/out" ] || return 0
  (cd "$S" && tar czf "$OUT/study.tgz" out/*.json out/*.md out/*.png logs runs/*/summary.json runs/*/knn_curve.json \
    runs/*/linear/metrics.json runs/*/linear.log extra smoke 2>/dev/null)
  for f in "$S"/out/slim/*.part*; do [ -f "$f" ] && mkdir -p "$OUT/slim" && cp "$f" "$OUT/slim/"; done
  cp "$S"/out/cifar10-quality-*.md "$OUT/" 2>/dev/null
  return 0
}
case "${1:-}" in
start)
  export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
  mkdir -p "$S/logs" "$S/out"; rm -rf "$W"; cp -a . "$W"; cd "$W" || exit 1
  . scripts/cifar10_data.sh; ARCHIVE=.gpudata/cifar10-jpeg.tar.xz cifar10_ready > "$S/logs/data.log" 2>&1 \
    || { echo "CIFAR-10 preparation failed"; tail -5 "$S/logs/data.log"; exit 1; }
  [ -d data/imagenet-samples ] || $PY -m scfs.data.prepare imagenet-samples \
    --archive .gpudata/imagenet-samples-100.tar.xz --out data/imagenet-samples >> "$S/logs/data.log" 2>&1
  DEADLINE=$(( $(date +%s) + ${MINUTES:-25} * 60 ))
  echo "data ready; study deadline $(date -d @$DEADLINE +%T)"
  COMMIT=${COMMIT:-unknown} setsid nohup $PY scripts/cifar10_study.py run --out "$S/out" --runs "$S/runs" \
    --parallel "${PARALLEL:-4}" --deadline "$DEADLINE" $([ "${RAMP:-1}" = 1 ] && echo --ramp) --slim scfs-soft-s0-e100 dino-dino-s0-e100 \
    ${ONLY:+--only $ONLY} \
    > "$S/logs/study.log" 2>&1 < /dev/null &
  echo $! > "$S/study.pid"
  if [ "${FIGURE:-0}" = 1 ]; then
    setsid nohup bash -c "
      a=$S/runs/scfs-soft-s0-e100; b=$S/runs/dino-dino-s0-e100
      until [ -f \$a/linear/metrics.json ] && [ -f \$b/linear/metrics.json ]; do sleep 10; done
      $PY -m scfs.workbench.docs_figures photos SCFS=\$a/checkpoints/last.ckpt DINO=\$b/checkpoints/last.ckpt \
        --folder data/imagenet-samples --size 64 --out $S/out/searched_regions_photos.png" \
      > "$S/logs/figure.log" 2>&1 < /dev/null &
    echo $! > "$S/figure.pid"
  fi
  if [ -n "${AFTER_RAMP:-}" ]; then  # e.g. the GPU gate: side by side with the runs, once the ramp has measured
    setsid nohup bash -c "until [ -f $S/out/ramp.done ] || ! kill -0 \$(cat $S/study.pid); do sleep 5; done
      cd $W && $AFTER_RAMP" > "$S/logs/after_ramp.log" 2>&1 < /dev/null &
  fi
  if [ -n "${AFTER_STUDY:-}" ]; then
    mkdir -p "$S/extra"
    setsid nohup bash -c "while kill -0 \$(cat $S/study.pid) 2>/dev/null; do sleep 5; done
      export S=$S; cd $W && $AFTER_STUDY" > "$S/logs/after_study.log" 2>&1 < /dev/null &
    echo $! > "$S/after_study.pid"
  fi
  sleep 5; cat "$S/logs/study.log"
  ;;
watch)
  end=$(( $(date +%s) + ${2:-540} ))
  while [ "$(date +%s)" -lt "$end" ] && { study_alive || alive "$S/after_study.pid"; }; do sleep 15; done
  grep "^\[study\]" "$S/logs/study.log" | tail -n 30
  [ -f "$S/logs/after_study.log" ] && { echo "after the study:"; tail -n 5 "$S/logs/after_study.log"; }
  nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
  copy_back
  ;;
collect)
  end=$(( $(date +%s) + ${2:-540} ))
  while [ "$(date +%s)" -lt "$end" ] && study_alive; do sleep 10; done
  while [ "$(date +%s)" -lt "$end" ] && alive "$S/after_study.pid"; do sleep 10; done
  for _ in $(seq 24); do  # a figure being drawn (both seed-0 probes done) gets two minutes to finish
    [ -f "$S/figure.pid" ] && kill -0 "$(cat "$S/figure.pid")" 2>/dev/null \
      && ls "$S"/runs/{scfs-soft,dino-dino}-s0-e100/linear/metrics.json > /dev/null 2>&1 || break; sleep 5; done
  cat "$S/logs/study.log" | grep -v "^\[study\] +.*start" | tail -n 60
  tail -n 3 "$S/logs/figure.log" 2>/dev/null
  [ -f "$S/logs/after_study.log" ] && { echo "after the study:"; tail -n 20 "$S/logs/after_study.log"; }
  copy_back; ls -la "$OUT"; [ ! -d "$OUT/slim" ] || ls -la "$OUT/slim"
  ;;
*) echo "usage: $0 start|watch SECONDS|collect [SECONDS]"; exit 2 ;;
esac
