#!/usr/bin/env bash
# One device call (about 7 min at most, TOTAL_S): build the CUDA extension, run the GPU harness for both weighting
# orders (cuda tiled, cuda chunked, and the bitwise tiled==chunked cross-check at several chunk/block sizes), the
# bandwidth probe (weighting pass alone under both orders, chunked chunk/block sweep), a per-kernel profile of both
# orders, and the benchmark with both orders side by side (cuda = tiled, cuda-chunked). Every step gets what is
# left of TOTAL_S (default 400 s, from the start of this script), so the call ends in time even if the build is slow.
# Files to $OUT (at most 8 come back): build.log (GPU + build), check.log, probe.txt, profile.txt (+ optional
# pytest/ncu output), bench.log, search-*.json, search-*.md.
# Usage (device machine, repo root): OUT=/some/dir bash scripts/gpu_search.sh [bench args, e.g. --quick --tag v3]
#   CHECK_BACKENDS=cuda (default; cuda,triton adds the Triton sweep), SCFS_SEARCH_WEIGHT_CHUNK_KIB / _BLOCK_KIB
#   pick the chunked sizes the harness and benchmark use (the probe sweeps its own).
set -uo pipefail
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} TORCH_EXTENSIONS_DIR=/tmp/torch_ext
export MAX_JOBS=${MAX_JOBS:-8}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
PY=${PY:-python3}
t0=$(date +%s)
DEADLINE=$(( t0 + ${TOTAL_S:-400} ))
# seconds for a step: its own cap, or what is left before the deadline, whichever is less (at least 1)
budget() { local left=$(( DEADLINE - $(date +%s) )); local want=$1; (( left < want )) && want=$left; (( want < 1 )) && want=1; echo "$want"; }
since() { echo "$(( $(date +%s) - t0 ))s"; }

nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv 2>&1 | tee "$OUT/build.log"
$PY -c "from scfs.search import cuda_backend as c; c.extension(); print('extension built', c.weighting())" 2>&1 \
  | tail -5 | tee -a "$OUT/build.log"
echo "build: $(since)" | tee -a "$OUT/build.log"

timeout -k 15 "$(budget "${CHECK_S:-100}")" $PY -m scfs.search.check --backends "${CHECK_BACKENDS:-cuda}" --weighting both \
  2>&1 | tee "$OUT/check.log" | grep -v '^ok' ; echo "check rc=${PIPESTATUS[0]} $(since)"

timeout -k 15 "$(budget "${PROBE_S:-60}")" $PY -m scfs.bench.search --probe --weighting both > "$OUT/probe.txt" 2>&1
echo "probe rc=$? $(since)"; cat "$OUT/probe.txt"

# per-kernel GPU time of one CUDA forward under each order (similarity, finalize, weighting) and of fwd+bwd
timeout -k 15 "$(budget 45)" $PY - > "$OUT/profile.txt" 2>&1 <<'PYEOF'
import torch
from torch.profiler import ProfilerActivity, profile
from scfs.search import cuda_backend, feature_search
for c, h, w in ((512, 28, 28), (2048, 7, 7)):
    for dt in (torch.float32, torch.bfloat16):
        f = torch.randn(32, c, h, w, device="cuda", dtype=dt)
        q = torch.randn(8, 32, c, device="cuda", dtype=dt)
        fg, qg = f.clone().requires_grad_(), q.clone().requires_grad_()
        g = torch.randn(256, c, h, w, device="cuda", dtype=dt)
        runs = []
        for order in ("tiled", "chunked"):
            def fwd(order=order):
                cuda_backend.set_weighting(order)
                return feature_search(f, q, backend="cuda")
            runs.append((f"fwd {order}", fwd))
        def fwd_bwd():
            cuda_backend.set_weighting("tiled")
            return torch.autograd.grad(feature_search(fg, qg, backend="cuda").features, (fg, qg), g)
        runs.append(("fwd+bwd tiled", fwd_bwd))
        for name, fn in runs:
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(10):
                    fn()
                torch.cuda.synchronize()
            print(f"== {c}x{h}x{w} {dt} {name} {cuda_backend.weighting()}: per-call GPU us by kernel (10 calls)")
            for e in sorted(prof.key_averages(), key=lambda e: -e.device_time_total)[:8]:
                print(f"  {e.device_time_total / 10:9.1f} us  x{e.count // 10:<3d} {e.key[:90]}")
PYEOF
echo "profile rc=$? $(since)"; head -80 "$OUT/profile.txt"

case " $* " in *" --weighting "* | *" --weighting="*) WARGS=() ;; *) WARGS=(--weighting both) ;; esac
timeout -k 15 "$(budget "${BENCH_S:-170}")" $PY -m scfs.bench.search --out "$OUT" "${WARGS[@]}" "$@" 2>&1 \
  | tee "$OUT/bench.log" | grep -v '^|' ; echo "bench rc=${PIPESTATUS[0]} $(since)"
cat "$OUT"/search-*.md 2>/dev/null

if [ "${SCFS_PYTEST:-0}" = "1" ]; then
  timeout -k 15 "$(budget 90)" $PY -m pytest -q -m gpu -p no:cacheprovider tests/search -x 2>&1 | tail -5 | tee -a "$OUT/profile.txt"
fi
if [ "${SCFS_NCU:-0}" = "1" ] && command -v ncu >/dev/null; then
  timeout -k 15 "$(budget 120)" ncu --clock-control none -k regex:"sim_kernel|weight_kernel|weight_chunked_kernel" -c 8 \
    --section SpeedOfLight --section Occupancy --section MemoryWorkloadAnalysis \
    $PY -c "
import torch; from scfs.search import cuda_backend, feature_search
for dt in (torch.float32, torch.bfloat16):
    f = torch.randn(32, 512, 28, 28, device='cuda', dtype=dt); q = torch.randn(8, 32, 512, device='cuda', dtype=dt)
    for order in ('tiled', 'chunked'):
        cuda_backend.set_weighting(order); feature_search(f, q, backend='cuda'); torch.cuda.synchronize()
" > "$OUT/ncu.txt" 2>&1; grep -E "weight|Throughput|Duration|Achieved Occupancy|Registers|L2 Hit" "$OUT/ncu.txt" | head -40
  cat "$OUT/ncu.txt" >> "$OUT/profile.txt"; rm -f "$OUT/ncu.txt"
fi
echo "done $(since)"
