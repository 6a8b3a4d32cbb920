"""A bounded LRU whose answers expire: what the hot path remembers of the store.

Each answer is kept for at most `ttl_s` and at most `entries` answers are kept (the
least recently used goes first), so no cache can grow with the number of callers or
outlive the bound its user states.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any


class TtlLru:
    def __init__(self, ttl_s: float, entries: int, clock: Callable[[], float]) -> None:
        self.ttl_s, self._entries, self._clock = ttl_s, entries, clock
        self._answers: OrderedDict[Hashable, tuple[float, Any]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, read: Callable[[], Any]) -> Any:
        """The remembered answer for `key`, or `read()`'s, remembered from now."""
        now = self._clock()
        with self._lock:
            hit = self._answers.get(key)
            if hit is not None and hit[0] > now:
                self._answers.move_to_end(key)
                return hit[1]
        value = read()
        with self._lock:
            self._answers[key] = (now + self.ttl_s, value)
            self._answers.move_to_end(key)
            while len(self._answers) > self._entries:
                self._answers.popitem(last=False)
        return value

    def forget(self, *keys: Hashable) -> None:
        with self._lock:
            for key in keys:
                self._answers.pop(key, None)
