// Fused SCFS search kernels. One block = one image b, TPX consecutive pixels, TY channel groups.
// Portable: no warp-size assumption, no warp shuffles, no inline PTX; bf16 handled as raw bits so the
// hipified source needs no bf16 header. Reductions over channels go through shared memory.
#include "search_kernels.h"

#include <cuda_fp16.h>

namespace scfs {
namespace {

constexpr int TPX = 32;  // pixels per block
constexpr int TY = 8;    // channel groups per block
constexpr int CK = 64;   // channels of queries staged in shared memory per step
constexpr int NT = TPX * TY;

struct bf16_t {
  uint16_t x;
};

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f(bf16_t v) { return __uint_as_float(static_cast<uint32_t>(v.x) << 16); }

template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ bf16_t from_f<bf16_t>(float v) {
  uint32_t u = __float_as_uint(v);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16_t{static_cast<uint16_t>((u >> 16) | 0x40u)};  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return bf16_t{static_cast<uint16_t>(u >> 16)};
}

// 4 consecutive elements as one access: float4 (16 B) for fp32, 8 B for the 2-byte types.
template <typename T> struct Vec4 { using type = uint2; };
template <> struct Vec4<float> { using type = float4; };

template <typename T>
__device__ __forceinline__ void load4(const T* ptr, float (&v)[4]) {
  const typename Vec4<T>::type raw = *reinterpret_cast<const typename Vec4<T>::type*>(ptr);
  const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int k = 0; k < 4; ++k) v[k] = to_f(e[k]);
}

template <typename T>
__device__ __forceinline__ void store4(T* ptr, const float (&v)[4]) {
  typename Vec4<T>::type raw;
  T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
  for (int k = 0; k < 4; ++k) e[k] = from_f<T>(v[k]);
  *reinterpret_cast<typename Vec4<T>::type*>(ptr) = raw;
}

template <typename T, int NMAX>
__global__ void __launch_bounds__(NT) fwd_kernel(FwdParams prm) {
  __shared__ float qs[NMAX][CK + 1];
  __shared__ float red[TY][NMAX + 1][TPX];
  __shared__ float qred[NT];
  __shared__ __align__(16) float sA[NMAX][TPX];
  __shared__ float sQn[NMAX];
  const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * TPX + tx;
  const int b = blockIdx.y, split = blockIdx.z, N = prm.N;
  const int p = blockIdx.x * TPX + tx;
  const bool pin = p < prm.P;
  const T* f = static_cast<const T*>(prm.f) + b * prm.fs.b + (pin ? p : 0) * prm.fs.p;

  if (prm.a_in == nullptr) {
    float acc[NMAX];
#pragma unroll
    for (int n = 0; n < NMAX; ++n) acc[n] = 0.f;
    float ss = 0.f, qss = 0.f;
    constexpr int TPR = NT / NMAX;  // threads staging one query row
    const int qrow = tid / TPR, qlane = tid % TPR;
    const T* q = static_cast<const T*>(prm.q) + b * prm.qb + qrow * prm.qn;
    for (int c0 = 0; c0 < prm.C; c0 += CK) {
      for (int j = qlane; j < CK; j += TPR) {
        const int c = c0 + j;
        const float v = (qrow < N && c < prm.C) ? to_f(q[c * prm.qc]) : 0.f;
        qs[qrow][j] = v;
        qss += v * v;
      }
      __syncthreads();
      const int jend = min(CK, prm.C - c0);
#pragma unroll 4
      for (int j = ty; j < jend; j += TY) {
        const float v = pin ? to_f(f[(c0 + j) * prm.fs.c]) : 0.f;
        ss += v * v;
#pragma unroll
        for (int n = 0; n < NMAX; ++n) acc[n] += qs[n][j] * v;
      }
      __syncthreads();
    }
#pragma unroll
    for (int n = 0; n < NMAX; ++n) red[ty][n][tx] = acc[n];
    red[ty][NMAX][tx] = ss;
    qred[tid] = qss;
    __syncthreads();
    for (int n = ty; n <= NMAX; n += TY) {
      float s = 0.f;
#pragma unroll
      for (int k = 0; k < TY; ++k) s += red[k][n][tx];
      red[0][n][tx] = s;
    }
    if (tid < NMAX) {
      float s = 0.f;
      for (int k = 0; k < TPR; ++k) s += qred[tid * TPR + k];
      sQn[tid] = sqrtf(s);
    }
    __syncthreads();
    const float fn = sqrtf(red[0][NMAX][tx]);
    const float finv = 1.f / fmaxf(fn, prm.eps);
    const bool first = split == 0;
    for (int n = ty; n < NMAX; n += TY) {
      const float s = red[0][n][tx] * finv / fmaxf(sQn[n], prm.eps);
      sA[n][tx] = s;
      if (first && pin && n < N) {
        const int64_t i = (static_cast<int64_t>(n) * prm.B + b) * prm.P + p;
        prm.sim[i] = s;
        if (prm.a_out != nullptr) prm.a_out[i] = s;
      }
    }
    if (first && ty == 0 && pin) prm.fnorm[static_cast<int64_t>(b) * prm.P + p] = fn;
    if (first && blockIdx.x == 0 && tid < N) prm.qnorm[tid * prm.B + b] = sQn[tid];
    __syncthreads();
  } else {
    for (int n = ty; n < NMAX; n += TY)
      sA[n][tx] = (pin && n < N) ? prm.a_in[(static_cast<int64_t>(n) * prm.B + b) * prm.P + p] : 0.f;
    __syncthreads();
  }

  if (prm.out == nullptr) return;
  const int c_lo = split * prm.c_per, c_hi = min(c_lo + prm.c_per, prm.CG);
  if (prm.vec) {
    // Write phase with 4 consecutive pixels per thread (host checked: P % 4 == 0, unit pixel stride, aligned).
    constexpr int PV = 4, GX = TPX / PV, GY = NT / GX;
    const int gx = tid % GX, gy = tid / GX;
    const int p0 = blockIdx.x * TPX + gx * PV;
    if (p0 >= prm.P) return;
    const T* g = static_cast<const T*>(prm.g) + b * prm.gs.b + p0;
    T* out = static_cast<T*>(prm.out) + b * prm.os.b + p0;
    const int64_t nstride = static_cast<int64_t>(prm.B) * prm.os.b;
#pragma unroll 2
    for (int c = c_lo + gy; c < c_hi; c += GY) {
      float v[PV];
      load4(g + c * prm.gs.c, v);
      T* o = out + c * prm.os.c;
#pragma unroll
      for (int n = 0; n < NMAX; ++n) {
        if (n < N) {
          const float4 an = *reinterpret_cast<const float4*>(&sA[n][gx * PV]);
          const float r[PV] = {an.x * v[0], an.y * v[1], an.z * v[2], an.w * v[3]};
          store4(o + n * nstride, r);
        }
      }
    }
    return;
  }
  if (!pin) return;
  float an[NMAX];
#pragma unroll
  for (int n = 0; n < NMAX; ++n) an[n] = sA[n][tx];
  const T* g = static_cast<const T*>(prm.g) + b * prm.gs.b + p * prm.gs.p;
  T* out = static_cast<T*>(prm.out) + b * prm.os.b + p * prm.os.p;
  const int64_t nstride = static_cast<int64_t>(prm.B) * prm.os.b;
#pragma unroll 2
  for (int c = c_lo + ty; c < c_hi; c += TY) {
    const float v = to_f(g[c * prm.gs.c]);
    T* o = out + c * prm.os.c;
#pragma unroll
    for (int n = 0; n < NMAX; ++n)
      if (n < N) o[n * nstride] = from_f<T>(an[n] * v);
  }
}

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
struct FwdL {
  template <typename T, int NM>
  static void run(const FwdParams& p, dim3 g, cudaStream_t s) { fwd_kernel<T, NM><<<g, dim3(TPX, TY), 0, s>>>(p); }
};
struct BwdAL {
  template <typename T, int NM>
  static void run(const BwdAParams& p, dim3 g, cudaStream_t s) { bwd_a_kernel<T, NM><<<g, dim3(TPX, TY), 0, s>>>(p); }
};
struct BwdFL {
  template <typename T, int NM>
  static void run(const BwdFParams& p, dim3 g, cudaStream_t s) { bwd_f_kernel<T, NM><<<g, dim3(TPX, TY), 0, s>>>(p); }
};

template <typename L, typename T, typename P>
cudaError_t by_n(const P& p, dim3 g, cudaStream_t s) {
  if (p.N <= 8) {
    L::template run<T, 8>(p, g, s);
  } else if (p.N <= 16) {
    L::template run<T, 16>(p, g, s);
  } else {
    L::template run<T, 32>(p, g, s);
  }
  return cudaGetLastError();
}

template <typename L, typename P>
cudaError_t dispatch(const P& p, DType dt, dim3 g, cudaStream_t s) {
  if (p.N < 1 || p.N > 32 || p.P < 1 || p.B < 1) return cudaErrorInvalidValue;
  switch (dt) {
    case kF32: return by_n<L, float>(p, g, s);
    case kBF16: return by_n<L, bf16_t>(p, g, s);
    case kF16: return by_n<L, __half>(p, g, s);
  }
  return cudaErrorInvalidValue;
}

dim3 grid_of(int P, int B, int splits) { return dim3((P + TPX - 1) / TPX, B, splits); }

}  // namespace

int pixel_tile() { return TPX; }

cudaError_t launch_fwd(const FwdParams& p, DType dt, cudaStream_t s) {
  return dispatch<FwdL>(p, dt, grid_of(p.P, p.B, p.splits), s);
}
cudaError_t launch_bwd_a(const BwdAParams& p, DType dt, cudaStream_t s) {
  return dispatch<BwdAL>(p, dt, grid_of(p.P, p.B, p.splits), s);
}
cudaError_t launch_bwd_f(const BwdFParams& p, DType dt, cudaStream_t s) {
  return dispatch<BwdFL>(p, dt, grid_of(p.P, p.B, p.splits), s);
}

}  // namespace scfs
