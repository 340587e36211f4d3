"""Ahead-of-time compile check of the Triton kernels: registers, spills and shared memory, with no GPU.

Compiles every kernel at every launch configuration the dispatcher can choose (FWD_CONFIGS and the fixed launches
in logprob_gather.py, lm_head.py, ppo_loss.py and ppo_loss_from_hidden.py), for each checked architecture and input
dtype, with ``triton.compile`` and a ``GPUTarget``, then reads each cubin's resources with ``cuobjdump -res-usage``
(shipped in the triton wheel). A row fails on a register spill (stack or local memory) or on shared memory beyond the
architecture's limit.

    python -m actfirst.kernels.compile_check           # prints the table; exit status 1 when a row fails
    python -m actfirst.kernels.compile_check --json    # the rows as JSON

Each fused-forward list is compiled with the hints its key promises: the aligned lists with the divisibility-by-16
hints a launch at real model shapes gets (aligned pointers; H, V and strides multiples of 16), the unaligned lists
(odd H) without them, which vectorizes less and needs more registers; the dispatcher launches a list only on shapes
that match its key (logprob_gather.is_aligned).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from actfirst.kernels import lm_head as lm
from actfirst.kernels import logprob_gather as lg
from actfirst.kernels import ppo_loss as pl
from actfirst.kernels import ppo_loss_from_hidden as pfh

# Shared memory a block may use, in bytes. Architecture 80's configurations also run on sm_86/sm_89 (and later
# non-Hopper GPUs), whose blocks get 99 KB, so they are held to that rather than the A100's 163 KB.
SMEM_LIMIT = {80: 99 * 1024, 90: 227 * 1024}
DTYPES = ("bf16", "fp16", "fp32")
_ALIGNED = [["tt.divisibility", 16]]
CUOBJDUMP = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"


def _job(kernel: str, arch: int, dtype: str, config: str, signature: dict[str, str], constexprs: dict,
         options: dict, aligned: bool = True) -> dict:
    """One compile job; with ``aligned``, every pointer and every stride or size named ``stride*``, ``V``, ``H`` or
    ``V_PER_SPLIT`` gets the divisibility-by-16 hint that a launch at real model shapes gets."""
    hinted = tuple(k for k, t in signature.items() if t.startswith("*") or k.startswith("stride")
                   or k in ("V", "H", "V_PER_SPLIT"))
    return dict(kernel=kernel, arch=arch, dtype=dtype, config=config, aligned=aligned, signature=signature,
                hinted=hinted, constexprs=constexprs, options=options)


def _fused_forward_jobs(arch: int, dt: str) -> list[dict]:
    """Every configuration of the fused forward, with the hints its FWD_CONFIGS key promises; the combine kernel."""
    width = "fp32" if dt == "fp32" else "16-bit"
    jobs = [_job("_logprob_gather_fwd_kernel", arch, dt, str(cfg),
                 {"h_ptr": f"*{dt}", "w_ptr": f"*{dt}", "part_ptr": "*fp32", "N": "i32", "V": "i32", "H": "i32",
                  "V_PER_SPLIT": "i32", "S": "i32", "stride_hn": "i32", "stride_wv": "i32", "inv_temp": "fp32"},
                 {"BLOCK_N": cfg.block_n, "BLOCK_V": cfg.block_v, "BLOCK_H": cfg.block_h, "GROUP": cfg.group,
                  "UPCAST_DOT": False},
                 {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}, aligned)
            for aligned in (True, False) for cfg in lg.FWD_CONFIGS[(arch, width, aligned)]]
    jobs.append(_job(
        "_logprob_gather_combine_kernel", arch, dt, f"N{lg.COMBINE_BLOCK_N} H{lg.COMBINE_BLOCK_H} "
        f"w{lg.COMBINE_NUM_WARPS}",
        {"part_ptr": "*fp32", "h_ptr": f"*{dt}", "w_ptr": f"*{dt}", "y_ptr": "*i64", "logp_ptr": "*fp32",
         "lse_ptr": "*fp32", "ent_ptr": "*fp32", "N": "i32", "V": "i32", "H": "i32", "S": "i32", "stride_hn": "i32",
         "stride_wv": "i32", "inv_temp": "fp32"},
        {"BLOCK_N": lg.COMBINE_BLOCK_N, "BLOCK_H": lg.COMBINE_BLOCK_H}, {"num_warps": lg.COMBINE_NUM_WARPS}))
    return jobs


def _row_kernel_jobs(arch: int, dt: str) -> list[dict]:
    """The kernels of the chunked and vocabulary-blocked paths, whose G is written in the inputs' dtype."""
    row = f"V{lm.ROW_BLOCK_V} w{lm.ROW_NUM_WARPS}"
    meta, options = {"BLOCK_V": lm.ROW_BLOCK_V}, {"num_warps": lm.ROW_NUM_WARPS}
    return [
        _job("_logit_grad_kernel", arch, dt, row,
             {"z_ptr": "*fp32", "gz_ptr": f"*{dt}", "lse_ptr": "*fp32", "g_ptr": "*fp32", "y_ptr": "*i64",
              "VB": "i32", "v0": "i32", "stride_zn": "i32", "stride_gn": "i32", "inv_temp": "fp32"}, meta, options),
        _job("_ppo_rows_kernel", arch, dt, row,
             {"z_ptr": "*fp32", "gz_ptr": f"*{dt}", "y_ptr": "*i64", "old_ptr": "*fp32", "teacher_ptr": "*fp32",
              "tw_ptr": "*fp32", "logp_ptr": "*fp32", "stats_ptr": "*fp32", "V": "i32", "stride_zn": "i32",
              "stride_gn": "i32", "stride_s": "i32", "inv_temp": "fp32", "clip_eps": "fp32", "dual_clip": "fp32"},
             meta, options),
        _job("_ppo_loss_kernel", arch, dt, f"B{pl.PPO_BLOCK} w{pl.PPO_NUM_WARPS}",
             {"logp_ptr": f"*{dt}", "logp_old_ptr": f"*{dt}", "logp_t_ptr": f"*{dt}", "mask_ptr": "*fp32",
              "idx_ptr": "*i64", "count_ptr": "*fp32", "grad_ptr": "*fp32", "part_ptr": "*fp32", "N": "i32",
              "num_samples": "i32", "clip_eps": "fp32", "dual_clip": "fp32", "eps": "fp32"},
             {"BLOCK": pl.PPO_BLOCK}, {"num_warps": pl.PPO_NUM_WARPS}),
    ]


def _jobs() -> list[dict]:
    """Every (kernel, arch, dtype, config, hints) the dispatcher can launch, with its compile arguments."""
    jobs = []
    for arch in SMEM_LIMIT:
        for dt in DTYPES:
            jobs += _fused_forward_jobs(arch, dt) + _row_kernel_jobs(arch, dt)
        # Kernels that see only fp32 logits and fp32 masks, whatever the input dtype.
        jobs.append(_job("_logprob_rows_kernel", arch, "any", f"V{lm.ROW_BLOCK_V} w{lm.ROW_NUM_WARPS}",
                         {"z_ptr": "*fp32", "y_ptr": "*i64", "logp_ptr": "*fp32", "lse_ptr": "*fp32",
                          "ent_ptr": "*fp32", "V": "i32", "stride_zn": "i32", "inv_temp": "fp32"},
                         {"BLOCK_V": lm.ROW_BLOCK_V}, {"num_warps": lm.ROW_NUM_WARPS}))
        jobs.append(_job("_sample_counts_kernel", arch, "any", f"B{pl.PPO_BLOCK} w{pl.PPO_NUM_WARPS}",
                         {"mask_ptr": "*fp32", "idx_ptr": "*i64", "count_ptr": "*fp32", "N": "i32"},
                         {"BLOCK": pl.PPO_BLOCK}, {"num_warps": pl.PPO_NUM_WARPS}))
    return jobs


def compile_one(job: dict) -> dict:
    """Compile one job for its architecture and read the cubin's resources: the job's table row."""
    fn = next(getattr(m, job["kernel"]) for m in (lg, lm, pl, pfh) if hasattr(m, job["kernel"]))
    names = list(job["signature"]) + list(job["constexprs"])
    signature = {name: job["signature"].get(name, "constexpr") for name in fn.arg_names}
    assert set(fn.arg_names) == set(names), f"{job['kernel']}: arguments {fn.arg_names}, checked {names}"
    attrs = {(fn.arg_names.index(a),): _ALIGNED for a in job["hinted"]} if job["aligned"] else {}
    src = ASTSource(fn=fn, signature=signature, constexprs=job["constexprs"], attrs=attrs)
    kernel = triton.compile(src, target=GPUTarget("cuda", job["arch"], 32), options=job["options"])
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        cubin.write_bytes(kernel.asm["cubin"])
        out = subprocess.run([str(CUOBJDUMP), "-res-usage", str(cubin)], capture_output=True, text=True,
                             check=True).stdout
    usage = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", out)
    if usage is None:
        raise RuntimeError(f"cuobjdump -res-usage: no resource line in {out!r}")
    regs, stack, static_smem, local = map(int, usage.groups())
    smem = static_smem + kernel.metadata.shared  # Triton's shared memory is dynamic, the rest static
    row = {k: job[k] for k in ("kernel", "arch", "dtype", "config", "aligned")}
    row.update(registers=regs, stack=stack + local, smem=smem, smem_limit=SMEM_LIMIT[job["arch"]])
    row["ok"] = row["stack"] == 0 and smem <= row["smem_limit"]
    return row


def compile_rows() -> list[dict]:
    """Every job's row, compiled in parallel (Triton's on-disk cache makes a rerun take seconds). Needs compiled
    @triton.jit kernels, so not the interpreter."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("compile_check: unset TRITON_INTERPRET (or use check_in_subprocess())")
    jobs = _jobs()
    with ProcessPoolExecutor(max_workers=min(len(jobs), os.cpu_count() or 1)) as pool:
        return list(pool.map(compile_one, jobs))


def check_in_subprocess(timeout_s: float = 600) -> list[dict]:
    """The rows, from a subprocess without TRITON_INTERPRET. tests/conftest.py sets it on machines without a GPU,
    and then @triton.jit kernels are interpreted Python functions that triton.compile cannot take."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "actfirst.kernels.compile_check", "--json"], env=env,
                          capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"compile_check failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def format_table(rows: list[dict]) -> str:
    """A Markdown table of the rows."""
    lines = ["| kernel | arch | dtype | config | hints | registers | stack | smem KiB (limit) | ok |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['kernel']} | sm_{r['arch']} | {r['dtype']} | {r['config']} | "
                     f"{'aligned' if r['aligned'] else 'none'} | {r['registers']} | {r['stack']} | "
                     f"{r['smem'] / 1024:.1f} ({r['smem_limit'] // 1024}) | {'yes' if r['ok'] else 'NO'} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args()
    rows = compile_rows()
    print(json.dumps(rows) if args.json else format_table(rows))
    sys.exit(0 if all(r["ok"] for r in rows) else 1)


if __name__ == "__main__":
    main()
