"""The peer watch's heartbeat process (``actfirst.parallel.watchdog``): started by ``PeerWatch.start``, never by hand.

``python -m actfirst.parallel.heartbeat ADDR PORT PREFIX RANK INTERVAL_S TIMEOUT_S PARENT_PID``
"""

from __future__ import annotations

import argparse
import sys

from actfirst.parallel.watchdog import beat


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments ``PeerWatch.start`` passes and beat until the parent process is gone; the line
    ``beating`` on stdout after the first beat tells ``PeerWatch.start`` that it may watch."""
    parser = argparse.ArgumentParser(prog="python -m actfirst.parallel.heartbeat")
    for name, kind in (("addr", str), ("port", int), ("prefix", str), ("rank", int), ("interval_s", float),
                       ("timeout_s", float), ("parent", int)):
        parser.add_argument(name, type=kind)
    return beat(**vars(parser.parse_args(argv)), first_beat=lambda: print("beating", flush=True))


if __name__ == "__main__":
    sys.exit(main())
