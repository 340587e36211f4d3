#include "ops.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "ActFirst native CPU ops";
  m.def("logprob_gather_forward", &logprob_gather_forward, "fused log-prob gather, forward (CPU)");
  m.def("logprob_gather_backward", &logprob_gather_backward, "fused log-prob gather, backward (CPU)");
  m.def("ppo_loss_forward", &ppo_loss_forward, "dual-clipped PPO token loss and gradient (CPU)");
  m.def("ppo_loss_from_hidden", &ppo_loss_from_hidden, "PPO loss and gradients straight from hidden states (CPU)");
}
