// Torch binding of the fused search kernels (search_kernels.cu stays torch-free).
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>

#include "search_kernels.h"

namespace {

scfs::DType dtype_of(const torch::Tensor& t) {
  switch (t.scalar_type()) {
    case torch::kFloat: return scfs::kF32;
    case torch::kBFloat16: return scfs::kBF16;
    case torch::kHalf: return scfs::kF16;
    default: TORCH_CHECK(false, "scfs search: unsupported dtype ", t.scalar_type());
  }
}

scfs::Strides3 st(const torch::Tensor& t) {
  TORCH_CHECK(t.dim() == 3, "scfs search: expected a 3-d (B, C, P) view");
  return {t.stride(0), t.stride(1), t.stride(2)};
}

void check(cudaError_t e, const char* what) {
  TORCH_CHECK(e == cudaSuccess, "scfs search: ", what, " launch failed: ", cudaGetErrorString(e));
}

template <typename T>
T* opt_ptr(const c10::optional<torch::Tensor>& t) {
  return t.has_value() ? t->data_ptr<T>() : nullptr;
}

void fwd(const torch::Tensor& f3, const torch::Tensor& q, const torch::Tensor& g3,
         const c10::optional<torch::Tensor>& out3, const torch::Tensor& sim, const c10::optional<torch::Tensor>& a_out,
         const torch::Tensor& fnorm, const torch::Tensor& qnorm, const c10::optional<torch::Tensor>& a_in,
         double eps, int64_t splits, int64_t c_per) {
  TORCH_CHECK(q.scalar_type() == f3.scalar_type() && g3.scalar_type() == f3.scalar_type(),
              "scfs search: feats, queries and g must share a dtype");
  scfs::FwdParams p{};
  p.f = f3.data_ptr(); p.fs = st(f3);
  p.q = q.data_ptr(); p.qn = q.stride(0); p.qb = q.stride(1); p.qc = q.stride(2);
  p.g = g3.data_ptr(); p.gs = st(g3);
  p.out = out3.has_value() ? out3->data_ptr() : nullptr;
  p.os = out3.has_value() ? st(*out3) : scfs::Strides3{0, 0, 0};
  p.sim = sim.data_ptr<float>(); p.a_out = opt_ptr<float>(a_out); p.a_in = opt_ptr<float>(a_in);
  p.fnorm = fnorm.data_ptr<float>(); p.qnorm = qnorm.data_ptr<float>();
  p.N = q.size(0); p.B = q.size(1); p.C = q.size(2); p.CG = g3.size(1); p.P = f3.size(2);
  p.splits = splits; p.c_per = c_per; p.eps = static_cast<float>(eps);
  // 4-pixel vector writes: unit pixel stride, P and channel/batch strides multiples of 4, aligned bases
  const int64_t align = 4 * f3.element_size();
  auto ok = [&](const torch::Tensor& t) {
    return t.stride(2) == 1 && t.stride(1) % 4 == 0 && t.stride(0) % 4 == 0 &&
           reinterpret_cast<uintptr_t>(t.data_ptr()) % align == 0;
  };
  p.vec = out3.has_value() && p.P % 4 == 0 && ok(g3) && ok(*out3) ? 1 : 0;
  check(scfs::launch_fwd(p, dtype_of(f3), c10::cuda::getCurrentCUDAStream().stream()), "fwd");
}

void bwd_a(const torch::Tensor& dout3, const torch::Tensor& g3, const torch::Tensor& a, const torch::Tensor& da,
           const torch::Tensor& dg, int64_t splits, int64_t c_per) {
  TORCH_CHECK(dout3.scalar_type() == g3.scalar_type(), "scfs search: grad dtype must match feats dtype");
  scfs::BwdAParams p{};
  p.dout = dout3.data_ptr(); p.ds = st(dout3); p.g = g3.data_ptr(); p.gs = st(g3);
  p.a = a.data_ptr<float>(); p.da = da.data_ptr<float>(); p.dg = dg.data_ptr<float>();
  p.N = a.size(0); p.B = a.size(1); p.CG = g3.size(1); p.P = a.size(2); p.splits = splits; p.c_per = c_per;
  check(scfs::launch_bwd_a(p, dtype_of(g3), c10::cuda::getCurrentCUDAStream().stream()), "bwd_a");
}

void bwd_f(const torch::Tensor& f3, const torch::Tensor& fnorm, const torch::Tensor& qhat, const torch::Tensor& ds,
           const torch::Tensor& sim, const c10::optional<torch::Tensor>& add, const torch::Tensor& df3,
           const torch::Tensor& dq, double eps, int64_t splits, int64_t c_per) {
  scfs::BwdFParams p{};
  p.f = f3.data_ptr(); p.fs = st(f3); p.fnorm = fnorm.data_ptr<float>(); p.qhat = qhat.data_ptr<float>();
  p.ds = ds.data_ptr<float>(); p.sim = sim.data_ptr<float>(); p.add = opt_ptr<float>(add);
  p.df = df3.data_ptr(); p.dfs = st(df3); p.dq = dq.data_ptr<float>();
  p.N = qhat.size(0); p.B = qhat.size(1); p.C = qhat.size(2); p.P = f3.size(2);
  p.splits = splits; p.c_per = c_per; p.eps = static_cast<float>(eps);
  check(scfs::launch_bwd_f(p, dtype_of(f3), c10::cuda::getCurrentCUDAStream().stream()), "bwd_f");
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("fwd", &fwd, "fused normalise + similarity + weighting");
  m.def("bwd_a", &bwd_a, "da and dg");
  m.def("bwd_f", &bwd_f, "df and per-tile dq partials");
  m.def("pixel_tile", &scfs::pixel_tile, "pixels per block");
}
