"""Search (UOPD, Appendix D.1, E.3) as one benchmark: its config, environment (a client of a retrieval server), its
response format and prompt (the observation is the whole prompt: no B.1 templates), registered as ``search``."""

from __future__ import annotations

from actfirst.envs.base import TextEnv, Transition
from actfirst.envs.benchmarks import Benchmark, register_benchmark
from actfirst.envs.search.config import SearchConfig
from actfirst.envs.search.data import SearchData
from actfirst.envs.search.text import SEARCH_RESPONSES


@register_benchmark
class SearchBenchmark(Benchmark):
    """Search (UOPD, D.1, D.5, E.3): Search-R1's questions, answered with a retrieval tool; scored by exact match.

    Think-then-act only: there are no B.1 next-action or inverse-dynamics templates and no reference trajectories,
    so the B.5 checks and the reference builder do not apply."""

    name = "search"
    config_class = SearchConfig
    data = SearchData()
    response_format = SEARCH_RESPONSES
    prompt_is_observation = True
    forced_answer_turn = True

    def make_env(self) -> TextEnv:
        from actfirst.envs.search.env import SearchTextEnv

        return SearchTextEnv(self.config)

    def prompt_fields(self, current: Transition) -> dict[str, str]:
        """None: the observation is the whole prompt (E.3)."""
        return {}

    def valid_action(self, action: str, current: Transition) -> bool:
        """A complete search or answer (E.3)."""
        return SEARCH_RESPONSES.has_action(action)

    def task_key(self, task) -> str:
        return task.key

    def task_type(self, task) -> str:
        """The question's ``data_source`` (nq, hotpotqa, 2wikimultihopqa, musique, bamboogle): EM per dataset."""
        return task.data_source

    def _tasks(self, split: str) -> list:
        """train: ``train_file``; eval: ``test_files`` (D.1)."""
        from actfirst.envs.search.env import load_questions

        if split == "train":
            return load_questions([self.config.train_file], "train_file")
        return load_questions(self.config.test_files, "test_files")
