"""Fused log-prob gather against a float64 reference, every backend, fresh random inputs each run."""

import pytest
import torch

from actfirst.kernels.dispatch import logprob_gather, native_ops
from actfirst.kernels.logprob_gather import logprob_gather_reference

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BACKENDS = ["torch"] + (["native"] if native_ops() is not None else []) + ["triton"]
# (atol on logp, rtol on gradients) per input dtype; logits are accumulated in fp32 by every backend.
TOL = {torch.float32: (1e-4, 1e-4), torch.bfloat16: (2e-2, 3e-2), torch.float16: (5e-3, 1e-2)}


def small_shapes(backend):
    # N = 1, N not a multiple of the block (64), V smaller than a block (128), odd H.
    shapes = [(1, 16, 50), (67, 24, 300), (5, 40, 129)]
    return shapes if backend == "triton" and DEVICE == "cpu" else shapes + [(200, 64, 1031)]


def make(n, h, v, dtype, seed_scale=1.0):
    gen = torch.Generator().manual_seed(torch.seed() % 2**31)
    hidden = (torch.randn(n, h, generator=gen, dtype=torch.float64) * seed_scale).to(DEVICE)
    weight = (torch.randn(v, h, generator=gen, dtype=torch.float64) / h**0.5).to(DEVICE)
    targets = torch.randint(0, v, (n,), generator=gen).to(DEVICE)
    return hidden.to(dtype), weight.to(dtype), targets


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_forward_and_backward_match_float64(backend, dtype, temperature):
    atol, rtol = TOL[dtype]
    for n, h, v in small_shapes(backend):
        hidden, weight, targets = make(n, h, v, dtype, seed_scale=2.0)
        hid = hidden.detach().clone().requires_grad_(True)
        w = weight.detach().clone().requires_grad_(True)
        logp, ent = logprob_gather(hid, w, targets, temperature, backend=backend)
        h64 = hidden.double().requires_grad_(True)
        w64 = weight.double().requires_grad_(True)
        ref, ref_ent = logprob_gather_reference(h64, w64, targets, temperature)
        assert logp.dtype == torch.float32 and logp.shape == (n,)
        torch.testing.assert_close(logp.double(), ref.detach(), atol=atol, rtol=0)
        torch.testing.assert_close(ent.double(), ref_ent, atol=atol * 2, rtol=0)
        upstream = torch.randn(n, dtype=torch.float64, device=DEVICE)
        (logp.double() * upstream).sum().backward()
        (ref * upstream).sum().backward()
        scale_h = h64.grad.abs().max().item() + 1e-6
        scale_w = w64.grad.abs().max().item() + 1e-6
        torch.testing.assert_close(hid.grad.double(), h64.grad, atol=rtol * scale_h, rtol=rtol)
        torch.testing.assert_close(w.grad.double(), w64.grad, atol=rtol * scale_w, rtol=rtol)
        assert hid.grad.dtype == dtype and w.grad.dtype == dtype


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != "triton" or DEVICE == "cuda"])
def test_qwen3_vocabulary(backend):
    """V = 151,936 (Qwen3), ragged N; weight gradient skipped (frozen teacher path)."""
    hidden, weight, targets = make(13, 32, 151_936, torch.float32, seed_scale=3.0)
    hid = hidden.clone().requires_grad_(True)
    logp, ent = logprob_gather(hid, weight, targets, 0.8, backend=backend)
    h64 = hidden.double().requires_grad_(True)
    ref, ref_ent = logprob_gather_reference(h64, weight.double(), targets, 0.8)
    # fp32 sums over 151,936 terms: about 1e-5 relative to |logp| ~ 15.
    torch.testing.assert_close(logp.double(), ref.detach(), atol=1e-3, rtol=0)
    torch.testing.assert_close(ent.double(), ref_ent, atol=1e-3, rtol=0)
    logp.sum().backward()
    ref.sum().backward()
    torch.testing.assert_close(hid.grad.double(), h64.grad, atol=1e-4, rtol=1e-4)


def test_triton_interpreter_large_vocab_tile_edges():
    """Triton forward across many vocabulary tiles, with a target in the last, partial tile."""
    hidden, weight, targets = make(3, 16, 1000, torch.float32)
    targets[0] = 999
    logp, _ = logprob_gather(hidden, weight, targets, 1.3, backend="triton")
    ref, _ = logprob_gather_reference(hidden.double(), weight.double(), targets, 1.3)
    torch.testing.assert_close(logp.double(), ref, atol=1e-4, rtol=0)


def test_no_grad_teacher_scoring_keeps_nothing():
    hidden, weight, targets = make(9, 16, 400, torch.float32)
    with torch.no_grad():
        logp, _ = logprob_gather(hidden, weight, targets)
    assert not logp.requires_grad


def test_bad_inputs_are_rejected():
    hidden, weight, targets = make(4, 8, 20, torch.float32)
    with pytest.raises(ValueError, match="hidden"):
        logprob_gather(hidden, weight[:, :5], targets)
    with pytest.raises(ValueError, match="targets"):
        logprob_gather(hidden, weight, targets[:3])
    with pytest.raises(ValueError, match="temperature=0"):
        logprob_gather(hidden, weight, targets, 0)
    if native_ops() is not None:
        with pytest.raises(RuntimeError, match="outside"):
            logprob_gather(hidden, weight, targets + 100, backend="native")
