"""Dual-clipped PPO token loss against a float64 reference, every backend, every branch and boundary (random inputs
from the printed seed; ACTFIRST_TEST_SEED replays it)."""

import pytest
import torch

from actfirst.kernels.dispatch import native_ops, ppo_loss
from actfirst.kernels.ppo_loss import ppo_loss_reference

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BACKENDS = ["torch"] + (["native"] if native_ops() is not None else []) + ["triton"]
CLIP, KAPPA = 0.2, 3.0


def batch(num_samples, max_len, gen, masked_samples=()):
    lengths = torch.randint(1, max_len + 1, (num_samples,), generator=gen)
    sample_idx = torch.repeat_interleave(torch.arange(num_samples), lengths)
    n = sample_idx.numel()
    logp_old = -torch.rand(n, generator=gen, dtype=torch.float64) * 5
    logp = logp_old + torch.randn(n, generator=gen, dtype=torch.float64) * 0.3
    logp_t = logp_old + torch.randn(n, generator=gen, dtype=torch.float64)
    mask = (torch.rand(n, generator=gen) > 0.2).double()
    for s in masked_samples:
        mask[sample_idx == s] = 0.0
    return [t.to(DEVICE) for t in (logp, logp_old, logp_t, mask, sample_idx)]


def compare(backend, logp, logp_old, logp_t, mask, sample_idx, num_samples, dtype=torch.float32, ties=None):
    """``ties``: tokens whose ratio sits exactly on a clip boundary, where clipped and unclipped losses are equal and
    the gradient is either one-sided value (which one depends on the last bit of the device's exp)."""
    x = logp.to(dtype).detach().clone().requires_grad_(True)
    loss, clip_frac, dual_frac = ppo_loss(x, logp_old.to(dtype), logp_t.to(dtype), mask, sample_idx, num_samples,
                                          clip_eps=CLIP, dual_clip=KAPPA, backend=backend)
    loss.backward()

    def reference(shift=0.0):
        # The reference sees exactly the low-precision inputs the kernel saw, in float64.
        x64 = (x.detach().double() + shift).requires_grad_(True)
        ref, ref_clip, ref_dual = ppo_loss_reference(x64, logp_old.to(dtype).double(), logp_t.to(dtype).double(),
                                                     mask, sample_idx, num_samples, clip_eps=CLIP, dual_clip=KAPPA)
        ref.backward()
        return ref, ref_clip, ref_dual, x64.grad

    ref, ref_clip, ref_dual, grad = reference()
    torch.testing.assert_close(loss.double(), ref.detach(), atol=1e-5, rtol=1e-5)
    # The gradient is returned in logp's dtype, so it carries that dtype's rounding.
    grad_rtol = {torch.float32: 1e-5, torch.bfloat16: 8e-3, torch.float16: 1e-3}[dtype]
    flips = 0.0  # the clip fraction may differ by the tie tokens whose branch (and so gradient) can go either way
    if ties is not None:
        below, above = reference(-1e-6)[3], reference(1e-6)[3]  # past float32 rounding of the ratio
        got = x.grad.double()[ties]
        one_sided = [torch.isclose(got, side[ties], atol=1e-6, rtol=grad_rtol) for side in (below, above)]
        assert torch.all(one_sided[0] | one_sided[1]), f"ties: gradient {got}, one-sided {below[ties]}, {above[ties]}"
        grad = torch.where(ties, x.grad.double(), grad)
        flips = (ties & ~torch.isclose(below, above, atol=1e-6, rtol=grad_rtol)).sum().item() / ties.numel()
    torch.testing.assert_close(x.grad.double(), grad, atol=1e-6, rtol=grad_rtol)
    torch.testing.assert_close(clip_frac.double(), ref_clip.double(), atol=1e-6 + flips, rtol=0)
    torch.testing.assert_close(dual_frac.double(), ref_dual.double(), atol=1e-6, rtol=0)
    return ref_clip.item(), ref_dual.item()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_random_batches(backend, dtype, gen):
    for num_samples, max_len in [(1, 1), (7, 33), (40, 100)]:
        compare(backend, *batch(num_samples, max_len, gen, masked_samples=(0,) if num_samples > 1 else ()),
                num_samples, dtype)


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_branch_and_boundary(backend):
    """Hand-placed ratios: inside, at and beyond 1 +- delta, under the dual clip, and beyond the +-20 clamp,
    for A < 0, A = 0 and A > 0."""
    log_ratios = torch.tensor([0.0, 0.1, -0.1, 0.5, -0.5, 2.0, -2.0, 25.0, -25.0, 20.0, -20.0], dtype=torch.float64)
    # Boundaries of the clip interval, exactly representable in float32.
    boundary = torch.log(torch.tensor([1 + CLIP, 1 - CLIP], dtype=torch.float32)).double()
    log_ratios = torch.cat([log_ratios, boundary])
    advantages = torch.tensor([-3.0, -0.5, 0.0, 0.7, 4.0], dtype=torch.float64)
    lr, adv = torch.meshgrid(log_ratios, advantages, indexing="ij")
    lr, adv = lr.flatten(), adv.flatten()
    logp_old = torch.full_like(lr, -2.0)
    logp = (logp_old + lr).float().double()  # float32-exact inputs
    logp_old = logp_old.float().double()
    logp_t = logp_old + adv
    n = lr.numel()
    sample_idx = torch.arange(n) % 3
    mask = torch.ones(n, dtype=torch.float64)
    ties = (torch.arange(n) >= n - len(boundary) * len(advantages)) & (adv != 0)
    clip, dual = compare(backend, *[t.to(DEVICE) for t in (logp, logp_old, logp_t, mask, sample_idx)], 3,
                         ties=ties.to(DEVICE))
    assert 0 < clip < 1 and 0 < dual < 1  # the grid does reach the clipped and dual-clipped branches


@pytest.mark.parametrize("backend", BACKENDS)
def test_fully_masked_batch(backend, gen):
    logp, logp_old, logp_t, mask, sample_idx = batch(3, 5, gen)
    mask = torch.zeros_like(mask)
    x = logp.float().requires_grad_(True)
    loss, clip_frac, dual_frac = ppo_loss(x, logp_old.float(), logp_t.float(), mask, sample_idx, 3, backend=backend)
    loss.backward()
    assert loss.item() == 0.0 and clip_frac.item() == 0.0 and dual_frac.item() == 0.0
    assert torch.all(x.grad == 0)


def test_bad_inputs_are_rejected():
    x = torch.zeros(4)
    with pytest.raises(ValueError, match="mask"):
        ppo_loss(x, x, x, torch.ones(3), torch.zeros(4, dtype=torch.long), 1)
    with pytest.raises(ValueError, match="num_samples=0"):
        ppo_loss(x, x, x, torch.ones(4), torch.zeros(4, dtype=torch.long), 0)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("order", ["packed", "shuffled"])
def test_many_blocks_any_token_order_and_mask_dtype(backend, order, gen):
    """More tokens than one Triton program (4,096) takes, samples straddling program boundaries, tokens packed
    sample by sample or shuffled (the per-sample sums then see a run per token), float and bool masks."""
    logp, logp_old, logp_t, mask, sample_idx = batch(41, 1000, gen, masked_samples=(3,))
    if order == "shuffled":
        perm = torch.randperm(sample_idx.numel(), generator=gen).to(DEVICE)
        logp, logp_old, logp_t, mask, sample_idx = (t[perm] for t in (logp, logp_old, logp_t, mask, sample_idx))
    assert sample_idx.numel() > 2 * 4096
    compare(backend, logp, logp_old, logp_t, mask, sample_idx, 41)
    compare(backend, logp, logp_old, logp_t, mask > 0, sample_idx, 41)


@pytest.mark.parametrize("backend", BACKENDS)
def test_upstream_gradient_and_single_backward(backend, gen):
    """The gradient is formed in the forward pass: an upstream gradient other than 1 scales it, and a second
    backward through the same graph raises instead of handing over a gradient twice."""
    logp, logp_old, logp_t, mask, sample_idx = batch(5, 20, gen)
    x = logp.float().requires_grad_(True)
    loss, _, _ = ppo_loss(x, logp_old.float(), logp_t.float(), mask, sample_idx, 5, backend=backend)
    (2.5 * loss).backward(retain_graph=True)
    x64 = logp.clone().requires_grad_(True)
    ref, _, _ = ppo_loss_reference(x64, logp_old.float().double(), logp_t.float().double(), mask, sample_idx, 5)
    (2.5 * ref).backward()
    torch.testing.assert_close(x.grad.double(), x64.grad, atol=1e-6, rtol=1e-5)
    if backend != "torch":
        with pytest.raises(RuntimeError, match="backward twice"):
            loss.backward()
