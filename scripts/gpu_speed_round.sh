#!/usr/bin/env bash
# One device call on a 2-GPU machine for issues 3 and 7 (about 6.5 min):
#   GPU 0: scripts/gpu_search.sh (CUDA extension build, harness for both weighting orders, probe, benchmark);
#   GPU 1, once the build is done (so nvcc does not steal the host from a host-bound step): the CIFAR step
#          benchmark, uncompiled vs torch.compile + CUDA graphs, with a profile (GPU busy time per step);
#   then both GPUs: the 2-GPU DDP equivalence test with SyncBatchNorm (pytest -m gpu tests/test_ddp.py), while
#          the CIFAR-10 tree is extracted and decoded into its cache for the calls that follow.
# Usage (device machine, repo root, wheels on PYTHONPATH): OUT=/dir bash scripts/gpu_speed_round.sh
# Everything lands in $OUT/round.tgz; the tables are printed last.
set -uo pipefail
export PYTHONUNBUFFERED=1 WANDB_MODE=disabled NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/k" "$OUT/s"
PY=${PY:-python3}
t0=$(date +%s)
(CUDA_VISIBLE_DEVICES=0 TOTAL_S=${KERNEL_S:-290} CHECK_S=90 BENCH_S=130 OUT="$OUT/k" \
  bash "$(dirname "$0")/gpu_search.sh" --quick --no-compile --tag "${KTAG:-v3-weighting}" > "$OUT/kernel.log" 2>&1) &
(until grep -q "^build:" "$OUT/k/build.log" 2>/dev/null; do sleep 2; done
 echo "step bench starts $(( $(date +%s) - t0 ))s"
 CUDA_VISIBLE_DEVICES=1 timeout "${STEP_S:-240}" $PY -m scfs.bench.step --suite cifar --setting bf16_cl \
   --setting bf16_cl_graphs --profile 3 --out "$OUT/s" > "$OUT/step.log" 2>&1; echo "step rc=$?") &
wait
echo "kernel + step done $(( $(date +%s) - t0 ))s"
timeout "${DDP_S:-150}" $PY -m pytest -q -m gpu -p no:cacheprovider tests/test_ddp.py > "$OUT/ddp.log" 2>&1 &
if [ ! -d data/cifar10/train ]; then
  $PY -m scfs.data.prepare cifar10 --archive .gpudata/cifar10-jpeg.tar.xz --out data/cifar10 > "$OUT/prep.log" 2>&1
fi
$PY -c "from scfs.data.datamodule import warm_cache; print(*warm_cache({'name': 'cifar10', 'root': 'data/cifar10'}, 12), sep='\n')" >> "$OUT/prep.log" 2>&1
wait
echo "all done $(( $(date +%s) - t0 ))s"
(cd "$OUT" && tar czf round.tgz k s ./*.log && rm -rf k s)
tail -n 4 "$OUT/prep.log" "$OUT/ddp.log"; grep -E "rc=|fail|FAIL|t==c" "$OUT/kernel.log" | head -20
tar xzf "$OUT/round.tgz" -O --wildcards '*.md' 2>/dev/null | grep -E "^\||^#" | head -70
