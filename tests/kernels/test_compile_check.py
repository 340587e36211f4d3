"""Every Triton kernel at every launch configuration, compiled for sm_80 and sm_90 without a GPU: no register spill,
shared memory within the architecture's limit (kernels/compile_check.py)."""

import pytest

pytest.importorskip("triton")

from actfirst.kernels import logprob_gather as lg  # noqa: E402
from actfirst.kernels.compile_check import SMEM_LIMIT, check_in_subprocess, format_table  # noqa: E402

KERNELS_BY_DTYPE = ("_logprob_gather_fwd_kernel", "_logprob_gather_combine_kernel", "_logit_grad_kernel",
                    "_ppo_rows_kernel", "_ppo_loss_kernel")
KERNELS_ANY_DTYPE = ("_logprob_rows_kernel", "_sample_counts_kernel")  # fp32 logits, fp32 masks only


def test_every_launch_config_compiles_without_spills():
    rows = check_in_subprocess()
    print(format_table(rows))
    seen = {(r["kernel"], r["arch"], r["dtype"], r["config"], r["aligned"]) for r in rows}
    for (arch, width, aligned), configs in lg.FWD_CONFIGS.items():
        for dtype in ("fp32",) if width == "fp32" else ("bf16", "fp16"):
            for cfg in configs:
                assert ("_logprob_gather_fwd_kernel", arch, dtype, str(cfg), aligned) in seen
    assert {r["arch"] for r in rows} == set(SMEM_LIMIT) == {80, 90}
    assert {(r["kernel"], r["dtype"]) for r in rows if r["kernel"] in KERNELS_BY_DTYPE} == {
        (k, d) for k in KERNELS_BY_DTYPE for d in ("bf16", "fp16", "fp32")}
    assert {(r["kernel"], r["arch"]) for r in rows if r["kernel"] in KERNELS_ANY_DTYPE} == {
        (k, arch) for k in KERNELS_ANY_DTYPE for arch in SMEM_LIMIT}
    bad = [r for r in rows if r["stack"] > 0 or r["smem"] > SMEM_LIMIT[r["arch"]] or r["registers"] > 255]
    assert not bad, "spills or too much shared memory:\n" + format_table(bad)
