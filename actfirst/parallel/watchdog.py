"""Peer watch: no rank is left waiting in a collective for a rank that is gone.

On one node the elastic agent stops every rank as soon as one fails. Across nodes, and under NCCL, a rank whose
peer died would wait in its next collective until the process group's timeout (default 30 minutes). So every rank
keeps a heartbeat counter on the job's TCP store (the rendezvous store torchrun gives every rank), and a daemon
thread stops this process (exit status ``PEER_STOPPED_EXIT``) with a line naming the peer when another rank
reported a failure (:meth:`PeerWatch.report_failure`, called by a rank that raises) or when the peer it watches (the
next rank in a ring, a few store calls a second per rank) has not moved its counter for ``timeout_s`` (killed, or
its machine gone): it then reports that peer's failure for everyone. Counters, not clocks, so nodes need not agree
on the time.

The heartbeat is a child process (``python -m actfirst.parallel.heartbeat``), not a thread: a library call that
holds the GIL (a C extension writing a multi-GB checkpoint, say) would stop a thread's beats for as long as it runs
and make a healthy rank look dead. The child beats every ``interval_s`` while its parent lives and stops within an
interval of the parent's death (it polls ``os.getppid()``: a dead parent's children are handed to another process),
so a dead rank still goes silent. It beats for a rank that is alive but stuck, as the thread did when the GIL was
free: a rank stuck in a collective is waiting for a dead peer, which is what the watch finds.
"""

from __future__ import annotations

import datetime
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch.distributed as dist

from actfirst.parallel.launch import PEER_STOPPED_EXIT

logger = logging.getLogger(__name__)

_PREFIX = "actfirst/peer_watch/"
START_GRACE_S = 120.0
"""A peer whose heartbeat has not beaten yet is given this long beyond ``timeout_s`` (its process imports torch)."""


class PeerWatch:
    """Heartbeats and failure notices of every rank through the job's store (see the module docstring)."""

    def __init__(self, rank: int, world_size: int, *, timeout_s: float = 60.0, interval_s: float = 1.0) -> None:
        if timeout_s <= interval_s:
            raise ValueError(f"timeout_s={timeout_s!r}: must exceed interval_s={interval_s!r}")
        self.rank, self.world_size = rank, world_size
        self.timeout_s, self.interval_s = timeout_s, interval_s
        self._address = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                         _PREFIX + os.environ.get("TORCHELASTIC_RUN_ID", "job"))
        self.store = _store(*self._address, timeout_s)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="peer-watch", daemon=True)
        self._heart: subprocess.Popen | None = None

    def start(self) -> PeerWatch:
        """Start the heartbeat process and, once it has beaten, the watching thread."""
        addr, port, prefix = self._address
        root = str(Path(__file__).resolve().parents[2])  # where ``actfirst`` is importable from
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])),
               "OMP_NUM_THREADS": "1"}
        self._heart = subprocess.Popen(
            [sys.executable, "-m", "actfirst.parallel.heartbeat", addr, str(port), prefix, str(self.rank),
             str(self.interval_s), str(self.timeout_s), str(os.getpid())],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, env=env)
        first = self._heart.stdout.readline()  # one line after its first beat; EOF if it failed (its error on stderr)
        self._heart.stdout.close()
        if not first:
            raise RuntimeError(f"rank {self.rank}: the peer watch's heartbeat process exited with status "
                               f"{self._heart.wait()} before its first beat (its error is above)")
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop watching, and tell the peers that this rank's heartbeat stops for a good reason (a normal end)."""
        if not self._stop.is_set():
            self._stop.set()
            try:
                self.store.set(f"done/{self.rank}", "1")
            except Exception:  # noqa: BLE001 - the store may be gone with the node that hosted it
                pass
        if self._heart is not None:
            self._heart.terminate()
            self._heart.wait()

    def fail(self, error: BaseException) -> None:
        """This rank failed with ``error`` (called before re-raising it). When another rank reported a failure, or a
        peer's heartbeat has stopped (killed, or its node gone: a collective with it is what failed here), that is
        the cause: this rank stops at once naming it (exit status ``PEER_STOPPED_EXIT``). Otherwise this rank's
        failure is reported to the others and the call returns."""
        own = f"rank {self.rank} failed: {type(error).__name__}: {error}"
        try:
            cause = self.store.get("failed").decode() if self.store.check(["failed"]) else None
            lost = [] if cause else self.silent_peers()
        except dist.DistStoreError:  # the store's node is gone
            cause, lost = "the job's store is unreachable", []
        if lost:
            cause = f"rank {lost[0]} stopped responding (rank {self.rank} then got {type(error).__name__}: {error})"
            self.report_failure(cause)
        if cause:
            self._exit(cause, force=True)
        self.report_failure(own)

    def silent_peers(self, window_s: float | None = None) -> list[int]:
        """The peers (not ended normally) whose heartbeat did not move within ``window_s`` (three intervals)."""
        peers = [r for r in range(self.world_size)
                 if r != self.rank and not self.store.check([f"done/{r}"]) and self.store.check([f"beat/{r}"])]
        before = {r: self.store.get(f"beat/{r}") for r in peers}
        time.sleep(3 * self.interval_s if window_s is None else window_s)
        return [r for r in peers if self.store.get(f"beat/{r}") == before[r]]

    def report_failure(self, message: str) -> None:
        """Tell every peer why the job fails (``message`` names the failed rank; the first report wins)."""
        self._stop.set()
        try:
            self.store.compare_set("failed", "", message)
        except Exception:  # noqa: BLE001 - the store may be gone with the node that hosted it
            pass

    def _run(self) -> None:
        last: tuple[int, bytes | None, float] = (-1, None, time.monotonic())
        while not self._stop.wait(self.interval_s):
            try:
                if self.store.check(["failed"]):
                    self._exit(self.store.get("failed").decode())
                peer = self._watched_peer()
                if peer is None:
                    continue
                now = time.monotonic()
                value = self.store.get(f"beat/{peer}") if self.store.check([f"beat/{peer}"]) else None
                rank, seen, since = last
                last = (peer, value, since if (peer, value) == (rank, seen) else now)
                if now - last[2] > self.timeout_s + (START_GRACE_S if value is None else 0.0):
                    why = f"rank {peer} stopped responding (no heartbeat for {now - last[2]:.0f} s)"
                    self.report_failure(why)
                    self._exit(why, force=True)
            except dist.DistStoreError as error:  # the store went away: so did the node that hosted it
                self._exit(f"the job's store is unreachable ({error})")

    def _watched_peer(self) -> int | None:
        """The next rank after this one (in a ring) that has not ended normally: every rank is watched by its
        predecessor, and whoever sees a peer die tells everyone through ``failed``."""
        for step in range(1, self.world_size):
            peer = (self.rank + step) % self.world_size
            if not self.store.check([f"done/{peer}"]):
                return peer
        return None

    def _exit(self, why: str, force: bool = False) -> None:
        if self._stop.is_set() and not force:
            return
        logger.error(f"[rank {self.rank}] stopping: {why}")
        os._exit(PEER_STOPPED_EXIT)


def _store(addr: str, port: int, prefix: str, timeout_s: float) -> dist.Store:
    """A client of the job's TCP store, under the peer watch's prefix."""
    store = dist.TCPStore(addr, port, is_master=False, timeout=datetime.timedelta(seconds=max(30.0, timeout_s)))
    return dist.PrefixStore(prefix, store)


def beat(addr: str, port: int, prefix: str, rank: int, interval_s: float, timeout_s: float, parent: int, *,
         first_beat: Callable[[], None]) -> int:
    """The heartbeat process's work (``actfirst.parallel.heartbeat`` runs it): bump ``beat/<rank>`` every
    ``interval_s`` while process ``parent`` is this one's parent (see the module docstring), calling ``first_beat``
    after the first beat. Returns 0 once the parent is gone, 1 if the store is."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the rank's to handle; its death ends this process
    store = _store(addr, port, prefix, timeout_s)
    first = True
    try:
        while os.getppid() == parent:
            store.add(f"beat/{rank}", 1)
            if first:
                first_beat()
                first = False
            time.sleep(interval_s)
    except dist.DistStoreError:  # the store's node is gone: the rank's own watch says so
        return 1
    return 0
