"""The GPU check's dry run: ``SHRUNKEN=1 bash bench/device_check.sh`` runs every step to the end on the CPU (tiny
shapes, the Triton interpreter for the kernel steps, gloo for FSDP2) and writes each step's rows."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]
STEPS = ("kernel_tests", "train_step", "memory_probe", "head_grad_error", "logprob_gather", "ppo_loss")


def _sections(fragment: str) -> dict[str, str]:
    """The fragment's ``### <step>`` sections by step name."""
    parts = re.split(r"^### (\w+)$", fragment, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_shrunken_device_check_runs_every_step_and_writes_its_rows(tmp_path):
    out = tmp_path / "device"
    env = {**os.environ, "SHRUNKEN": "1", "PYTHON": sys.executable, "OUT": str(out), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(["bash", "bench/device_check.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    fragment = (out / "RESULTS-fragment.md").read_text()
    assert re.search(r"^## Device check, \d{4}-\d\d-\d\d$", fragment, re.MULTILINE), fragment[:300]
    assert "shrunken dry run on the CPU" in fragment and "NOT measurements" in fragment
    sections = _sections(fragment)
    assert list(sections) == list(STEPS), fragment
    for name, text in sections.items():
        assert ": exit 0 after" in text, f"{name}: {text[:600]}"

    tests = sections["kernel_tests"]
    assert re.search(r"^\d+ passed in ", tests, re.MULTILINE) and "failed" not in tests, tests
    train = sections["train_step"]
    for update in (1, 2):
        for phase in ("score", "fwd_bwd", "step", "sync"):
            row = rf"^\| {update} \| {phase} \| \d+\.\d\d \|"
            assert re.search(row, train, re.MULTILINE), f"update {update}, {phase}: {train}"
    assert re.search(r"^\| load \| .* \| True \|$", train, re.MULTILINE), train
    result = json.loads((out / "train_step.json").read_text())
    assert result["checkpoint"]["round_trip_equal"] is True and result["checkpoint"]["dcp_bytes"] > 0
    assert all(u["gathered_params"] > 0 and u["score_s"] > 0 for u in result["updates"])

    probe = json.loads((out / "memory_probe.json").read_text())["cases"]
    assert len(probe) == 8  # (checkpointing off, on) x (two samples, one) x (sdpa, flex)
    ran = [c for c in probe if c["attention"] == "sdpa"]
    assert len(ran) == 4 and all(c["allocated_mib"] > 0 for c in ran), ran
    assert all(c["predicted_mib"] is None for c in probe)  # the plan measured no tiny shape: nothing to compare
    assert sections["memory_probe"].count("\n| tiny |") == 8

    assert re.search(r"^\| 8B \| 512 \| 64 \| fp32 \|", sections["head_grad_error"], re.MULTILINE)
    assert re.search(r"^\| 0\.6B \| 16 \| fwd_bwd \|", sections["logprob_gather"], re.MULTILINE)
    assert re.search(r"N=\s+5000 fused", sections["ppo_loss"])
