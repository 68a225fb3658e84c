"""The chunked weighting order's block decode and sizes (csrc/search_order.h), compiled with the host C++ compiler.

The CUDA kernel calls exactly these functions, so this checks on the CPU that its 1-d grid visits every
(n, image, row chunk, K tile) exactly once, in chunk -> n -> unit order, for many shapes and chunk/block sizes.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

CSRC = Path(__file__).resolve().parents[2] / "csrc"
CXX = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")

PROGRAM = r"""
#include "search_order.h"

#include <cstdio>
#include <vector>

using scfs::ChunkedUnit;

static int fails = 0;
#define CHECK(cond, ...)                                            \
  do {                                                              \
    if (!(cond)) {                                                  \
      if (fails++ < 20) {                                           \
        std::printf("FAIL %s line %d: ", #cond, __LINE__);          \
        std::printf(__VA_ARGS__);                                   \
        std::printf("\n");                                          \
      }                                                             \
    }                                                               \
  } while (0)

// one weighting launch: N outputs, B images, map (R rows x K) seen in tiles of TK (tyw rows per step)
static void one(int N, int B, int R, int K, int TK, int tyw, int esize, long long block_bytes, long long chunk_bytes) {
  int rch;
  int64_t cu;
  const int64_t row_bytes = static_cast<int64_t>(TK) * esize;
  scfs::chunked_sizes(R, tyw, row_bytes, block_bytes, chunk_bytes, &rch, &cu);
  const int64_t steps_max = (R + tyw - 1) / tyw;
  CHECK(rch >= tyw && rch % tyw == 0 && rch / tyw <= steps_max, "rch %d tyw %d R %d", rch, tyw, R);
  CHECK(rch == tyw || static_cast<int64_t>(rch) * row_bytes <= block_bytes, "rch %d over block %lld", rch,
        block_bytes);
  CHECK(cu >= 1, "cu %lld", static_cast<long long>(cu));
  const int64_t unit_bytes = static_cast<int64_t>(rch < R ? rch : R) * row_bytes;
  CHECK(cu == 1 || cu * unit_bytes <= chunk_bytes, "cu %lld unit %lld chunk %lld", static_cast<long long>(cu),
        static_cast<long long>(unit_bytes), chunk_bytes);
  CHECK(cu * unit_bytes + unit_bytes > chunk_bytes || cu == 1, "chunk underfilled");
  const int64_t rtiles = (R + rch - 1) / rch, ktiles = (K + TK - 1) / TK;
  const int64_t units = rtiles * ktiles * B, blocks = units * N;
  std::vector<int> seen(static_cast<size_t>(blocks), 0);
  int64_t prev_chunk = 0, prev_n = 0, prev_unit = -1;
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const ChunkedUnit u = scfs::chunked_unit(blk, N, B, rtiles, ktiles, cu);
    const bool in = u.n >= 0 && u.n < N && u.b >= 0 && u.b < B && u.rt >= 0 && u.rt < rtiles && u.kt >= 0 &&
                    u.kt < ktiles;
    CHECK(in, "blk %lld -> n %d b %d rt %d kt %d", static_cast<long long>(blk), u.n, u.b, u.rt, u.kt);
    if (!in) continue;
    const int64_t unit = (static_cast<int64_t>(u.b) * rtiles + u.rt) * ktiles + u.kt;  // memory order
    ++seen[static_cast<size_t>(unit * N + u.n)];
    // order: chunk nondecreasing; within a chunk n nondecreasing; within (chunk, n) units consecutive
    const int64_t chunk = unit / cu;
    CHECK(chunk >= prev_chunk, "chunk went back at blk %lld", static_cast<long long>(blk));
    if (chunk == prev_chunk && blk > 0) {
      CHECK(u.n >= prev_n, "n went back inside a chunk at blk %lld", static_cast<long long>(blk));
      if (u.n == prev_n) CHECK(unit == prev_unit + 1, "units not consecutive at blk %lld", static_cast<long long>(blk));
      if (u.n != prev_n) CHECK(unit == chunk * cu, "slice does not start at the chunk's first unit");
    } else {
      CHECK(u.n == 0 && unit == chunk * cu, "chunk %lld does not start at n 0 / its first unit",
            static_cast<long long>(chunk));
    }
    prev_chunk = chunk;
    prev_n = u.n;
    prev_unit = unit;
  }
  for (int64_t i = 0; i < blocks; ++i)
    CHECK(seen[static_cast<size_t>(i)] == 1, "(unit %lld, n %lld) visited %d times", static_cast<long long>(i / N),
          static_cast<long long>(i % N), seen[static_cast<size_t>(i)]);
}

int main() {
  const int Ns[] = {1, 3, 8, 17, 32};
  const int Bs[] = {1, 2, 5};
  const int RKs[][2] = {{1, 1}, {16, 1}, {1, 16}, {48, 91}, {512, 784}, {784, 512}, {2048, 49}, {49, 2048}, {96, 4096},
                        {200, 169}, {64, 45}};
  const int shapes[][3] = {{32, 8, 4}, {32, 32, 4}, {64, 32, 2}, {32, 8, 2}};  // (TK, tyw, esize) of the kernels
  const long long blocks[] = {1, 1024, 4096, 8192, 40000};
  const long long chunks[] = {1, 5000, 40 * 1024, 4 << 20, 1LL << 40};
  int launches = 0;
  for (int N : Ns)
    for (int B : Bs)
      for (const auto& rk : RKs)
        for (const auto& sh : shapes)
          for (long long bb : blocks)
            for (long long cb : chunks) {
              one(N, B, rk[0], rk[1], sh[0], sh[1], sh[2], bb, cb);
              ++launches;
            }
  std::printf("%d launches checked, %d failures\n", launches, fails);
  return fails == 0 ? 0 : 1;
}
"""


@pytest.mark.skipif(CXX is None, reason="no host C++ compiler")
def test_chunked_order_visits_every_unit_once_in_chunk_n_unit_order(tmp_path):
    src = tmp_path / "order_check.cpp"
    src.write_text(PROGRAM)
    exe = tmp_path / "order_check"
    cmd = [CXX, "-std=c++17", "-O1", "-Wall", "-Werror", f"-I{CSRC}", str(src), "-o", str(exe)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert " 0 failures" in run.stdout
