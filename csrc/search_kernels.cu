// Fused SCFS search, forward. Two passes, each shaped for the memory system rather than fused at any cost:
//  1. sim_kernel: one block = one image b, TPX consecutive pixels, TY channel groups, a channel range; reads
//     each feature element once (8 independent loads in flight per thread) and reduces N dot products + the
//     sum of squares through shared memory. Small maps split channels over blocks (partials, then a fixed-
//     order finalize: deterministic, no atomics, independent of B).
//  2. weight_kernel: the write-bound part (N copies): 16-byte loads/stores along the contiguous axis when
//     aligned, the block's weights staged in shared memory, many blocks (pixel tiles x row chunks x B).
//     weight_chunked_kernel (WeightParams::order == kWeightChunked, off by default; measured on an H200, no
//     general win: see search_kernels.h): the
//     same products with one n per block and a 1-d grid ordered chunk -> n -> unit (see that kernel).
// Portable: no warp-size assumption, no warp shuffles, no inline PTX; bf16 handled as raw bits.
#include "search_common.cuh"
#include "search_order.h"

#include <limits>

namespace scfs {
namespace {
using namespace detail;

template <typename T, int NMAX>
__global__ void __launch_bounds__(NT) sim_kernel(SimParams prm) {
  __shared__ float qs[NMAX][CK + 1];
  __shared__ float red[TY][NMAX + 1][TPX];
  __shared__ float qred[NT];
  __shared__ float sQss[NMAX];
  const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * TPX + tx;
  const int b = blockIdx.y, s = blockIdx.z, N = prm.N;
  const int p = blockIdx.x * TPX + tx;
  const bool pin = p < prm.P;
  const int c_lo = s * prm.c_per, c_hi = min(c_lo + prm.c_per, prm.C);
  const T* f = static_cast<const T*>(prm.f) + static_cast<int64_t>(b) * prm.fs.b +
               static_cast<int64_t>(pin ? p : 0) * prm.fs.p;
  float acc[NMAX];
#pragma unroll
  for (int n = 0; n < NMAX; ++n) acc[n] = 0.f;
  float ss = 0.f, qss = 0.f;
  constexpr int TPR = NT / NMAX;  // threads staging one query row
  constexpr int PER = CK / TY;    // feature loads per thread per chunk, all issued before use
  const int qrow = tid / TPR, qlane = tid % TPR;
  const T* q = static_cast<const T*>(prm.q) + static_cast<int64_t>(b) * prm.qb + static_cast<int64_t>(qrow) * prm.qn;
  for (int c0 = c_lo; c0 < c_hi; c0 += CK) {
    for (int j = qlane; j < CK; j += TPR) {
      const int c = c0 + j;
      const float v = (qrow < N && c < c_hi) ? to_f(q[static_cast<int64_t>(c) * prm.qc]) : 0.f;
      qs[qrow][j] = v;
      qss += v * v;
    }
    float v[PER];
#pragma unroll
    for (int k = 0; k < PER; ++k) {
      const int c = c0 + ty + k * TY;
      v[k] = (pin && c < c_hi) ? to_f(f[static_cast<int64_t>(c) * prm.fs.c]) : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < PER; ++k) {
      ss += v[k] * v[k];
#pragma unroll
      for (int n = 0; n < NMAX; ++n) acc[n] += qs[n][ty + k * TY] * v[k];
    }
    __syncthreads();
  }
#pragma unroll
  for (int n = 0; n < NMAX; ++n) red[ty][n][tx] = acc[n];
  red[ty][NMAX][tx] = ss;
  qred[tid] = qss;
  __syncthreads();
  for (int n = ty; n <= NMAX; n += TY) {
    float t = 0.f;
#pragma unroll
    for (int k = 0; k < TY; ++k) t += red[k][n][tx];
    red[0][n][tx] = t;
  }
  if (tid < NMAX) {
    float t = 0.f;
    for (int k = 0; k < TPR; ++k) t += qred[tid * TPR + k];
    sQss[tid] = t;
  }
  __syncthreads();
  if (prm.S == 1) {
    const float fn = sqrtf(red[0][NMAX][tx]);
    const float finv = 1.f / fmaxf(fn, prm.eps);
    for (int n = ty; n < N; n += TY) {
      if (!pin) break;
      const float sv = red[0][n][tx] * finv / fmaxf(sqrtf(sQss[n]), prm.eps);
      const int64_t i = (static_cast<int64_t>(n) * prm.B + b) * prm.P + p;
      prm.sim[i] = sv;
      if (prm.a_out != nullptr) prm.a_out[i] = sv;
    }
    if (ty == 0 && pin) prm.fnorm[static_cast<int64_t>(b) * prm.P + p] = fn;
    if (blockIdx.x == 0 && tid < N) prm.qnorm[tid * prm.B + b] = sqrtf(sQss[tid]);
    return;
  }
  for (int n = ty; n <= N; n += TY) {
    if (!pin) break;
    prm.part[((static_cast<int64_t>(s) * (N + 1) + n) * prm.B + b) * prm.P + p] =
        n == N ? red[0][NMAX][tx] : red[0][n][tx];
  }
  if (blockIdx.x == 0 && tid < N) prm.qpart[(static_cast<int64_t>(s) * N + tid) * prm.B + b] = sQss[tid];
}

// One thread per (b, p): sum the S channel-split partials in split order.
__global__ void __launch_bounds__(NT) finalize_kernel(SimParams prm) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * NT + threadIdx.x;
  const int64_t BP = static_cast<int64_t>(prm.B) * prm.P;
  if (i >= BP) return;
  const int b = static_cast<int>(i / prm.P), p = static_cast<int>(i % prm.P);
  const int N = prm.N, S = prm.S;
  const int64_t sstride = (N + 1) * BP;
  float ss = 0.f;
  for (int s = 0; s < S; ++s) ss += prm.part[s * sstride + N * BP + i];
  const float fn = sqrtf(ss);
  const float finv = 1.f / fmaxf(fn, prm.eps);
  prm.fnorm[i] = fn;
  for (int n = 0; n < N; ++n) {
    float d = 0.f, qq = 0.f;
    for (int s = 0; s < S; ++s) {
      d += prm.part[s * sstride + n * BP + i];
      qq += prm.qpart[(static_cast<int64_t>(s) * N + n) * prm.B + b];
    }
    const float qn = sqrtf(qq);
    const float sv = d * finv / fmaxf(qn, prm.eps);
    prm.sim[n * BP + i] = sv;
    if (prm.a_out != nullptr) prm.a_out[n * BP + i] = sv;
    if (p == 0) prm.qnorm[n * prm.B + b] = qn;
  }
}

constexpr int WMAXN = 32;

// out[n, b, r, k] = a[n, b, (AIN ? k : r)] * g[b, r, k]; block = TK elements of K x rch rows of one image.
template <typename T, int V, bool AIN>
__global__ void __launch_bounds__(NT) weight_kernel(WeightParams prm) {
  constexpr int TX = V == 1 ? 32 : 128 / (V * sizeof(T));  // threads along K: one 128-byte line per row
  constexpr int TYW = NT / TX;         // rows per step
  constexpr int TK = TX * V;           // K elements per block
  __shared__ __align__(16) float sa[AIN ? WMAXN : 1][AIN ? TK : 4];
  const int tx = threadIdx.x % TX, ty = threadIdx.x / TX;
  const int b = blockIdx.z, N = prm.N;
  const int k0 = blockIdx.x * TK, k = k0 + tx * V;
  const int r0 = blockIdx.y * prm.rch, r1 = min(r0 + prm.rch, prm.R);
  const int64_t aN = static_cast<int64_t>(prm.B) * prm.P;
  const float* a = prm.a + static_cast<int64_t>(b) * prm.P;
  if (AIN) {
    for (int e = threadIdx.x; e < N * TK; e += NT) {
      const int n = e / TK, kk = e % TK;
      sa[n][kk] = k0 + kk < prm.K ? a[n * aN + k0 + kk] : 0.f;
    }
    __syncthreads();
  }
  if (k >= prm.K) return;  // V > 1: the host checked K % V == 0, so a vector is all in or all out
  const T* g = static_cast<const T*>(prm.g) + static_cast<int64_t>(b) * prm.gb + static_cast<int64_t>(k) * prm.gk;
  T* out = static_cast<T*>(prm.out) + static_cast<int64_t>(b) * prm.ob + static_cast<int64_t>(k) * prm.ok;
#pragma unroll 2
  for (int r = r0 + ty; r < r1; r += TYW) {
    float v[V];
    VecIO<T, V>::load(g + static_cast<int64_t>(r) * prm.gr, v);
    T* o = out + static_cast<int64_t>(r) * prm.orow;
#pragma unroll 4
    for (int n = 0; n < N; ++n) {
      float w[V];
      if (AIN) {
        VecIO<T, V>::load_f32(&sa[n][tx * V], w);
      } else {
        const float an = a[n * aN + r];
#pragma unroll
        for (int j = 0; j < V; ++j) w[j] = an;
      }
#pragma unroll
      for (int j = 0; j < V; ++j) w[j] *= v[j];
      VecIO<T, V>::store(o + n * prm.on, w);
    }
  }
}

// Block shape of the weighting kernels: TX threads along K (one 128-byte line per row when vectorised), TYW
// rows per step, TK elements of K per block.
template <typename T, int V>
struct WShape {
  static constexpr int TX = V == 1 ? 32 : 128 / (V * static_cast<int>(sizeof(T)));
  static constexpr int TYW = NT / TX;
  static constexpr int TK = TX * V;
};

// Chunked order: out[n, b, r, k] = a[n, b, (AIN ? k : r)] * g[b, r, k] for ONE n per block. A unit is rch rows
// x TK elements of K of one image, units numbered in memory order (K tile fastest, then row chunk, then b).
// The 1-d grid is ordered chunk -> n -> unit: blocks [c*N*U + n*U, c*N*U + (n+1)*U) write output slice n of
// chunk c (U = chunk_units units), so blocks in flight together write one slice contiguously and re-read the
// chunk of g from L2 for each n. The last chunk holds the remaining units (no idle blocks). The product is
// the tiled kernel's (w = a; w *= v; then the same rounding to T), so outputs are bitwise identical.
template <typename T, int V, bool AIN>
__global__ void __launch_bounds__(NT) weight_chunked_kernel(WeightParams prm) {
  constexpr int TX = WShape<T, V>::TX, TYW = WShape<T, V>::TYW, TK = WShape<T, V>::TK;
  __shared__ __align__(16) float sa[AIN ? TK : 4];
  const int tx = threadIdx.x % TX, ty = threadIdx.x / TX;
  const ChunkedUnit u = chunked_unit(blockIdx.x, prm.N, prm.B, (prm.R + prm.rch - 1) / prm.rch,
                                     (prm.K + TK - 1) / TK, prm.chunk_units);
  const int n = u.n, b = u.b, kt = u.kt, rt = u.rt;
  const int k0 = kt * TK, k = k0 + tx * V;
  const int r0 = rt * prm.rch, r1 = min(r0 + prm.rch, prm.R);
  const float* a = prm.a + (static_cast<int64_t>(n) * prm.B + b) * prm.P;
  if (AIN) {
    for (int e = threadIdx.x; e < TK; e += NT) sa[e] = k0 + e < prm.K ? a[k0 + e] : 0.f;
    __syncthreads();
  }
  if (k >= prm.K) return;  // V > 1: the host checked K % V == 0, so a vector is all in or all out
  const T* g = static_cast<const T*>(prm.g) + static_cast<int64_t>(b) * prm.gb + static_cast<int64_t>(k) * prm.gk;
  T* out = static_cast<T*>(prm.out) + static_cast<int64_t>(n) * prm.on + static_cast<int64_t>(b) * prm.ob +
           static_cast<int64_t>(k) * prm.ok;
  float wa[V];
  if (AIN) VecIO<T, V>::load_f32(&sa[tx * V], wa);
#pragma unroll 4
  for (int r = r0 + ty; r < r1; r += TYW) {
    float v[V];
    VecIO<T, V>::load(g + static_cast<int64_t>(r) * prm.gr, v);
    float w[V];
    if (AIN) {
#pragma unroll
      for (int j = 0; j < V; ++j) w[j] = wa[j];
    } else {
      const float an = a[r];
#pragma unroll
      for (int j = 0; j < V; ++j) w[j] = an;
    }
#pragma unroll
    for (int j = 0; j < V; ++j) w[j] *= v[j];
    VecIO<T, V>::store(out + static_cast<int64_t>(r) * prm.orow, w);
  }
}

// Launchers as plain statements (no macros) so that hipify rewrites every kernel launch.
struct SimL {
  template <typename T, int NM>
  static void run(const SimParams& p, dim3 g, cudaStream_t s) { sim_kernel<T, NM><<<g, dim3(TPX, TY), 0, s>>>(p); }
};

template <typename T, int V>
cudaError_t weight_chunked_run(const WeightParams& p, cudaStream_t s) {
  constexpr int TK = WShape<T, V>::TK;
  const int64_t units = static_cast<int64_t>((p.K + TK - 1) / TK) * ((p.R + p.rch - 1) / p.rch) * p.B;
  const int64_t blocks = units * p.N;
  if (blocks > std::numeric_limits<int>::max()) return cudaErrorInvalidConfiguration;
  const dim3 grid(static_cast<unsigned>(blocks));
  if (p.a_inner) {
    weight_chunked_kernel<T, V, true><<<grid, NT, 0, s>>>(p);
  } else {
    weight_chunked_kernel<T, V, false><<<grid, NT, 0, s>>>(p);
  }
  return cudaGetLastError();
}

template <typename T, int V>
cudaError_t weight_run(const WeightParams& p, cudaStream_t s) {
  if (p.order == kWeightChunked) return weight_chunked_run<T, V>(p, s);
  constexpr int TK = V == 1 ? 32 : 128 / static_cast<int>(sizeof(T));
  const dim3 grid((p.K + TK - 1) / TK, (p.R + p.rch - 1) / p.rch, p.B);
  if (p.a_inner) {
    weight_kernel<T, V, true><<<grid, NT, 0, s>>>(p);
  } else {
    weight_kernel<T, V, false><<<grid, NT, 0, s>>>(p);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t weight_by_vec(const WeightParams& p, cudaStream_t s) {
  constexpr int V16 = 16 / sizeof(T), V8 = sizeof(T) == 2 ? 4 : 1;
  if (p.vec == V16) return weight_run<T, V16>(p, s);
  if (V8 > 1 && p.vec == V8) return weight_run<T, V8 == 1 ? 4 : V8>(p, s);
  return weight_run<T, 1>(p, s);
}

}  // namespace

int pixel_tile() { return TPX; }

void sim_config(int C, int P, int* S, int* c_per) {
  // about 16 blocks per image whatever B is: small maps split channels (partials + finalize)
  const int tiles = (P + TPX - 1) / TPX;
  int splits = (16 + tiles - 1) / tiles;
  const int max_splits = (C + CK - 1) / CK;
  if (splits > max_splits) splits = max_splits;
  if (splits < 1) splits = 1;
  int per = (C + splits - 1) / splits;
  per = (per + CK - 1) / CK * CK;
  *c_per = per;
  *S = (C + per - 1) / per;
}

int weight_vec_elems(DType dt) { return dt == kF32 ? 4 : 8; }

void weight_config(WeightParams* p, DType dt) {
  const int V = p->vec > 1 ? p->vec : 1;
  const int esize = dt == kF32 ? 4 : 2;
  const int TK = V == 1 ? 32 : 128 / esize, TYW = NT / (TK / V);
  if (p->order == kWeightChunked) {
    // rows per block: about block_bytes of g (a whole number of TYW-row steps, no more than the map has);
    // units per chunk: about chunk_bytes of g, at least one
    chunked_sizes(p->R, TYW, static_cast<int64_t>(TK) * esize, p->block_bytes, p->chunk_bytes, &p->rch,
                  &p->chunk_units);
    return;
  }
  const int64_t ktiles = (p->K + TK - 1) / TK;
  int iters = 4;  // rows per thread: fewer when that leaves the GPU short of blocks
  while (iters > 1 && ktiles * ((p->R + TYW * iters - 1) / (TYW * iters)) * p->B < 4096) iters /= 2;
  p->rch = TYW * iters;
}

cudaError_t launch_sim(const SimParams& p, DType dt, cudaStream_t s) {
  if (p.S < 1 || p.c_per < 1 || p.C < 1) return cudaErrorInvalidValue;
  const cudaError_t e = dispatch<SimL>(p, dt, grid_of(p.P, p.B, p.S), s);
  if (e != cudaSuccess || p.S == 1) return e;
  const int64_t bp = static_cast<int64_t>(p.B) * p.P;
  finalize_kernel<<<static_cast<unsigned>((bp + NT - 1) / NT), NT, 0, s>>>(p);
  return cudaGetLastError();
}

cudaError_t launch_weight(const WeightParams& p, DType dt, cudaStream_t s) {
  if (p.N < 1 || p.N > WMAXN || p.R < 1 || p.K < 1 || p.B < 1 || p.rch < 1) return cudaErrorInvalidValue;
  if (p.order != kWeightTiled && (p.order != kWeightChunked || p.chunk_units < 1)) return cudaErrorInvalidValue;
  switch (dt) {
    case kF32: return weight_by_vec<float>(p, s);
    case kBF16: return weight_by_vec<bf16_t>(p, s);
    case kF16: return weight_by_vec<__half>(p, s);
  }
  return cudaErrorInvalidValue;
}

}  // namespace scfs
