"""The engine's CUDA stream and the update's, so that a decode step never queues behind an update kernel.

The engine (vLLM's in-process engine core, stepped by the event loop's thread) and the update (teacher scoring and
the student's steps, in a thread of their own: ``asyncio.to_thread``) share one GPU. On one stream every decode
step would wait for the update's kernels queued before it, and the overlap that ``pipeline: async`` and
``inflight`` give would not exist on a GPU. So, on CUDA:

- **The engine's stream** (high priority, FSDP2's -1 for its own communication streams) is made the current stream
  of the thread that builds and steps the engine, before vLLM starts (:meth:`StreamSplit.enter_engine_stream`).
  vLLM keeps each thread's current stream itself (``vllm.utils.torch_utils.current_stream``, fed by its wrapper of
  ``torch.cuda.set_stream``) and captures and replays its CUDA graphs, samples, reloads weights and sleeps there;
  so does everything else that thread runs: the weight gather (consumed by the reload, bucket by bucket), the
  probe's scoring, checkpoints, evaluations.
- **The update's stream** (normal priority) is current in the update's thread for the span of
  :meth:`StreamSplit.update_phase`.

Correctness: two streams order nothing between them, so every hand-over of GPU data between the two threads is
ordered explicitly, at two points:

1. *The update starts after what the engine's thread queued before it*: on entry the update's stream waits for the
   engine's (``update.wait_stream(engine)``, a wait on the GPU, not on the host). The update reads weights loaded
   on the engine's thread (the models at start, a restored checkpoint) and overwrites the student's shards that the
   previous weight gather read there. The wait holds back the update's first kernel behind at most the decode step
   in flight; nothing on the engine's stream ever waits for the update's.
2. *The weight gather and the reload start after the update's last kernel*: on exit an event is recorded on the
   update's stream and **the update's own thread** waits for it (``event.synchronize()``) before the phase returns.
   The trainer awaits that thread before it syncs the weights, so the gather (which reads the shards the optimizer
   step wrote), the reload that consumes the gathered buckets, and every later read on the engine's thread (a
   checkpoint of the shards and AdamW's moments, say) are issued after the update finished on the GPU. Waiting on
   the host in the update's thread costs the engine nothing (its thread never blocks on it), where a GPU-side wait
   of the engine's stream would queue every later decode step behind the update's tail. The reload then follows
   the gather on the engine's stream in stream order: the gathered tensors are allocated, read and freed there.

Memory needs nothing more for correctness: each thread's tensors are allocated and freed on its own stream (the
caching allocator reuses a block only on the stream that freed it), and the tensors that cross (weights, shards)
are never freed while the other side could still use them. Its cost: blocks one stream freed stay cached for that
stream, so the engine's thread's transients (the gather's buckets, the probe's scoring) and the update's do not
reuse each other's; ``bench/colocated_fit.py`` runs the same split, so its measured peaks include it.

On the CPU there are no streams: :func:`stream_split` returns None, and the engine and the trainer run as before.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

ENGINE_PRIORITY = -1
"""The engine stream's priority: the highest torch's stream pools offer (lower is higher; FSDP2 uses it too)."""


class StreamSplit:
    """The engine's stream and the update's (see the module docstring). ``select`` makes a stream current for a
    block (``torch.cuda.stream``) and ``set_current`` for good (``torch.cuda.set_stream``, as vLLM wraps it)."""

    def __init__(self, engine: Any, update: Any, *, select: Callable[[Any], Any] | None = None,
                 set_current: Callable[[Any], None] | None = None) -> None:
        self.engine, self.update = engine, update
        self._select = select or torch.cuda.stream
        self._set_current = set_current or (lambda stream: torch.cuda.set_stream(stream))

    def enter_engine_stream(self) -> None:
        """Make the engine's stream the calling thread's current stream, for good: call it in the thread that builds
        and steps the engines, before the first engine starts (and again before each: the same stream)."""
        importlib.import_module("vllm.utils.torch_utils")  # installs vLLM's set_stream wrapper, which must see it
        self._set_current(self.engine)

    def check_engine_stream(self) -> None:
        """Raise unless vLLM's current stream in the calling thread is the engine's (a startup check, after the
        engine started: vLLM would otherwise have made a stream of its own for this thread)."""
        from vllm.utils.torch_utils import current_stream

        if current_stream().cuda_stream != self.engine.cuda_stream:
            raise RuntimeError(f"vLLM steps on CUDA stream {current_stream()}, not the engine's {self.engine}: the "
                               "engine's stream must be entered in the thread that builds the engine, before it "
                               "starts (actfirst.engine.streams)")

    @contextlib.contextmanager
    def update_phase(self) -> Iterator[None]:
        """Run the block (teacher scoring and the student's update, in the update's own thread) on the update's
        stream: after what the engine's thread queued before (sync point 1), and returning only once the GPU has
        finished the block's last kernel (sync point 2)."""
        self.update.wait_stream(self.engine)
        with self._select(self.update):
            yield
            done = self.update.record_event()
        done.synchronize()


@functools.cache
def _split_for(device_index: int) -> StreamSplit:
    device = torch.device("cuda", device_index)
    return StreamSplit(torch.cuda.Stream(device, priority=ENGINE_PRIORITY), torch.cuda.Stream(device))


def stream_split() -> StreamSplit | None:
    """This process's split on its current CUDA device (one per device, shared by its engines); None on the CPU."""
    if not torch.cuda.is_available():
        return None
    return _split_for(torch.cuda.current_device())
