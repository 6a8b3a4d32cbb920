"""Content-free priors ("calibrate before use"), cached per probe in bounded memory.

Each probe can also be scored with the state replaced by "N/A"; its scores are then
divided by (log: minus) that prior. The prior depends only on the probe (its question,
listing and how the state is framed), so it is cached, keyed by a digest of the probe (`Probe.prior_key`),
and always computed alone, so a cached prior equals a fresh one bit for bit.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np


class PriorCache:
    """A bounded cache of content-free scores, keyed by a digest of the probe.

    Segmented LRU: a new prior waits in a small probation segment; one that is used
    again (a catalog entry's, a question an application asks all day) moves to the
    protected segment, which a stream of one-off inline questions cannot flush. So an
    entry version's priors are computed once and kept while it is in use, in bounded
    memory (`capacity` priors in all).
    """

    def __init__(self, capacity: int, protected_share: float = 0.8) -> None:
        self.capacity = capacity
        self._protected_capacity = int(capacity * protected_share)
        self._probation: OrderedDict[str, np.ndarray] = OrderedDict()
        self._protected: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def peek(self, key: str) -> np.ndarray | None:
        """The cached value, without counting a hit or moving it."""
        with self._lock:
            value = self._protected.get(key)
            return value if value is not None else self._probation.get(key)

    def get(self, key: str) -> np.ndarray | None:
        with self._lock:
            if key in self._protected:
                self._protected.move_to_end(key)
                self.hits += 1
                return self._protected[key]
            value = self._probation.pop(key, None)
            if value is None:
                self.misses += 1
                return None
            self.hits += 1
            self._protected[key] = value  # used twice: worth keeping
            while len(self._protected) > self._protected_capacity:
                demoted, old = self._protected.popitem(last=False)
                self._probation[demoted] = old
            self._trim()
            return value

    def put(self, key: str, value: np.ndarray) -> None:
        if self.capacity <= 0:
            return
        with self._lock:
            if key in self._protected:
                self._protected[key] = value
                return
            self._probation[key] = value
            self._probation.move_to_end(key)
            self._trim()

    def clear(self) -> None:
        """Forget every prior (benchmarks measure a cold cache)."""
        with self._lock:
            self._probation.clear()
            self._protected.clear()

    def _trim(self) -> None:
        while len(self._probation) + len(self._protected) > self.capacity:
            if self._probation:
                self._probation.popitem(last=False)
            else:
                self._protected.popitem(last=False)

    def __len__(self) -> int:
        return len(self._probation) + len(self._protected)
