// Native CPU ops of ActFirst (see kernels/ for the torch references and the Triton versions).
#pragma once
#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

// expf that the compiler vectorizes (glibc's expf only vectorizes under -ffast-math, which we avoid because the
// kernels rely on infinities and exact comparisons): Cephes' range reduction and degree-6 polynomial, relative
// error about 2e-7 on [-87.3, 88]; 0 below -87.3 (and for -inf), inputs above 88 are clamped.
inline float fast_exp(float x) {
  const float lo = -87.3365447504019f, hi = 88.0f;
  const float xc = std::min(std::max(x, lo), hi);
  const float k = std::floor(xc * 1.44269504088896341f + 0.5f);
  float r = xc - k * 0.693359375f;
  r = r - k * -2.12194440e-4f;
  float y = 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * r * r + r + 1.0f;
  y = __builtin_bit_cast(float, __builtin_bit_cast(int32_t, y) + (static_cast<int32_t>(k) << 23));  // y * 2^k
  return x < lo ? 0.f : y;
}

// Scales a row of logits by 1 / temperature in place and returns its maximum.
inline float scale_row_max(float* row, int64_t len, float inv_temp) {
  float mx = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : mx)
  for (int64_t j = 0; j < len; ++j) {
    row[j] *= inv_temp;
    mx = std::max(mx, row[j]);
  }
  return mx;
}

// One token of the dual-clipped PPO loss (Appendix B.4, Eq. 29-31) for token weight w = m / (|B| (M_b + eps)):
// its weighted loss, its weighted d loss / d logp, and which branch it took (counted for supervised tokens only).
// Ties take the unclipped branch and keep l_clip; clip() passes gradient on its closed interval (as torch.clamp).
struct PPOToken {
  float loss, grad;
  bool clipped, dual;
};

inline PPOToken ppo_token(float logp, float logp_old, float logp_teacher, float w, float lo_clip, float hi_clip,
                          float kappa) {
  const bool sup = w > 0.f;
  const float adv = sup ? logp_teacher - logp_old : 0.f;
  const float log_ratio = logp - logp_old;
  const float ratio = fast_exp(std::min(std::max(log_ratio, -20.f), 20.f));
  const float unclipped = -adv * ratio;
  const float clipped = -adv * std::min(std::max(ratio, lo_clip), hi_clip);
  const bool take_clipped = clipped > unclipped;
  const float l_clip = take_clipped ? clipped : unclipped;
  const bool take_dual = (adv < 0.f) & (l_clip > -kappa * adv);
  const bool in_clip = (ratio >= lo_clip) & (ratio <= hi_clip);
  const bool in_range = (log_ratio >= -20.f) & (log_ratio <= 20.f);
  const bool no_grad = (take_clipped & !in_clip) | take_dual | !in_range;
  return {(take_dual ? -kappa * adv : l_clip) * w, no_grad ? 0.f : -adv * ratio * w, sup & take_clipped,
          sup & take_dual};
}

// Fused log-prob gather, forward: (logp, lse, entropy), each [N] fp32. The vocabulary is walked in tiles of
// `tile` rows of the LM head: one [N, tile] fp32 block is alive at a time, never [N, V].
std::vector<at::Tensor> logprob_gather_forward(const at::Tensor& hidden, const at::Tensor& weight,
                                               const at::Tensor& targets, double temperature, int64_t tile);

// Fused log-prob gather, backward for an upstream gradient of logp: (grad_hidden, grad_weight or undefined).
std::vector<at::Tensor> logprob_gather_backward(const at::Tensor& hidden, const at::Tensor& weight,
                                                const at::Tensor& targets, const at::Tensor& lse,
                                                const at::Tensor& grad_logp, double temperature, int64_t tile,
                                                bool need_weight_grad);

// Dual-clipped PPO token loss (Eq. 29-32) in one pass: (loss [], grad [N] fp32, clipped count [], dual count []).
// `token_weight` is m / (|B| (M_b + eps)) per token (0 where masked).
std::vector<at::Tensor> ppo_loss_forward(const at::Tensor& logp, const at::Tensor& logp_old,
                                         const at::Tensor& logp_teacher, const at::Tensor& token_weight,
                                         double clip_eps, double dual_clip);

// Op 3: the dual-clipped PPO loss straight from hidden states, rows in chunks of `chunk` ([chunk, V] logits at a
// time): (loss [], grad_hidden, grad_weight, logp [N] fp32, clipped count [], dual count []).
std::vector<at::Tensor> ppo_loss_from_hidden(const at::Tensor& hidden, const at::Tensor& weight,
                                             const at::Tensor& targets, double temperature,
                                             const at::Tensor& logp_old, const at::Tensor& logp_teacher,
                                             const at::Tensor& token_weight, double clip_eps, double dual_clip,
                                             int64_t chunk);
