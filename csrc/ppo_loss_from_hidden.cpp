// Op 3: the dual-clipped PPO loss straight from hidden states, on the CPU. Rows are processed in chunks whose
// [chunk, V] logits fit a memory budget; within a chunk the logits become log-probs, then the PPO gradient
// d L / d logp, then G = (g / tau)(onehot - p) in place, then grad_h = G W and grad_W += G^T h. Three GEMMs in all,
// as eager autograd, against four for logprob_gather's forward plus its recomputing backward.
#include <ATen/Parallel.h>

#include <cmath>
#include <limits>

#include "ops.h"

std::vector<at::Tensor> ppo_loss_from_hidden(const at::Tensor& hidden, const at::Tensor& weight,
                                             const at::Tensor& targets, double temperature,
                                             const at::Tensor& logp_old, const at::Tensor& logp_teacher,
                                             const at::Tensor& token_weight, double clip_eps, double dual_clip,
                                             int64_t chunk) {
  TORCH_CHECK(hidden.dim() == 2 && weight.dim() == 2 && hidden.size(1) == weight.size(1),
              "hidden must be [N, H] and weight [V, H]");
  const int64_t n = hidden.size(0), v = weight.size(0);
  TORCH_CHECK(targets.numel() == n && logp_old.numel() == n && logp_teacher.numel() == n &&
                  token_weight.numel() == n,
              "targets, logp_old, logp_teacher and token_weight must have N entries");
  const float inv_temp = static_cast<float>(1.0 / temperature);
  auto h = hidden.to(at::kFloat).contiguous();
  auto w = weight.to(at::kFloat).contiguous();
  auto y = targets.to(at::kLong).contiguous();
  auto old = logp_old.to(at::kFloat).contiguous();
  auto teacher = logp_teacher.to(at::kFloat).contiguous();
  auto tw = token_weight.to(at::kFloat).contiguous();
  auto grad_h = at::empty_like(h);
  auto grad_w = at::zeros_like(w);
  auto logp = at::empty({n}, h.options());
  const int64_t* yp = y.data_ptr<int64_t>();
  const float *po = old.data_ptr<float>(), *pt = teacher.data_ptr<float>(), *pw = tw.data_ptr<float>();
  float* lp = logp.data_ptr<float>();
  const float lo_clip = static_cast<float>(1.0 - clip_eps), hi_clip = static_cast<float>(1.0 + clip_eps);
  const float kappa = static_cast<float>(dual_clip);
  double loss = 0.0, n_clipped = 0.0, n_dual = 0.0;
  for (int64_t r0 = 0; r0 < n; r0 += chunk) {
    const int64_t c = std::min(chunk, n - r0);
    auto hc = h.narrow(0, r0, c);
    auto z = at::mm(hc, w.t());  // [c, V]
    float* zp = z.data_ptr<float>();
    std::vector<double> row_loss(c), row_clipped(c), row_dual(c);
    at::parallel_for(0, c, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const int64_t r = r0 + i;
        TORCH_CHECK(yp[r] >= 0 && yp[r] < v, "targets[", r, "]=", yp[r], " is outside [0, ", v, ")");
        float* row = zp + i * v;
        const float mx = scale_row_max(row, v, inv_temp);
        double sum = 0.0;
        for (int64_t c0 = 0; c0 < v; c0 += 1024) {
          const int64_t c1 = std::min(v, c0 + 1024);
          float part = 0.f;
#pragma omp simd reduction(+ : part)
          for (int64_t j = c0; j < c1; ++j) part += fast_exp(row[j] - mx);
          sum += part;
        }
        const float lse = mx + static_cast<float>(std::log(sum));
        const float logp_r = row[yp[r]] - lse;
        lp[r] = logp_r;
        const PPOToken tok = ppo_token(logp_r, po[r], pt[r], pw[r], lo_clip, hi_clip, kappa);
        row_loss[i] = tok.loss;
        row_clipped[i] = tok.clipped ? 1.0 : 0.0;
        row_dual[i] = tok.dual ? 1.0 : 0.0;
        const float g = tok.grad;
        // G = (g / tau)(onehot(y) - p), in place.
        const float gs = g * inv_temp;
#pragma omp simd
        for (int64_t j = 0; j < v; ++j) row[j] = -gs * fast_exp(row[j] - lse);
        row[yp[r]] += gs;
      }
    });
    for (int64_t i = 0; i < c; ++i) {
      loss += row_loss[i];
      n_clipped += row_clipped[i];
      n_dual += row_dual[i];
    }
    auto grad_hc = grad_h.narrow(0, r0, c);
    at::mm_out(grad_hc, z, w);
    grad_w.addmm_(z.t(), hc);
  }
  auto opts = h.options();
  return {at::scalar_tensor(loss, opts), grad_h.to(hidden.scalar_type()), grad_w.to(weight.scalar_type()), logp,
          at::scalar_tensor(n_clipped, opts), at::scalar_tensor(n_dual, opts)};
}
