"""When a job must be done by, and whether anybody still waits for it.

Every decision and chat carries one `Deadline`: the caller's (what is left of the
gateway's own deadline, passed in `X-Amzn-SageMaker-Custom-Attributes` as
`timeout_ms=N`), capped by SageMaker's 60 s per invocation. The engine checks it
between llama.cpp decodes, so a job whose time ran out, or whose caller hung up, stops
within one decode and frees the model for the next request, instead of finishing work
nobody will read. A job still queued when its deadline passes never runs.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

from scorer_container.errors import CallerGone, DeadlineExceeded


class Deadline:
    def __init__(self, seconds: float | None = None, *, clock: Callable[[], float] = time.monotonic,
                 given: bool = False) -> None:
        self._clock = clock
        self.seconds = math.inf if seconds is None else seconds  # what the caller gave it, all of it
        self.given = given  # the caller set it (timeout_ms), rather than the scorer's own ceiling
        self.at = math.inf if seconds is None else clock() + seconds
        self._gone = threading.Event()

    def caller_gone(self) -> None:
        """The connection closed: whatever is computed now is for nobody."""
        self._gone.set()

    @property
    def gone(self) -> bool:
        return self._gone.is_set()

    def remaining(self) -> float:
        return self.at - self._clock()

    def expired(self) -> bool:
        return self._gone.is_set() or self._clock() >= self.at

    def check(self) -> None:
        """Raise if the job should stop now."""
        if self._gone.is_set():
            raise CallerGone("the caller closed the connection; the job was abandoned")
        if self._clock() >= self.at:
            raise DeadlineExceeded("the request's deadline passed before the model finished; it was abandoned")


def never() -> Deadline:
    return Deadline(None)
