"""Fetch a benchmark's data (its package's ``data``: ``actfirst/envs/<name>/data.py``)::

    python -m actfirst.data alfworld                  # into $ALFWORLD_DATA, else ~/.cache/alfworld
    python -m actfirst.data search --dest DIR --only questions corpus
    python -m actfirst.data webshop --list            # what it would fetch, and where

Before fetching it says what it fetches, the disk it needs at most and what is free (and refuses when that does
not fit); resumable: run it again after an interruption. At the end it says where the data is and what to set in a
config. The downloads go through huggingface_hub (Hub files: ``HF_ENDPOINT``, ``HF_TOKEN``, ``HF_HUB_OFFLINE``),
gdown (Google Drive) and pooch (other URLs): ``actfirst.preparation.downloads``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from actfirst.core.user_input import ConfigError, check_writable_dir, command
from actfirst.envs.benchmarks import BENCHMARKS
from actfirst.preparation.downloads import DownloadError, fetch_data, plan_fetch

EXIT_FAILED = 1


@command
def main(argv: list[str] | None = None) -> int:
    """Fetch the data of one benchmark; returns the exit status (1: a download failed, what was kept is said)."""
    parser = argparse.ArgumentParser(prog="python -m actfirst.data", description="Fetch a benchmark's data.")
    parser.add_argument("benchmark", choices=sorted(BENCHMARKS))
    parser.add_argument("--dest", help="where the data goes (default: the benchmark's own place, see --list)")
    parser.add_argument("--only", nargs="+", metavar="SOURCE", help="fetch only these sources (see --list)")
    parser.add_argument("--list", action="store_true", help="list the sources and the destination, fetch nothing")
    args = parser.parse_args(argv)
    data = BENCHMARKS[args.benchmark].data
    if data is None:
        raise ConfigError(f"benchmark={args.benchmark!r}: declares no data to fetch")
    if data.note:
        print(data.note)
    dest = Path(args.dest).expanduser() if args.dest else data.default_dest()
    names = [s.name for s in data.sources]
    unknown = sorted(set(args.only or ()) - set(names))
    if unknown:
        raise ConfigError(f"--only={unknown}: not sources of {args.benchmark} (its sources: {names})")
    if args.list:
        for source in data.sources:
            print(f"{source.name}: {source.what} ({', '.join(f.where for f in source.files)})")
        print(f"destination: {dest}")
        return 0
    if not data.sources:
        return 0
    check_writable_dir(dest, "--dest")
    try:
        plan = plan_fetch(data, dest, args.only)
        for line in plan.lines():
            print(line, flush=True)
        report = fetch_data(data, dest, args.only, plan=plan)
    except DownloadError as e:
        print(f"python -m actfirst.data: failed: {' '.join(str(e).split())}", file=sys.stderr)
        return EXIT_FAILED
    if report.present:
        print(f"already in place: {', '.join(report.present)}")
    if report.fetched:
        print(f"fetched: {', '.join(report.fetched)}")
    for line in data.next_steps(dest):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
