#!/usr/bin/env bash
# One device call: build the CUDA extension, run the GPU harness and the benchmark, copy results to $OUT.
# Usage (device machine, repo root): OUT=/some/dir bash scripts/gpu_search.sh [--quick]
set -uo pipefail
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} TORCH_EXTENSIONS_DIR=/tmp/torch_ext
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
PY=${PY:-python3}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
t0=$(date +%s)
$PY -c "from scfs.search import cuda_backend as c; c.extension(); print('extension built')" 2>&1 | tail -5 | tee "$OUT/build.log"
echo "build: $(( $(date +%s) - t0 ))s"
timeout 200 $PY -m scfs.search.check 2>&1 | tee "$OUT/check.log" | grep -v '^ok' ; echo "check rc=${PIPESTATUS[0]} $(( $(date +%s) - t0 ))s"
timeout 300 $PY -m scfs.bench.search --out "$OUT" "$@" 2>&1 | tee "$OUT/bench.log" | grep -v '^|' ; echo "bench rc=${PIPESTATUS[0]} $(( $(date +%s) - t0 ))s"
timeout 90 $PY -m pytest -q -m gpu -p no:cacheprovider tests/search -x 2>&1 | tail -5 | tee "$OUT/pytest_gpu.log"
cat "$OUT"/search-*.md 2>/dev/null
if [ "${SCFS_NCU:-0}" = "1" ] && command -v ncu >/dev/null; then
  timeout 120 ncu --clock-control none -k regex:fwd_kernel -c 2 --section SpeedOfLight --section Occupancy \
    $PY -c "
import torch; from scfs.search import feature_search
for dt in (torch.float32, torch.bfloat16):
    f = torch.randn(32, 512, 28, 28, device='cuda', dtype=dt); q = torch.randn(8, 32, 512, device='cuda', dtype=dt)
    feature_search(f, q, backend='cuda'); torch.cuda.synchronize()
" > "$OUT/ncu.txt" 2>&1; grep -E "Throughput|Duration|Achieved Occupancy|Registers" "$OUT/ncu.txt" | head -24
fi
