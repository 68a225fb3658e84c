// Torch binding of the fused search kernels (the .cu files stay torch-free). Host work per call is kept to
// pointer/stride reads, one config computation and the launches: no syncs, no device queries.
#include <torch/extension.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <limits>
#include <tuple>

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

cudaStream_t stream() { return c10::cuda::getCurrentCUDAStream().stream(); }

// Block order of the weighting pass, process-wide (set from Python: scfs.search.cuda_backend.set_weighting).
struct WeightingConfig {
  int order = scfs::kWeightTiled;
  int64_t chunk_bytes = int64_t{4} << 20;
  int64_t block_bytes = int64_t{8} << 10;
};
WeightingConfig g_weighting;

void set_weighting(int64_t order, int64_t chunk_bytes, int64_t block_bytes) {
  TORCH_CHECK(order == scfs::kWeightTiled || order == scfs::kWeightChunked,
              "scfs search: weighting order must be 0 (tiled) or 1 (chunked), got ", order);
  TORCH_CHECK(chunk_bytes >= 1 && block_bytes >= 1, "scfs search: chunk and block bytes must be >= 1");
  g_weighting.order = static_cast<int>(order);
  g_weighting.chunk_bytes = chunk_bytes;
  g_weighting.block_bytes = block_bytes;
}

std::tuple<int64_t, int64_t, int64_t> get_weighting() {
  return {g_weighting.order, g_weighting.chunk_bytes, g_weighting.block_bytes};
}

void run_sim(const torch::Tensor& f3, const torch::Tensor& q, const torch::Tensor& sim, float* a_out,
             const torch::Tensor& fnorm, const torch::Tensor& qnorm, double eps) {
  TORCH_CHECK(q.scalar_type() == f3.scalar_type(), "scfs search: feats and queries must share a dtype");
  scfs::SimParams p{};
  p.f = f3.data_ptr(); p.fs = st(f3);
  p.q = q.data_ptr(); p.qn = q.stride(0); p.qb = q.stride(1); p.qc = q.stride(2);
  p.sim = sim.data_ptr<float>(); p.a_out = a_out;
  p.fnorm = fnorm.data_ptr<float>(); p.qnorm = qnorm.data_ptr<float>();
  p.N = q.size(0); p.B = q.size(1); p.C = q.size(2); p.P = f3.size(2); p.eps = static_cast<float>(eps);
  scfs::sim_config(p.C, p.P, &p.S, &p.c_per);
  torch::Tensor part, qpart;  // scratch of the channel-split path, freed (stream-ordered) on return
  if (p.S > 1) {
    const auto fo = f3.options().dtype(torch::kFloat);
    part = torch::empty({p.S, p.N + 1, p.B, p.P}, fo);
    qpart = torch::empty({p.S, p.N, p.B}, fo);
    p.part = part.data_ptr<float>(); p.qpart = qpart.data_ptr<float>();
  }
  check(scfs::launch_sim(p, dtype_of(f3), stream()), "similarity");
}

// out3 (N*B, CG, P) = a (N, B, P) * g3 (B, CG, P); picks the (B, R, K) orientation from the strides.
void run_weight(const torch::Tensor& g3, const torch::Tensor& out3, const torch::Tensor& a) {
  TORCH_CHECK(out3.scalar_type() == g3.scalar_type(), "scfs search: output and map dtypes differ");
  TORCH_CHECK(a.is_contiguous() && a.scalar_type() == torch::kFloat, "scfs search: weights must be contiguous fp32");
  scfs::WeightParams p{};
  const int B = g3.size(0), CG = g3.size(1), P = g3.size(2);
  p.N = a.size(0); p.B = B; p.P = P;
  p.g = g3.data_ptr(); p.out = out3.data_ptr(); p.a = a.data_ptr<float>();
  p.gb = g3.stride(0); p.ob = out3.stride(0); p.on = static_cast<int64_t>(B) * out3.stride(0);
  // channels along the fast axis (channels_last, or 1x1 maps) when both maps have unit channel stride
  const bool cl = g3.stride(1) == 1 && out3.stride(1) == 1 && (P == 1 || g3.stride(2) != 1);
  if (cl) {
    p.R = P; p.K = CG; p.gr = g3.stride(2); p.gk = 1; p.orow = out3.stride(2); p.ok = 1; p.a_inner = 0;
  } else {
    p.R = CG; p.K = P; p.gr = g3.stride(1); p.gk = g3.stride(2); p.orow = out3.stride(1); p.ok = out3.stride(2);
    p.a_inner = 1;
  }
  const scfs::DType dt = dtype_of(g3);
  auto fits = [&](int64_t V) {
    auto al = [&](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % (V * g3.element_size()) == 0; };
    return p.gk == 1 && p.ok == 1 && p.K % V == 0 && (p.R == 1 || (p.gr % V == 0 && p.orow % V == 0)) &&
           p.gb % V == 0 && p.ob % V == 0 && al(p.g) && al(p.out);
  };
  const int64_t V16 = scfs::weight_vec_elems(dt);
  p.vec = fits(V16) ? V16 : (V16 == 8 && fits(4) ? 4 : 1);
  p.order = g_weighting.order;
  p.chunk_bytes = g_weighting.chunk_bytes;
  p.block_bytes = g_weighting.block_bytes;
  scfs::weight_config(&p, dt);
  check(scfs::launch_weight(p, dt, stream()), "weighting");
}

// Generic forward (all modes): similarity (when a_in is absent) and/or weighting (when out3 is given).
void fwd(const torch::Tensor& f3, const torch::Tensor& q, const torch::Tensor& g3,
         const c10::optional<torch::Tensor>& out3, const torch::Tensor& sim, const c10::optional<torch::Tensor>& a_out,
         const torch::Tensor& fnorm, const torch::Tensor& qnorm, const c10::optional<torch::Tensor>& a_in,
         double eps) {
  const c10::cuda::CUDAGuard guard(f3.device());
  if (!a_in.has_value()) run_sim(f3, q, sim, opt_ptr<float>(a_out), fnorm, qnorm, eps);
  if (out3.has_value()) run_weight(g3, *out3, a_in.has_value() ? *a_in : sim);
}

// Soft mode in one call, outputs allocated here: (out (N*B, CG, H, W) in feats' memory format, sim, a, fnorm,
// qnorm). poison fills the outputs with NaN first (check harness: proves every element is written).
std::vector<torch::Tensor> fwd_soft(const torch::Tensor& f3, const torch::Tensor& q_in, const torch::Tensor& g3,
                                    int64_t h, int64_t w, bool channels_last, bool poison, double eps) {
  const c10::cuda::CUDAGuard guard(f3.device());
  const torch::Tensor q = q_in.scalar_type() == f3.scalar_type() ? q_in : q_in.to(f3.scalar_type());
  const int64_t N = q.size(0), B = q.size(1), P = f3.size(2), CG = g3.size(1);
  const auto fo = f3.options().dtype(torch::kFloat);
  const auto fmt = channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
  torch::Tensor out = torch::empty({N * B, CG, h, w}, f3.options().memory_format(fmt));
  torch::Tensor stats = torch::empty({2 * N * B * P + B * P + N * B}, fo);  // one allocation for the fp32 outputs
  torch::Tensor sim = stats.narrow(0, 0, N * B * P).view({N, B, P});
  torch::Tensor a = stats.narrow(0, N * B * P, N * B * P).view({N, B, P});
  torch::Tensor fnorm = stats.narrow(0, 2 * N * B * P, B * P).view({B, P});
  torch::Tensor qnorm = stats.narrow(0, 2 * N * B * P + B * P, N * B).view({N, B});
  if (poison) {
    out.fill_(std::numeric_limits<float>::quiet_NaN());
    stats.fill_(std::numeric_limits<float>::quiet_NaN());
  }
  run_sim(f3, q, sim, a.data_ptr<float>(), fnorm, qnorm, eps);
  run_weight(g3, out.flatten(2), sim);
  return {out, sim, a, fnorm, qnorm};
}

void bwd_a(const torch::Tensor& dout3, const torch::Tensor& g3, const torch::Tensor& a, const torch::Tensor& da,
           const torch::Tensor& dg, int64_t splits, int64_t c_per) {
  TORCH_CHECK(dout3.scalar_type() == g3.scalar_type(), "scfs search: grad dtype must match feats dtype");
  const c10::cuda::CUDAGuard guard(g3.device());
  scfs::BwdAParams p{};
  p.dout = dout3.data_ptr(); p.ds = st(dout3); p.g = g3.data_ptr(); p.gs = st(g3);
  p.a = a.data_ptr<float>(); p.da = da.data_ptr<float>(); p.dg = dg.data_ptr<float>();
  p.N = a.size(0); p.B = a.size(1); p.CG = g3.size(1); p.P = a.size(2); p.splits = splits; p.c_per = c_per;
  check(scfs::launch_bwd_a(p, dtype_of(g3), stream()), "bwd_a");
}

void bwd_f(const torch::Tensor& f3, const torch::Tensor& fnorm, const torch::Tensor& qhat, const torch::Tensor& ds,
           const torch::Tensor& sim, const c10::optional<torch::Tensor>& add, const torch::Tensor& df3,
           const torch::Tensor& dq, double eps, int64_t splits, int64_t c_per) {
  const c10::cuda::CUDAGuard guard(f3.device());
  scfs::BwdFParams p{};
  p.f = f3.data_ptr(); p.fs = st(f3); p.fnorm = fnorm.data_ptr<float>(); p.qhat = qhat.data_ptr<float>();
  p.ds = ds.data_ptr<float>(); p.sim = sim.data_ptr<float>(); p.add = opt_ptr<float>(add);
  p.df = df3.data_ptr(); p.dfs = st(df3); p.dq = dq.data_ptr<float>();
  p.N = qhat.size(0); p.B = qhat.size(1); p.C = qhat.size(2); p.P = f3.size(2);
  p.splits = splits; p.c_per = c_per; p.eps = static_cast<float>(eps);
  check(scfs::launch_bwd_f(p, dtype_of(f3), stream()), "bwd_f");
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("fwd", &fwd, "similarity (+ norms) and/or weighting, caller-allocated outputs");
  m.def("fwd_soft", &fwd_soft, "soft-mode forward, outputs allocated in C++");
  m.def("bwd_a", &bwd_a, "da and dg");
  m.def("bwd_f", &bwd_f, "df and per-tile dq partials");
  m.def("pixel_tile", &scfs::pixel_tile, "pixels per block");
  m.def("set_weighting", &set_weighting, "weighting-pass block order (0 tiled, 1 chunked), chunk and block bytes");
  m.def("get_weighting", &get_weighting, "(order, chunk bytes, block bytes) of the weighting pass");
}
