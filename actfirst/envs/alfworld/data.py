"""ALFWorld's official games (C.1): where they are looked for, the refusal when they are missing, and what
``python -m actfirst.data alfworld`` fetches.

The data folder is the first of: the config's ``data_dir``, ``$ALFWORLD_DATA``, ALFWorld's own default
``~/.cache/alfworld`` (where ``alfworld-download`` puts it). It must hold ``json_2.1.1/{train,valid_seen,
valid_unseen}``, each with games (``game.tw-pddl`` files). The fetch takes the archives ``alfworld-download`` takes
(its release URLs, through pooch), into the same folder, and its ``logic/`` files.
"""

from __future__ import annotations

import importlib.resources
import os
from pathlib import Path

from actfirst.core.files import write_atomically
from actfirst.core.user_input import ConfigError
from actfirst.preparation.downloads import BenchmarkData, Source, UrlFile

SPLITS = ("train", "valid_seen", "valid_unseen")
GAMES_FOLDER = "json_2.1.1"
LOGIC = "logic"
"""Beside the games: ALFWorld's PDDL domain and grammar (``alfworld-download`` copies them there)."""
LOGIC_FILES = ("alfred.pddl", "alfred.twl2")
DEFAULT_DATA_DIR = "~/.cache/alfworld"
"""ALFWorld's own default (``alfworld.info``), used when neither ``data_dir`` nor ``$ALFWORLD_DATA`` is set."""
FETCH_COMMAND = "python -m actfirst.data alfworld"
_RELEASES = "https://github.com/alfworld/alfworld/releases/download"


def data_dir(configured: str | None) -> tuple[Path, str]:
    """The ALFWorld data folder and where it came from (``data_dir``, ``$ALFWORLD_DATA`` or ALFWorld's default)."""
    if configured is not None:
        return Path(configured).expanduser(), f"data_dir={configured!r}"
    if os.environ.get("ALFWORLD_DATA"):
        return Path(os.environ["ALFWORLD_DATA"]).expanduser(), f"$ALFWORLD_DATA={os.environ['ALFWORLD_DATA']!r}"
    return (Path(DEFAULT_DATA_DIR).expanduser(),
            f"ALFWorld's default {DEFAULT_DATA_DIR} (no data_dir nor $ALFWORLD_DATA)")


def split_dir(configured: str | None, split: str) -> Path:
    """The folder of ``split``'s official games."""
    return data_dir(configured)[0] / GAMES_FOLDER / split


def check_real_games(configured: str | None) -> None:
    """Refuse (one line: where it looked and the command that fetches them) unless every split folder holds a game."""
    root, source = data_dir(configured)
    for split in SPLITS:
        folder = root / GAMES_FOLDER / split
        if not folder.is_dir() or next(folder.rglob("game.tw-pddl"), None) is None:
            what = "no such folder" if not folder.is_dir() else "no game.tw-pddl in it"
            raise ConfigError(f"games='real': no ALFWorld games at {folder} ({what}; the data folder from {source}); "
                              f"fetch them with: {FETCH_COMMAND} (or set data_dir to where they are, or games: "
                              f"generated for games generated offline, not the paper's)")


class ALFWorldData(BenchmarkData):
    """ALFWorld's json_2.1.1 games: the trajectory files, their PDDL and the TextWorld games, the release assets
    ``alfworld-download`` of the pinned alfworld (0.4.2) takes, by their sizes as GitHub's release API lists them
    (its MaskRCNN detector, for the visual ALFWorld, is left out); then, as ``alfworld-download`` does, the PDDL
    domain and grammar of the installed alfworld into ``logic/`` (what ALFWorld's own ``AlfredTWEnv`` reads)."""

    sources = (
        Source("json", (UrlFile(f"{_RELEASES}/0.2.2/json_2.1.1_json.zip", "json_2.1.1_json.zip", size=72_018_818),),
               "zip", what="json_2.1.1/<split>/<task>/<trial>/traj_data.json: the ALFRED trajectories (task types)"),
        Source("pddl", (UrlFile(f"{_RELEASES}/0.2.2/json_2.1.1_pddl.zip", "json_2.1.1_pddl.zip", size=34_881_784),),
               "zip", what="json_2.1.1/.../initial_state.pddl: each game's PDDL problem"),
        Source("tw-pddl", (UrlFile(f"{_RELEASES}/0.4.0/json_2.1.2_tw-pddl.zip", "json_2.1.2_tw-pddl.zip",
                                   size=36_493_542),),
               "zip", what="json_2.1.1/.../game.tw-pddl: the TextWorld games played"),
    )

    def finish(self, dest: Path) -> None:
        """``logic/alfred.pddl`` and ``logic/alfred.twl2`` from the installed alfworld, kept where present."""
        packaged = importlib.resources.files("alfworld").joinpath("data")  # alfworld.info's paths, not imported:
        (dest / LOGIC).mkdir(parents=True, exist_ok=True)                 # it sets $ALFWORLD_DATA on import
        for name in LOGIC_FILES:
            if not (dest / LOGIC / name).is_file():
                write_atomically(dest / LOGIC / name, packaged.joinpath(name).read_text())

    def default_dest(self) -> Path:
        """Where the games are looked for when the config has no ``data_dir``: ``$ALFWORLD_DATA``, else
        ``~/.cache/alfworld``."""
        return data_dir(None)[0]

    def next_steps(self, dest: Path) -> list[str]:
        lines = [f"ALFWorld's games are in {dest / GAMES_FOLDER}; configs with env.games: real read them"]
        if dest.resolve() != self.default_dest().resolve():
            lines.append(f"set env.data_dir={dest} (or export ALFWORLD_DATA={dest})")
        return lines
