"""Fused log-prob gather against a float64 reference, every backend and CUDA path, fresh random inputs each run (the
seed is printed; ACTFIRST_TEST_SEED replays it)."""

import math

import pytest
import torch

from actfirst.kernels import logprob_gather as lg
from actfirst.kernels.dispatch import last_path, logprob_gather, native_ops
from actfirst.kernels.logprob_gather import logprob_gather_reference

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# (backend, CUDA path): the Triton paths run on the GPU, or on the CPU under the interpreter (cuBLAS -> torch).
BACKENDS = [("torch", None)] + ([("native", None)] if native_ops() is not None else []) + [
    ("triton", "fused"), ("triton", "chunked")]
# (atol on logp, rtol on gradients) per input dtype; logits are accumulated in fp32 by every backend.
TOL = {torch.float32: (1e-4, 1e-4), torch.bfloat16: (2e-2, 3e-2), torch.float16: (5e-3, 1e-2)}


def small_shapes(backend):
    # N = 1, N not a multiple of a row block, V below a GPU vocabulary tile (128), odd H (several H chunks of 16
    # under the interpreter).
    shapes = [(1, 16, 50), (67, 24, 300), (5, 40, 129)]
    return shapes if backend == "triton" and DEVICE == "cpu" else shapes + [(200, 64, 1031)]


def small_chunks(n, v):
    """A memory budget of 7 rows of logits (chunked) and a vocabulary block of v // 3 columns (fused path's
    gradients), so that the small shapes cross chunk and block boundaries."""
    return 4 * min(7 * v, max(1, v // 3) * n)


def make(gen, n, h, v, dtype, seed_scale=1.0):
    hidden = (torch.randn(n, h, generator=gen, dtype=torch.float64) * seed_scale).to(DEVICE)
    weight = (torch.randn(v, h, generator=gen, dtype=torch.float64) / h**0.5).to(DEVICE)
    targets = torch.randint(0, v, (n,), generator=gen).to(DEVICE)
    return hidden.to(dtype), weight.to(dtype), targets


@pytest.mark.parametrize(("backend", "path"), BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_forward_and_backward_match_float64(backend, path, dtype, temperature, gen):
    atol, rtol = TOL[dtype]
    for n, h, v in small_shapes(backend):
        hidden, weight, targets = make(gen, n, h, v, dtype, seed_scale=2.0)
        hid = hidden.detach().clone().requires_grad_(True)
        w = weight.detach().clone().requires_grad_(True)
        kw = {} if path is None else {"path": path, "chunk_bytes": small_chunks(n, v)}
        logp, ent = logprob_gather(hid, w, targets, temperature, backend=backend, **kw)
        assert last_path("logprob_gather").path == (path or backend)
        h64 = hidden.double().requires_grad_(True)
        w64 = weight.double().requires_grad_(True)
        ref, ref_ent = logprob_gather_reference(h64, w64, targets, temperature)
        assert logp.dtype == torch.float32 and logp.shape == (n,)
        torch.testing.assert_close(logp.double(), ref.detach(), atol=atol, rtol=0)
        torch.testing.assert_close(ent.double(), ref_ent, atol=atol * 2, rtol=0)
        upstream = torch.randn(n, generator=gen, dtype=torch.float64).to(DEVICE)
        (logp.double() * upstream).sum().backward()
        (ref * upstream).sum().backward()
        scale_h = h64.grad.abs().max().item() + 1e-6
        scale_w = w64.grad.abs().max().item() + 1e-6
        torch.testing.assert_close(hid.grad.double(), h64.grad, atol=rtol * scale_h, rtol=rtol)
        torch.testing.assert_close(w.grad.double(), w64.grad, atol=rtol * scale_w, rtol=rtol)
        assert hid.grad.dtype == dtype and w.grad.dtype == dtype


@pytest.mark.parametrize(("backend", "path"), [b for b in BACKENDS if b[0] != "triton" or DEVICE == "cuda"])
def test_qwen3_vocabulary(backend, path, gen):
    """V = 151,936 (Qwen3), ragged N; weight gradient skipped (frozen teacher path)."""
    hidden, weight, targets = make(gen, 13, 32, 151_936, torch.float32, seed_scale=3.0)
    hid = hidden.clone().requires_grad_(True)
    logp, ent = logprob_gather(hid, weight, targets, 0.8, backend=backend, path=path)
    h64 = hidden.double().requires_grad_(True)
    ref, ref_ent = logprob_gather_reference(h64, weight.double(), targets, 0.8)
    # fp32 sums over 151,936 terms: about 1e-5 relative to |logp| ~ 15.
    torch.testing.assert_close(logp.double(), ref.detach(), atol=1e-3, rtol=0)
    torch.testing.assert_close(ent.double(), ref_ent, atol=1e-3, rtol=0)
    logp.sum().backward()
    ref.sum().backward()
    torch.testing.assert_close(hid.grad.double(), h64.grad, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("path", ["fused", "chunked"])
def test_triton_large_vocab_tile_edges(path, gen):
    """Both forwards across many vocabulary tiles (and row blocks of 2,048 columns), with a target in the last,
    partial one."""
    hidden, weight, targets = make(gen, 3, 16, 4100, torch.float32)
    targets[0] = 4099
    logp, _ = logprob_gather(hidden, weight, targets, 1.3, backend="triton", path=path)
    ref, _ = logprob_gather_reference(hidden.double(), weight.double(), targets, 1.3)
    torch.testing.assert_close(logp.double(), ref, atol=1e-4, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("splits", [2, 3, 7, 10_000])
def test_vocab_split_forward_matches_float64(dtype, splits, gen):
    """The split path: per-split (max, sum, entropy term) partials combined by the second kernel, at odd shapes
    (N = 1, V below a tile, V not a multiple of a split, more splits asked for than there are tiles)."""
    atol = TOL[dtype][0]
    for n, h, v in [(1, 16, 50), (67, 24, 300), (5, 40, 129), (3, 17, 1000)]:
        hidden, weight, targets = make(gen, n, h, v, dtype, seed_scale=2.0)
        logp, lse, ent = lg.logprob_gather_forward_fused(hidden, weight, targets, 0.7, splits=splits)
        logits = hidden.double() @ weight.double().T / 0.7
        ref, ref_ent = logprob_gather_reference(hidden.double(), weight.double(), targets, 0.7)
        torch.testing.assert_close(logp.double(), ref, atol=atol, rtol=0)
        torch.testing.assert_close(lse.double(), torch.logsumexp(logits, -1), atol=atol, rtol=0)
        torch.testing.assert_close(ent.double(), ref_ent, atol=atol * 2, rtol=0)


def test_dispatcher_splits_the_vocabulary_when_rows_cannot_fill_the_gpu(monkeypatch, gen):
    """Through logprob_gather and autograd, with the GPU's SM count faked so that 20 rows cannot fill it."""
    monkeypatch.setattr(lg, "_num_sms", lambda device: 48)
    chosen, real = [], lg.vocab_splits
    monkeypatch.setattr(lg, "vocab_splits", lambda *args, **kw: chosen.append(real(*args, **kw)) or chosen[-1])
    hidden, weight, targets = make(gen, 20, 24, 1000, torch.float32, seed_scale=2.0)
    hid = hidden.clone().requires_grad_(True)
    w = weight.clone().requires_grad_(True)
    logp, ent = logprob_gather(hid, w, targets, 0.9, backend="triton", path="fused")
    assert len(chosen) == 1 and chosen[0] > 1
    h64 = hidden.double().requires_grad_(True)
    w64 = weight.double().requires_grad_(True)
    ref, ref_ent = logprob_gather_reference(h64, w64, targets, 0.9)
    torch.testing.assert_close(logp.double(), ref.detach(), atol=1e-4, rtol=0)
    torch.testing.assert_close(ent.double(), ref_ent, atol=2e-4, rtol=0)
    upstream = torch.randn(20, generator=gen, dtype=torch.float64).to(DEVICE)
    (logp.double() * upstream).sum().backward()
    (ref * upstream).sum().backward()
    torch.testing.assert_close(hid.grad.double(), h64.grad, atol=1e-4 * h64.grad.abs().max().item(), rtol=1e-4)
    torch.testing.assert_close(w.grad.double(), w64.grad, atol=1e-4 * w64.grad.abs().max().item(), rtol=1e-4)


def test_vocab_splits_fill_the_gpu():
    """An H200 (132 SMs), Qwen3's 151,936-entry vocabulary in 1,187 tiles of 128, row blocks of 64."""
    assert lg.vocab_splits(16, 1187, 132) == 8  # N = 1,024: 16 x 8 = 128 programs, one wave
    assert lg.vocab_splits(132, 1187, 132) == 1  # the rows fill the GPU
    assert lg.vocab_splits(1024, 1187, 132) == 1
    assert lg.vocab_splits(3, 2, 132) == 2  # never more splits than tiles
    assert lg.vocab_splits(1024, 1187, 132, min_splits=38) == 38  # enough splits for L2 locality
    assert lg.vocab_splits(16, 1187, 132, min_splits=38) == 40  # 640 programs: 4.85 waves, within 5% of the best
    for row_blocks in range(1, 132):
        s = lg.vocab_splits(row_blocks, 1187, 132)
        fill = row_blocks * s / (132 * math.ceil(row_blocks * s / 132))
        assert fill >= 0.85 and s <= 8 * 132 // row_blocks, (row_blocks, s, fill)


@pytest.mark.parametrize(("backend", "path"), BACKENDS)
def test_entropy_and_no_grad_scoring_carry_no_gradient(backend, path, gen):
    """With inputs that require grad: logp does, the entropy never does, and under no_grad (teacher scoring)
    neither output keeps a graph."""
    hidden, weight, targets = make(gen, 9, 16, 400, torch.float32)
    hidden.requires_grad_(True)
    weight.requires_grad_(True)
    logp, ent = logprob_gather(hidden, weight, targets, backend=backend, path=path)
    assert logp.requires_grad and logp.grad_fn is not None
    assert not ent.requires_grad and ent.grad_fn is None
    with torch.no_grad():
        logp, ent = logprob_gather(hidden, weight, targets, backend=backend, path=path)
    assert not logp.requires_grad and logp.grad_fn is None
    assert not ent.requires_grad and ent.grad_fn is None


def test_bad_inputs_are_rejected(gen):
    hidden, weight, targets = make(gen, 4, 8, 20, torch.float32)
    with pytest.raises(ValueError, match="hidden"):
        logprob_gather(hidden, weight[:, :5], targets)
    with pytest.raises(ValueError, match="targets"):
        logprob_gather(hidden, weight, targets[:3])
    with pytest.raises(ValueError, match="temperature=0"):
        logprob_gather(hidden, weight, targets, 0)
    if native_ops() is not None:
        with pytest.raises(RuntimeError, match="outside"):
            logprob_gather(hidden, weight, targets + 100, backend="native")
    with pytest.raises(ValueError, match="path='fused' applies to backend 'triton'"):
        logprob_gather(hidden, weight, targets, backend="torch", path="fused")
    with pytest.raises(ValueError, match="path='auto'"):
        logprob_gather(hidden, weight, targets, backend="triton", path="auto")
    with pytest.raises(ValueError, match="one dtype"):
        logprob_gather(hidden, weight.double(), targets, backend="triton")
    # Triton cannot raise from a kernel: a target outside the vocabulary gives NaN, never a read outside W.
    bad = targets.clone()
    bad[1] = 20
    for path in ("fused", "chunked"):
        logp, _ = logprob_gather(hidden, weight, bad, backend="triton", path=path)
        assert logp[1].isnan() and not logp[[0, 2, 3]].isnan().any()
