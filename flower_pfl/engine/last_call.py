"""A function's value for the object it was last called with, kept per thread.

A node's clients, one after another, look up what depends only on their shared run config (its parsed
settings, its data request, its model): the object is the same for each, and an ``lru_cache`` would hash
and compare its many fields every time. ``LastCall`` answers by identity, and keeps one entry per thread,
so threads that serve other runs never see each other's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class LastCall(Generic[K, V]):
    """``make(key)``, kept for the ``key`` object this thread last asked for (by identity: ``key`` must not change
    while it is kept, as a frozen config or a run config does not)."""

    def __init__(self, make: Callable[[K], V]) -> None:
        self.make = make
        self._local = threading.local()

    def __call__(self, key: K) -> V:
        last: tuple[K, V] | None = getattr(self._local, "last", None)
        if last is not None and last[0] is key:
            return last[1]
        value = self.make(key)
        self._local.last = (key, value)
        return value
