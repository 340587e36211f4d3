"""ALFWorld behind ``TextEnv`` (Appendix C.1), played through TextWorld's PDDL engine as ALFWorld plays it.

Tasks come from ``$ALFWORLD_DATA/json_2.1.1/{train,valid_seen,valid_unseen}`` when the user has the download, and
otherwise from games generated offline by ``actfirst.envs.alfworld.games``. Admissible actions exclude help; a
turn limit (30) truncates the episode; success is the game's won flag, score 100 or 0.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from actfirst.envs.base import EnvState, TextEnv, Transition
from actfirst.envs.checks import normalize_set, normalize_text
from actfirst.envs.startup import import_simulator

SPLITS = ("train", "valid_seen", "valid_unseen")
_HEADER = "-= Welcome to TextWorld, ALFRED! =-"
_TASK = "Your task is to: "


@dataclasses.dataclass(frozen=True, slots=True, order=True)
class ALFWorldTask:
    """One ALFWorld game: its ``game.tw-pddl`` file and ALFRED task type."""

    game_file: str
    task_type: str


def _read_task(game_file: Path) -> ALFWorldTask | None:
    traj = game_file.parent / "traj_data.json"
    if not traj.exists():
        return None
    if not json.loads(game_file.read_text()).get("solvable"):
        return None
    return ALFWorldTask(str(game_file), json.loads(traj.read_text())["task_type"])


def alfworld_tasks(root: str | Path) -> list[ALFWorldTask]:
    """Every solvable game under ``root`` (ALFWorld's own filter: movable-receptacle and sliced tasks skipped)."""
    tasks = []
    for game_file in sorted(Path(root).rglob("game.tw-pddl")):
        if "movable" in str(game_file.parent) or "Sliced" in str(game_file.parent):
            continue
        task = _read_task(game_file)
        if task is not None:
            tasks.append(task)
    return tasks


def walkthrough(task: ALFWorldTask) -> list[str]:
    """The planner's solution stored in the game file (ALFWorld's "walkthrough"; empty when absent)."""
    return list(json.loads(Path(task.game_file).read_text()).get("walkthrough") or [])


def split_intro(feedback: str) -> tuple[str, str]:
    """(first observation, task description) from ALFWorld's intro text (header dropped)."""
    text = feedback.replace(_HEADER, "").strip()
    cut = text.rfind(_TASK)
    if cut < 0:
        return text, ""
    return text[:cut].strip(), text[cut + len(_TASK):].strip()


class ALFWorldTextEnv(TextEnv):
    """One TextWorld PDDL environment, loading a game per reset (a ``textworld`` or ``alfworld`` package that does
    not import raises ``EnvStartError``)."""

    benchmark = "alfworld"

    def __init__(self, max_turns: int = 30):
        textworld = import_simulator(self.benchmark, "textworld")
        pddl = import_simulator(self.benchmark, "textworld.envs").PddlEnv
        demangler = import_simulator(self.benchmark, "alfworld.agents.environment.alfred_tw_env").AlfredDemangler

        self.max_turns = max_turns
        infos = textworld.EnvInfos(admissible_commands=True, won=True)
        self._env = demangler(pddl(infos), shuffle=False)
        self._admissible: tuple[str, ...] = ()
        self._turn = 0
        self._task_description = ""
        self._loaded = ""
        self._state = None  # the game state of the last reset or step

    def reset(self, task: ALFWorldTask, admissible: bool = True) -> Transition:
        if task.game_file != self._loaded:  # parsing a game's domain and grammar takes about a second
            self._env.load(task.game_file)
            self._loaded = task.game_file
        state = self._env.reset()
        self._turn = 0
        observation, self._task_description = split_intro(state["feedback"])
        return self._transition(state, observation, done=False, valid=True)

    def step(self, action: str) -> Transition:
        valid = normalize_text(action) in normalize_set(self._admissible)
        state, _, done = self._env.step(action)
        self._turn += 1
        return self._transition(state, state["feedback"], done=bool(done), valid=valid)

    def state(self) -> EnvState:
        """The positive facts of the PDDL state and the won flag (C.5). TextWorld's PddlEnv gathers the facts into
        every game state it returns (``_facts``, by object id; ``EnvInfos(facts=True)`` adds the same facts under
        display names), so reading them costs nothing; its facts keep the negated effects of executed actions
        (``not_...``), which are left out."""
        facts = sorted(str(fact) for fact in self._state["_facts"] if not fact.is_negation)
        return EnvState(tuple(facts), bool(self._state["won"]))

    def _transition(self, state, observation: str, *, done: bool, valid: bool) -> Transition:
        self._state = state
        self._admissible = tuple(a for a in state["admissible_commands"] if normalize_text(a) != "help")
        won = bool(state["won"])
        return Transition(observation=observation.strip(), admissible=self._admissible, score=100.0 if won else 0.0,
                          done=done, won=won, valid=valid, turn=self._turn, truncated=self._truncated(self._turn, done),
                          task_description=self._task_description)

    def close(self) -> None:
        self._env.close()
