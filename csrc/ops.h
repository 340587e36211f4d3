// Native CPU ops of ActFirst (see kernels/ for the torch references and the Triton versions).
#pragma once
#include <torch/extension.h>

#include <vector>

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
