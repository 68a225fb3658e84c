// Device helpers shared by the fused search kernels: dtype conversion (bf16 as raw bits, so the hipified
// source needs no bf16 header), 16-byte vector loads/stores, and the dtype / query-count dispatch.
// Portable: no warp-size assumption, no warp shuffles, no inline PTX.
#pragma once
#include "search_kernels.h"

#include <cuda_fp16.h>

namespace scfs {
namespace detail {

constexpr int TPX = 32;  // pixels per block (similarity and backward kernels)
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

template <int BYTES> struct RawVec;
template <> struct RawVec<16> { using type = uint4; };
template <> struct RawVec<8> { using type = uint2; };

// V consecutive elements as one access: V * sizeof(T) == 16 or 8 bytes (V a multiple of 4), or V == 1.
template <typename T, int V>
struct VecIO {
  using raw_t = typename RawVec<V * sizeof(T)>::type;
  static_assert(V % 4 == 0, "vector access covers a multiple of 4 elements");
  __device__ __forceinline__ static void load(const T* ptr, float (&v)[V]) {
    const raw_t raw = *reinterpret_cast<const raw_t*>(ptr);
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int k = 0; k < V; ++k) v[k] = to_f(e[k]);
  }
  __device__ __forceinline__ static void store(T* ptr, const float (&v)[V]) {
    raw_t raw;
    T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
    for (int k = 0; k < V; ++k) e[k] = from_f<T>(v[k]);
    *reinterpret_cast<raw_t*>(ptr) = raw;
  }
  // V floats from 16-byte aligned shared or global memory
  __device__ __forceinline__ static void load_f32(const float* ptr, float (&v)[V]) {
#pragma unroll
    for (int k = 0; k < V; k += 4) {
      const float4 x = *reinterpret_cast<const float4*>(ptr + k);
      v[k] = x.x;
      v[k + 1] = x.y;
      v[k + 2] = x.z;
      v[k + 3] = x.w;
    }
  }
};

template <typename T>
struct VecIO<T, 1> {
  __device__ __forceinline__ static void load(const T* ptr, float (&v)[1]) { v[0] = to_f(*ptr); }
  __device__ __forceinline__ static void store(T* ptr, const float (&v)[1]) { *ptr = from_f<T>(v[0]); }
  __device__ __forceinline__ static void load_f32(const float* ptr, float (&v)[1]) { v[0] = *ptr; }
};

// Query-count dispatch: kernels templated on NMAX in {8, 16, 32}; L::run<T, NMAX>(params, grid, stream).
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

inline dim3 grid_of(int P, int B, int splits) { return dim3((P + TPX - 1) / TPX, B, splits); }

}  // namespace detail
}  // namespace scfs
