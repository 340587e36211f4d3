"""The fast-action-first waiting queue: one FCFS deque per request kind."""

from __future__ import annotations

from collections import deque

from actfirst.engine.request import Request, RequestKind


class FastFirstQueue:
    """Waiting requests. ``peek``/``pop`` serve every waiting fast action before any full response;
    within a kind, first come first served (``prepend`` puts a paused or requeued request back in front)."""

    def __init__(self) -> None:
        self._queues: dict[RequestKind, deque[Request]] = {kind: deque() for kind in RequestKind}

    def add(self, request: Request) -> None:
        self._queues[request.kind].append(request)

    def prepend(self, request: Request) -> None:
        self._queues[request.kind].appendleft(request)

    def peek(self, kind: RequestKind) -> Request | None:
        queue = self._queues[kind]
        return queue[0] if queue else None

    def pop(self, kind: RequestKind) -> Request:
        return self._queues[kind].popleft()

    def remove(self, request: Request) -> None:
        self._queues[request.kind].remove(request)

    def num_waiting(self, kind: RequestKind) -> int:
        return len(self._queues[kind])

    def __len__(self) -> int:
        return sum(len(q) for q in self._queues.values())

    def __iter__(self):
        for kind in RequestKind:
            yield from self._queues[kind]
