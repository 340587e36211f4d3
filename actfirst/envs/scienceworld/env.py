"""ScienceWorld behind ``TextEnv`` (Appendix C.1): the easy preset, templates and objects for the prompts, the full
admissible-action list for validation, score = the highest score reached clipped to [0, 100], success = score >=
99.999, a turn limit (30 in training).

The admissible-action list is most of a step's cost (the JVM enumerates every valid action-object combination: 57
of 72 ms per step measured in-process on the 2-core VM, bench/RESULTS.md "ScienceWorld's admissible list on
demand"), and ScienceWorld's prompts do not show it. An episode reset with ``admissible=False`` builds it only when
asked (``admissible()``, at most once per state): its transitions carry ``admissible=None`` and a step's ``valid``
is None unless the list of the state it left was asked for. The simulator is driven through its server directly
(as ``ScienceWorldEnv.step`` does, without the list, the task description and the look/inventory calls it adds to
every step); look-around and inventory are read when ``state()`` asks. A reset loads the task once (the library's
``reset()`` after ``load()`` loads it a second time)."""

from __future__ import annotations

from actfirst.envs.base import EnvState, TextEnv
from actfirst.envs.checks import normalize_set, normalize_text
from actfirst.envs.scienceworld.simulator import JVM_OPTIONS, start_simulator
from actfirst.envs.scienceworld.tasks import ScienceWorldTask
from actfirst.envs.scienceworld.transition import ScienceWorldTransition

SUCCESS_SCORE = 99.999  # Appendix C.1


class ScienceWorldTextEnv(TextEnv):
    """One JVM-backed ScienceWorld simulator, reloaded for each task (one that cannot start raises
    ``EnvStartError``: ``actfirst.envs.scienceworld.simulator``)."""

    benchmark = "scienceworld"

    def __init__(self, max_turns: int = 30, simplification: str = "easy", jvm_options: str = JVM_OPTIONS):
        self.max_turns = max_turns
        self.simplification = simplification
        # The simulator's own step limit must never end an episode before ours does.
        self._env = start_simulator(10 * max_turns + 100, jvm_options)
        self._admissible: tuple[str, ...] | None = None  # the current state's list, once built
        self._lists = True  # whether every transition of the episode carries its list (reset's ``admissible``)
        self._best = 0.0
        self._turn = 0
        self._task_description = ""

    def gold_path(self, task: ScienceWorldTask) -> list[str]:
        """The simulator's gold action sequence for ``task`` (read after a reset: it changes between loads)."""
        self._env.load(task.task_type, task.variation, self.simplification, generateGoldPath=True)
        self._env.reset()
        return list(self._env.get_gold_action_sequence())

    def succeeds(self, task: ScienceWorldTask, actions: list[str]) -> bool:
        """Whether ``actions`` from a reset of ``task`` end the episode with success, through the simulator's own
        step only (without the admissible list, the templates and the free look/inventory calls a ``Transition``
        needs: about 15x faster; used to shorten references)."""
        self._env.load(task.task_type, task.variation, self.simplification)
        self._env.reset()
        server, best = self._env.server, 0.0
        for action in actions:
            server.step(action)
            score = int(round(100 * server.getScore()))  # as ScienceWorldEnv.step computes it
            best = max(best, min(100.0, float(score)))
            if server.getCompleted() or score < 0:
                return best >= SUCCESS_SCORE
        return False

    def reset(self, task: ScienceWorldTask, admissible: bool = True) -> ScienceWorldTransition:
        self._env.load(task.task_type, task.variation, self.simplification)  # the server's reset() is this load again
        self._best, self._turn, self._lists = 0.0, 0, admissible
        self._task_description = self._env.server.freeActionTaskDesc().removeprefix("Task Description:").strip()
        observation, done = self._execute("look around")  # what ScienceWorldEnv.reset does, as its first move
        return self._transition(observation, done=done, valid=True)

    def step(self, action: str) -> ScienceWorldTransition:
        valid = None if self._admissible is None else normalize_text(action) in normalize_set(self._admissible)
        observation, done = self._execute(action)
        self._turn += 1
        return self._transition(observation, done=done, valid=valid)

    def admissible(self) -> tuple[str, ...]:
        """The current state's full admissible-action list (built once per state)."""
        if self._admissible is None:
            self._admissible = tuple(self._env.get_valid_action_object_combinations())
        return self._admissible

    def state(self) -> EnvState:
        """C.5's state, a stand-in: ScienceWorld has no facts, so the state is the simulator's look-around and
        inventory text (free actions that consume no time, read here: nothing has moved since the last reset or
        step) and the success flag. Objects out of sight (another room, a closed container) are not in it."""
        return EnvState((self._env.look(), self._env.inventory()), self._best >= SUCCESS_SCORE)

    def _execute(self, action: str) -> tuple[str, bool]:
        """One simulator move: its observation and termination, as ``ScienceWorldEnv.step`` computes them (the
        move limit, a negative score); the best score reached is kept."""
        server = self._env.server
        observation = server.step(action)
        score = int(round(100 * server.getScore()))
        self._best = max(self._best, min(100.0, max(0.0, float(score))))
        done = server.getCompleted() or score < 0 or server.getNumMoves() > self._env.envStepLimit
        return observation, bool(done)

    def _transition(self, observation: str, *, done: bool, valid: bool | None) -> ScienceWorldTransition:
        self._admissible = None
        listed = self.admissible() if self._lists else None
        return ScienceWorldTransition(observation=observation, admissible=listed, score=self._best, done=done,
                                      won=self._best >= SUCCESS_SCORE, valid=valid, turn=self._turn,
                                      truncated=self._truncated(self._turn, done),
                                      task_description=self._task_description,
                                      templates=tuple(self._env.get_possible_actions()),
                                      objects=tuple(self._env.get_possible_objects()))

    def close(self) -> None:
        self._env.close()
