// Fused SCFS search, backward: bwd_a (da and dg from dout) and bwd_f (dfeats and per-tile dq partials).
// Same portability rules as the forward (search_common.cuh).
#include "search_common.cuh"

namespace scfs {
namespace {
using namespace detail;

template <typename T, int NMAX>
__global__ void __launch_bounds__(NT) bwd_a_kernel(BwdAParams prm) {
  __shared__ float sA[NMAX][TPX];
  __shared__ float red[TY][NMAX][TPX];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int b = blockIdx.y, split = blockIdx.z, N = prm.N;
  const int p = blockIdx.x * TPX + tx;
  const bool pin = p < prm.P;
  for (int n = ty; n < NMAX; n += TY)
    sA[n][tx] = (pin && n < N) ? prm.a[(static_cast<int64_t>(n) * prm.B + b) * prm.P + p] : 0.f;
  __syncthreads();
  float dacc[NMAX], an[NMAX];
#pragma unroll
  for (int n = 0; n < NMAX; ++n) {
    dacc[n] = 0.f;
    an[n] = sA[n][tx];
  }
  if (pin) {
    const T* g = static_cast<const T*>(prm.g) + b * prm.gs.b + p * prm.gs.p;
    const T* d = static_cast<const T*>(prm.dout) + b * prm.ds.b + p * prm.ds.p;
    const int64_t nstride = static_cast<int64_t>(prm.B) * prm.ds.b;
    float* dg = prm.dg + static_cast<int64_t>(b) * prm.CG * prm.P + p;
    const int c_lo = split * prm.c_per, c_hi = min(c_lo + prm.c_per, prm.CG);
#pragma unroll 2
    for (int c = c_lo + ty; c < c_hi; c += TY) {
      const float gv = to_f(g[c * prm.gs.c]);
      float acc = 0.f;
#pragma unroll
      for (int n = 0; n < NMAX; ++n) {
        if (n < N) {
          const float dv = to_f(d[n * nstride + c * prm.ds.c]);
          acc += an[n] * dv;
          dacc[n] += dv * gv;
        }
      }
      dg[static_cast<int64_t>(c) * prm.P] = acc;
    }
  }
#pragma unroll
  for (int n = 0; n < NMAX; ++n) red[ty][n][tx] = dacc[n];
  __syncthreads();
  for (int n = ty; n < N; n += TY) {
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < TY; ++k) s += red[k][n][tx];
    if (pin) prm.da[((static_cast<int64_t>(split) * N + n) * prm.B + b) * prm.P + p] = s;
  }
}

template <typename T, int NMAX>
__global__ void __launch_bounds__(NT) bwd_f_kernel(BwdFParams prm) {
  __shared__ float sDs[NMAX][TPX];
  __shared__ float sDsi[NMAX][TPX + 1];
  __shared__ float qh[NMAX][CK + 1];
  __shared__ float sF[CK][TPX + 1];
  __shared__ float sT[TPX], sInv[TPX];
  const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * TPX + tx;
  const int b = blockIdx.y, split = blockIdx.z, N = prm.N;
  const int p = blockIdx.x * TPX + tx;
  const bool pin = p < prm.P;
  for (int n = ty; n < NMAX; n += TY) {
    const int64_t i = (static_cast<int64_t>(n) * prm.B + b) * prm.P + p;
    const bool ok = pin && n < N;
    const float dsv = ok ? prm.ds[i] : 0.f;
    sDs[n][tx] = dsv;
    sDsi[n][tx] = ok ? dsv * prm.sim[i] : 0.f;  // temporarily ds * s
  }
  __syncthreads();
  if (ty == 0) {
    float t = 0.f;
    for (int n = 0; n < NMAX; ++n) t += sDsi[n][tx];
    const float fn = pin ? prm.fnorm[static_cast<int64_t>(b) * prm.P + p] : 1.f;
    const float inv = 1.f / fmaxf(fn, prm.eps);
    sT[tx] = fn <= prm.eps ? 0.f : t * inv;
    sInv[tx] = inv;
  }
  __syncthreads();
  for (int n = ty; n < NMAX; n += TY) sDsi[n][tx] = sDs[n][tx] * sInv[tx];
  const float inv = sInv[tx], tinv = sT[tx];
  const T* f = static_cast<const T*>(prm.f) + b * prm.fs.b + (pin ? p : 0) * prm.fs.p;
  T* df = static_cast<T*>(prm.df) + b * prm.dfs.b + (pin ? p : 0) * prm.dfs.p;
  const float* add = prm.add == nullptr ? nullptr : prm.add + static_cast<int64_t>(b) * prm.C * prm.P + p;
  const int c_lo = split * prm.c_per, c_hi = min(c_lo + prm.c_per, prm.C);
  for (int c0 = c_lo; c0 < c_hi; c0 += CK) {
    for (int e = tid; e < NMAX * CK; e += NT) {
      const int n = e / CK, j = e % CK, c = c0 + j;
      qh[n][j] = (n < N && c < c_hi) ? prm.qhat[(static_cast<int64_t>(n) * prm.B + b) * prm.C + c] : 0.f;
    }
    __syncthreads();
    for (int j = ty; j < CK; j += TY) {
      const int c = c0 + j;
      const bool ok = pin && c < c_hi;
      const float v = ok ? to_f(f[c * prm.fs.c]) : 0.f;
      sF[j][tx] = v;
      if (ok) {
        float dfh = 0.f;
#pragma unroll
        for (int n = 0; n < NMAX; ++n) dfh += sDs[n][tx] * qh[n][j];
        float r = (dfh - v * tinv) * inv;
        if (add != nullptr) r += add[static_cast<int64_t>(c) * prm.P];
        df[c * prm.dfs.c] = from_f<T>(r);
      }
    }
    __syncthreads();
    for (int e = tid; e < NMAX * CK; e += NT) {
      const int n = e / CK, j = e % CK;
      if (n < N && c0 + j < c_hi) {
        float s = 0.f;
#pragma unroll 8
        for (int k = 0; k < TPX; ++k) s += sDsi[n][k] * sF[j][k];
        prm.dq[((static_cast<int64_t>(blockIdx.x) * N + n) * prm.B + b) * prm.C + c0 + j] = s;
      }
    }
    __syncthreads();
  }
}

// Launchers as plain statements (no macros) so that hipify rewrites every kernel launch.
struct BwdAL {
  template <typename T, int NM>
  static void run(const BwdAParams& p, dim3 g, cudaStream_t s) { bwd_a_kernel<T, NM><<<g, dim3(TPX, TY), 0, s>>>(p); }
};
struct BwdFL {
  template <typename T, int NM>
  static void run(const BwdFParams& p, dim3 g, cudaStream_t s) { bwd_f_kernel<T, NM><<<g, dim3(TPX, TY), 0, s>>>(p); }
};

}  // namespace

cudaError_t launch_bwd_a(const BwdAParams& p, DType dt, cudaStream_t s) {
  return dispatch<BwdAL>(p, dt, grid_of(p.P, p.B, p.splits), s);
}
cudaError_t launch_bwd_f(const BwdFParams& p, DType dt, cudaStream_t s) {
  return dispatch<BwdFL>(p, dt, grid_of(p.P, p.B, p.splits), s);
}

}  // namespace scfs
