"""ScienceWorld's data: nothing to fetch (``python -m actfirst.data scienceworld`` says so)."""

from __future__ import annotations

from actfirst.preparation.downloads import BenchmarkData


class ScienceWorldData(BenchmarkData):
    """None: the simulator (``scienceworld.jar``) and its tasks ship in the ``scienceworld`` pip package."""

    note = ("ScienceWorld's data ships in its pip package (scienceworld: the simulator's jar, its tasks and "
            "objects), installed with the environment by scripts/setup.sh: nothing to fetch")
