#!/usr/bin/env bash
# A queue of GPU jobs run one after the other in one GPU window (a device machine held for about 25 minutes,
# commands of at most 10 minutes each; ../shared/DEVICE.md). Benchmarks must not share the GPU, so the jobs run in
# order, each alone; the queue runs under setsid in a copy of the tree outside the one each command re-copies, so it
# outlives the command that started it.
#
#   COMMIT=$(git rev-parse --short HEAD) OUT=$OUT MINUTES=25 bash scripts/gpu_queue.sh start scripts/queues/speed.queue
#   (several queue files run as one queue, in the order given)
#   OUT=$OUT bash scripts/gpu_queue.sh watch 540
#   OUT=$OUT bash scripts/gpu_queue.sh collect 540
#
# The queue file: one job per line, `<name> <seconds> <command>`; `#` starts a comment. <seconds> is the job's
# expected length: a job that would not end before the deadline (`start` + MINUTES) is left for the next window and
# said so, and the queue goes on with the next job that fits. A job runs in the tree's copy with $JOB_OUT (its own
# folder, kept), $Q (the queue's folder: an earlier job's folder is $Q/jobs/<name>), $COMMIT and the caller's
# environment (the wheels' PYTHONPATH, say); what it prints goes to $Q/logs/<name>.log.
# Each line of the queue's own log ($Q/queue.log) says when a job started, ended (exit status, seconds) or was left.
# SKIP='<name> <name>' leaves out the jobs an earlier window has done (their records committed).
# `start` starts nothing when a job names a carried input (.gpudata/, .whl/, .pub/) this tree lacks: the device
# call brings those folders only where its `carry` names them.
# The queue lives as long as the machine, which goes back shortly after a call ends (the device status's
# idle_release_s, seconds): follow each call at once with the next `watch`, and read what came back after the last.
# `watch SECONDS` waits at most SECONDS while the queue runs, prints that log and copies back what there is;
# `collect SECONDS` is the same, for the last command of a window. What comes back: $OUT/queue.tgz (every job's
# folder without checkpoints, its log, the queue's log) and the jobs' *.md records beside it, as <job>--<record>.md.
# File them as records with `python -m scfs.bench.queue_records <files_at>/queue.tgz` (here, not on the device).
set -uo pipefail
W=${QUEUE_TREE:-/tmp/queue-tree}; Q=${QUEUE_DIR:-/tmp/queue}; OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
queue_alive() { [ -f "$Q/queue.pid" ] && kill -0 "$(cat "$Q/queue.pid")" 2>/dev/null; }
copy_back() {
  [ -d "$Q/jobs" ] || return 0
  (cd "$Q" && tar czf "$OUT/queue.tgz" --exclude='*.ckpt' --exclude='*.pt' queue.log jobs logs 2>/dev/null)
  # the records beside it, named by their job (two jobs may write the same record name); a call brings back at
  # most 8 files, the archive one of them
  local n=0 f job
  for f in "$Q"/jobs/*/*.md; do
    [ -f "$f" ] && [ $n -lt 7 ] || continue
    job=$(basename "$(dirname "$f")"); cp "$f" "$OUT/$job--$(basename "$f")"; n=$((n + 1))
  done
  return 0
}
missing_inputs() {  # the carried inputs (.gpudata/, .whl/, .pub/: ignored by git, so a call brings them only
  # where its `carry` names them) that a queue file's jobs name and this tree lacks, as '<job>: <path>' lines
  local - name secs cmd word; set -f
  while read -r name secs cmd; do
    [ -z "$name" ] || [[ $name == \#* ]] || [[ " ${SKIP:-} " == *" $name "* ]] && continue
    for word in $cmd; do
      word=${word//\"/}; word=${word//\'/}
      case $word in .gpudata/*|.whl/*|.pub/*) compgen -G "$word" > /dev/null || echo "$name: $word" ;; esac
    done
  done < "$1"
}
run_queue() {  # the queue itself, under setsid: $1 the queue file (in the tree's copy), $2 the deadline (epoch s)
  local file=$1 deadline=$2 name secs cmd t0 rc
  while read -r name secs cmd; do
    [ -z "$name" ] || [[ $name == \#* ]] && continue
    if ! [[ $secs =~ ^[0-9]+$ ]] || [ -z "$cmd" ]; then
      echo "[queue] bad line for '$name': expected '<name> <seconds> <command>'"; continue
    fi
    if [[ " ${SKIP:-} " == *" $name "* ]]; then echo "[queue] skipped $name (in SKIP)"; continue; fi
    if [ $(( $(date +%s) + secs )) -gt "$deadline" ]; then
      echo "[queue] left $name for the next window: ${secs} s expected, $(( deadline - $(date +%s) )) s left"
      continue
    fi
    mkdir -p "$Q/jobs/$name"; t0=$(date +%s)
    echo "[queue] +$(( t0 - START )) s start $name (${secs} s expected)"
    (export JOB_OUT=$Q/jobs/$name; eval "$cmd") > "$Q/logs/$name.log" 2>&1 < /dev/null
    rc=$?
    echo "[queue] +$(( $(date +%s) - START )) s $name ended, exit status $rc, in $(( $(date +%s) - t0 )) s"
  done < "$file"
  echo "[queue] done"
}
case "${1:-}" in
start)
  shift; [ $# -gt 0 ] || { echo "usage: $0 start QUEUE_FILE [QUEUE_FILE ...]"; exit 2; }
  for file in "$@"; do
    [ -f "$file" ] || { echo "no queue file '$file': give a file of '<name> <seconds> <command>' lines"; exit 2; }
  done
  missing=$(for file in "$@"; do missing_inputs "$file"; done)
  if [ -n "$missing" ]; then  # a job would fail in its first second and the window's minutes go by unused
    echo "$missing" | sed 's/^/missing input, job /'
    echo "these are not in this tree: name their folders in the run call's carry (e.g. [\".whl\", \".gpudata\", \".pub\"])"
    exit 2
  fi
  export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 WANDB_MODE=offline COMMIT=${COMMIT:-unknown}
  rm -rf "$Q" "$W"; mkdir -p "$Q/logs" "$Q/jobs"; cat "$@" > "$Q/queue.txt"; cp -a . "$W"; cd "$W" || exit 1
  export PYTHONPATH="$W${PYTHONPATH:+:$PYTHONPATH}"
  . scripts/python_shim.sh; python_shim "$Q/bin"   # the jobs say `python`, as the README does
  export START=$(date +%s); DEADLINE=$(( START + ${MINUTES:-25} * 60 )); export Q SKIP=${SKIP:-}
  echo "queue $*, deadline $(date -d @"$DEADLINE" +%T)"
  export -f run_queue
  setsid nohup bash -c "run_queue '$Q/queue.txt' $DEADLINE" > "$Q/queue.log" 2>&1 < /dev/null &
  echo $! > "$Q/queue.pid"
  sleep 3; cat "$Q/queue.log"
  ;;
watch|collect)
  end=$(( $(date +%s) + ${2:-540} ))
  while [ "$(date +%s)" -lt "$end" ] && queue_alive; do sleep 10; done
  cat "$Q/queue.log" 2>/dev/null
  running=$(grep " start " "$Q/queue.log" 2>/dev/null | tail -n 1 | awk '{print $5}')
  if queue_alive && [ -n "$running" ]; then echo "running: $running"; tail -n 5 "$Q/logs/$running.log"; fi
  command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
  copy_back; [ "$1" = collect ] && ls -la "$OUT"
  ;;
*) echo "usage: $0 start QUEUE_FILE [QUEUE_FILE ...] | watch SECONDS | collect SECONDS"; exit 2 ;;
esac
