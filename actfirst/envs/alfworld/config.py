"""ALFWorld's config section (``env:`` of an ALFWorld run; ``configs/envs/alfworld.yaml``)."""

from __future__ import annotations

import dataclasses

from actfirst.schema import check


@dataclasses.dataclass(kw_only=True, slots=True)
class ALFWorldConfig:
    """ALFWorld as Appendix C.1 sets it up: $ALFWORLD_DATA's json_2.1.1 splits when set, else generated games."""

    max_turns: int = 30
    generated_dir: str = "runs/alfworld_games"
    """Where generated games go when $ALFWORLD_DATA is not set."""
    games_per_type: int = 10
    """Generated games per task type and split."""
    seed: int = 0

    def __post_init__(self) -> None:
        check(self.max_turns >= 1, "max_turns", self.max_turns, "must be >= 1")
        check(self.games_per_type >= 1, "games_per_type", self.games_per_type, "must be >= 1")
