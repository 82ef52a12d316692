"""The candidates waiting to be graded, served round-robin by client: one client's thousand
rollouts do not starve another's one, and no client holds more than its share waiting."""

from __future__ import annotations

import collections
import threading
from collections.abc import Hashable
from typing import Generic, TypeVar

Item = TypeVar("Item")


class QueueFull(Exception):
    """A client already has as many candidates waiting as one may."""


class QueueClosed(Exception):
    """The session is closing: nothing new is taken."""


class FairQueue(Generic[Item]):
    """Per-client queues taken in turn; thread-safe."""

    def __init__(self, per_client: int) -> None:
        if per_client < 1:
            raise ValueError(f"per_client {per_client}: expected at least 1")
        self.per_client = per_client
        self._queues: dict[Hashable, collections.deque[Item]] = {}
        self._turns: collections.deque[Hashable] = collections.deque()  # clients waiting
        self._cond = threading.Condition()
        self._closed = False

    def put(self, client: Hashable, item: Item) -> None:
        with self._cond:
            if self._closed:
                raise QueueClosed("the session is closing and takes no new candidates")
            queue = self._queues.setdefault(client, collections.deque())
            if len(queue) >= self.per_client:
                raise QueueFull(f"client {client!r} has {len(queue)} candidates waiting "
                                f"(at most {self.per_client}); wait for results first")
            if not queue:
                self._turns.append(client)
            queue.append(item)
            self._cond.notify_all()

    def take(self, most: int, timeout: float | None = None, quiet_s: float = 0.0
             ) -> list[Item]:
        """Up to ``most`` items, one per client in turn, waiting for the first; [] once the
        queue is closed and empty (or after ``timeout`` with nothing come). Once one has come,
        more are waited for while they keep coming, each within ``quiet_s`` of the last
        (until ``most`` wait): a burst of clients' candidates goes as one batch."""
        with self._cond:
            self._cond.wait_for(lambda: self._turns or self._closed, timeout)
            waiting = self._depth()
            while self._turns and waiting < most and not self._closed and \
                    self._cond.wait(quiet_s) and self._depth() > waiting:
                waiting = self._depth()
            taken: list[Item] = []
            while self._turns and len(taken) < most:
                client = self._turns.popleft()
                queue = self._queues[client]
                taken.append(queue.popleft())
                if queue:
                    self._turns.append(client)
                else:
                    del self._queues[client]
            return taken

    def depth(self) -> int:
        with self._cond:
            return self._depth()

    def _depth(self) -> int:
        return sum(map(len, self._queues.values()))

    def close(self) -> None:
        """Take nothing new; what waits is still taken."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def drop(self) -> list[Item]:
        """Take nothing new; what was still waiting, handed back."""
        with self._cond:
            self._closed = True
            left = [item for client in self._turns for item in self._queues[client]]
            self._queues.clear()
            self._turns.clear()
            self._cond.notify_all()
            return left
