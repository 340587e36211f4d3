"""Op 3, the PPO loss straight from hidden states, against the composed float64 reference: every backend and CUDA
path, gradients formed in the forward pass and accumulated over micro-batches, no gradient work without grad (random
inputs from the printed seed; ACTFIRST_TEST_SEED replays it)."""

import pytest
import torch

from actfirst.kernels import lm_head
from actfirst.kernels.dispatch import last_path, native_ops, ppo_loss_from_hidden
from actfirst.kernels.ppo_loss_from_hidden import ppo_loss_from_hidden_reference

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BACKENDS = [("torch", None)] + ([("native", None)] if native_ops() is not None else []) + [
    ("triton", "fused"), ("triton", "chunked")]
CLIP, KAPPA, TEMP = 0.2, 3.0, 0.7


def make(gen, n, h, v, num_samples, dtype):
    """Hidden states, LM head, targets and a batch whose old and teacher log-probs lie near the model's."""
    hidden = torch.randn(n, h, generator=gen, dtype=torch.float64)
    weight = torch.randn(v, h, generator=gen, dtype=torch.float64) / h**0.5
    targets = torch.randint(0, v, (n,), generator=gen)
    sample_idx = torch.sort(torch.randint(0, num_samples, (n,), generator=gen)).values
    mask = (torch.rand(n, generator=gen) > 0.2).double()
    with torch.no_grad():
        logp, *_ = ppo_loss_from_hidden_reference(hidden, weight, targets, targets.double(), targets.double(), mask,
                                                  sample_idx, num_samples, temperature=TEMP)
    logp_old = (logp + 0.3 * torch.randn(n, generator=gen, dtype=torch.float64)).float()
    logp_teacher = (logp + torch.randn(n, generator=gen, dtype=torch.float64)).float()
    return [t.to(DEVICE) for t in (hidden.to(dtype), weight.to(dtype), targets, logp_old, logp_teacher, mask,
                                   sample_idx)]


def reference_grads(hidden, weight, targets, logp_old, logp_teacher, mask, sample_idx, num_samples, scale=1.0):
    """Loss, logp, clip fraction and both gradients in float64, from exactly the low-precision inputs."""
    h64 = hidden.detach().double().requires_grad_(True)
    w64 = weight.detach().double().requires_grad_(True)
    loss, logp, clip_frac, _ = ppo_loss_from_hidden_reference(h64, w64, targets, logp_old, logp_teacher, mask,
                                                              sample_idx, num_samples, temperature=TEMP,
                                                              clip_eps=CLIP, dual_clip=KAPPA)
    (scale * loss).backward()
    return loss.detach(), logp, clip_frac, h64.grad, w64.grad


def small_chunks(n, v):
    """7 rows of logits per chunk (chunked) and vocabulary blocks of v // 3 columns (fused)."""
    return 4 * min(7 * v, (v // 3) * n)


def assert_grads_close(got, ref, tol):
    torch.testing.assert_close(got.double(), ref, atol=tol * ref.abs().max().item(), rtol=tol)


@pytest.mark.parametrize(("backend", "path"), BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_composed_float64_reference(backend, path, dtype, gen):
    n, h, num_samples = 45, 24, 4
    v = 1031 if backend != "triton" or DEVICE == "cuda" else 300
    inputs = make(gen, n, h, v, num_samples, dtype)
    hid, w = (t.clone().requires_grad_(True) for t in inputs[:2])
    kw = {} if path is None else {"path": path, "chunk_bytes": small_chunks(n, v)}
    loss, logp, clip_frac, _ = ppo_loss_from_hidden(hid, w, *inputs[2:], num_samples, temperature=TEMP,
                                                    clip_eps=CLIP, dual_clip=KAPPA, backend=backend, **kw)
    (3 * loss).backward()  # an upstream gradient other than 1: the gradients formed in the forward are scaled
    ref, ref_logp, ref_clip, ref_h, ref_w = reference_grads(hid, w, *inputs[2:], num_samples, scale=3.0)
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(loss.double(), ref, atol=tol, rtol=tol)
    torch.testing.assert_close(logp.double(), ref_logp, atol=tol, rtol=0)
    assert_grads_close(hid.grad, ref_h, tol)
    assert_grads_close(w.grad, ref_w, tol)
    assert hid.grad.dtype == dtype and w.grad.dtype == dtype
    assert abs(clip_frac.item() - ref_clip.item()) <= 1 / n + 1e-6  # a token at a clip boundary may flip
    assert last_path("ppo_loss_from_hidden").path == (path or backend)


@pytest.mark.parametrize(("path", "head_grad_dtype"), [("chunked", None), ("chunked", torch.float32),
                                                        ("fused", None)])
def test_micro_batches_accumulate_into_the_head(path, head_grad_dtype, gen, monkeypatch):
    """Two calls per optimizer step (gradient accumulation), bf16 inputs; the head's gradient accumulated across
    row chunks in bf16 (the default) or fp32, or written per vocabulary block (fused): .grad holds the sum of both
    micro-batches' float64 gradients. fp32 accumulators of bf16 products are added in slices of 7 rows (the path
    for torch releases whose addmm takes no fp32 accumulator; on the CPU, always)."""
    n, h, v, num_samples = 40, 16, 200, 3
    monkeypatch.setattr(lm_head, "ACC_SLICE_BYTES", 4 * h * 7)
    w = make(gen, n, h, v, num_samples, torch.bfloat16)[1].requires_grad_(True)
    ref_w = torch.zeros(v, h, dtype=torch.float64, device=DEVICE)
    for _ in range(2):
        hidden, _, *rest = make(gen, n, h, v, num_samples, torch.bfloat16)
        hid = hidden.requires_grad_(True)
        loss, *_ = ppo_loss_from_hidden(hid, w, *rest, num_samples, temperature=TEMP, clip_eps=CLIP,
                                        dual_clip=KAPPA, backend="triton", path=path,
                                        chunk_bytes=4 * min(6 * v, 70 * n), head_grad_dtype=head_grad_dtype)
        loss.backward()
        *_, ref_h, grad_w = reference_grads(hid, w, *rest, num_samples)
        assert_grads_close(hid.grad, ref_h, 3e-2)
        ref_w += grad_w
    assert_grads_close(w.grad, ref_w, 3e-2)


@pytest.mark.parametrize("path", ["fused", "chunked"])
def test_frozen_head_and_no_grad_form_no_weight_gradient(path, gen, monkeypatch):
    """A head that does not require grad gets no gradient; under no_grad only
    the forward runs: any gradient product would raise here."""
    n, h, v, num_samples = 20, 16, 150, 2
    hidden, weight, *rest = make(gen, n, h, v, num_samples, torch.float32)
    hid = hidden.clone().requires_grad_(True)
    loss, *_ = ppo_loss_from_hidden(hid, weight, *rest, num_samples, temperature=TEMP, backend="triton", path=path)
    loss.backward()
    assert hid.grad is not None and weight.grad is None

    def no_gradient_work(*args, **kwargs):
        raise AssertionError("a gradient product ran under no_grad")

    monkeypatch.setattr(lm_head, "grad_products", no_gradient_work)
    monkeypatch.setattr(lm_head, "grads_by_vocab_blocks", no_gradient_work)
    with torch.no_grad():
        loss_ng, logp_ng, _, _ = ppo_loss_from_hidden(hid, weight, *rest, num_samples, temperature=TEMP,
                                                      backend="triton", path=path)
    torch.testing.assert_close(loss_ng, loss.detach(), atol=1e-6, rtol=1e-5)
    assert not loss_ng.requires_grad and last_path("ppo_loss_from_hidden").vocab_block == 0


@pytest.mark.parametrize(("backend", "path"), BACKENDS[1:])
def test_second_backward_raises(backend, path, gen):
    """The gradients are handed over once (without a copy); retain_graph cannot replay them."""
    hidden, weight, *rest = make(gen, 10, 8, 64, 2, torch.float32)
    hid = hidden.requires_grad_(True)
    loss, *_ = ppo_loss_from_hidden(hid, weight, *rest, 2, backend=backend, path=path)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="backward twice"):
        loss.backward()
