// Block order and sizes of the chunked weighting pass (WeightParams::order == kWeightChunked), as plain
// host/device functions with no CUDA dependency, so that a CPU test (tests/search/test_weight_order_cpu.py)
// compiles this header with g++ and checks every (n, unit) is visited exactly once in chunk -> n -> unit order.
#pragma once
#include <cstdint>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define SCFS_HD __host__ __device__ __forceinline__
#else
#define SCFS_HD inline
#endif

namespace scfs {

// One block's work: output slice n, image b, row chunk rt (rows [rt*rch, rt*rch + rch)), K tile kt.
struct ChunkedUnit {
  int n, b, rt, kt;
};

// Units (rch rows x one K tile of one image) are numbered in memory order: K tile fastest, then row chunk,
// then image. Block blk of the 1-d grid of N * units blocks: full chunks first, cu units each, blocks
// [c*N*cu + n*cu, c*N*cu + (n+1)*cu) = slice n of chunk c; then the last chunk's (units % cu) units, n-major.
SCFS_HD ChunkedUnit chunked_unit(int64_t blk, int N, int B, int64_t rtiles, int64_t ktiles, int64_t cu) {
  const int64_t units = ktiles * rtiles * B;
  const int64_t full = units / cu;  // full chunks
  const int64_t per = static_cast<int64_t>(N) * cu;
  int64_t unit;
  int n;
  if (blk < full * per) {
    const int64_t c = blk / per, rem = blk - c * per;
    n = static_cast<int>(rem / cu);
    unit = c * cu + (rem - n * cu);
  } else {
    const int64_t last = units - full * cu, rem = blk - full * per;
    n = static_cast<int>(rem / last);
    unit = full * cu + (rem - n * last);
  }
  const int64_t rest = unit / ktiles;
  ChunkedUnit u;
  u.n = n;
  u.kt = static_cast<int>(unit - rest * ktiles);
  u.rt = static_cast<int>(rest % rtiles);
  u.b = static_cast<int>(rest / rtiles);
  return u;
}

// Rows per block (*rch): about block_bytes of g, a whole number of tyw-row steps, no more steps than the map
// has rows for. Units per chunk (*cu): about chunk_bytes of g, at least 1. row_bytes: bytes of one K tile row.
SCFS_HD void chunked_sizes(int R, int tyw, int64_t row_bytes, int64_t block_bytes, int64_t chunk_bytes, int* rch,
                           int64_t* cu) {
  const int64_t steps_max = (R + tyw - 1) / tyw;
  int64_t steps = block_bytes / (tyw * row_bytes);
  steps = steps < 1 ? 1 : (steps > steps_max ? steps_max : steps);
  *rch = static_cast<int>(tyw * steps);
  const int64_t unit_bytes = (*rch < R ? *rch : R) * row_bytes;
  const int64_t c = chunk_bytes / unit_bytes;
  *cu = c < 1 ? 1 : c;
}

}  // namespace scfs
