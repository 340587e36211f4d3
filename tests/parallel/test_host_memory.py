"""Host memory for the environment workers: each shipped benchmark's measured MiB per worker times the workers a
stage runs on the node, refused when the node cannot hold them (before anything starts), a warning when more than
is free now."""

from pathlib import Path

import pytest

from actfirst.core.config import TrainConfig
from actfirst.core.schema import load_config, paths_unchecked
from actfirst.core.user_input import ConfigError
from actfirst.envs.benchmarks import BENCHMARKS
from actfirst.parallel.host_memory import check_host_memory, eval_worker_stage, run_worker_stages

ROOT = Path(__file__).parents[2]
GIB = 2**30


def paper(benchmark: str = "alfworld", *overrides: str) -> TrainConfig:
    with paths_unchecked():
        return load_config(TrainConfig, ROOT / "configs" / "train" / benchmark / "qwen3-1.7b.yaml",
                           ["env=null", *overrides])


def test_the_paper_alfworld_preparation_on_8_ranks_needs_its_workers_times_the_measured_mib():
    cfg = paper()
    prepare, train = run_worker_stages(cfg, 8, preparing=True)
    assert (prepare.workers, train.workers) == (8 * cfg.scheduler.b_max, cfg.rollout.batch_tasks)
    assert prepare.gib == pytest.approx(8 * 256 * BENCHMARKS["alfworld"].worker_mib / 1024)
    assert prepare.line() == ("preparation: the teacher's rollouts: 2,048 alfworld workers (256 per rank x 8 rank(s), "
                              f"scheduler.b_max=256) x 103 MiB = {2048 * 103 / 1024:,.1f} GiB")
    assert [s.key for s in run_worker_stages(cfg, 8, preparing=False)] == ["rollout.tasks_per_rank"]
    # a node of 256 GiB with 100 free: a warning; of 24 GiB: refused by key, with what fits
    (warning,) = check_host_memory([prepare, train], (256 * GIB, 100 * GIB))
    assert warning.startswith("warning: preparation: the teacher's rollouts: 2,048 alfworld workers")
    assert warning.endswith("more than the 100.0 GiB of host memory free now (of 256.0 GiB)")
    assert check_host_memory([prepare, train], (256 * GIB, 250 * GIB)) == []
    with pytest.raises(ConfigError, match=r"^scheduler\.b_max=256: preparation: .* more than this node's 24\.0 GiB "
                                          r"of host memory; 29 workers per rank fit"):
        check_host_memory([prepare, train], (24 * GIB, 20 * GIB))


def test_scienceworld_and_the_unmeasured_benchmarks():
    cfg = paper("scienceworld", "rollout.tasks_per_rank=null")
    (train,) = run_worker_stages(cfg, 4, preparing=False)
    assert (train.key, train.per_rank, train.workers) == ("rollout.batch_tasks", cfg.rollout.batch_tasks // 4,
                                                          cfg.rollout.batch_tasks)
    assert BENCHMARKS["scienceworld"].worker_mib > BENCHMARKS["alfworld"].worker_mib  # its JVM
    evaluation = eval_worker_stage("webshop", 64, 8)
    assert evaluation.gib is None and "(MiB per worker not measured)" in evaluation.line()
    assert check_host_memory([evaluation], (GIB, GIB)) == []


def test_the_run_refuses_before_anything_starts(tmp_path, capsys, monkeypatch):
    """The CPU demo's config (its shipped models) with the teacher's rollouts still to play at a b_max no machine
    holds: one line, exit status 2, before preparation writes anything."""
    from actfirst.run import main

    monkeypatch.chdir(ROOT)
    status = main([f"out_dir={tmp_path / 'run'}", "prepare.build_models=null", f"references={tmp_path / 'refs.jsonl'}",
                   "prepare.teacher_rollouts=1", "scheduler.b_max=1000000", "student.max_num_seqs=1000000"])
    err = capsys.readouterr().err.strip()
    assert status == 2 and err.startswith("python -m actfirst.run: error: scheduler.b_max=1000000: preparation: ")
    assert "of host memory;" in err and not (tmp_path / "run").exists() and not list(tmp_path.iterdir())
