#!/usr/bin/env bash
# One device call on a 2-GPU machine for issues 7 and 3, in order of what is still unmeasured:
#   1. the 2-GPU DDP equivalence test with SyncBatchNorm (pytest -m gpu tests/test_ddp.py), DDP_S seconds at most;
#   2. the CIFAR step benchmark on GPU 0, uncompiled vs torch.compile + CUDA graphs (reduce-overhead), with a profile
#      (kernel launches and GPU busy time per step), STEP_S seconds at most; the GPUs are otherwise idle, so the rows
#      are side by side;
#   3. kernel: the search-op round (scripts/gpu_search.sh: harness, probe, benchmark at B=32 and 64 with the
#      torch.compile baseline; KERNEL_ARGS), KERNEL_S seconds at most.
#   4. real: the CIFAR step fed by the real data path (--data real), REAL_S seconds at most;
#   5. step50: the ResNet-50 step rows with the profile (STEP50_SETTINGS, default bf16_cl), STEP50_S seconds at most.
#   6. graphs50: the ResNet-50 rows under CUDA graphs (GRAPHS50_ARGS, default B=32 bf16_cl_graphs), GRAPHS50_S.
#   7. pooled: ResNet-50 SCFS B=32 with method.stage_pooled_bn=true, then false (profiled), POOLED_S for both.
# timeout -k: a compile worker pool can outlive a plain SIGTERM and hold the call to its limit (2026-11-30).
# PARTS picks and orders them (default "ddp step"; "kernel" alone fits one call; all of them do not).
# Lesson of the first round (2026-11-30): the step rows overlapped the kernel harness and the step process rebuilt
# the CUDA extension (its own TORCH_EXTENSIONS_DIR), so the uncompiled row was slowed and nothing was comparable; the
# compile + CUDA-graph warm-up of one SCFS CIFAR row took 155 s. Now one shared extension dir, and no overlap.
# Usage (device machine, repo root, wheels on PYTHONPATH): OUT=/dir bash scripts/gpu_speed_round.sh
# Everything lands in $OUT/round.tgz (at most 8 files come back); the tables are printed last.
set -uo pipefail
export PYTHONUNBUFFERED=1 WANDB_MODE=disabled NCCL_NVLS_ENABLE=0 TORCH_EXTENSIONS_DIR=/tmp/torch_ext
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/k" "$OUT/s" "$OUT/r" "$OUT/s50" "$OUT/g50" "$OUT/p"
PY=${PY:-python3}
t0=$(date +%s)
since() { echo "$(( $(date +%s) - t0 ))s"; }
$PY -c "from scfs.search import cuda_backend as c; c.extension(); print('extension built')" 2>&1 | tail -2
echo "build $(since)"
for part in ${PARTS:-ddp step}; do
  case $part in
    ddp) timeout -k 15 "${DDP_S:-150}" $PY -m pytest -q -m gpu -p no:cacheprovider tests/test_ddp.py > "$OUT/ddp.log" 2>&1
         echo "ddp rc=$? $(since)"; tail -n 3 "$OUT/ddp.log" ;;
    step) CUDA_VISIBLE_DEVICES=0 timeout -k 15 "${STEP_S:-420}" $PY -m scfs.bench.step --suite cifar --setting bf16_cl \
            --setting bf16_cl_graphs --profile 3 --out "$OUT/s" > "$OUT/step.log" 2>&1
          echo "step rc=$? $(since)" ;;
    real) # the same CIFAR step fed by the real data path (JPEG tree decoded once, views made on the GPU)
          . "$(dirname "$0")/cifar10_data.sh"; cifar10_ready --no-cache > /dev/null
          CUDA_VISIBLE_DEVICES=0 timeout -k 15 "${REAL_S:-150}" $PY -m scfs.bench.step --suite cifar --setting bf16_cl \
            --data real --data-root data/cifar10 --profile 3 --out "$OUT/r" > "$OUT/real.log" 2>&1
          echo "real rc=$? $(since)" ;;
    step50) # ResNet-50 rows with the profile (GPU busy ms vs step ms: host- or GPU-bound?); STEP50_SETTINGS
          # shellcheck disable=SC2086
          CUDA_VISIBLE_DEVICES=0 timeout -k 15 "${STEP50_S:-240}" $PY -m scfs.bench.step --suite resnet50 \
            ${STEP50_SETTINGS:---setting bf16_cl} --profile 3 --out "$OUT/s50" > "$OUT/step50.log" 2>&1
          echo "step50 rc=$? $(since)" ;;
    graphs50) # ResNet-50 under torch.compile + CUDA graphs (reduce-overhead) with the profile: the eager step is
          # host-bound (GPU busy 44 % of the SCFS B=32 step, step-h200-2026-11-30-ab.md); compile warm-up is long,
          # so each row is saved as it ends (GRAPHS50_ARGS picks rows, GRAPHS50_S seconds at most)
          # shellcheck disable=SC2086
          CUDA_VISIBLE_DEVICES=0 timeout -k 15 "${GRAPHS50_S:-540}" $PY -m scfs.bench.step --suite resnet50 \
            ${GRAPHS50_ARGS:---batch 32 --setting bf16_cl_graphs} --profile 3 --out "$OUT/g50" > "$OUT/graphs50.log" 2>&1
          echo "graphs50 rc=$? $(since)" ;;
    pooled) # the stage heads' closed-form conv3 + bn3 against the materialised head, ResNet-50 SCFS B=32, profiled
          # (GPU busy and the stage parts' kernel ms are the numbers it changes), POOLED_S seconds for both runs
          for v in true false; do
            CUDA_VISIBLE_DEVICES=0 timeout -k 15 "$(( ${POOLED_S:-200} / 2 ))" $PY -m scfs.bench.step --suite resnet50 \
              --batch 32 --setting bf16_cl --method scfs --profile 3 --override "method.stage_pooled_bn=$v" \
              --out "$OUT/p/$v" > "$OUT/pooled-$v.log" 2>&1
            echo "pooled $v rc=$? $(since)"
          done ;;
    kernel) # shellcheck disable=SC2086
      # the harness sweeps both backends on the GPU (Triton's two-pass forward was only interpreter-checked); the
      # benchmark times the default (tiled) CUDA order only, at B=32 and 64, with the torch.compile baseline
      CUDA_VISIBLE_DEVICES=0 TOTAL_S=${KERNEL_S:-540} CHECK_BACKENDS=${CHECK_BACKENDS:-cuda,triton} \
        CHECK_S=${CHECK_S:-150} PROBE_S=${PROBE_S:-20} BENCH_S=${BENCH_S:-300} OUT="$OUT/k" \
        bash "$(dirname "$0")/gpu_search.sh" ${KERNEL_ARGS:---tag v4 --weighting tiled --compile-until 150} \
        > "$OUT/kernel.log" 2>&1
      echo "kernel $(since)"; grep -E "rc=|failing" "$OUT/kernel.log" ;;
    *) echo "unknown part $part (ddp, step, real, step50, graphs50, pooled, kernel)"; exit 2 ;;
  esac
done
(cd "$OUT" && tar czf round.tgz k s r s50 g50 p ./*.log && rm -rf k s r s50 g50 p)
tar xzf "$OUT/round.tgz" -O --wildcards '*.md' 2>/dev/null | grep -E "^\||^#" | head -70
