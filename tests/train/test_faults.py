"""Faults of the asynchronous pipeline a whole run (``python -m actfirst.run``, its in-process vLLM engine, its
environment workers) must survive or report (issue 42): batches that keep giving no samples stop the run with one
error; an ``inflight`` run resumed from a checkpoint taken while its collection ahead ran counts what that collection
did; Ctrl-C while a collection runs ahead ends the run promptly, leaving no process and its last checkpoint intact."""

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from test_kill_resume import Run, checkpoint_state, metrics_lines
from test_loop import check_tokens

TOY = Path(__file__).parents[1] / "toy"


def fault_config(tiny_model_dir, tmp_path: Path, **changes) -> Path:
    """A run on the toy corridor (``tests/toy``), by default its fault injection whose every ``reset`` raises
    (``tests/toy/fault_injection_toy.py``); ``changes`` replace whole top-level keys."""
    cfg = {"benchmark": "fault_injection_reset", "benchmark_module": "fault_injection_toy",
           "env": {"max_turns": 3, "tasks": 4}, "teacher": str(tiny_model_dir), "references": None,
           "student": {"model": str(tiny_model_dir), "dtype": "float32", "max_model_len": 2048, "max_num_seqs": 16,
                       "max_num_batched_tokens": 4096, "kv_cache_gib": 1},
           "scheduler": {"b_max": 16}, "rollout": {"strategy": "vanilla", "batch_tasks": 2, "max_prompt_tokens": 1500},
           "batch_samples": 2, "micro_batch_tokens": 4096, "num_updates": 2, "probe_contexts": 0,
           "report_to": [], "out_dir": str(tmp_path / "run"), **changes}
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_batches_that_give_no_sample_stop_the_run_with_one_error(tiny_model_dir, tmp_path, monkeypatch):
    """Every episode fails at ``reset``: after ``max_empty_batches`` rollout batches in a row without a sample the
    run stops, within a bounded time, with one line naming the setting, the benchmark and the first failures, no
    traceback, and no process of its group left (before: it started batch after batch, forever)."""
    config = fault_config(tiny_model_dir, tmp_path)  # max_empty_batches: 8, the default
    log = tmp_path / "run.log"
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TOY), os.environ.get("PYTHONPATH", "")]))
    run = Run(config, log)
    try:
        code = run.proc.wait(timeout=240)
    except subprocess.TimeoutExpired:
        run.kill()
        pytest.fail(f"the run still collected after 240 s:\n{run.output()[-3000:]}")
    run.wait_group_gone("the error")
    out = run.output()
    assert code == 1, out[-3000:]
    [line] = [x for x in out.splitlines() if "max_empty_batches" in x]
    assert line.startswith("python -m actfirst.run: error: max_empty_batches=8: 8 rollout batches in a row gave no "
                           "sample for update 1 on rank 0 (benchmark 'fault_injection_reset'"), line
    assert "fault injection: reset of ToyTask(" in line and "Traceback" not in out, out[-3000:]


def test_an_inflight_run_resumed_while_its_collection_ran_ahead_counts_all_it_did(tiny_model_dir, tmp_path,
                                                                                    monkeypatch):
    """``pipeline: inflight`` with weights entering mid-collection (a sample spanning two versions, tokens carried
    over a weight load): a checkpoint every 2 updates, taken while the collection ahead for the next update ran past
    the weight sync (what it finished then counts in the next update's open record, which the checkpoint saves);
    SIGKILL after that checkpoint, then ``--resume``: every update logged once, and the run's totals (transitions,
    rollout batches) equal those of the same run unkilled (before: the open record was lost, and they fell short)."""
    # The toy corridor (tests/toy/toy_benchmark.py): its resets and steps take no time, so the collection ahead is
    # generation from its first instant and a request is in flight at nearly every instant of it, the weight load
    # included (on ALFWorld a reset takes about 1.7 s, longer than the tiny models' update: the load came before
    # the first request). A rollout batch (two episodes of 12 turns: the tiny student finds no valid action) feeds
    # two updates: the odd ones collect nothing ahead, the even ones one batch, which outlasts their short update:
    # update 2's checkpoint is taken while it runs past the sync.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TOY), os.environ.get("PYTHONPATH", "")]))
    changes = {"benchmark": "toy", "benchmark_module": "toy_benchmark", "env": {"max_turns": 12, "tasks": 4},
               "pipeline": "inflight", "num_updates": 4, "checkpoint_every": 2, "batch_samples": 12,
               "rollout": {"strategy": "vanilla", "batch_tasks": 2, "max_prompt_tokens": 1500,
                           "budget": {"first_stage": 120, "total": 128, "second_stage": 4, "fast_action_tokens": 6}}}
    whole = tmp_path / "whole"
    killed_dir = tmp_path / "killed"
    for out_dir in (whole, killed_dir):
        out_dir.mkdir()
    wpath, kpath = (fault_config(tiny_model_dir, d, **changes) for d in (whole, killed_dir))
    run = Run(wpath, whole / "run.log")
    run.finish()
    rows = [json.loads(line) for line in metrics_lines(whole / "run").values()]
    print([(r["transitions"], r["rollout_batches"], r["carried_tokens"], r["pipeline/spanning_samples"]) for r in rows])
    assert sum(r["carried_tokens"] for r in rows) > 0 and sum(r["pipeline/spanning_samples"] for r in rows) > 0
    check_tokens(rows, per_update=False)  # the records of the requests that finished after a sync kept

    run = Run(kpath, killed_dir / "killed.log")
    latest = killed_dir / "run" / "checkpoints" / "latest"
    while not (latest.exists() and latest.read_text().strip() == "update_000002"):
        run.check_alive()
        time.sleep(0.005)
    run.kill()
    resumed = Run(kpath, killed_dir / "resumed.log", "--resume")
    resumed.finish()
    again = [json.loads(line) for line in metrics_lines(killed_dir / "run").values()]  # each update once
    assert [r["update"] for r in again] == [1, 2, 3, 4]
    totals = [(r["total_transitions"], sum(x["rollout_batches"] for x in rs[:i + 1]))
              for rs in (rows, again) for i, r in enumerate(rs)]
    print(totals)
    assert again[-1]["total_transitions"] == rows[-1]["total_transitions"]
    assert sum(r["rollout_batches"] for r in again) == sum(r["rollout_batches"] for r in rows)
    assert sum(r["rollout_batches"] for r in again) == again[-1]["rollout/batch_n"] + 1  # every batch counted once


@pytest.mark.parametrize("stop", ["ctrl-c", "sigterm"])
def test_ctrl_c_while_a_collection_runs_ahead_ends_promptly_and_leaves_the_checkpoint(tiny_model_dir, tmp_path,
                                                                                      monkeypatch, stop):
    """Ctrl-C (SIGINT to the run's process group) or SIGTERM (to the run's process: a launcher's or a scheduler's
    stop) while the collection ahead waits on environment workers whose simulator hangs in ``step`` (the
    fault-injection toy, from update 1's checkpoint on): the run cancels the collection, lets the update finish and
    kills the workers still in a call without waiting on them, exiting within a bounded time, no process of its
    group left, update 1's checkpoint intact (before: on Ctrl-C the workers were closed first, one by one, each given
    10 s to answer a close it could not read; SIGTERM ended the run at once, leaving the hung workers behind)."""
    flag = tmp_path / "hang"
    config = fault_config(tiny_model_dir, tmp_path, benchmark="fault_injection_hang", num_updates=6, batch_samples=8,
                          checkpoint_every=1, env={"max_turns": 3, "tasks": 4, "hang_flag": str(flag)},
                          rollout={"strategy": "vanilla", "batch_tasks": 4, "max_prompt_tokens": 1500})
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TOY), os.environ.get("PYTHONPATH", "")]))
    run = Run(config, tmp_path / "run.log")
    out_dir = tmp_path / "run"
    latest = out_dir / "checkpoints" / "latest"
    while not (latest.exists() and latest.read_text().strip() == "update_000001"):
        run.check_alive()
        time.sleep(0.005)
    flag.touch()  # every step from now on hangs: the collection ahead waits on its workers
    time.sleep(3)
    run.check_alive()
    if stop == "ctrl-c":
        os.killpg(run.pgid, signal.SIGINT)  # as a terminal's: the whole foreground group
    else:
        run.proc.send_signal(signal.SIGTERM)
    t0 = time.perf_counter()
    try:
        code = run.proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        run.kill()
        pytest.fail(f"still running 120 s after {stop}:\n{run.output()[-3000:]}")
    took = time.perf_counter() - t0
    print(f"exited {code} {took:.1f} s after {stop}")
    try:
        run.wait_group_gone(stop, timeout=10)
    finally:  # what a failure leaves (hung workers sleep for an hour) ends here
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.pgid, signal.SIGKILL)
    assert code != 0 and took < 20, (code, took, run.output()[-3000:])
    assert checkpoint_state(out_dir)["update"] == 1
    if stop == "ctrl-c":  # one line, as a shell's: no traceback
        assert code == 130 and "python -m actfirst.run: interrupted" in run.output(), run.output()[-3000:]
        assert "Traceback" not in run.output(), run.output()[-3000:]
