"""The GPU check's dry run: ``SHRUNKEN=1 bash bench/device_check.sh`` runs every step to the end on the CPU (tiny
shapes, the Triton interpreter for the kernel steps, gloo for FSDP2), writes each step's rows as they come and at
most 8 files; killed mid-way, its fragment keeps the rows of the steps that finished."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).parents[1]
STEPS = ("kernel_tests", "colocated_fit", "stream_interference", "head_ops", "ppo_loss", "memory_probe")
FILES = {"RESULTS-fragment.md", "device_check.log", "colocated_fit.json", "stream_interference.json",
         "head_ops.json", "ppo_loss.json", "memory_probe.json"}
MAX_FILES = 8
"""What the run tool brings back from a device call."""


def _env(out: Path, tmp: Path) -> dict[str, str]:
    return {**os.environ, "SHRUNKEN": "1", "PYTHON": sys.executable, "OUT": str(out), "OMP_NUM_THREADS": "1",
            "TMPDIR": str(tmp), "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def _sections(fragment: str) -> dict[str, str]:
    """The fragment's ``### <step>`` sections by step name."""
    parts = re.split(r"^### (\w+)$", fragment, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def _files(out: Path) -> set[str]:
    return {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()}


def test_shrunken_device_check_runs_every_step_and_writes_its_rows(tmp_path):
    out = tmp_path / "device"
    proc = subprocess.run(["bash", "bench/device_check.sh"], cwd=ROOT, env=_env(out, tmp_path), capture_output=True,
                          text=True, timeout=1200, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert _files(out) == FILES and len(FILES) <= MAX_FILES
    fragment = (out / "RESULTS-fragment.md").read_text()
    assert re.search(r"^## Device check, \d{4}-\d\d-\d\d$", fragment, re.MULTILINE), fragment[:300]
    assert "shrunken dry run on the CPU" in fragment and "NOT measurements" in fragment
    sections = _sections(fragment)
    assert list(sections) == list(STEPS), fragment
    for name, text in sections.items():
        assert f"`{name}`: exit 0 after" in text, f"{name}: {text[:600]}"

    tests = sections["kernel_tests"]
    assert re.search(r"^\d+ passed", tests, re.MULTILINE) and "failed" not in tests, tests
    colocated = sections["colocated_fit"]
    for phase in ("ballast", "directory", "student", "teacher"):
        assert re.search(rf"^\| - \| {phase} \| \d+\.\d\d \|", colocated, re.MULTILINE), f"{phase}: {colocated}"
    for update in (1, 2):
        for phase in ("score", "fwd_bwd", "step", "sync"):
            assert re.search(rf"^\| {update} \| {phase} \| \d+\.\d\d \|", colocated, re.MULTILINE), colocated
    result = json.loads((out / "colocated_fit.json").read_text())
    assert len(result["rows"]) == 12 and result["mfu"]["student_tflops"] > 0 and result["ballast_bytes_held"] > 0
    streams = json.loads((out / "stream_interference.json").read_text())["modes"]
    assert [m["mode"] for m in streams] == ["alone", "shared", "split"] and all(m["steps"] > 0 for m in streams)
    assert streams[0]["updates"] == 0 and all(m["updates"] >= 1 for m in streams[1:])
    for mode in ("alone", "shared", "split"):
        assert re.search(rf"^\| {mode} \| \d+ \|", sections["stream_interference"], re.MULTILINE)
    for cell in (r"1\.7B \| 16 \| fwd_bwd", r"1\.7B \| 32 \| fwd_bwd", r"8B \| 32 \| fwd"):
        assert re.search(rf"^\| {cell} \|", sections["head_ops"], re.MULTILINE), sections["head_ops"]
    assert re.search(r"^\| 5,000 \| fused \| \d+\.\d{3} \|", sections["ppo_loss"], re.MULTILINE)
    probe = json.loads((out / "memory_probe.json").read_text())["cases"]
    assert [(c["checkpointing"], c["attention"]) for c in probe] == [
        (True, "flex_attention"), (True, "sdpa"), (False, "flex_attention"), (False, "sdpa")]
    assert all(c["allocated_mib"] > 0 for c in probe if c["attention"] == "sdpa"), probe
    assert sections["memory_probe"].count("\n| tiny | 2 x 256 |") == 4


def _kill_session(sid: int) -> None:
    """SIGKILL every process of session ``sid`` (the script and the step it runs, whose ``timeout`` makes a process
    group of its own)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid:  # after the command name: state, ppid, pgrp, session
            try:
                os.kill(int(stat.parent.name), signal.SIGKILL)
            except ProcessLookupError:
                pass


FINISHED_ROWS = {"kernel_tests": [r"^\d+ passed"],
                 "colocated_fit": [rf"^\| {u} \| {p} \| " for u in (1, 2)
                                   for p in ("score", "fwd_bwd", "step", "sync")],
                 "stream_interference": [rf"^\| {m} \| \d+ \|" for m in ("alone", "shared", "split")]}
"""Rows a finished step's section must hold (the steps the kill below can leave finished)."""


def test_a_killed_device_check_keeps_the_rows_of_what_finished(tmp_path):
    """Killed whole (as a device call past its limit) once its second step has printed a row: every step that
    finished keeps its rows and exit status in the fragment, the step that was running keeps the rows it printed
    (which step that is depends on how fast this machine reacts: the second or the third; on a loaded machine the
    kill may even land between two steps, and then none was running), nothing after it ran, and at most 8 files are
    there."""
    out = tmp_path / "device"
    proc = subprocess.Popen(["bash", "bench/device_check.sh"], cwd=ROOT, env=_env(out, tmp_path),
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True, text=True)
    fragment_file, deadline = out / "RESULTS-fragment.md", time.monotonic() + 900
    try:
        while "| - | teacher |" not in (fragment_file.read_text() if fragment_file.exists() else ""):
            assert proc.poll() is None and time.monotonic() < deadline, "the colocated step never printed a row"
            time.sleep(0.1)
    finally:
        _kill_session(proc.pid)
        stdout = proc.communicate(timeout=60)[0]
    assert "wrote " not in stdout  # killed before its end
    sections = _sections(fragment_file.read_text())
    names = list(sections)
    assert names in (list(STEPS[:2]), list(STEPS[:3])), names
    *finished, running = names
    if f"`{running}`: exit" in sections[running]:  # killed between two steps: the last one named had finished
        finished, running = names, None
    for name in finished:
        assert f"`{name}`: exit 0 after" in sections[name], sections[name]
        for pattern in FINISHED_ROWS[name]:
            assert re.search(pattern, sections[name], re.MULTILINE), (name, pattern, sections[name])
    if running == "colocated_fit":
        assert "| - | teacher |" in sections[running]
    assert len(_files(out)) <= MAX_FILES and _files(out) <= FILES
