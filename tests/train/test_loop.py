"""The training loop end to end through its command line (a subprocess: its own vLLM engine), on generated ALFWorld
games with tiny models: the update turns (train-inference mismatch near zero, the weight version advancing in the
engine, nothing thrown away), checkpoints are written, ``--resume`` continues the same series, and the TensorBoard
directory the run's final message names holds it."""

import json
import os
import subprocess
import sys

import pytest
import yaml

from actfirst.train.metrics import scalar_metrics


@pytest.fixture(scope="module")
def run_config(tiny_run_config, tmp_path_factory):
    root = tmp_path_factory.mktemp("loop")
    cfg = {**tiny_run_config, "num_updates": 2, "probe_contexts": 2, "checkpoint_every": 1,
           "out_dir": str(root / "run")}
    cfg["rollout"] = {**cfg["rollout"], "batch_tasks": 3}  # the shared config is not changed
    path = root / "train.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path, root / "run"


def train_cli(config, *args):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "actfirst.run", "--config", str(config), *args], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def read_metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_the_loop_turns_and_resumes(run_config):
    config, run_dir = run_config
    out = train_cli(config)
    assert "update    2" in out and "done: 2 updates" in out
    rows = read_metrics(run_dir)
    assert [r["update"] for r in rows] == [1, 2]
    # Update 1 consumes samples of the engine's current weights: the trainer's log-probs match the engine's.
    assert rows[0]["mismatch_mean"] < 1e-4 and rows[0]["mismatch_max"] < 1e-3
    assert rows[0]["version_lag_mean"] == 0.0
    # The weight version advances in the engine with every update; nothing generated was thrown away.
    assert [r["weight_version"] for r in rows] == [1, 2]
    assert all(r["discarded_tokens"] == 0 and r["skipped"] == 0 for r in rows)
    assert all(r["probe/gap"] is not None and r["probe/gap"] < 0 for r in rows)
    assert all(0 <= r["clip_frac"] <= 1 and r["num_supervised"] > 0 for r in rows)
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "update_000002"
    check_wall_clock(run_dir, rows)
    check_rollout_diagnostics(rows)
    check_tensorboard(out, rows)
    check_tokens(rows, per_update=True)

    # A second run without --resume refuses to mix its metrics into this run's.
    proc = subprocess.run([sys.executable, "-m", "actfirst.run", "--config", str(config)], capture_output=True,
                          text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode != 0 and "--resume" in proc.stderr

    # --resume continues from update 3 of the same series.
    out = train_cli(config, "num_updates=3", "--resume")
    assert "resume:" in out and "update_000002" in out
    rows = read_metrics(run_dir)
    assert [r["update"] for r in rows] == [1, 2, 3]
    assert rows[2]["weight_version"] == 3
    assert rows[2]["elapsed_s"] > rows[1]["elapsed_s"]
    # n, the curricula's clock, goes on: update 3 needs a new rollout batch (one gives at most 9 of 12 samples)
    assert rows[2]["rollout/batch_n"] > rows[1]["rollout/batch_n"]
    check_wall_clock(run_dir, rows)
    check_rollout_diagnostics(rows)
    assert rows[2]["throughput/window_s"] > rows[1]["throughput/window_s"]  # the window goes on after the resume
    check_tensorboard(out, rows)  # the redone update's first events dropped, as in metrics.jsonl


def check_tensorboard(stdout, rows):
    """The TensorBoard directory the run's final message names holds every update's metrics, as metrics.jsonl does,
    and the training curve drawn at the end."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    [line] = [line for line in stdout.splitlines() if line.startswith("  tensorboard: ")]
    events = EventAccumulator(line.split()[1], size_guidance={"images": 0, "scalars": 0})
    events.Reload()
    logged = {key: {e.step: e.value for e in events.Scalars(key)} for key in events.Tags()["scalars"]}
    assert sorted(logged["loss"]) == [r["update"] for r in rows] and "probe/gap" in logged
    for row in rows:
        for key, value in scalar_metrics(row).items():
            assert logged[key][row["update"]] == pytest.approx(value, rel=1e-6), key  # float32 in the event file
    assert events.Images("training_curve")[-1].step == rows[-1]["update"]


def test_uopd_through_the_loop_keeps_its_score_buffer_across_resume(run_config, tmp_path):
    """UOPD end to end (the teacher's own engine beside the student's): its figures in every update's metrics, its
    interventions accounted for, and a resumed run that thresholds at once from the checkpointed score buffer (a lost
    buffer would make its first rollout batch random: ``uopd/random_turns``)."""
    config, _ = run_config
    cfg = yaml.safe_load(config.read_text())
    cfg.update(out_dir=str(tmp_path / "run"), rollout={**cfg["rollout"], "strategy": "uopd"},
               uopd={"rate": [0.5, 0.5], "min_scores": 4, "buffer_size": 64}, references=None)
    path = tmp_path / "uopd.yaml"
    path.write_text(yaml.safe_dump(cfg))
    train_cli(path)
    rows = read_metrics(tmp_path / "run")
    first = rows[0]
    assert first["uopd/turns"] > 0 and first["uopd/random_turns"] == first["uopd/turns"]  # an empty buffer
    assert first["uopd/score_mean"] is not None and 0 <= first["uopd/score_mean"] <= 1
    train_cli(path, "num_updates=4", "--resume")
    rows = read_metrics(tmp_path / "run")
    resumed = next(r for r in rows[2:] if r["uopd/turns"])
    assert resumed["uopd/random_turns"] == 0 and resumed["uopd/threshold_mean"] is not None
    # Every intervention either became an SFT target or was counted as a teacher response without an action (this
    # random tiny teacher rarely writes one).
    decided = [r for r in rows if r["uopd/turns"]]
    assert sum(round(r["uopd/intervention_rate"] * r["uopd/turns"]) for r in decided) > 0
    assert sum(r["sft_samples"] for r in rows) + sum(r["uopd/teacher_no_action"] for r in decided) > 0
    assert all(r["mismatch_max"] is None or r["mismatch_max"] < 1e-3 for r in rows)


def check_wall_clock(run_dir, rows):
    """C.3's figure: final (after the last metrics line: the last checkpoint and the shutdown), the probe apart
    (the sum of the updates' ``probe_s``, resumes included), and the one the run summary reports."""
    wall = json.loads((run_dir / "wall_clock.json").read_text())
    assert wall["train_s"] > rows[-1]["elapsed_s"] and wall["updates"] == rows[-1]["update"]
    assert all(r["probe_s"] > 0 for r in rows)
    assert abs(wall["probe_s"] - sum(r["probe_s"] for r in rows)) < 1e-6
    assert json.loads((run_dir / "run_summary.json").read_text())["wall_clock"]["train_s"] == wall["train_s"]
    model = wall["rollout_model"]  # the run's own rollout figures (actfirst.train.speedup.run_figures)
    assert model["batches"] == sum(r["rollout_batches"] for r in rows) > 0
    assert model["eq36_s_per_batch"] > 0 and model["measured_s_per_batch"] > 0 and model["l_full_s"] > 0


def check_rollout_diagnostics(rows):
    """C.5's throughput windows and the speedup model's figures (``actfirst.train.speedup``) in every line: the
    run's figures are over every rollout batch so far (an update that collected none keeps the run's)."""
    for r in rows:
        assert r["throughput/window_s"] > 0 and r["throughput/full_window"] > 0
        assert r["throughput/first_600s"] == pytest.approx(r["throughput/full_window"], rel=1e-6) \
            if r["throughput/window_s"] <= 600 else r["throughput/first_600s"] > 0
        assert r["speedup/run_eq36"] > 0 and r["speedup/run_measured"] > 0 and r["speedup/run_eq26"] > 0
    collected = [r for r in rows if r["rollout_batches"]]
    assert collected and all(r["speedup/eq36"] > 0 for r in collected)
    assert all(r["speedup/eq36"] is None for r in rows if not r["rollout_batches"])


def check_tokens(rows, *, per_update):
    """The tokens an update counts (``generated_tokens``) are those of the requests it counts (``queue``): the
    rollouts' only, never the probe's, the engines' check's or an evaluation's. ``per_update``: update by update
    (no request outlives a weight sync); otherwise over the run (``pipeline: inflight``: a request that spans the
    sync has tokens in two updates, its record in the second)."""
    queued = [sum(kind["tokens"] for kind in r["queue"].values()) for r in rows]
    generated = [r["generated_tokens"] for r in rows]
    assert all(r["discarded_tokens"] == 0 for r in rows)
    if per_update:
        assert generated == queued, (generated, queued)
    assert sum(generated) == sum(queued), (generated, queued)


def test_bad_config_is_named(run_config, tmp_path):
    config, _ = run_config
    bad = yaml.safe_load(config.read_text())
    bad["rollout"]["strategy"] = "actfrist"
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    proc = subprocess.run([sys.executable, "-m", "actfirst.run", "--config", str(path)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and "rollout.strategy='actfrist'" in proc.stderr


@pytest.mark.parametrize("pipeline", ["serial", "async"])
def test_a_step_trains_on_one_rollout_batch(run_config, tmp_path, pipeline):
    """003's step (``batch: rollout``, with its token-mean loss): every update trains on every sample of exactly one
    rollout batch (Vanilla: one full response per transition), nothing is dropped, and the rollout-batch counter n
    advances once per step. Serial: each update collects its own batch under its weights;
    async: the batch of update u + 1 is collected during update u (one version behind), none after the last."""
    config, _ = run_config
    train_cli(config, "batch=rollout", "loss.aggregation=token_mean", "rollout.strategy=vanilla", "references=null",
              "num_updates=3", f"pipeline={pipeline}", f"out_dir={tmp_path / 'rollout'}")
    rows = read_metrics(tmp_path / "rollout")
    print([(r["update"], r["rollout_batches"], r["transitions"], r["num_samples"]) for r in rows])
    assert all(r["buffer/dropped"] == 0 for r in rows) and rows[-1]["buffer/size"] == 0
    assert [r["weight_version"] for r in rows] == [1, 2, 3]
    if pipeline == "serial":
        assert [r["rollout/batch_n"] for r in rows] == [0, 1, 2] and all(r["rollout_batches"] == 1 for r in rows)
        assert all(r["num_samples"] == r["transitions"] > 0 for r in rows)
        assert all(r["version_lag_mean"] == 0 and r["buffer/size"] == 0 for r in rows)
    else:  # the buffer holds the next step's batch when an update ends
        assert [r["buffer/size"] for r in rows[:-1]] == [r["num_samples"] for r in rows[1:]]
        assert [r["rollout/batch_n"] for r in rows] == [1, 2, 2] and [r["rollout_batches"] for r in rows] == [2, 1, 0]
        assert sum(r["num_samples"] for r in rows) == sum(r["transitions"] for r in rows)  # none collected in vain
        assert [r["pipeline/max_staleness"] for r in rows] == [0, 1, 1]
        assert rows[0]["version_lag_mean"] == 0 and all(r["version_lag_mean"] == 1 for r in rows[1:])


def test_async_keeps_the_staleness_bound_and_the_transitions_of_serial(run_config, tmp_path):
    """``pipeline: async`` (the default) against ``serial``, same seeds, Vanilla OPD: every consumed sample is at most
    one weight version behind, the next update's rollouts are collected during the update, and the transitions per
    update are not inflated (the collection ahead is sized to what the next update lacks: over the run it gives at
    most under one episode per update more than serial; a collection of whole rollout batches, the old ``overlap``,
    doubled them here). Scoring and the update run on their own torch threads, the cores the engine does not use."""
    config, _ = run_config
    cfg = yaml.safe_load(config.read_text())
    updates, max_turns = 4, cfg["env"]["max_turns"]
    rows = {}
    for pipeline in ("serial", "async"):
        train_cli(config, f"pipeline={pipeline}", "rollout.strategy=vanilla", "references=null",
                  f"num_updates={updates}", "probe_contexts=0", f"out_dir={tmp_path / pipeline}")
        rows[pipeline] = read_metrics(tmp_path / pipeline)
    print({p: [(r["transitions"], r["rollout_batches"], r["buffer/dropped"], r["pipeline/overlapped"]) for r in rows[p]]
           for p in rows})
    cores = len(os.sched_getaffinity(0))
    for pipeline, series in rows.items():
        assert [r["weight_version"] for r in series] == list(range(1, updates + 1))
        assert all(r["pipeline"] == pipeline for r in series)
        assert all(r["pipeline/max_staleness"] <= 1 and r["version_lag_mean"] <= 1 for r in series)
        assert all(r["discarded_tokens"] == 0 and r["skipped"] == 0 for r in series)
        assert all(r["num_samples"] == cfg["batch_samples"] for r in series)
        assert all(r["cpu/engine_threads"] == 1 for r in series)  # OMP_NUM_THREADS=1 (train_cli)
        assert all(r["cpu/update_threads"] == max(1, cores - 1) for r in series)  # the cores the engine does not use
    assert not any(r["pipeline/overlapped"] for r in rows["serial"])
    assert any(r["pipeline/overlapped"] for r in rows["async"]) and not rows["async"][-1]["pipeline/overlapped"]
    serial, overlapped = (sum(r["transitions"] for r in rows[p]) for p in ("serial", "async"))
    assert overlapped <= serial + (updates - 1) * (max_turns - 1), (serial, overlapped)


def test_inflight_weights_enter_while_the_collection_runs(run_config, tmp_path):
    """``pipeline: inflight``: the new weights enter the engine as soon as the update ends, while the next update's
    collection may still run (its requests keep their tokens: ``carried_tokens``); every consumed sample is at most
    one weight version behind by its oldest token, nothing generated is thrown away, and a checkpoint waits for the
    collection in flight (the resumed run continues the series)."""
    config, _ = run_config
    out = tmp_path / "inflight"
    train_cli(config, "pipeline=inflight", "num_updates=3", "checkpoint_every=2", f"out_dir={out}")
    rows = read_metrics(out)
    print([(r["transitions"], r["carried_tokens"], r["pipeline/max_staleness"], r["pipeline/wait_s"]) for r in rows])
    assert [r["weight_version"] for r in rows] == [1, 2, 3] and all(r["pipeline"] == "inflight" for r in rows)
    assert all(r["pipeline/max_staleness"] <= 1 and 0 <= r["version_lag_mean"] <= 1 for r in rows)
    assert all(r["discarded_tokens"] == 0 and r["skipped"] == 0 and r["carried_tokens"] >= 0 for r in rows)
    assert rows[0]["mismatch_mean"] < 1e-4 and rows[0]["pipeline/max_staleness"] == 0
    train_cli(config, "pipeline=inflight", "num_updates=4", "checkpoint_every=2", f"out_dir={out}", "--resume")
    assert [r["update"] for r in read_metrics(out)] == [1, 2, 3, 4]
