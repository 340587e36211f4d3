"""The engine's CUDA stream and the update's (``actfirst.engine.streams``): on the CPU nothing changes; the order of
the two sync points around an update and the weight sync that follows, shown on the real engine with recording
stand-ins for the CUDA streams (test doubles: there is no GPU here)."""

from __future__ import annotations

import asyncio
import contextlib
import threading

from safetensors.torch import load_file

from actfirst.engine.request import RequestKind, SamplingSpec
from actfirst.engine.streams import StreamSplit, stream_split


class RecordingStreamTestDouble:
    """Stands in for a CUDA stream: records, with the calling thread's name, what is asked of it."""

    def __init__(self, name: str, log: list[tuple[str, str]]) -> None:
        self.name, self.log = name, log

    def wait_stream(self, other: RecordingStreamTestDouble) -> None:
        self.log.append((threading.current_thread().name, f"{self.name} stream waits for {other.name} stream"))

    def record_event(self) -> RecordingEventTestDouble:
        self.log.append((threading.current_thread().name, f"event recorded on {self.name} stream"))
        return RecordingEventTestDouble(self.name, self.log)


class RecordingEventTestDouble:
    """Stands in for a CUDA event: records the host's wait for it."""

    def __init__(self, stream: str, log: list[tuple[str, str]]) -> None:
        self.stream, self.log = stream, log

    def synchronize(self) -> None:
        self.log.append((threading.current_thread().name, f"host waits for the {self.stream} stream's event"))


def recording_split_test_double(log: list[tuple[str, str]]) -> StreamSplit:
    """A StreamSplit over recording streams, whose stream switches are recorded too."""

    @contextlib.contextmanager
    def select(stream: RecordingStreamTestDouble):
        log.append((threading.current_thread().name, f"{stream.name} stream current"))
        yield
        log.append((threading.current_thread().name, f"{stream.name} stream no longer current"))

    def set_current(stream: RecordingStreamTestDouble) -> None:
        log.append((threading.current_thread().name, f"{stream.name} stream current for good"))

    return StreamSplit(RecordingStreamTestDouble("engine", log), RecordingStreamTestDouble("update", log),
                       select=select, set_current=set_current)


def test_nothing_changes_on_the_cpu(engine):
    assert stream_split() is None and engine.vllm.streams is None
    with engine.update_phase() as inside:  # a no-op context
        assert inside is None


def test_the_update_and_the_weight_sync_are_ordered_by_the_two_sync_points(engine, tiny_model_dir, monkeypatch):
    """What the trainer does, in its threads: the update inside ``update_phase`` in a thread of its own, then the
    weight sync on the engine's (the event loop's) thread, then a decode. The update's stream waits for the
    engine's before the update's first kernel; the update's thread waits on the host for the update's last one
    before the phase returns; only then does the engine's thread gather (vLLM's reload pulls the buckets) and
    decode."""
    log: list[tuple[str, str]] = []
    split = recording_split_test_double(log)
    split.enter_engine_stream()
    monkeypatch.setattr(engine.vllm, "streams", split)
    weights = load_file(f"{tiny_model_dir}/model.safetensors")

    def gathered():  # the weight gather, as the reload consumes it
        log.append((threading.current_thread().name, "gather: first bucket"))
        yield from weights.items()
        log.append((threading.current_thread().name, "gather: every bucket consumed by the reload"))

    def update() -> None:
        with engine.update_phase():
            log.append((threading.current_thread().name, "update's kernels queued"))

    async def run() -> str:
        loop_thread = threading.current_thread().name
        await asyncio.to_thread(update)
        engine.update_weights(gathered())
        await engine.generate([1, 2, 3], RequestKind.FULL_RESPONSE, SamplingSpec(max_tokens=2, seed=0))
        return loop_thread

    main = threading.current_thread().name
    loop_thread = asyncio.run(run())
    update_thread = next(thread for thread, what in log if what == "update's kernels queued")
    assert loop_thread == main != update_thread
    assert log == [
        (main, "engine stream current for good"),
        (update_thread, "update stream waits for engine stream"),  # sync point 1
        (update_thread, "update stream current"),
        (update_thread, "update's kernels queued"),
        (update_thread, "event recorded on update stream"),
        (update_thread, "update stream no longer current"),
        (update_thread, "host waits for the update stream's event"),  # sync point 2
        (main, "gather: first bucket"),
        (main, "gather: every bucket consumed by the reload"),
    ]
