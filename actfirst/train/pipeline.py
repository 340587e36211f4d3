"""The training pipeline (C.3: "rollout collection and student optimization proceed asynchronously"): how much the
rollout batches collected ahead hold, and how the CPU's cores are split between the engine and the update.

``pipeline: serial`` runs an update's phases one after the other: rollout batches of ``rollout.batch_tasks`` tasks
until the buffer holds the update's samples, then scoring and the update, then the weight sync. A rollout batch that
gives more than the update needs leaves the rest in the buffer for the next update (B.4: one version behind).

``pipeline: async`` (the default; ``inflight`` too, whose weights enter the engine mid-rollout) collects the *next*
update's samples while the teacher scores and the student updates. The weights then enter the engine only once that
collection ends, so its samples are of version v when update v + 1 trains on them: one version behind, B.4's bound,
and nothing they leave over survives the update after (two versions behind: dropped). Collecting whole rollout
batches of ``batch_tasks`` tasks ahead (the old ``overlap``) therefore threw away whatever a batch gave beyond one
update's samples: with batches of twice an update's samples, the transitions per update doubled.

So the collection ahead is *sized and streamed* here instead of fixed: it runs rollout batches one after another,
each of the tasks expected to give what the next update still lacks (its quota less the buffered samples that stay
eligible, over the samples per episode of the latest rollout batches: :meth:`SampleYield.tasks_for`), until the
buffer holds the quota; a batch that came short is followed at once by one for the shortfall, still during the
update. What is thrown away per update is what the last episodes give beyond the quota (under one episode's samples
on average), far below a whole batch's; serial drops too, whatever a batch holds beyond two updates' samples (on the
CPU demo a third of each batch, so there async collects fewer transitions per update than serial: bench/RESULTS.md).
An update's own collection (the first update's: nothing is known yet, so a whole batch) is sized the same way. Under
``batch: rollout`` (003's step: one rollout batch per update) the collection ahead is that one batch of
``batch_tasks`` tasks.

The CPU split (:func:`update_threads`): vLLM's CPU engine runs its OpenMP threads (``OMP_NUM_THREADS``) on the event
loop's thread and ignores ``torch.set_num_threads`` after it starts. Scoring and the update run in a thread of their
own in every mode, whose torch thread count (:func:`set_torch_threads`, per thread under OpenMP) is the rank's cores
less the engine's. The same under ``serial``, whose engine idles during the update: the pipelines then differ only
in their schedule, and on the shared 2-core VM a second OpenMP thread made the update slower, not faster (16.5 s
against 5.8 s per update with one, bench/RESULTS.md); ``parallel.cpu_update_threads`` sets another count. On a GPU
the update runs on the device beside the engine (colocated); its host threads are left as they are.
"""

from __future__ import annotations

import collections
import math
import os

import torch

YIELD_WINDOW = 10
"""Rollout batches whose samples per episode size the next collection."""


class SampleYield:
    """Samples per episode over the latest :data:`YIELD_WINDOW` rollout batches (sizes the batches collected ahead)."""

    def __init__(self) -> None:
        self.window: collections.deque[tuple[int, int]] = collections.deque(maxlen=YIELD_WINDOW)
        """(episodes, samples) of each recent rollout batch."""

    def add(self, episodes: int, samples: int) -> None:
        """Count a finished rollout batch."""
        self.window.append((episodes, samples))

    def per_episode(self) -> float | None:
        """Samples per episode over the window (None before any batch, or when no episode gave a sample)."""
        episodes, samples = (sum(x) for x in zip(*self.window, strict=True)) if self.window else (0, 0)
        return samples / episodes if episodes and samples else None

    def tasks_for(self, need: int, most: int) -> int:
        """The tasks of a rollout batch expected to give ``need`` samples (at least 1, at most ``most``; ``most``
        while nothing is known yet)."""
        if need < 1:
            raise ValueError(f"need={need}: a rollout batch is sized for at least one sample")
        per_episode = self.per_episode()
        return most if per_episode is None else min(most, max(1, math.ceil(need / per_episode)))

    def state_dict(self) -> list[list[int]]:
        return [list(x) for x in self.window]

    def load_state_dict(self, state: list[list[int]]) -> None:
        self.window.clear()
        self.window.extend((int(e), int(s)) for e, s in state)


def update_threads(setting: int | None, *, engine_threads: int, ranks_here: int) -> int:
    """The torch threads for scoring and the update on the CPU: ``setting`` (``parallel.cpu_update_threads``) when
    given, else this rank's share of the process's cores (``ranks_here``: the node's ranks) less the engine's
    ``engine_threads``, at least 1, whatever the pipeline (see the module docstring)."""
    if setting is not None:
        return setting
    return max(1, len(os.sched_getaffinity(0)) // max(1, ranks_here) - engine_threads)


def set_torch_threads(n: int) -> int:
    """Set the calling thread's torch (OpenMP) threads to ``n`` and return what torch reports. vLLM's CPU worker
    replaces ``torch.set_num_threads`` by a no-op once it has started, so this calls the function it replaced
    (``torch._C.set_num_threads``)."""
    torch._C.set_num_threads(n)  # torch.set_num_threads itself, under a name vLLM leaves
    return torch.get_num_threads()

