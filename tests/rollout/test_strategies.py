"""Strategies declare themselves (``actfirst.rollout.strategies``): a class defined here, in the test only, is in
every list of strategies and accepted by the configs; the registry refuses a second name or a missing label; the
built-in strategies declare what the paper's methods need. What each strategy executes on a real engine:
``test_runner.py``."""

from pathlib import Path

import pytest

from actfirst.compare import parse_args
from actfirst.comparison.tables import METHODS
from actfirst.core.config import ConfigError, RolloutConfig, TrainConfig
from actfirst.core.schema import check, load_config
from actfirst.envs.checks import CheckResult
from actfirst.rollout.strategies import (
    STRATEGIES,
    ActionSource,
    Guidance,
    RolloutStrategy,
    TCODConfig,
    make_strategy,
)

pytestmark = pytest.mark.usefixtures("alfworld_data")  # configs with games: real load

CONFIGS = Path(__file__).parents[2] / "configs" / "train"


@pytest.fixture
def every_other_turn():
    """A strategy defined only here: NAP fast actions on even turns, full responses on odd ones, reading the
    ``tcod`` section for a limit of its own; removed from the registry afterwards."""

    class EveryOtherTurn(RolloutStrategy):
        name = "every_other_turn"
        label = "Every Other Turn"
        fast_actions = True
        section = "tcod"

        def __init__(self, tcod: TCODConfig) -> None:
            self.tcod = tcod

        @classmethod
        def from_section(cls, section: TCODConfig | None) -> RolloutStrategy:
            return cls(section or TCODConfig())

        @classmethod
        def check_config(cls, cfg) -> None:
            check(cfg.tcod.max_turns != 1, "tcod.max_turns", cfg.tcod.max_turns, "must not be 1 for every_other_turn")

        def source(self, guidance: Guidance, turn: int, reference_length: int) -> ActionSource:
            return ActionSource.NEXT_ACTION if turn % 2 == 0 else ActionSource.FULL_RESPONSE

    yield EveryOtherTurn
    del STRATEGIES[EveryOtherTurn.name]


def test_a_strategy_defined_in_a_test_is_in_every_list_and_config(every_other_turn, paths):
    name = every_other_turn.name
    assert STRATEGIES[name] is every_other_turn and list(STRATEGIES)[-1] == name
    assert METHODS[name] == "Every Other Turn" and list(METHODS) == list(STRATEGIES)
    assert parse_args(["--strategies", "vanilla", name]).strategies == ["vanilla", name]
    rollout = RolloutConfig(strategy=name)
    assert not rollout.uses_references
    cfg = load_config(TrainConfig, CONFIGS / "alfworld" / "qwen3-1.7b.yaml",
                      paths + [f"rollout.strategy={name}", "tcod.max_turns=4"])
    assert cfg.rollout.strategy == name and cfg.strategy_section is cfg.tcod
    strategy = make_strategy(name, cfg.strategy_section)
    assert isinstance(strategy, every_other_turn) and strategy.tcod.max_turns == 4
    assert [strategy.source(strategy.start(), t, 0) for t in range(3)] == [
        ActionSource.NEXT_ACTION, ActionSource.FULL_RESPONSE, ActionSource.NEXT_ACTION]
    assert make_strategy(name).tcod == TCODConfig()
    # its own check, and the benchmark check reading its fast_actions
    with pytest.raises(ConfigError, match=r"tcod\.max_turns=1: must not be 1 for every_other_turn"):
        load_config(TrainConfig, CONFIGS / "alfworld" / "qwen3-1.7b.yaml",
                    paths + [f"rollout.strategy={name}", "tcod.max_turns=1"])
    with pytest.raises(ConfigError, match=rf"rollout.strategy='{name}': needs .* benchmark 'search' does not have; "
                                          r"use vanilla, f2b or uopd$"):
        load_config(TrainConfig, CONFIGS / "search" / "opd-qwen2.5-1.5b.yaml",
                    paths[:2] + [f"rollout.strategy={name}"])


def test_an_unknown_strategy_is_refused_by_name():
    with pytest.raises(ConfigError, match=r"strategy='actfist': must be one of \['vanilla', 'actfirst', 'no_id'"):
        RolloutConfig(strategy="actfist")
    with pytest.raises(ValueError, match=r"rollout.strategy='actfist': not one of \['vanilla'"):
        make_strategy("actfist")


def test_the_registry_refuses_a_second_name_and_a_missing_label():
    with pytest.raises(TypeError, match="rollout.strategy 'vanilla' is already ThinkThenAct"):
        type("Vanilla2", (RolloutStrategy,), {"name": "vanilla", "label": "Vanilla again"})
    with pytest.raises(TypeError, match=r"Unlabelled \(rollout.strategy 'unlabelled'\): declares no label"):
        type("Unlabelled", (RolloutStrategy,), {"name": "unlabelled"})
    assert "unlabelled" not in STRATEGIES and STRATEGIES["vanilla"].__name__ == "ThinkThenAct"


def test_the_methods_declare_what_they_need():
    """The paper's methods, what they read and where they run (000 Sec. 5.3; 003 Sec. 4.2, Appendix D.3)."""
    assert list(STRATEGIES) == ["vanilla", "actfirst", "no_id", "no_nap", "ref_prefix_50", "ref_prefix_100", "f2b",
                                "b2f", "uopd"]
    assert [n for n, c in STRATEGIES.items() if c.fast_actions] == ["actfirst", "no_id", "no_nap", "ref_prefix_50",
                                                                    "ref_prefix_100"]
    assert [n for n, c in STRATEGIES.items() if c.uses_references] == ["actfirst", "no_nap", "ref_prefix_50",
                                                                       "ref_prefix_100", "b2f"]
    assert {n: c.section for n, c in STRATEGIES.items() if c.section} == {"f2b": "tcod", "b2f": "tcod",
                                                                          "uopd": "uopd"}
    assert [n for n, c in STRATEGIES.items() if c.intervenes] == ["uopd"]
    for strategy in STRATEGIES.values():  # every declared section is a TrainConfig section of its own
        assert strategy.section is None or strategy.section in TrainConfig.__dataclass_fields__


def test_hooks_of_the_ablations():
    """w/o NAP fallback ends the episode at a failed check where ActFirst-OPD goes on with NAP; B2F's replayed
    prefix gets no sample; Reference-Prefix Replay (50%) rounds up."""
    failed = CheckResult(passed=False, reason="observation differs")
    for name, goes_on in (("actfirst", True), ("no_nap", False)):
        strategy = make_strategy(name)
        guidance = strategy.start()
        assert guidance.active and strategy.source(guidance, 0, 3) is ActionSource.INVERSE_DYNAMICS
        assert strategy.after_check(guidance, 0, failed) is goes_on
        assert not guidance.active and guidance.fallback_turn == 0
        assert strategy.source(guidance, 1, 3) is ActionSource.NEXT_ACTION
    b2f = make_strategy("b2f", TCODConfig(eta=5))
    assert not b2f.samples(ActionSource.REFERENCE) and b2f.samples(ActionSource.FULL_RESPONSE)
    assert make_strategy("vanilla").samples(ActionSource.REFERENCE)
    half = make_strategy("ref_prefix_50")
    assert [half.source(half.start(), t, 3) for t in range(3)] == [ActionSource.REFERENCE, ActionSource.REFERENCE,
                                                                   ActionSource.NEXT_ACTION]
