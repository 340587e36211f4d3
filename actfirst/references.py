"""Reference trajectories (Appendix C.2): one per training task, replayed and cached before training.

    python -m actfirst.references build --benchmark scienceworld --out refs/scienceworld.jsonl
    python -m actfirst.references build --benchmark alfworld --out refs/alfworld.jsonl --candidates teacher.jsonl

Candidates per task: the simulator's gold path (ScienceWorld), the planner's walkthrough stored with each game
(ALFWorld), and any JSONL of candidate action sequences (one ``{"task": <key>, "actions": [...]}`` per line, e.g.
teacher rollouts; ``<key>`` as ``task_key`` prints it). Every candidate is replayed under the training environment
configuration; successful replays are kept and the shortest is selected (WebShop: the highest score first, then
the fewest actions); ScienceWorld candidates are first shortened while their replay still succeeds.

The cache is JSONL, one line per task, holding the actions and every observation o_1 ... o_{T+1} with the
per-step information the transition checks need (ALFWorld admissible sets, ScienceWorld action templates, WebShop
clickables); it holds no tokens, so it serves every student size. ``<out>.meta.json`` records the coverage. The
build appends each finished task to ``<out>.partial`` as it goes (an interrupted build resumes from it) and
publishes ``<out>`` only at 100% coverage, unless ``--allow-partial`` is given, which the metadata then records.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from actfirst.envs.base import Transition
from actfirst.envs.checks import CheckResult, alfworld_check, scienceworld_check, webshop_check
from actfirst.envs.workers import EnvSpec, EnvWorker, WorkerDied


class PartialCacheError(RuntimeError):
    """A reference cache does not cover every task (and partial use was not asked for)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Reference:
    """One task's selected trajectory: actions a_1..a_T and transitions o_1..o_{T+1} (index 0 is the reset)."""

    task: str
    actions: list[str]
    transitions: list[Transition]
    source: str

    @property
    def score(self) -> float:
        return self.transitions[-1].score

    def check(self, benchmark: str, t: int, *, action: str, current: Transition, next: Transition,
              after_search_mismatch: bool = False) -> CheckResult:
        """The transition check (B.5) of the student's turn ``t`` (0-based: from o_{t+1} by ``action`` to
        ``next``) against this reference's turn ``t``. Past the reference's last action there is nothing to
        match: the check fails with reason "reference exhausted"."""
        if t >= len(self.actions):
            return CheckResult(False, "reference exhausted")
        ref = self.transitions[t + 1]
        common = dict(action=action, done=next.done, ref_done=ref.done, next_observation=next.observation,
                      ref_next_observation=ref.observation)
        if benchmark == "alfworld":
            return alfworld_check(**common, admissible=current.admissible, next_admissible=next.admissible,
                                  ref_next_admissible=ref.admissible)
        if benchmark == "scienceworld":
            return scienceworld_check(**common, admissible=current.admissible, next_templates=next.templates,
                                      ref_next_templates=ref.templates)
        following = self.actions[t + 1] if t + 1 < len(self.actions) else None
        return webshop_check(**common, has_search_bar=current.has_search_bar, clickables=current.admissible,
                             next_clickables=next.admissible, ref_next_clickables=ref.admissible,
                             next_has_search_bar=next.has_search_bar, ref_next_has_search_bar=ref.has_search_bar,
                             ref_action=self.actions[t], ref_following_action=following,
                             after_search_mismatch=after_search_mismatch)

    def to_json(self) -> str:
        return json.dumps({"task": self.task, "actions": self.actions, "source": self.source,
                           "transitions": [t.to_dict() for t in self.transitions]})

    @classmethod
    def from_json(cls, line: str) -> Reference:
        data = json.loads(line)
        return cls(data["task"], data["actions"], [Transition.from_dict(t) for t in data["transitions"]],
                   data["source"])


def task_key(benchmark: str, task: Any) -> str:
    """The stable name of a task in caches and candidate files."""
    if benchmark == "scienceworld":
        return f"{task.task_type}/{task.variation}"
    if benchmark == "alfworld":
        return str(Path(task.game_file).parent.name)
    return str(task.goal_idx)


def _slim(benchmark: str, transition: Transition) -> Transition:
    """What the cache keeps of a transition: ScienceWorld's admissible list and object aliases are not compared
    by the checks (B.5) and are large, so they are dropped."""
    if benchmark == "scienceworld":
        return dataclasses.replace(transition, admissible=(), objects=())
    return transition


def _succeeded(benchmark: str, transitions: Sequence[Transition]) -> bool:
    last = transitions[-1]
    return last.done and (last.score > 0 if benchmark == "webshop" else last.won)


async def replay(worker: EnvWorker, task: Any, actions: Sequence[str]) -> tuple[list[str], list[Transition]]:
    """Execute ``actions`` from a reset; stops at termination. Returns the executed actions and o_1..o_{T+1}."""
    transitions = [await worker.areset(task)]
    executed = []
    for action in actions:
        if transitions[-1].done:
            break
        transitions.append(await worker.astep(action))
        executed.append(action)
    return executed, transitions


async def shorten(worker: EnvWorker, task: Any, actions: list[str]) -> list[str]:
    """Drop actions one at a time (from the end, each tried once) while the replay still succeeds (C.2;
    ScienceWorld, through its fast success-only replay)."""
    i = len(actions) - 1
    while i >= 0:
        trial = actions[:i] + actions[i + 1:]
        if await worker.acall("succeeds", task, trial):
            actions = trial
        i -= 1
    return actions


def read_candidates(paths: Sequence[str | Path]) -> dict[str, list[tuple[str, list[str]]]]:
    """Candidate action sequences by task key from JSONL files; a malformed line is an error naming it."""
    out: dict[str, list[tuple[str, list[str]]]] = {}
    for path in paths:
        for n, line in enumerate(Path(path).read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                key, actions = str(row["task"]), row["actions"]
                if not isinstance(actions, list) or not all(isinstance(a, str) for a in actions):
                    raise TypeError("actions must be a list of strings")
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"{path}:{n}: bad candidate line ({e}): {line[:120]!r}") from e
            out.setdefault(key, []).append((f"candidates:{Path(path).name}", actions))
    return out


async def build_one(benchmark: str, worker: EnvWorker, task: Any, candidates: list[tuple[str, list[str]]],
                    shorten_candidates: bool) -> Reference | None:
    """Replay every candidate of ``task``; the selected reference, or None when none succeeds."""
    if benchmark == "scienceworld":
        candidates = [("gold", await worker.acall("gold_path", task))] + candidates
    elif benchmark == "alfworld":
        from actfirst.envs.alfworld_env import walkthrough

        candidates = [("walkthrough", walkthrough(task))] + candidates
    best = None
    for source, actions in candidates:
        executed, transitions = await replay(worker, task, actions)
        if not _succeeded(benchmark, transitions):
            continue
        valid_only = [a for a, t in zip(executed, transitions[1:]) if t.valid]
        if len(valid_only) < len(executed):  # e.g. ScienceWorld gold paths' "open door" no-ops (B.5 validity)
            trial, trial_transitions = await replay(worker, task, valid_only)
            if _succeeded(benchmark, trial_transitions):
                executed, transitions = trial, trial_transitions
        if shorten_candidates:
            executed = await shorten(worker, task, executed)
            executed, transitions = await replay(worker, task, executed)
            if not _succeeded(benchmark, transitions):
                continue
        ref = Reference(task_key(benchmark, task), executed, [_slim(benchmark, t) for t in transitions], source)
        rank = (-ref.score, len(ref.actions)) if benchmark == "webshop" else (len(ref.actions),)
        if best is None or rank < best[0]:
            best = (rank, ref)
    return best[1] if best else None


def _config_path(benchmark: str, path: str | None) -> Path:
    return Path(path) if path else Path(__file__).parents[1] / "configs" / "envs" / f"{benchmark}.yaml"


def training_tasks(benchmark: str, args: argparse.Namespace) -> list[Any]:
    """The training tasks the cache must cover (from the benchmark's config, narrowed by the CLI flags)."""
    from actfirst.config import ALFWorldConfig, ScienceWorldConfig, load_config

    if benchmark == "scienceworld":
        from actfirst.envs.scienceworld_tasks import scienceworld_max_variations, scienceworld_splits

        cfg = load_config(ScienceWorldConfig, _config_path(benchmark, args.config))
        train, _ = scienceworld_splits(cfg.train_task_types, scienceworld_max_variations())
        if args.task_types:
            unknown = sorted(set(args.task_types) - set(cfg.train_task_types))
            if unknown:
                raise ValueError(f"--task-types={unknown}: not trained task types in the ScienceWorld config")
            train = [t for t in train if t.task_type in args.task_types]
        return [t for t in train if t.variation < args.per_type] if args.per_type else train
    if benchmark == "alfworld":
        from actfirst.envs.alfworld_env import alfworld_split

        cfg = load_config(ALFWorldConfig, _config_path(benchmark, args.config))
        return alfworld_split("train", args.games or cfg.generated_dir, per_type=args.per_type or cfg.games_per_type,
                              seed=cfg.seed)
    from actfirst.envs.webshop_env import webshop_split

    tasks = webshop_split("train")
    return tasks[: args.per_type] if args.per_type else tasks


def load_references(path: str | Path, allow_partial: bool = False) -> dict[str, Reference]:
    """A cache by task key; refuses a cache below 100% coverage unless ``allow_partial``."""
    meta = json.loads(Path(f"{path}.meta.json").read_text())
    if meta["coverage"] < 1.0 and not allow_partial:
        raise PartialCacheError(f"{path}: coverage {meta['coverage']:.1%} ({meta['covered']}/{meta['tasks']}), "
                                f"missing {meta['missing'][:10]}; pass allow_partial=True to use it anyway")
    refs = [Reference.from_json(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return {r.task: r for r in refs}


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


async def _build(args: argparse.Namespace) -> int:
    benchmark = args.benchmark
    tasks = training_tasks(benchmark, args)
    keys = [task_key(benchmark, t) for t in tasks]
    if len(set(keys)) != len(keys):
        raise ValueError("task keys are not unique; check the task set")
    candidates = read_candidates(args.candidates)
    unknown = sorted(set(candidates) - set(keys))
    if unknown:
        print(f"warning: candidates for {len(unknown)} tasks outside the task set ignored, e.g. {unknown[:3]}",
              file=sys.stderr)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(f"{out}.partial")
    done: dict[str, str] = {}
    if partial.exists():
        for line in partial.read_text().splitlines():
            if line.strip():
                try:
                    done[json.loads(line)["task"]] = line
                except json.JSONDecodeError:  # a line cut by an interruption
                    pass
        _write_atomically(partial, "".join(line + "\n" for line in done.values()))  # the cut line goes
        print(f"resuming: {len(done)} of {len(tasks)} tasks already in {partial}")
    todo = [t for t, k in zip(tasks, keys) if k not in done]
    failed: dict[str, str] = {}
    queue: asyncio.Queue = asyncio.Queue()
    for task in todo:
        queue.put_nowait(task)
    spec_kwargs = {"max_turns": 10_000}  # references are replayed in full; the turn limit applies to rollouts
    workers = [EnvWorker(EnvSpec(benchmark, spec_kwargs)) for _ in range(min(args.workers, max(1, len(todo))))]
    start, finished = time.monotonic(), 0

    async def run(worker: EnvWorker) -> None:
        nonlocal finished
        with partial.open("a") as sink:
            while not queue.empty():
                task = queue.get_nowait()
                key = task_key(benchmark, task)
                try:
                    ref = await build_one(benchmark, worker, task, candidates.get(key, []), benchmark == "scienceworld"
                                          and not args.no_shorten)
                except WorkerDied as e:
                    failed[key] = f"worker died: {e}"
                    continue
                finished += 1
                if ref is None:
                    failed[key] = "no candidate replayed successfully"
                else:
                    line = ref.to_json()
                    sink.write(line + "\n")
                    sink.flush()
                    done[key] = line
                rate = finished / (time.monotonic() - start)
                print(f"[{len(done)}/{len(tasks)}] {key}: "
                      f"{'FAILED' if ref is None else f'{len(ref.actions)} actions ({ref.source})'}"
                      f" | {rate:.2f} tasks/s", flush=True)

    try:
        await asyncio.gather(*(run(w) for w in workers))
    finally:
        for w in workers:
            w.close()
    covered = [k for k in keys if k in done]
    meta = {"benchmark": benchmark, "tasks": len(keys), "covered": len(covered),
            "coverage": len(covered) / max(1, len(keys)), "missing": [k for k in keys if k not in done],
            "failures": failed, "built": time.strftime("%Y-%m-%dT%H:%M:%S"), "shortened": benchmark == "scienceworld"
            and not args.no_shorten, "candidate_files": [str(p) for p in args.candidates]}
    print(f"coverage {meta['coverage']:.1%} ({len(covered)}/{len(keys)})")
    if meta["coverage"] < 1.0 and not args.allow_partial:
        print(f"error: {len(keys) - len(covered)} tasks have no successful candidate (e.g. {meta['missing'][:5]}); "
              f"{out} not written. Add candidates (--candidates) and rerun to resume from {partial}, or pass "
              f"--allow-partial to publish a partial cache.", file=sys.stderr)
        return 2
    _write_atomically(Path(f"{out}.meta.json"), json.dumps(meta, indent=1))
    _write_atomically(out, "".join(done[k] + "\n" for k in covered))
    partial.unlink(missing_ok=True)
    print(f"wrote {out} ({len(covered)} references){' PARTIAL' if meta['coverage'] < 1.0 else ''}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m actfirst.references", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="build a reference cache for a benchmark's training tasks")
    build.add_argument("--benchmark", required=True, choices=["alfworld", "scienceworld", "webshop"])
    build.add_argument("--out", required=True, help="cache path (JSONL); metadata goes to <out>.meta.json")
    build.add_argument("--candidates", nargs="*", default=[], help="JSONL files of candidate action sequences")
    build.add_argument("--workers", type=int, default=4, help="environment worker processes")
    build.add_argument("--config", help="benchmark config (default configs/envs/<benchmark>.yaml)")
    build.add_argument("--task-types", nargs="*", help="ScienceWorld: only these trained task types")
    build.add_argument("--per-type", type=int, default=0,
                       help="ScienceWorld: variations per type; ALFWorld (generated): games per type; WebShop: goals")
    build.add_argument("--games", help="ALFWorld without $ALFWORLD_DATA: directory of generated games "
                                       "(default: the config's generated_dir)")
    build.add_argument("--no-shorten", action="store_true", help="ScienceWorld: skip candidate shortening")
    build.add_argument("--allow-partial", action="store_true", help="publish a cache below 100%% coverage")
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error(f"--workers={args.workers}: must be >= 1")
    if args.per_type < 0:
        parser.error(f"--per-type={args.per_type}: must be >= 0")
    return asyncio.run(_build(args))


if __name__ == "__main__":
    sys.exit(main())
