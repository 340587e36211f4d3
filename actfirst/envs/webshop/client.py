"""The workers' side of the node's WebShop server (``actfirst.envs.webshop.server``): where it listens, starting it
when it is not running, and one connection per environment.

A server is named by its catalog (the install, ``product_file``, ``attribute_file``, ``goal_file``,
``search_index``, ``num_products``): ``socket_path`` is a Unix socket under the temporary directory, so each node
(and each catalog on it) has its own. :func:`ensure_server` connects, or starts the server and waits until it has
loaded, under a file lock, so that of all the ranks and workers of a node one starts it and the others wait for it.
The server runs detached (its own session, no parent among the workers: closing a worker never stops it), logs to
``<socket>.log`` and exits when idle (``server_idle_exit_s``). A server that dies is started again by the next
:func:`ensure_server`; the episodes it was playing are lost (:class:`ServerLost`).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from actfirst.envs.webshop.config import WebShopConfig
from actfirst.envs.webshop.install import require_install

_CATALOG_KEYS = ("product_file", "attribute_file", "goal_file", "search_index", "num_products")
_SERVER_KEYS = _CATALOG_KEYS + ("server_idle_exit_s",)
_PID_WAIT_S = 60.0
"""How long a server just started may take to write its pid file (its interpreter's start)."""


class ServerLost(RuntimeError):
    """The connection to the WebShop server broke (the server died); the episode in flight is lost."""


class ServerFailed(RuntimeError):
    """The WebShop server could not be started (its log's last lines in the message)."""


def socket_path(config: WebShopConfig) -> Path:
    """The Unix socket of the server of ``config``'s catalog on this node."""
    install = require_install()
    key = json.dumps([str(install.root)] + [getattr(config, k) for k in _CATALOG_KEYS])
    folder = Path(tempfile.gettempdir()) / f"actfirst-webshop-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    return folder / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.sock"


def _overrides(config: WebShopConfig) -> list[str]:
    return [f"{k}={json.dumps(getattr(config, k))}" for k in _SERVER_KEYS]


def server_pid(path: Path) -> int | None:
    """The pid of the server of ``path`` while it runs (loading or serving), else None."""
    try:
        pid = int(path.with_suffix(".pid").read_text())
        process = psutil.Process(pid)
        running = process.is_running() and process.status() != psutil.STATUS_ZOMBIE
        return pid if running and "actfirst.envs.webshop.server" in " ".join(process.cmdline()) else None
    except (OSError, ValueError, psutil.Error):
        return None


def _connect(path: Path) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
    except (FileNotFoundError, ConnectionRefusedError):
        sock.close()
        return None
    return sock


def ensure_server(config: WebShopConfig) -> socket.socket:
    """A connection to the server of ``config``'s catalog, started (and waited for) if it is not running."""
    path = socket_path(config)
    sock = _connect(path)
    if sock is not None:
        return sock
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one starter per node; the others wait here, then connect
        sock = _connect(path)
        if sock is not None:
            return sock
        if server_pid(path) is None:
            _start(path, config)
        return _wait(path, config.server_start_timeout_s)


def _start(path: Path, config: WebShopConfig) -> None:
    """Start the server detached: ``sh`` puts it in the background and exits, so no worker is its parent."""
    path.unlink(missing_ok=True)
    path.with_suffix(".pid").unlink(missing_ok=True)
    log = path.with_suffix(".log")
    command = [sys.executable, "-m", "actfirst.envs.webshop.server", "--socket", str(path), *_overrides(config)]
    subprocess.run(["sh", "-c", 'exec "$@" </dev/null >"$LOG" 2>&1 &', "sh", *command], check=True,
                   env=dict(os.environ, LOG=str(log)), start_new_session=True)


def _wait(path: Path, timeout_s: float) -> socket.socket:
    """Wait until the server of ``path`` listens; a server that ends first, or runs past ``timeout_s``, fails."""
    started, seen = time.monotonic(), False
    while True:
        sock = _connect(path)
        if sock is not None:
            return sock
        running = server_pid(path) is not None
        waited = time.monotonic() - started
        if not running and (seen or waited > _PID_WAIT_S):
            raise ServerFailed(f"the WebShop server of {path} exited while loading:\n{_log_tail(path)}")
        if waited > timeout_s:
            raise ServerFailed(f"the WebShop server of {path} did not load within server_start_timeout_s="
                               f"{timeout_s:g} s:\n{_log_tail(path)}")
        seen = seen or running
        time.sleep(0.2)


def _log_tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.with_suffix(".log").read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return "(no log)"


class ServerConnection:
    """One environment's connection: requests answered in order, one at a time."""

    def __init__(self, config: WebShopConfig):
        self.config = config
        self._sock: socket.socket | None = None
        self._reader = None

    def call(self, op: str, **args) -> dict:
        """Send ``{"op": op, **args}`` and return the reply; :class:`ServerLost` if the server went away, a
        ``RuntimeError`` with the server's traceback if the simulator raised."""
        if self._sock is None:
            self._sock = ensure_server(self.config)
            self._reader = self._sock.makefile("rb")
        try:
            self._sock.sendall(json.dumps({"op": op, **args}).encode() + b"\n")
            line = self._reader.readline()
        except OSError as e:
            self.close()
            raise ServerLost(f"the WebShop server went away during {op} ({e}); the episode is lost") from None
        if not line:
            self.close()
            raise ServerLost(f"the WebShop server closed the connection during {op}; the episode is lost")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"WebShop server: {reply['error']}\n{reply.get('traceback', '')}")
        return reply

    def close(self) -> None:
        if self._sock is not None:
            self._reader.close()
            self._sock.close()
            self._sock = self._reader = None
