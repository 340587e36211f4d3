"""ALFWorld's config section (``env:`` of an ALFWorld run; ``actfirst/envs/alfworld/alfworld.yaml``)."""

from __future__ import annotations

import dataclasses
from typing import Literal

from actfirst.core.schema import check
from actfirst.envs.alfworld.data import check_real_games


@dataclasses.dataclass(kw_only=True, slots=True)
class ALFWorldConfig:
    """ALFWorld as Appendix C.1 sets it up, on its official games or on games generated offline (``games``)."""

    games: Literal["real", "generated"]
    """``real``: ALFWorld's json_2.1.1 games (C.1; ``python -m actfirst.data alfworld`` fetches them), refused when
    the config is loaded if they are missing; ``generated``: ALFRED-style games generated offline into
    ``generated_dir`` (tests and demos; not the paper's games). No default: a config says which."""
    data_dir: str | None = None
    """With ``games: real``: the folder holding ``json_2.1.1`` (None: ``$ALFWORLD_DATA``, else ALFWorld's default
    ``~/.cache/alfworld``)."""
    max_turns: int = 30
    generated_dir: str = "runs/alfworld_games"
    """With ``games: generated``: where the games are generated (and kept)."""
    games_per_type: int = 10
    """With ``games: generated``: games per task type and split."""
    seed: int = 0

    def __post_init__(self) -> None:
        check(self.games in ("real", "generated"), "games", self.games, "must be 'real' or 'generated'")
        check(self.max_turns >= 1, "max_turns", self.max_turns, "must be >= 1")
        check(self.games_per_type >= 1, "games_per_type", self.games_per_type, "must be >= 1")
        check(self.data_dir is None or self.games == "real", "data_dir", self.data_dir,
               "is read only with games: real (generated games go to generated_dir)")
        if self.games == "real":
            check_real_games(self.data_dir)
