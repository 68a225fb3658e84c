// Fused Semantics-Consistent Feature Search kernels: plain CUDA runtime API, no torch headers, so this
// header and the .cu files compile standalone with `nvcc -c` and, after hipify, with `hipcc -c`.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

namespace scfs {

enum DType : int { kF32 = 0, kBF16 = 1, kF16 = 2 };

struct Strides3 {
  int64_t b, c, p;  // element strides of a (B, C, P = H*W) view
};

// Similarity pass: read feats once, per pixel N dot products with the raw queries and the sum of squares.
// S == 1: the block owns all C channels of its pixels and writes the final sim / a_out / fnorm / qnorm.
// S > 1 (small maps): channel split s writes partial sums into part / qpart, launch 2 (finalize) sums the S
// partials in a fixed order. S and c_per depend on (C, P) only (sim_config), so results never depend on B.
struct SimParams {
  const void* f; Strides3 fs;               // feats (B, C, P), dtype dt
  const void* q; int64_t qn, qb, qc;        // raw queries (N, B, C), dtype dt
  float* sim; float* a_out;                 // (N, B, P); a_out may be null
  float* fnorm; float* qnorm;               // (B, P) and (N, B) unclamped norms
  float* part; float* qpart;                // S > 1: (S, N + 1, B, P) and (S, N, B) scratch
  int N, B, C, P, S, c_per;
  float eps;
};

// Weighting pass: out[n] = a[n] * g, a (N, B, P) float32. The map is seen as (B, R, K) with K the fast
// (inner) axis: contiguous maps have R = channels, K = pixels and a varies along K (a_inner = 1);
// channels_last maps have R = pixels, K = channels and a is constant along K (a_inner = 0).
// Two block orders compute the same products (bitwise identical outputs):
//  kWeightTiled (default): a block reads its tile of g once and writes it to all N outputs (N write streams
//    49 MiB apart at once for a ResNet-50 layer2 batch: measured at ~2.2 TB/s on an H200).
//  kWeightChunked (opt-in; H200, 2026-11-30: bitwise equal, faster on fp32 without projection, slower on bf16
//    and layer4, see search-h200-2026-11-30-v3-weighting.md): one n per block, 1-d grid ordered chunk -> n -> unit, so consecutive
//    blocks write one output slice contiguously and each chunk of g (chunk_bytes) is re-read from L2 N times.
enum WeightOrder : int { kWeightTiled = 0, kWeightChunked = 1 };

struct WeightParams {
  const void* g; int64_t gb, gr, gk;        // (B, R, K) element strides
  void* out; int64_t ob, orow, ok, on;      // out[n] starts at out + n * on
  const float* a;                           // (N, B, P) contiguous
  int N, B, R, K, P;
  int a_inner;                              // 1: a indexed by k, 0: by r
  int vec;                                  // elements per vector access along K: 1, or 16 (or 8) bytes' worth
  int rch;                                  // rows per block (weight_config)
  int order;                                // WeightOrder (caller; 0 = tiled)
  int64_t chunk_bytes;                      // chunked: bytes of g per chunk (caller)
  int64_t block_bytes;                      // chunked: bytes of g per block, the rows-per-block target (caller)
  int64_t chunk_units;                      // chunked: blocks (units of rch rows x one K tile) per chunk and n
};

struct BwdAParams {
  const void* dout; Strides3 ds;            // (N*B, CG, P)
  const void* g; Strides3 gs;               // (B, CG, P)
  const float* a;                           // (N, B, P)
  float* da;                                // (splits, N, B, P) per-split partial sums
  float* dg;                                // (B, CG, P) contiguous
  int N, B, CG, P, splits, c_per;
};

struct BwdFParams {
  const void* f; Strides3 fs;               // (B, C, P)
  const float* fnorm;                       // (B, P)
  const float* qhat;                        // (N, B, C) contiguous, normalised queries
  const float* ds; const float* sim;        // (N, B, P)
  const float* add;                         // (B, C, P) contiguous or nullptr
  void* df; Strides3 dfs;                   // (B, C, P)
  float* dq;                                // (tiles, N, B, C) per-pixel-tile partial dq̂
  int N, B, C, P, splits, c_per;
  float eps;
};

int pixel_tile();                                      // pixels per block of the similarity / backward kernels
void sim_config(int C, int P, int* S, int* c_per);     // channel split of the similarity pass (B-independent)
int weight_vec_elems(DType dt);                        // elements per 16-byte vector of the weighting pass
void weight_config(WeightParams* p, DType dt);         // fills p->rch (and p->chunk_units) from the shape;
                                                      // p->vec, p->order and the chunked sizes set by the caller
// vector width: 16-byte (else for 16-bit types 8-byte) accesses when K, the strides and pointers allow, else 1
cudaError_t launch_sim(const SimParams& p, DType dt, cudaStream_t stream);      // 1 or 2 launches
cudaError_t launch_weight(const WeightParams& p, DType dt, cudaStream_t stream);
cudaError_t launch_bwd_a(const BwdAParams& p, DType dt, cudaStream_t stream);
cudaError_t launch_bwd_f(const BwdFParams& p, DType dt, cudaStream_t stream);

}  // namespace scfs
