"""The dispatcher's choice of CUDA path and chunk sizes (kernels/paths.py) at the shapes the benchmarks measure: the
Qwen3 heads (V = 151,936; H = 1,024 for 0.6B, 4,096 for 8B) in bf16, on meta tensors (nothing is allocated)."""

import pytest
import torch

from actfirst.kernels import paths

V = 151_936


def plan(n, h, **kwargs):
    hidden = torch.empty(n, h, dtype=torch.bfloat16, device="meta")
    return paths.plan(hidden, torch.empty(V, h, dtype=torch.bfloat16, device="meta"), **kwargs)


def test_budget_is_twice_the_hidden_states_and_at_least_32_mib():
    assert plan(65_536, 4_096, need_grad=False).budget_bytes == 2 * 65_536 * 4_096 * 2  # 1 GiB
    assert plan(1_024, 4_096, need_grad=False).budget_bytes == 32 << 20
    p = plan(65_536, 4_096, need_grad=True, single_pass=True)
    assert p.chunk_rows == (1 << 30) // (4 * V) and p.vocab_block == (1 << 30) // (4 * 65_536) // 128 * 128
    assert plan(1_000, 64, need_grad=False, chunk_bytes=4 * V * 3).chunk_rows == 3


def test_free_memory_caps_the_budget(monkeypatch):
    """With little free memory the budget is half of it, and the chunked path (which needs large chunks) loses."""
    assert plan(65_536, 4_096, need_grad=True, single_pass=True).path == "chunked"
    monkeypatch.setattr(paths, "free_device_bytes", lambda device: 64 << 20)
    p = plan(65_536, 4_096, need_grad=True, single_pass=True)
    assert p.budget_bytes == 32 << 20 and p.chunk_rows == (32 << 20) // (4 * V)
    assert p.path == "fused"


@pytest.mark.parametrize(("n", "h", "need_grad", "expected"), [
    (1_024, 1_024, False, "fused"), (1_024, 4_096, False, "fused"),  # the rows alone cannot amortize a chunk
    (65_536, 4_096, False, "chunked"),  # the fp32 round trip is 8 of 2H = 8,192 FLOP-equivalents a logit
    (1_024, 4_096, True, "fused"), (65_536, 1_024, True, "chunked"), (65_536, 4_096, True, "chunked"),
])
def test_cost_model_choices(n, h, need_grad, expected):
    p = plan(n, h, need_grad=need_grad, single_pass=need_grad)
    assert p.path == expected, p.estimate_ms
    assert set(p.estimate_ms) == {"fused", "chunked"} and all(t > 0 for t in p.estimate_ms.values())


def test_forced_path_keeps_the_sizes_and_bad_paths_are_rejected():
    auto, forced = plan(65_536, 4_096, need_grad=True), plan(65_536, 4_096, need_grad=True, path="fused")
    assert forced.path == "fused" and (forced.chunk_rows, forced.vocab_block) == (auto.chunk_rows, auto.vocab_block)
    with pytest.raises(ValueError, match="path='blocked'"):
        plan(8, 8, need_grad=False, path="blocked")
    with pytest.raises(ValueError, match="chunk_bytes=0"):
        plan(8, 8, need_grad=False, chunk_bytes=0)
