"""One WebShop server per node: the official simulator's catalog, search engine and goal list loaded once, and the
episodes of every worker of every rank on the node played on it.

WebShop's text environment (``WebAgentTextEnv``) takes an existing ``SimServer`` (its catalog, Lucene searcher and
goals); each connection gets its own ``WebAgentTextEnv`` on the one ``SimServer``, with its own session (WebShop
keeps an episode's state by session id), as AgentGym serves WebShop to many clients. The server listens on a Unix
socket (one per node and catalog: ``client.socket_path``), answers one request at a time (WebShop's code is pure
Python under one GIL, its searcher one JVM), and exits after ``server_idle_exit_s`` without a connection. Workers
start it on demand (``client.ensure_server``)::

    python -m actfirst.envs.webshop.server --socket PATH [key=value ...]   # what ensure_server runs
    python -m actfirst.envs.webshop.server --check [key=value ...]         # load, report time and memory, one reset

``key=value``: keys of the ``env:`` section of a WebShop config (``product_file=...``, ``search_index=...``).
Requests and replies are JSON lines: ``{"op": "reset", "goal": 17}`` -> ``{"observation": ..., "available":
{"has_search_bar": ..., "clickables": [...]}}``; ``{"op": "step", "action": "click[buy now]"}`` -> the same plus
``reward`` and ``done``; ``{"op": "goal", "goal": 17}`` -> the goal and its product's options; ``{"op": "info"}``;
an error -> ``{"error": ...}``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import selectors
import signal
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from actfirst.core.schema import load_config
from actfirst.core.user_input import ConfigError, command
from actfirst.envs.webshop.config import WebShopConfig
from actfirst.envs.webshop.install import WebShopInstall, activate, require_install

GOAL_SEED = 233
"""C.1: "The goal-construction seed is fixed at 233"."""
_BASE_URL = "http://127.0.0.1:3000"
"""What WebShop's simulated browser calls its site (only a prefix of its URLs)."""


def catalog_path(folder: Path, name: str, key: str, kind: str = "file") -> Path:
    """``name`` as WebShop's files are named: relative to ``folder`` (its ``data`` or ``search_engine`` folder), or
    a path; a missing one is a :class:`ConfigError` naming ``key`` and the value."""
    path = folder / name
    if not (path.is_file() if kind == "file" else path.is_dir()):
        raise ConfigError(f"{key}={name!r}: no such {kind} ({path}); bash scripts/setup_webshop.sh --catalog "
                          "preview|full|generated installs a catalog and its search index")
    return path


def _index_folder(install: WebShopInstall, config: WebShopConfig) -> Path:
    from actfirst.envs.webshop.index import INDEXES

    folder = (catalog_path(install.search_engine_dir, config.search_index, "search_index", "directory")
              if config.search_index is not None else install.search_engine_dir)
    return catalog_path(folder, INDEXES[config.num_products], "search_index", "directory")


def load_simulator(config: WebShopConfig) -> Any:
    """WebShop's ``SimServer`` on ``config``'s catalog: products, goals (prices and price caps drawn after seeding
    ``random`` with 233, the shuffle seeded 233 by WebShop) and its Lucene searcher on ``search_index``; an index
    built from another catalog is a :class:`ConfigError`."""
    install = require_install()
    activate(install)
    files = {key: catalog_path(install.data_dir, getattr(config, key), key)
             for key in ("product_file", "attribute_file", "goal_file")}
    index = _index_folder(install, config)
    from pyserini.search.lucene import LuceneSearcher
    from web_agent_site.envs import web_agent_text_env

    from actfirst.envs.webshop.index import index_mismatch, set_catalog

    set_catalog(files["product_file"], files["attribute_file"], files["goal_file"])
    # WebShop opens its index under its own folder by num_products; the same searcher on the configured folder.
    web_agent_text_env.init_search_engine = lambda num_products: LuceneSearcher(str(index))
    random.seed(GOAL_SEED)
    simulator = web_agent_text_env.SimServer(_BASE_URL, str(files["product_file"]), num_products=config.num_products,
                                             human_goals=True)
    problem = index_mismatch(simulator.search_engine, simulator.all_products)
    if problem:
        raise ConfigError(f"search_index={config.search_index!r}: {index} was not built from "
                          f"product_file={config.product_file!r} ({problem}); rebuild it: bash "
                          "scripts/setup_webshop.sh --catalog <that catalog>")
    return simulator


class Session:
    """One connection's environment: a ``WebAgentTextEnv`` on the shared simulator, one episode at a time."""

    def __init__(self, simulator: Any, number: int):
        from web_agent_site.envs.web_agent_text_env import WebAgentTextEnv

        self.simulator = simulator
        self.env = WebAgentTextEnv(observation_mode="text", server=simulator, session_prefix=f"c{number}-")
        simulator.user_sessions.pop(self.env.session, None)  # the environment's own reset at construction

    def handle(self, request: dict) -> dict:
        op = request.get("op")
        if op == "reset":
            return self._reset(int(request["goal"]))
        if op == "step":
            observation, reward, done, _ = self.env.step(str(request["action"]))
            return {"observation": observation, "reward": float(reward), "done": bool(done),
                    "available": self.env.get_available_actions()}
        if op == "goal":
            return self._goal(int(request["goal"]))
        if op == "info":
            return {"goals": len(self.simulator.goals), "products": len(self.simulator.all_products),
                    "pid": os.getpid()}
        raise ValueError(f"op={op!r}: not one of reset, step, goal, info")

    def _reset(self, goal: int) -> dict:
        goals = len(self.simulator.goals)
        if not 0 <= goal < goals:
            raise IndexError(f"goal {goal} is outside the {goals} goals of this catalog")
        self.close()  # one session per connection: the last episode's state goes
        observation, _ = self.env.reset(session=goal)
        return {"observation": observation, "available": self.env.get_available_actions()}

    def _goal(self, goal: int) -> dict:
        entry = self.simulator.goals[goal]
        options = entry["goal_options"]
        product = self.simulator.product_item_dict[entry["asin"]]
        return {"instruction": entry["instruction_text"], "asin": entry["asin"],
                "options": list(options.values() if isinstance(options, dict) else options),
                "price_upper": float(entry["price_upper"]), "product_options": product["options"]}

    def close(self) -> None:
        if self.env.session is not None:
            self.simulator.user_sessions.pop(self.env.session, None)


def serve(simulator: Any, path: Path, idle_exit_s: float) -> None:
    """Answer every connection on the Unix socket ``path`` until no connection has been open for ``idle_exit_s``."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.unlink(missing_ok=True)
    listener.bind(str(tmp))
    listener.listen(256)
    os.replace(tmp, path)  # clients see the socket only once the simulator is loaded
    bound = os.stat(path).st_ino
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    connections: dict[socket.socket, tuple[Session, bytearray]] = {}
    opened, idle_since = 0, time.monotonic()
    try:
        while connections or time.monotonic() - idle_since < idle_exit_s:
            for key, _ in selector.select(timeout=1.0):
                if key.fileobj is listener:
                    conn, _ = listener.accept()
                    opened += 1
                    connections[conn] = (Session(simulator, opened), bytearray())
                    selector.register(conn, selectors.EVENT_READ)
                    continue
                conn = key.fileobj
                if not _receive(conn, *connections[conn]):
                    selector.unregister(conn)
                    connections.pop(conn)[0].close()
                    conn.close()
                    if not connections:
                        idle_since = time.monotonic()
    finally:
        if path.exists() and os.stat(path).st_ino == bound:  # not a newer server's
            path.unlink()
        listener.close()


def _receive(conn: socket.socket, session: Session, buffer: bytearray) -> bool:
    """Read what ``conn`` sent and answer each complete request; False once the client has gone."""
    try:
        data = conn.recv(1 << 16)
    except ConnectionError:
        return False
    if not data:
        return False
    buffer.extend(data)
    while b"\n" in buffer:
        line, _, rest = bytes(buffer).partition(b"\n")
        buffer[:] = rest
        try:
            reply = session.handle(json.loads(line))
        except Exception as e:
            reply = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
        try:
            conn.sendall(json.dumps(reply).encode() + b"\n")
        except ConnectionError:
            return False
    return True


def memory_bytes() -> int:
    """This process's resident memory (the JVM runs inside it, through JNI)."""
    import psutil

    return psutil.Process().memory_info().rss


def check(config: WebShopConfig) -> dict[str, Any]:
    """Load the simulator as the server does and play one reset: the load's wall and CPU seconds (the JVM's threads
    included), the resident and peak memory, the catalog's sizes and the first page."""
    started, cpu = time.perf_counter(), time.process_time()
    simulator = load_simulator(config)
    loaded, cpu = time.perf_counter() - started, time.process_time() - cpu
    page = Session(simulator, 0).handle({"op": "reset", "goal": 0})
    return {"load_s": round(loaded, 1), "cpu_s": round(cpu, 1), "rss_mib": round(memory_bytes() / 2**20),
            "peak_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
            "products": len(simulator.all_products), "goals": len(simulator.goals),
            "first_page": page["observation"]}


@command
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m actfirst.envs.webshop.server", description=__doc__.split("\n")[0])
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--socket", help="serve on this Unix socket (what client.ensure_server runs)")
    what.add_argument("--check", action="store_true", help="load, report load time and memory, one reset; exit")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="keys of a WebShop config's env section")
    args = parser.parse_args(argv)
    if args.socket is not None:  # first: the client waits for this file to know the server is loading
        pid_file = Path(args.socket).with_suffix(".pid")
        pid_file.write_text(str(os.getpid()))
    config = load_config(WebShopConfig, None, args.overrides, key="env")
    if args.check:
        report = check(config)
        print(f"webshop_server: {report['products']} products, {report['goals']} goals, loaded in "
              f"{report['load_s']} s ({report['cpu_s']} s CPU), {report['rss_mib']} MiB resident (peak "
              f"{report['peak_mib']} MiB); goal 0: {report['first_page'][:160]}")
        return 0
    started = time.perf_counter()
    simulator = load_simulator(config)
    print(f"webshop_server: {len(simulator.all_products)} products, {len(simulator.goals)} goals, loaded in "
          f"{time.perf_counter() - started:.1f} s, {memory_bytes() / 2**20:.0f} MiB resident; serving {args.socket}",
          flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # a stop also removes the socket and the pid file
    try:
        serve(simulator, Path(args.socket), config.server_idle_exit_s)
    finally:
        if pid_file.read_text() == str(os.getpid()):
            pid_file.unlink()
    print("webshop_server: idle, exiting", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
