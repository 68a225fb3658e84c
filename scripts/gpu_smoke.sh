#!/usr/bin/env bash
# The GPU gate: every GPU-facing command of the README, each for a few steps, on one GPU machine, in at most
# 6 minutes on one H200; prints one PASS/FAIL table last and writes it to
# benchmarks/results/gpu-smoke-<date>.md (and $OUT/) naming the commit it ran on.
#
#   COMMIT=$(git rev-parse --short HEAD) OUT=/dir bash scripts/gpu_smoke.sh     (device machine, repo root)
#
# Needs on the machine: the project's wheels on PYTHONPATH (hydra-core, omegaconf, faiss-cpu, pycocotools; see
# the README's contributing section) and the two shared archives in .gpudata/ (git-excluded copies of
# ../shared/data/*.tar.xz). Each README command runs exactly as written there, followed only by overrides that
# cut it to a few steps (shown in the table); a command missing from the README fails its row, so the two stay
# in step. Independent commands run side by side (the GPU and 16 cores have room), so the wall time is the
# longest chain, not the sum. On a machine with 2+ GPUs it adds a DDP CIFAR run next to one GPU at the same
# global batch.
# A row that failed side by side (the GPU shared with other work, a study say, or a GPU with less memory than an
# H200's) runs again alone once both waves are done, with the rows of wave 2 that failed after it (they may have
# lacked its checkpoint): a pass then names the first failure, a failure says "(failed alone too)". Sharing the GPU
# fails more than out of memory or time (cuDNN benchmarks again an algorithm it chose whose workspace it can no
# longer allocate, for one). A row the README lacks did not run and does not run again. A failed row gives the line
# of its log that says why (`failure_line`), not what the command printed after it. A command that exits 0 but logs
# a failure it swallowed (the end-of-run figure) fails its row.
set -uo pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 OMP_NUM_THREADS=2 WANDB_MODE=offline
OUT=${OUT:-/tmp/gpu-smoke}; mkdir -p "$OUT"
# the rows' scratch (logs, arguments, outputs) stays outside $OUT: a device call returns at most 8 files, and
# the work after the smoke in the same call needs its share; $OUT gets the record and one archive of the logs
WK=${SMOKE_WORK:-/tmp/gpu-smoke-work}; rm -rf "$WK"; mkdir -p "$WK/logs"
PY=${PY:-python3}
COMMIT=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
STAMP=$(date +%F); T0=$(date +%s)
# the host's CPU and speed before the rows load it: rows take 1.3-1.45x longer on some hosts of the same GPU kind
HOST=$($PY -m scfs.bench.host --phrase 2>/dev/null); [ -n "$HOST" ] || HOST="Host: not measured (python -m scfs.bench.host failed)."
NGPU=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | wc -l)
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
# rows at once: all of a wave on a GPU of an H200's memory (about 139 GiB); on a smaller one (an H100's 80 GiB) so
# many side by side ran eight rows out of memory, and running them again alone took longer than fewer at once, so
# one row per 5 GiB there. SMOKE_PARALLEL sets it (0: no limit).
GIB=$(( $(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -n 1 | tr -dc 0-9) + 0 ))
GIB=$(( GIB / 1024 ))
PARALLEL=${SMOKE_PARALLEL:-$([ "$GIB" -gt 0 ] && [ "$GIB" -lt 120 ] && echo $(( GIB / 5 )) || echo 0)}
[ "$PARALLEL" -gt 0 ] && echo "at most $PARALLEL rows at once (GPU memory ${GIB} GiB)"
slot() {  # wait until fewer than $PARALLEL rows run (none of that with 0)
  [ "$PARALLEL" -gt 0 ] || return 0
  while [ "$(jobs -rp | wc -l)" -ge "$PARALLEL" ]; do wait -n 2>/dev/null || sleep 0.2; done
}
ROWS="$WK/rows.tsv"; : > "$ROWS"; rm -rf "$WK/args"; mkdir -p "$WK/args"
. "$(dirname "$0")/python_shim.sh"; python_shim /tmp/smoke-bin   # the README says `python`
. "$(dirname "$0")/failure_line.sh"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
SHORT="trainer.max_epochs=1 +trainer.limit_train_batches=4"   # a few steps of every training command
STUDY=smoke/study-$COMMIT   # the multirun folder of the study rows: runs/multirun/<date>/<time> in the README

in_readme() { [ -z "$1" ] || grep -qF -- "$1" README.md; }

# run ID 'README COMMAND' EXTRA...: the README's command, its placeholders (<ckpt>, <scfs ckpt>, <dino ckpt>; in
# EXTRA too) filled in from the runs of wave 1 (<ckpt>: the run named by $CKRUN, smoke-scfs by default), then
# EXTRA (the overrides that make it short); logged, timed, one row. An empty README COMMAND marks a step that is
# not a README command (the notebook); EXTRA is then the command. Each row's arguments are kept in $WK/args (in
# the order the rows were started) so that `retry_alone` can run it again.
TAB=$'\t'
SWALLOWED='searched-regions figure skipped'   # failures a command logs but does not exit on
note_args() {  # ID README EXTRA: once per row, keyed by when it was first named (with its time limit)
  ls "$WK/args"/*-"$1" > /dev/null 2>&1 || printf '%s\n%s\n%s\n%s\n%s\n' "$2" "$3" "${CKRUN:-}" "${WAVE:-1}" \
    "${LIMIT:-330}" > "$WK/args/$(date +%s%N)-$1"
}
run() {
  local id=$1 readme=$2; shift 2
  local extra="$*" t rc why=""
  [ -n "${RETRY:-}" ] || note_args "$id" "$readme" "$extra"
  t=$(date +%s)
  if ! in_readme "$readme"; then
    printf '%s\tFAIL\t0\t%s\t%s\tnot in README.md\n' "$id" "$readme" "$extra" >> "$ROWS"; return 1
  fi
  local cmd="$readme $extra" ck="" dk=""
  case $cmd in *"<ckpt>"*|*"<scfs ckpt>"*) ck=$(last_ckpt "${CKRUN:-smoke-scfs}");; esac
  case $cmd in *"<dino ckpt>"*) dk=$(last_ckpt smoke-dino);; esac
  cmd=${cmd//<scfs ckpt>/$ck}; cmd=${cmd//<dino ckpt>/$dk}; cmd=${cmd//<ckpt>/$ck}
  cmd=${cmd//<date>\/<time>/$STUDY}
  eval "timeout ${LIMIT:-330} $cmd" > "$WK/logs/$id.log" 2>&1; rc=$?
  if [ $rc -eq 0 ] && grep -q "$SWALLOWED" "$WK/logs/$id.log"; then
    rc=1; why=$(grep -m 1 "$SWALLOWED" "$WK/logs/$id.log" | sed 's/.*\('"$SWALLOWED"'\)/\1/')
  elif [ $rc -ne 0 ]; then
    why=$(failure_line "$WK/logs/$id.log")
  fi
  [ $rc -eq 124 ] && why="timed out after ${LIMIT:-330} s"
  # run again alone: a pass names the failure side by side; a failure its own line first (its log beside the
  # first one's, <id>.side-by-side.log)
  if [ -n "${RETRY:-}" ]; then why=${why:+$why (failed alone too)}; why=${why:-"run again alone after: $RETRY"}; fi
  why=$(printf '%s' "$why" | cut -c1-200 | tr '\t|' '  ')
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$id" "$([ $rc -eq 0 ] && echo PASS || echo FAIL)" "$(( $(date +%s) - t ))" \
    "$readme" "$extra" "$why" >> "$ROWS"
  # one line per finished row as it ends, so that a smoke cut short by the device call still says where it was
  echo "+$(( $(date +%s) - T0 )) s $id $([ $rc -eq 0 ] && echo PASS || echo FAIL) in $(( $(date +%s) - t )) s${why:+: $why}"
  return $rc
}
# The rows that failed side by side, one after the other on the GPU alone, and once any row of wave 1 ran again,
# every row of wave 2 that failed or did not run; a row that never ran (its chain stopped before it) gets a FAIL
# row when nothing runs it again.
crowded() {  # ID: the row ran and failed beside others (whose GPU memory, time or cuDNN workspace it may have lacked)
  grep -q "^$1${TAB}FAIL" "$ROWS" || return 1
  ! grep "^$1$TAB" "$ROWS" | cut -f6 | grep -q "^not in README.md"
}
# More than RETRY_MAX rows (about a third) failed side by side is a broken commit, not a crowded GPU: none runs
# again (running each alone would spend the window on it), and the record says so.
RETRY_MAX=${SMOKE_RETRY_MAX:-12}; NOT_RETRIED=""
retry_alone() {
  local f id wave again="" redo2=0 first n=0
  for f in $(ls "$WK/args" | sort); do
    id=${f#*-}
    crowded "$id" || continue
    again="$again $f"; n=$((n + 1)); [ "$(sed -n 4p "$WK/args/$f")" = 1 ] && redo2=1
  done
  if [ $n -gt "$RETRY_MAX" ]; then
    NOT_RETRIED="$n rows failed side by side, more than SMOKE_RETRY_MAX=$RETRY_MAX: none ran again alone."
    again=""; redo2=0
  fi
  for f in $(ls "$WK/args" | sort); do
    id=${f#*-}; wave=$(sed -n 4p "$WK/args/$f")
    [[ " $again " == *" $f "* ]] && continue
    if ! grep -q "^$id$TAB" "$ROWS"; then
      [ $redo2 = 1 ] && again="$again $f" \
        || printf '%s\tFAIL\t0\t%s\t%s\tdid not run: the step before it failed\n' "$id" "$(sed -n 1p "$WK/args/$f")" \
           "$(sed -n 2p "$WK/args/$f")" >> "$ROWS"
    elif [ $redo2 = 1 ] && [ "$wave" = 2 ] && grep -q "^$id${TAB}FAIL" "$ROWS"; then
      again="$again $f"
    fi
  done
  for f in $(printf '%s\n' $again | sort); do
    id=${f#*-}
    first=$(grep "^$id$TAB" "$ROWS" | cut -f6); [ -n "$first" ] || first="did not run side by side"
    grep -qi "out of memory" "$WK/logs/$id.log" 2>/dev/null && first="CUDA out of memory side by side"
    [[ $first == *"side by side" ]] || first="$first side by side"
    [ -f "$WK/logs/$id.log" ] && mv "$WK/logs/$id.log" "$WK/logs/$id.side-by-side.log"
    grep -v "^$id$TAB" "$ROWS" > "$ROWS.tmp"; mv "$ROWS.tmp" "$ROWS"
    RETRY=$first CKRUN=$(sed -n 3p "$WK/args/$f") LIMIT=$(sed -n 5p "$WK/args/$f") \
      run "$id" "$(sed -n 1p "$WK/args/$f")" "$(sed -n 2p "$WK/args/$f")"
  done
}
last_ckpt() { find runs/"$1" -name last.ckpt -path '*/checkpoints/*' -printf '%T@ %p\n' 2>/dev/null | sort -n | tail -n 1 | cut -d' ' -f2; }

# --- data: CIFAR-10 decoded once (the parallel runs share the cache); an ImageFolder of the 100 sample photos
# (5 made-up classes: enough for the ImageNet recipe's data path)
ARCHIVE=.gpudata/cifar10-jpeg.tar.xz; . "$(dirname "$0")/cifar10_data.sh"
cifar10_ready > "$WK/logs/data.log" 2>&1 || echo "CIFAR-10 preparation failed (see logs/data.log)"
if [ ! -d data/imagenet-smoke/train ]; then
  $PY -m scfs.data.prepare imagenet-samples --archive .gpudata/imagenet-samples-100.tar.xz \
    --out data/imagenet-samples >> "$WK/logs/data.log" 2>&1
  i=0
  for f in $(find data/imagenet-samples -type f -name '*.jpg' | sort); do
    split=train; [ $((i % 5)) -eq 0 ] && split=val
    mkdir -p "data/imagenet-smoke/$split/class$((i / 5 % 5))" && cp "$f" "data/imagenet-smoke/$split/class$((i / 5 % 5))/"
    i=$((i + 1))
  done
fi
echo "data ready after $(( $(date +%s) - T0 )) s"

# --- wave 1: every training command and the GPU tools, side by side
# The GPU recipes ship compiled (torch.compile + CUDA graphs): row cifar10 runs that default path as written; the
# other training rows add compile=false (the eager row of the README), since eight compiles side by side would
# outlast the budget; bench-step's and cifar10's rows cover the compiled path.
C="python -m scfs.train +experiment=cifar10"; E="compile=false"
# The longest rows first, so that they start at once also where fewer rows run at once than the wave holds (`slot`).
# The GPU tests of the compiled paths that only a GPU can check (CUDA graph replays against eager; the step's calls
# traced whole on CUDA, with this machine's torch; the compiled backward's cuDNN algorithms chosen by the warm-up;
# the first-run launch-config benchmarks under `compile_autotune_ms`'s budget): side by side on an H100 they took
# 229-309 s in one row, and 438 s on a slower host, so two rows (each test's seconds in the log), each with the
# longer limit of the other pytest rows; the backward warm-up's test alone takes 280 s, so the forward warm-up's
# (88 s) runs in the first row
slot; LIMIT=450 run pytest-gpu "python -m pytest -m gpu" \
  "-q -p no:cacheprovider --durations=0 tests/method/test_compile_backend.py tests/data/test_batch_aug.py tests/method/test_compile.py tests/test_cuda_driver.py tests/method/test_cudnn_warmup.py tests/reliability/test_background_checkpoints.py tests/reliability/test_check_finite.py -k 'not test_cudnn_warmup or forward_warmup'" &
slot; LIMIT=450 run pytest-gpu-tuning "python -m pytest -m gpu" \
  "-q -p no:cacheprovider --durations=0 tests/method/test_cudnn_warmup.py tests/method/test_autotune_budget.py -k 'not forward_warmup'" &
# the child's and the helpers' cache entries are the run's: two or three cold compiles each, beside a loaded GPU
# and host, so rows of their own with a longer limit, one test each (the longest row sets the smoke's wall time);
# pytest-gpu-helper takes every GPU test of the file that no other row names
slot; LIMIT=450 run pytest-gpu-background "python -m pytest -m gpu" \
  "-q -p no:cacheprovider tests/method/test_background_compile.py -k childs_cache" &
slot; LIMIT=450 run pytest-gpu-helper "python -m pytest -m gpu" \
  "-q -p no:cacheprovider tests/method/test_background_compile.py -k 'not childs_cache and not backward_helper and not split_student'" &
slot; LIMIT=450 run pytest-gpu-backward-helper "python -m pytest -m gpu" \
  "-q -p no:cacheprovider tests/method/test_background_compile.py -k 'backward_helper and not split_student'" &
slot; LIMIT=450 run pytest-gpu-split-student "python -m pytest -m gpu" \
  "-q -p no:cacheprovider tests/method/test_background_compile.py -k split_student" &
# the helpers of the student's call per view size run one after the other, then the run's first step
slot; LIMIT=450 run pytest-gpu-split-helpers "python -m pytest -m gpu" \
  "-q -p no:cacheprovider tests/method/test_backward_helper.py" &
slot; run cifar10 "$C" "$SHORT name=smoke-graphs" &
slot; run cifar10-eager "$C compile=false" "$SHORT name=smoke-scfs" &
# compiled without kernel generation (the step's own kernels replayed as CUDA graphs, the loss eager)
slot; run cifar10-cudagraphs "$C compile_backend=cudagraphs compile_mode=default" \
  "$SHORT name=smoke-cudagraphs eval.knn_at_start=false" &
# eager steps while a child process compiles the step (a few steps: the run ends first and stops the child)
slot; run cifar10-background "$C compile_background=true" "$SHORT name=smoke-background eval.knn_at_start=false" &
slot; run cifar10-dino "$C method=dino" "$E $SHORT name=smoke-dino" &
for m in hard softmax roi none; do  # the README's loop over the modes; soft is the default (row cifar10)
  slot; run "search-$m" "$C search=\$m" "$E $SHORT name=smoke-search-$m eval.knn_at_start=false" &
done
# the centred search (search.centre=true) compiled as shipped: its kernel op plus the rank-one term in the loss graph
slot; run search-centred "$C search.centre=true" "$SHORT name=smoke-search-centred eval.knn_at_start=false" &
slot; run imagenet "python -m scfs.train +experiment=imagenet" \
  "data.root=data/imagenet-smoke global_batch_size=32 num_workers=4 $E $SHORT name=smoke-imagenet" &
RA="python -m scfs.train resume=auto"
RX="+experiment=cifar10 $E name=smoke-resume trainer.max_epochs=2 +trainer.limit_train_batches=4 eval.knn_at_start=false"
slot; ( run resume-stop "$C" "$E $SHORT name=smoke-resume eval.knn_at_start=false" && run resume-auto "$RA" "$RX" \
  || note_args resume-auto "$RA" "$RX" ) &
# the seeds study through the local-GPU launcher, cut to seed 0 (SCFS and DINO side by side on GPU 0)
rm -rf "runs/multirun/$STUDY"
slot; run study-local-gpus "python -m scfs.train -m +study=cifar10_seeds hydra/launcher=local_gpus hydra.launcher.per_gpu=3" \
  "seed=0 hydra.sweep.dir=runs/multirun/$STUDY hydra.sweeper.reuse=false $E $SHORT eval.knn_at_start=false" &
slot; run search-check "python -m scfs.search.check --quick" "" &
V="python -m scfs.train +experiment=cifar10_vit"  # the ViT rows: compiled as written, DINO eager, ViT-S/16 eager
slot; run cifar10-vit "$V" "$SHORT name=smoke-vit" &
slot; run cifar10-vit-dino "$V method=dino" "$E $SHORT name=smoke-vit-dino" &
slot; run imagenet-vit "python -m scfs.train +experiment=imagenet_vit" \
  "data.root=data/imagenet-smoke batch_size=16 num_workers=4 $E $SHORT name=smoke-imagenet-vit" &
slot; run search-check-vit "python -m scfs.search.check --shapes vit" "" &
slot; run bench-step "python -m scfs.bench.step --quick" "--out $WK/step --steps 10 --warmup 3" &
slot; run bench-step-vit "python -m scfs.bench.step --suite vit" "--quick --out $WK/step-vit --steps 10 --warmup 3" &
slot; run imagenet-gpu-decode "python -m scfs.train +experiment=imagenet data.decode=gpu" \
  "data.root=data/imagenet-smoke global_batch_size=32 num_workers=4 $E $SHORT name=smoke-imagenet-gpu-decode" &
slot; run bench-loader "python -m scfs.bench.loader --photos data/imagenet-samples --repeat 8 --decode cpu gpu" \
  "--batches 6 --warmup 2 --out $WK/loader" &
slot; run bench-e2e "python -m scfs.bench.e2e --archive .gpudata/imagenet-samples-100.tar.xz --profile" \
  "--photos data/imagenet-samples --tree data/imagenet-e2e --repeat 2 --batch 16 --epochs 2 --setting bf16_cl \
  --override compile=false --out $WK/e2e" &
if [ "$NGPU" -ge 2 ]; then  # DDP next to one GPU at the same global batch: time per epoch and kNN side by side
  slot; run ddp-2gpu "python -m scfs.train +experiment=cifar10 trainer=ddp trainer.devices=2 sync_bn=true" \
    "global_batch_size=512 trainer.max_epochs=2 $E name=smoke-ddp" &
  slot; CUDA_VISIBLE_DEVICES=0 run ddp-1gpu-same-batch "$C" "global_batch_size=512 trainer.max_epochs=2 $E name=smoke-1gpu" &
fi
wait
echo "wave 1 done after $(( $(date +%s) - T0 )) s"

# --- wave 2: the evaluation CLIs and notebook 02 on the checkpoints of wave 1
export WAVE=2
slot; run knn "python -m scfs.eval.knn ckpt=<ckpt>" "" &
slot; run study-table "python -m scfs.eval.compare runs/multirun/<date>/<time>" "" &
slot; run linear-fast "python -m scfs.eval.linear ckpt=<ckpt> fast=true" "probe.epochs=2" &
slot; run linear-full "python -m scfs.eval.linear ckpt=<ckpt>" "probe.epochs=1" &
slot; run detect "python -m scfs.eval.detect ckpt=<ckpt>" "schedule.max_iters=20" &
slot; run precision "python -m scfs.eval.precision SCFS=<scfs ckpt> DINO=<dino ckpt> random" "--limit 40" &
slot; run precision-centred "python -m scfs.eval.precision SCFS=<scfs ckpt> DINO=<dino ckpt> random --centre" "--limit 40" &
slot; run notebook-02 "" "env SCFS_NB_SMALL=1 SCFS_NB_STATIC=1 CKPT=<ckpt> $PY scripts/run_notebook_cells.py notebooks/02_searched_regions.ipynb" &
slot; CKRUN=smoke-vit run attention "python -m scfs.workbench.docs_figures attention <ckpt> --folder data/imagenet-samples" \
  "--size 32 --out $WK/attention.png" &
slot; CKRUN=smoke-vit run knn-vit "python -m scfs.eval.knn ckpt=<ckpt>" "" &
wait
unset WAVE
retry_alone
WALL=$(( $(date +%s) - T0 ))

# --- the record: one PASS/FAIL table, last
REC_DIR=${REC_DIR:-benchmarks/results}; REC="$REC_DIR/gpu-smoke-$STAMP.md"; mkdir -p "$REC_DIR"
NPASS=$(awk -F'\t' '$2 == "PASS"' "$ROWS" | wc -l); NROWS=$(wc -l < "$ROWS")
{
  echo "# GPU smoke, $STAMP: $NPASS of $NROWS PASS"
  echo
  echo "Commit \`$COMMIT\`; $GPU x $NGPU; $WALL s wall; torch $($PY -c 'import torch; print(torch.__version__)'), lightning \
$($PY -c 'import lightning; print(lightning.__version__)'). Made by \`COMMIT=$COMMIT OUT=\$OUT bash scripts/gpu_smoke.sh\`:"
  echo "each README command as written there, then only the overrides that cut it to a few steps."
  echo "$HOST"
  [ -n "$NOT_RETRIED" ] && echo "$NOT_RETRIED"
  [ "$NGPU" -lt 2 ] && echo "$NGPU GPU(s): the 2-GPU DDP rows did not run."
  echo
  echo "| step | result | s | README command | + overrides | why it failed, or ran again |"
  echo "|---|---|---|---|---|---|"
  sort "$ROWS" | awk -F'\t' '{printf "| %s | %s | %s | `%s` | `%s` | %s |\n", $1, $2, $3, $4, $5, $6}'
} > "$OUT/gpu-smoke.md"
cp "$OUT/gpu-smoke.md" "$REC"
tar czf "$OUT/smoke-logs.tgz" -C "$WK" logs  # one file: the device returns at most 8 files
cat "$OUT/gpu-smoke.md"
[ "$NPASS" -eq "$NROWS" ]
