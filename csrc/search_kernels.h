// Fused Semantics-Consistent Feature Search kernels: plain CUDA runtime API, no torch headers, so this
// header and search_kernels.cu compile standalone with `nvcc -c` and, after hipify, with `hipcc -c`.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

namespace scfs {

enum DType : int { kF32 = 0, kBF16 = 1, kF16 = 2 };

struct Strides3 {
  int64_t b, c, p;  // element strides of a (B, C, P = H*W) view
};

struct FwdParams {
  const void* f; Strides3 fs;               // feats (B, C, P), dtype dt
  const void* q; int64_t qn, qb, qc;        // raw queries (N, B, C), dtype dt
  const void* g; Strides3 gs;               // map to weight (B, CG, P): feats or projected feats
  void* out; Strides3 os;                   // (N*B, CG, P) or nullptr: similarity only
  float* sim; float* a_out;                 // (N, B, P) written when a_in == nullptr (a_out may be null)
  const float* a_in;                        // (N, B, P) precomputed weights, or nullptr: fused soft mode
  float* fnorm; float* qnorm;               // (B, P) and (N, B) unclamped norms
  int N, B, C, CG, P, splits, c_per;
  int vec;                                  // 1: 4-pixel vector writes are safe (host checked)
  float eps;
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

int pixel_tile();  // pixels per block (grid.x = ceil(P / pixel_tile()))
cudaError_t launch_fwd(const FwdParams& p, DType dt, cudaStream_t stream);
cudaError_t launch_bwd_a(const BwdAParams& p, DType dt, cudaStream_t stream);
cudaError_t launch_bwd_f(const BwdFParams& p, DType dt, cudaStream_t stream);

}  // namespace scfs
