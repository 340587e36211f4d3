"""``python -m actfirst.compare`` end to end on the tiny training run (generated ALFWorld games, tiny models): 2
strategies x 2 seeds x 2 updates, each run in its own process in ABBA order, the threshold fixed before any run
trained, every checkpoint evaluated after training on the same episodes (a reloaded engine plays as a fresh one),
threads and phases recorded, the paired interval from the runs' own times; ``--resume`` redoes nothing."""

import json
import math
import os
import subprocess
import sys

import yaml

from actfirst.evaluation.report import load_episodes
from actfirst.evaluation.stats import paired_ratio

STRATEGIES = ("vanilla", "actfirst")


def compare_cli(*args):
    proc = subprocess.run([sys.executable, "-m", "actfirst.compare", *args], capture_output=True, text=True,
                          timeout=3000, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc.stdout


def test_compare_end_to_end(tiny_run_config, tmp_path):
    cfg = {**tiny_run_config, "num_updates": 2, "probe_contexts": 0,
           "evaluation": {"tasks": 2, "seeds": [42], "max_in_flight": 2},
           "compare": {"threshold": 50.0, "checkpoint_every": 1}}
    cfg["rollout"] = {**cfg["rollout"], "budget": {**cfg["rollout"]["budget"], "eval_first_stage": 12,
                                                     "eval_total": 16}}  # the shared config is not changed
    config = tmp_path / "train.yaml"
    config.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "cmp"
    printed = compare_cli("--config", str(config), "--strategies", *STRATEGIES, "--seeds", "0", "1", "--out", str(out))

    # ABBA: seed 0 vanilla then actfirst, seed 1 the other way round; each run its own process (its own session).
    started = [line.split(" -> ")[0] for line in printed.splitlines() if line.startswith("== ")]
    assert started == ["== Vanilla OPD (vanilla), seed 0", "== ActFirst-OPD (actfirst), seed 0",
                       "== ActFirst-OPD (actfirst), seed 1", "== Vanilla OPD (vanilla), seed 1"]
    runs = {(s, k): out / s / f"seed{k}" for s in STRATEGIES for k in (0, 1)}
    first_start = {key: json.loads((path / "clock.jsonl").read_text().splitlines()[0])["started"]
                   for key, path in runs.items()}
    assert first_start[("actfirst", 1)] < first_start[("vanilla", 1)]  # the order in time too
    fixed = json.loads((out / "threshold.json").read_text())
    assert fixed["threshold"] == 50.0 and fixed["fixed_at"] < min(first_start.values())  # before any training
    assert fixed["warm_start"]["update"] == 0 and fixed["warm_start"]["summary"]["episodes"] == 2

    saved = json.loads((out / "comparison.json").read_text())
    by_strategy = {m["strategy"]: m for m in saved["methods"]}
    for (strategy, seed), path in runs.items():
        evals = [json.loads(line) for line in (path / "checkpoint_evals.jsonl").read_text().splitlines()]
        metrics = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
        assert [r["update"] for r in evals] == [1, 2]  # every checkpoint, evaluated after training
        assert [r["elapsed_s"] for r in evals] == [r["elapsed_s"] for r in metrics]  # the training time at it
        assert all(r["summary"]["episodes"] == 2 for r in evals)
        assert not (path / "evals.jsonl").exists()  # no evaluation inside the training time
        summary = json.loads((path / "run_summary.json").read_text())
        assert summary["threads"]["training"]["torch_threads"] == 1
        assert summary["threads"]["training"]["OMP_NUM_THREADS"] == "1"
        row = next(r for r in by_strategy[strategy]["runs"] if r["seed"] == seed)
        assert row["phases_s"]["update_s"] == math.fsum(r["update_s"] for r in metrics)
        assert [p["update"] for p in row["curve"]] == [0, 1, 2] and row["curve"][0]["elapsed_s"] == 0.0
    # Identical episodes: each checkpoint's evaluation plays the same (seed, task) episodes as the warm start's.
    warm = load_episodes(fixed["warm_start"]["report"])
    reloaded = json.loads((runs[("actfirst", 0)] / "checkpoint_evals.jsonl").read_text().splitlines()[1])
    assert [(e.seed, e.task) for e in load_episodes(reloaded["report"])] == [(e.seed, e.task) for e in warm]

    # The paired speedup from the runs' own final times, by hand.
    train_s = {key: json.loads((path / "wall_clock.json").read_text())["train_s"] for key, path in runs.items()}
    logs = [math.log(train_s[("vanilla", k)] / train_s[("actfirst", k)]) for k in (0, 1)]
    actfirst = by_strategy["actfirst"]
    assert math.isclose(actfirst["speedup"], math.exp(sum(logs) / 2), rel_tol=1e-12)
    assert actfirst["speedup_ci95"] == paired_ratio({k: train_s[("vanilla", k)] for k in (0, 1)},
                                                    {k: train_s[("actfirst", k)] for k in (0, 1)})["ci95"]
    assert (out / "curves.png").read_bytes()[:4] == b"\x89PNG"

    # A model loaded into the running engine plays as a fresh engine of it does.
    fresh = tmp_path / "fresh.json"
    proc = subprocess.run([sys.executable, "-m", "actfirst.eval", "--config", str(config), "--checkpoint",
                           reloaded["model"], "--out", str(fresh)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [(e.actions, e.response_hashes) for e in load_episodes(fresh)] == \
        [(e.actions, e.response_hashes) for e in load_episodes(reloaded["report"])]

    # --resume: every run finished and every checkpoint evaluated, so nothing is done again.
    before = {key: (path / "checkpoint_evals.jsonl").read_text() for key, path in runs.items()}
    printed = compare_cli("--config", str(config), "--strategies", *STRATEGIES, "--seeds", "0", "1", "--out", str(out),
                          "--resume")
    assert printed.count("not trained again") == 4 and " -> " not in printed
    assert {key: (path / "checkpoint_evals.jsonl").read_text() for key, path in runs.items()} == before
