"""The teacher's SFT data (Appendix C.2: "SFT on successful trajectories", "score-filtered SFT"): trajectories of
the reference cache and of candidate files, replayed, filtered by outcome and turned into B.1 full responses.

::

    trajectories = read_trajectories(benchmark, references="refs/alfworld.jsonl",
                                     candidate_files=["refs/alfworld.jsonl.teacher.jsonl"])
    kept, counts = await replay_trajectories(benchmark, pool, tasks, trajectories, min_score=None)
    samples = trajectory_examples(tokenizer, benchmark, kept, modes=[Mode.FULL_RESPONSE], max_prompt_tokens=3584,
                                  thought="short")
    write_examples(work / "examples.pt", samples)

Sources: the reference cache (``actfirst.preparation.reference_cache``: one trajectory per task) and candidate files,
JSONL of ``{"task": <key>, "actions": [...]}`` as ``actfirst.preparation.teacher_candidates.write_candidates`` writes a
source model's rollouts (``<references>.teacher.jsonl``). A candidate line may also carry ``"thoughts": [...]``, one
reasoning text (or null) per action: the source model's own thinking, which its full responses then hold; a step without
one gets a thought written from the step (``actfirst.train.sft.THOUGHTS``, as the demo's models learn). The same action
sequence of a task is kept once (with thoughts where any source has them).

Every trajectory is replayed under the run's benchmark config (the cache's transitions are slimmed, and a prompt
needs the full ones); it is kept when its replay executes every action and its final transition passes the filter:
success (``Benchmark.succeeded``, C.1) by default, or a score of at least ``min_score`` (WebShop's score filter).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from actfirst.core.user_input import ConfigError, read_jsonl
from actfirst.envs.base import Transition
from actfirst.envs.benchmarks import Benchmark
from actfirst.preparation.reference_cache import load_references, replay
from actfirst.rollout.prompts import Mode
from actfirst.rollout.sample import Sample
from actfirst.train.sft import THOUGHTS, ExpertStep, examples, replayed_steps

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class Trajectory:
    """One task's action sequence from a source, with the source's reasoning per action where it has one."""

    task: str
    actions: tuple[str, ...]
    source: str
    thoughts: tuple[str | None, ...] | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Replayed:
    """A kept trajectory: its steps as the rollouts see them, and how it ended."""

    trajectory: Trajectory
    steps: tuple[ExpertStep, ...]
    final: Transition


def read_trajectories(benchmark: Benchmark, *, references: str | None, candidate_files: Sequence[str]
                      ) -> list[Trajectory]:
    """Every source's trajectories, one per distinct (task, actions) (thoughts kept where a source has them)."""
    out: list[Trajectory] = []
    if references is not None:
        cache = load_references(references, benchmark=benchmark, allow_partial=True)
        out += [Trajectory(ref.task, tuple(ref.actions), f"references:{Path(references).name}")
                for ref in cache.values()]
    for i, path in enumerate(candidate_files):
        out += _read_candidate_file(path, f"candidate_files[{i}]")
    best: dict[tuple[str, tuple[str, ...]], Trajectory] = {}
    for t in out:
        key = (t.task, t.actions)
        if key not in best or (best[key].thoughts is None and t.thoughts is not None):
            best[key] = t
    return list(best.values())


def _read_candidate_file(path: str, key: str) -> list[Trajectory]:
    out = []
    for n, row in read_jsonl(path, key):
        actions, thoughts = row.get("actions"), row.get("thoughts")
        if "task" not in row or not isinstance(actions, list) or not all(isinstance(a, str) for a in actions):
            raise ConfigError(f"{key}={path!r}: line {n} is not a candidate (want {{\"task\": <key>, \"actions\": "
                              f"[<string>, ...]}}, optionally \"thoughts\": [<string or null>, ...])")
        if thoughts is not None and (not isinstance(thoughts, list) or len(thoughts) != len(actions)
                                     or not all(t is None or isinstance(t, str) for t in thoughts)):
            raise ConfigError(f"{key}={path!r}: line {n}: thoughts must be a list of one string (or null) per "
                              f"action ({len(actions)} actions)")
        out.append(Trajectory(str(row["task"]), tuple(actions), f"candidates:{Path(path).name}",
                              None if thoughts is None else tuple(thoughts)))
    return out


def passes(benchmark: Benchmark, final: Transition, min_score: float | None) -> bool:
    """The filter: C.1 success (``min_score`` None), else a final score of at least ``min_score``."""
    return benchmark.succeeded(final) if min_score is None else final.score >= min_score


async def replay_trajectories(benchmark: Benchmark, pool: Any, tasks: Sequence[Any],
                              trajectories: Sequence[Trajectory], *, min_score: float | None,
                              progress: bool = True) -> tuple[list[Replayed], dict[str, Any]]:
    """Replay ``trajectories`` of ``tasks`` on the workers of ``pool``; returns the kept ones, in the order given,
    and the counts per source (given, kept, failed the filter, stopped early, of an unknown task)."""
    by_key = {benchmark.task_key(t): t for t in tasks}
    counts: dict[str, Counter] = {}
    jobs = []
    for t in trajectories:
        counts.setdefault(t.source, Counter())["given"] += 1
        if t.task in by_key:
            jobs.append(t)
        else:
            counts[t.source]["unknown_task"] += 1
    started, done, total = time.monotonic(), 0, len(jobs)
    every = max(1, total // 20)

    async def one(worker, t: Trajectory) -> Replayed | None:
        nonlocal done
        executed, transitions = await replay(worker, by_key[t.task], t.actions)
        outcome = ("stopped_early" if len(executed) < len(t.actions)
                   else "filtered" if not passes(benchmark, transitions[-1], min_score) else "kept")
        counts[t.source][outcome] += 1
        done += 1
        if progress and (done % every == 0 or done == total):
            rate = done / max(1e-9, time.monotonic() - started)
            logger.info(f"[make_teacher] replayed {done}/{total}, kept {sum(c['kept'] for c in counts.values())} "
                        f"| {rate:.1f}/s")
        if outcome != "kept":
            return None
        return Replayed(t, tuple(replayed_steps(t.task, t.actions, transitions)), transitions[-1])

    replayed = await pool.map(one, jobs)
    return [r for r in replayed if r is not None], {s: dict(c) for s, c in counts.items()}


def trajectory_examples(tokenizer: Any, benchmark: Benchmark, kept: Sequence[Replayed], *, modes: Sequence[Mode],
                        max_prompt_tokens: int, thought: str) -> list[Sample]:
    """One supervised sample per step and mode (``actfirst.train.sft.examples``): the source's own thought where it
    has one, else the ``thought`` style's."""
    written = THOUGHTS[thought]
    out = []
    for r in kept:
        own = r.trajectory.thoughts

        def step_thought(b: Benchmark, step: ExpertStep, own=own) -> str:
            text = own[len(step.history)] if own is not None else None
            return text.strip() if text is not None else written(b, step)

        out += examples(tokenizer, benchmark, r.steps, modes=modes, max_prompt_tokens=max_prompt_tokens,
                        thought=step_thought)
    return out


async def build_samples(benchmark: Benchmark, tokenizer: Any, *, references: str | None,
                        candidate_files: Sequence[str], min_score: float | None, modes: Sequence[Mode],
                        max_prompt_tokens: int, thought: str, workers: int) -> tuple[list[Sample], dict[str, Any]]:
    """Read, replay and filter every source's trajectories of the training tasks, and make their samples; returns
    them with the data record (counts per source, trajectories, tasks covered, samples, tokens)."""
    from actfirst.envs.workers import EnvPool

    trajectories = read_trajectories(benchmark, references=references, candidate_files=candidate_files)
    tasks = benchmark.tasks("train")
    logger.info(f"[make_teacher] {len(trajectories)} trajectories from "
                f"{len(candidate_files) + (references is not None)} source(s) for {len(tasks)} training tasks; "
                f"replaying")
    size = max(1, min(workers, len(trajectories)))
    with EnvPool(benchmark.env_spec(), size=size) as pool:
        kept, counts = await replay_trajectories(benchmark, pool, tasks, trajectories, min_score=min_score)
    warn_unknown(counts)
    if not kept:
        raise ConfigError(f"min_score={min_score!r}: no trajectory of the sources passed the filter (per source: "
                          f"{counts})")
    samples = trajectory_examples(tokenizer, benchmark, kept, modes=modes, max_prompt_tokens=max_prompt_tokens,
                                  thought=thought)
    record = {"sources": counts, "trajectories": len(kept), "tasks_covered": len({r.trajectory.task for r in kept}),
              "training_tasks": len(tasks),
              "with_own_thoughts": sum(r.trajectory.thoughts is not None for r in kept),
              "samples": len(samples), "tokens": sum(s.num_tokens for s in samples),
              "supervised_tokens": sum(len(s.response_ids) for s in samples)}
    return samples, record


def write_examples(path: Path, samples: Sequence[Sample]) -> None:
    """The samples' token ids as one flat int32 tensor with offsets (what every rank maps), written atomically."""
    lengths = [s.num_tokens for s in samples]
    state = {"ids": torch.tensor([t for s in samples for t in s.context_ids + s.response_ids], dtype=torch.int32),
             "offsets": torch.tensor([0] + lengths, dtype=torch.int64).cumsum(0),
             "context": torch.tensor([len(s.context_ids) for s in samples], dtype=torch.int64),
             "tasks": [s.task for s in samples], "turns": [s.turn for s in samples],
             "strategies": [s.strategy for s in samples]}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


class Examples:
    """The samples of :func:`write_examples`, memory-mapped; ``sample(i)`` builds one."""

    def __init__(self, path: Path) -> None:
        self.state = torch.load(path, mmap=True, weights_only=True)
        offsets, context = self.state["offsets"], self.state["context"]
        self.lengths: list[int] = (offsets[1:] - offsets[:-1]).tolist()
        self.response_lengths: list[int] = [n - c for n, c in zip(self.lengths, context.tolist(), strict=True)]

    def __len__(self) -> int:
        return len(self.lengths)

    def sample(self, i: int) -> Sample:
        """Sample ``i``: its context and every response token supervised."""
        start, end = int(self.state["offsets"][i]), int(self.state["offsets"][i + 1])
        ids = self.state["ids"][start:end].tolist()
        c = int(self.state["context"][i])
        n = end - start - c
        return Sample(context_ids=ids[:c], response_ids=ids[c:], loss_mask=[1] * n, logprobs=[0.0] * n,
                      weight_version=0, task=self.state["tasks"][i], turn=self.state["turns"][i],
                      strategy=self.state["strategies"][i])


def warn_unknown(counts: dict[str, Any]) -> None:
    """One warning line per source whose trajectories name tasks outside the training set."""
    for source, c in counts.items():
        if c.get("unknown_task"):
            logger.warning(f"warning: {source}: {c['unknown_task']} trajectories of tasks outside the training set "
                           f"ignored")
