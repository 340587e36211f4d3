// Dual-clipped PPO token loss on the CPU (Appendix B.4, Eq. 29-32): one OpenMP-parallel, SIMD pass for the loss,
// d loss / d logp and the clip counts (ppo_token in ops.h; the same branch rules as kernels/ppo_loss.py).
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>

#include "ops.h"

std::vector<at::Tensor> ppo_loss_forward(const at::Tensor& logp, const at::Tensor& logp_old,
                                         const at::Tensor& logp_teacher, const at::Tensor& token_weight,
                                         double clip_eps, double dual_clip) {
  const int64_t n = logp.numel();
  TORCH_CHECK(logp_old.numel() == n && logp_teacher.numel() == n && token_weight.numel() == n,
              "logp, logp_old, logp_teacher and token_weight must have the same length");
  auto lp = logp.to(at::kFloat).contiguous(), lo = logp_old.to(at::kFloat).contiguous();
  auto lt = logp_teacher.to(at::kFloat).contiguous(), w = token_weight.to(at::kFloat).contiguous();
  auto grad = at::empty({n}, lp.options());
  const float *p = lp.data_ptr<float>(), *po = lo.data_ptr<float>(), *pt = lt.data_ptr<float>();
  const float* pw = w.data_ptr<float>();
  float* pg = grad.data_ptr<float>();
  const float lo_clip = static_cast<float>(1.0 - clip_eps), hi_clip = static_cast<float>(1.0 + clip_eps);
  const float kappa = static_cast<float>(dual_clip);
  // Blocks of kBlock tokens: a branch-free inner loop (gcc does not vectorize it yet) with float partial sums
  // (exact for the counts), accumulated in double across blocks and threads.
  constexpr int64_t kBlock = 2048;
  const int64_t num_blocks = (n + kBlock - 1) / kBlock;
  double loss = 0.0, n_clipped = 0.0, n_dual = 0.0;
#pragma omp parallel for reduction(+ : loss, n_clipped, n_dual) schedule(static)
  for (int64_t b = 0; b < num_blocks; ++b) {
    const int64_t begin = b * kBlock, end = std::min(n, begin + kBlock);
    float block_loss = 0.f, block_clipped = 0.f, block_dual = 0.f;
#pragma omp simd reduction(+ : block_loss, block_clipped, block_dual)
    for (int64_t j = begin; j < end; ++j) {
      const PPOToken tok = ppo_token(p[j], po[j], pt[j], pw[j], lo_clip, hi_clip, kappa);
      pg[j] = tok.grad;
      block_loss += tok.loss;
      block_clipped += tok.clipped ? 1.f : 0.f;
      block_dual += tok.dual ? 1.f : 0.f;
    }
    loss += block_loss;
    n_clipped += block_clipped;
    n_dual += block_dual;
  }
  auto opts = lp.options();
  return {at::scalar_tensor(loss, opts), grad, at::scalar_tensor(n_clipped, opts), at::scalar_tensor(n_dual, opts)};
}
