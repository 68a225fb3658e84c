#!/usr/bin/env bash
# A study (conf/study/<STUDY>.yaml) on the GPUs of one machine in calls of under 10 minutes: each call runs the
# study's multirun through the local-GPU launcher with a chunk budget, so every job stops cleanly with its
# last.ckpt before the call ends; the same call again skips the finished jobs and resumes the others. When all are
# finished, the study table (mean ± std over seeds), its JSON and the kNN figure go to $OUT.
#
#   STUDY=cifar10_seeds PER_GPU=3 CHUNK_MIN=7 OUT=/dir bash scripts/gpu_study.sh   (device machine, repo root, wheels
#   on PYTHONPATH, .gpudata/cifar10-jpeg.tar.xz for the CIFAR-10 studies); repeat the same call until it says done
#   (exit status 3 until then: `until bash scripts/gpu_study.sh; do [ $? -eq 3 ] || break; done` runs it to the end).
#   PRECISION='<precision options>' (e.g. '--image-size 64 --local-size 32' for STUDY=shapes_long) then scores the
#   search precision of the teachers, raw and centred, against random init (python -m scfs.eval.precision).
#   ATTENTION='<figure options>' (e.g. '--folder data/imagenet-samples --size 32' for STUDY=cifar10_vit) then draws
#   each method's CLS attention per head beside its search (python -m scfs.workbench.docs_figures attention).
set -uo pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 WANDB_MODE=offline
STUDY=${STUDY:-cifar10_seeds}; OUT=${OUT:-/tmp/study}; PY=${PY:-python3}; mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [[ $STUDY == cifar10* ]]; then
  ARCHIVE=.gpudata/cifar10-jpeg.tar.xz; . "$(dirname "$0")/cifar10_data.sh"
  cifar10_ready > "$OUT/data.log" 2>&1 || { echo "CIFAR-10 preparation failed (see $OUT/data.log)"; exit 1; }
fi
DIR=runs/multirun/$STUDY-$(date +%Y-%m-%d_%H-%M-%S)
timeout -k 30 "${LIMIT:-540}" $PY -m scfs.train -m "+study=$STUDY" hydra/launcher=local_gpus \
  "hydra.launcher.per_gpu=${PER_GPU:-3}" "chunk_minutes=${CHUNK_MIN:-7}" "hydra.sweep.dir=$DIR" "$@" 2>&1 \
  | grep -E '^\[(study|local_gpus)\]|error' | tee "$OUT/$(basename "$DIR").log"
rc=${PIPESTATUS[0]}
[ -f "$DIR/multirun.yaml" ] || { echo "the multirun did not start (exit status $rc)"; exit 1; }
$PY -m scfs.eval.compare "$DIR" --out "$OUT/$STUDY.md" || exit 1
if [ "$rc" -ne 0 ] || grep -q '"stopped_by_chunk_budget": true' "$DIR"/*/summary.json 2>/dev/null; then
  echo "not done yet (exit status $rc): run the same command again to continue the jobs not finished"
  exit 3
else
  echo "done: $OUT/$STUDY.md (and .json, _knn.png)"
  if [ -n "${PRECISION:-}" ]; then  # the search precision of the study's teachers, raw and centred, per method
    for read_out in raw centred; do
      $PY -m scfs.eval.precision --multirun "$DIR" random --random-seeds 0 1 2 \
        $([ $read_out = centred ] && echo --centre) $PRECISION --out "$OUT/precision-$read_out" 2>&1 | tail -n 12
    done
  fi
  if [ -n "${ATTENTION:-}" ]; then  # a ViT study: the first teacher of each method, $OUT/attention-<method>.png
    $PY -m scfs.workbench.docs_figures attention --multirun "$DIR" $ATTENTION --out "$OUT/attention.png" 2>&1 \
      | tail -n 4
  fi
fi
