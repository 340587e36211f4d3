// Fused log-prob gather on the CPU: tiled over the vocabulary, BLAS for the tile GEMM, OpenMP-parallel and
// SIMD row updates (online log-sum-exp, entropy, target logit). Same algorithm as kernels/logprob_gather.py.
#include <ATen/Parallel.h>

#include <cmath>
#include <limits>

#include "ops.h"

namespace {

void check_inputs(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets) {
  TORCH_CHECK(hidden.device().is_cpu() && weight.device().is_cpu(), "native logprob_gather runs on the CPU");
  TORCH_CHECK(hidden.dim() == 2 && weight.dim() == 2, "hidden must be [N, H] and weight [V, H]");
  TORCH_CHECK(hidden.size(1) == weight.size(1), "hidden.size(1)=", hidden.size(1), " != weight.size(1)=",
              weight.size(1));
  TORCH_CHECK(targets.dim() == 1 && targets.size(0) == hidden.size(0), "targets must be [N]");
  TORCH_CHECK(targets.scalar_type() == at::kLong, "targets must be int64");
}

}  // namespace

std::vector<at::Tensor> logprob_gather_forward(const at::Tensor& hidden, const at::Tensor& weight,
                                               const at::Tensor& targets, double temperature, int64_t tile) {
  check_inputs(hidden, weight, targets);
  const int64_t n = hidden.size(0), v = weight.size(0);
  const float inv_temp = static_cast<float>(1.0 / temperature);
  auto opts = hidden.options().dtype(at::kFloat);
  auto logp = at::empty({n}, opts), lse = at::empty({n}, opts), ent = at::empty({n}, opts);
  if (n == 0) return {logp, lse, ent};
  auto h = hidden.to(at::kFloat).contiguous();
  auto y = targets.contiguous();
  const int64_t* yp = y.data_ptr<int64_t>();
  // Sums in double: the entropy lse - t / s cancels, and V = 151,936 fp32 terms lose about 1e-3 of it.
  std::vector<float> m(n, -std::numeric_limits<float>::infinity()), zy(n, 0.f);
  std::vector<double> s(n, 0.0), t(n, 0.0);
  for (int64_t v0 = 0; v0 < v; v0 += tile) {
    const int64_t vt = std::min(tile, v - v0);
    auto z = at::mm(h, weight.narrow(0, v0, vt).to(at::kFloat).t());  // [N, vt], multi-threaded BLAS
    float* zp = z.data_ptr<float>();
    at::parallel_for(0, n, 8, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        float* row = zp + r * vt;
        const float mx = scale_row_max(row, vt, inv_temp);
        const float m_new = std::max(m[r], mx);
        // Float partial sums over chunks (vectorized), double across chunks: the entropy lse - t / s cancels.
        double se = 0.0, te = 0.0;
        for (int64_t c0 = 0; c0 < vt; c0 += 1024) {
          const int64_t c1 = std::min(vt, c0 + 1024);
          float cs = 0.f, ct = 0.f;
#pragma omp simd reduction(+ : cs, ct)
          for (int64_t j = c0; j < c1; ++j) {
            const float e = fast_exp(row[j] - m_new);
            cs += e;
            ct += e * row[j];
          }
          se += cs;
          te += ct;
        }
        const double scale = std::exp(static_cast<double>(m[r] - m_new));  // 0 on the first tile (m = -inf)
        s[r] = s[r] * scale + se;
        t[r] = t[r] * scale + te;
        m[r] = m_new;
        const int64_t target = yp[r] - v0;
        if (target >= 0 && target < vt) zy[r] = row[target];
      }
    });
  }
  float* lp = logp.data_ptr<float>();
  float* lsep = lse.data_ptr<float>();
  float* ep = ent.data_ptr<float>();
  for (int64_t r = 0; r < n; ++r) {
    TORCH_CHECK(yp[r] >= 0 && yp[r] < v, "targets[", r, "]=", yp[r], " is outside [0, ", v, ")");
    lsep[r] = m[r] + static_cast<float>(std::log(s[r]));
    lp[r] = zy[r] - lsep[r];
    ep[r] = static_cast<float>(lsep[r] - t[r] / s[r]);
  }
  return {logp, lse, ent};
}

std::vector<at::Tensor> logprob_gather_backward(const at::Tensor& hidden, const at::Tensor& weight,
                                                const at::Tensor& targets, const at::Tensor& lse,
                                                const at::Tensor& grad_logp, double temperature, int64_t tile,
                                                bool need_weight_grad) {
  check_inputs(hidden, weight, targets);
  const int64_t n = hidden.size(0), v = weight.size(0);
  const float inv_temp = static_cast<float>(1.0 / temperature);
  auto h = hidden.to(at::kFloat).contiguous();
  auto grad_h = at::zeros(h.sizes(), h.options());
  at::Tensor grad_w;  // every row is written by the tile loop below (zeros when there are no tokens)
  if (need_weight_grad) grad_w = n > 0 ? at::empty(weight.sizes(), h.options()) : at::zeros(weight.sizes(), h.options());
  auto y = targets.contiguous();
  auto l = lse.to(at::kFloat).contiguous();
  auto g = grad_logp.to(at::kFloat).contiguous();
  const int64_t* yp = y.data_ptr<int64_t>();
  const float* lp = l.data_ptr<float>();
  const float* gp = g.data_ptr<float>();
  for (int64_t v0 = 0; v0 < v && n > 0; v0 += tile) {
    const int64_t vt = std::min(tile, v - v0);
    auto wt = weight.narrow(0, v0, vt).to(at::kFloat).contiguous();  // [vt, H]
    auto z = at::mm(h, wt.t());
    float* zp = z.data_ptr<float>();
    // z -> G = (g / tau) (onehot(y) - p), in place.
    at::parallel_for(0, n, 8, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        float* row = zp + r * vt;
        const float gs = gp[r] * inv_temp, lse_r = lp[r];
#pragma omp simd
        for (int64_t j = 0; j < vt; ++j) row[j] = -gs * fast_exp(row[j] * inv_temp - lse_r);
        const int64_t target = yp[r] - v0;
        if (target >= 0 && target < vt) row[target] += gs;
      }
    });
    grad_h.addmm_(z, wt);
    if (need_weight_grad) {
      auto grad_w_tile = grad_w.narrow(0, v0, vt);  // rows of a contiguous tensor: written in place, no temporary
      at::mm_out(grad_w_tile, z.t(), h);
    }
  }
  return {grad_h.to(hidden.scalar_type()),
          need_weight_grad ? grad_w.to(weight.scalar_type()) : at::Tensor()};
}
