"""ScienceWorld splits (Appendix C.1) against the real simulator's task list and variation counts."""

from pathlib import Path

import pytest

from actfirst.core.schema import load_config
from actfirst.core.user_input import ConfigError
from actfirst.envs.scienceworld.config import ScienceWorldConfig
from actfirst.envs.scienceworld.tasks import TASK_TYPES, scienceworld_splits

CONFIG = Path(__file__).parents[2] / "actfirst" / "envs" / "scienceworld" / "scienceworld.yaml"


@pytest.fixture(scope="module")
def max_variations():
    from scienceworld import ScienceWorldEnv

    env = ScienceWorldEnv("", envStepLimit=10)
    try:
        assert tuple(sorted(env.get_task_names())) == tuple(sorted(TASK_TYPES))
        return {t: env.get_max_variations(t) for t in TASK_TYPES}
    finally:
        env.close()


def test_paper_split_sizes(max_variations):
    cfg = load_config(ScienceWorldConfig, CONFIG)
    assert len(cfg.train_task_types) == 17
    train, evaluation = scienceworld_splits(cfg.train_task_types, max_variations)
    assert len(evaluation) == 150
    assert sum(t.task_type in cfg.train_task_types for t in evaluation) == 85  # 17 x 5
    assert sum(t.task_type not in cfg.train_task_types for t in evaluation) == 65  # 13 x 5
    assert len(train) == sum(max_variations[t] // 2 for t in cfg.train_task_types)
    assert not set(train) & set(evaluation)
    boil = sorted(t.variation for t in train if t.task_type == "boil")
    assert boil == list(range(max_variations["boil"] // 2))  # the first half
    assert sorted(t.variation for t in evaluation if t.task_type == "boil") == list(
        range(max_variations["boil"] - 5, max_variations["boil"]))  # the last five


def test_bad_task_types_are_rejected(max_variations):
    with pytest.raises(ConfigError, match="train_task_types=\\['boiling'\\]"):
        load_config(ScienceWorldConfig, CONFIG, ["train_task_types=[boil, boiling]"])
    with pytest.raises(ConfigError, match="duplicates"):
        load_config(ScienceWorldConfig, CONFIG, ["train_task_types=[boil, boil]"])
    with pytest.raises(ValueError, match="max_variations"):
        scienceworld_splits(["boil"], {"boil": 30})
