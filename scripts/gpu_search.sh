#!/usr/bin/env bash
# One device call: build the CUDA extension, run the GPU harness, a per-kernel profile and the benchmark, copy
# results to $OUT (at most 8 files come back). Budget (about 6.5 min): CHECK_S + BENCH_S + the build.
# Usage (device machine, repo root): OUT=/some/dir bash scripts/gpu_search.sh [bench args, e.g. --quick --tag v2]
set -uo pipefail
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} TORCH_EXTENSIONS_DIR=/tmp/torch_ext
export MAX_JOBS=${MAX_JOBS:-8}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
PY=${PY:-python3}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
t0=$(date +%s)
$PY -c "from scfs.search import cuda_backend as c; c.extension(); print('extension built')" 2>&1 | tail -5 | tee "$OUT/build.log"
echo "build: $(( $(date +%s) - t0 ))s"
timeout "${CHECK_S:-110}" $PY -m scfs.search.check 2>&1 | tee "$OUT/check.log" | grep -v '^ok' ; echo "check rc=${PIPESTATUS[0]} $(( $(date +%s) - t0 ))s"
# per-kernel GPU time of one CUDA forward (similarity, finalize, weighting) and fwd+bwd, layer2/layer4 fp32+bf16
timeout 60 $PY - > "$OUT/profile.txt" 2>&1 <<'PYEOF'
import torch
from torch.profiler import ProfilerActivity, profile
from scfs.search import feature_search
for c, h, w in ((512, 28, 28), (2048, 7, 7)):
    for dt in (torch.float32, torch.bfloat16):
        f = torch.randn(32, c, h, w, device="cuda", dtype=dt)
        q = torch.randn(8, 32, c, device="cuda", dtype=dt)
        fg, qg = f.clone().requires_grad_(), q.clone().requires_grad_()
        g = torch.randn(256, c, h, w, device="cuda", dtype=dt)
        for _ in range(3):
            feature_search(f, q, backend="cuda")
            torch.autograd.grad(feature_search(fg, qg, backend="cuda").features, (fg, qg), g)
        torch.cuda.synchronize()
        for name, fn in (
            ("fwd", lambda: feature_search(f, q, backend="cuda")),
            ("fwd+bwd", lambda: torch.autograd.grad(feature_search(fg, qg, backend="cuda").features, (fg, qg), g)),
        ):
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(10):
                    fn()
                torch.cuda.synchronize()
            print(f"== {c}x{h}x{w} {dt} {name}: per-call GPU us by kernel (10 calls)")
            for e in sorted(prof.key_averages(), key=lambda e: -e.device_time_total)[:8]:
                print(f"  {e.device_time_total / 10:9.1f} us  x{e.count // 10:<3d} {e.key[:90]}")
PYEOF
echo "profile rc=$? $(( $(date +%s) - t0 ))s"; cat "$OUT/profile.txt" | head -60
timeout "${BENCH_S:-230}" $PY -m scfs.bench.search --out "$OUT" "$@" 2>&1 | tee "$OUT/bench.log" | grep -v '^|' ; echo "bench rc=${PIPESTATUS[0]} $(( $(date +%s) - t0 ))s"
if [ "${SCFS_PYTEST:-0}" = "1" ]; then
  timeout 90 $PY -m pytest -q -m gpu -p no:cacheprovider tests/search -x 2>&1 | tail -5 | tee "$OUT/pytest_gpu.log"
fi
cat "$OUT"/search-*.md 2>/dev/null
if [ "${SCFS_NCU:-0}" = "1" ] && command -v ncu >/dev/null; then
  timeout 120 ncu --clock-control none -k regex:"sim_kernel|weight_kernel" -c 4 --section SpeedOfLight --section Occupancy \
    $PY -c "
import torch; from scfs.search import feature_search
for dt in (torch.float32, torch.bfloat16):
    f = torch.randn(32, 512, 28, 28, device='cuda', dtype=dt); q = torch.randn(8, 32, 512, device='cuda', dtype=dt)
    feature_search(f, q, backend='cuda'); torch.cuda.synchronize()
" > "$OUT/ncu.txt" 2>&1; grep -E "Throughput|Duration|Achieved Occupancy|Registers" "$OUT/ncu.txt" | head -24
fi
