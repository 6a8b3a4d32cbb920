"""A streamed chat completion, relayed from the backend to the caller as it is generated.

The backend's pieces become whole server-sent events (`gateway.streaming.events`),
passed on one by one. The stream always ends with `data: [DONE]`; when the backend's
stream broke off, or the stream reached its bound, an OpenAI-shaped error event comes
first, since after the 200 has started no status can say it. However it ends (the
events done, an error, or the caller gone, which closes this generator), the backend is
hung up on (the scorer stops generating), the attempt's whole time is metered, and the
tenant's place in flight and reserved spend are released and settled.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator

from gateway.backends.base import StreamBroken, StreamedAnswer
from gateway.backends.pools import MetricsSink
from gateway.decisions.cost import Meter
from gateway.streaming.events import DONE, error_event, events

log = logging.getLogger("gateway.relay")


class ChatRelay:
    """The caller's events, an iterator whose `close()` always ends the stream: also when it
    was never read (a generator never started runs no `finally`, and would hold the tenant's
    place and reservation until collected)."""

    def __init__(self, answer: StreamedAnswer, release: contextlib.ExitStack, meter: Meter, bound: float,
                 clock: Callable[[], float], metrics: MetricsSink | None = None) -> None:
        self._answer, self._release, self._meter = answer, release, meter
        self._bound, self._clock, self._metrics = bound, clock, metrics
        self._events = self._relay()
        self._started = self._finished = False
        self._streamed_from = clock()

    def __iter__(self) -> ChatRelay:
        return self

    def __next__(self) -> bytes:
        self._started = True
        return next(self._events)

    def close(self) -> None:
        if self._started:
            self._events.close()
        else:
            self._finish("unread")

    def __del__(self) -> None:
        # The last resort: a response dropped on its way to the caller (an error after the
        # route returned it) still gives the tenant's place back and settles its spend.
        if not getattr(self, "_finished", True):  # (True: built only in part, nothing to give back)
            self.close()

    def _relay(self) -> Iterator[bytes]:
        ended = "caller_gone"  # unless the events end otherwise: the caller closed the stream
        try:
            for event in events(self._bounded(), self._answer.endpoint):
                yield event
                if event == DONE:
                    ended = "done"
                    return
        except _PastBound:
            ended = "bound"
            yield error_event("the stream reached its time limit; ask for a shorter completion (max_tokens)", "timeout")
            yield DONE
        except StreamBroken as broken:
            ended = "broken"
            log.warning("chat stream broke off", extra={"endpoint": broken.endpoint, "reason": broken.reason})
            yield error_event("the model endpoint failed mid-stream; the completion is incomplete", "stream_broken")
            yield DONE
        finally:
            self._finish(ended)

    def _bounded(self) -> Iterator[bytes]:
        """The answer's pieces, checked against the bound as each arrives (keep-alives included)."""
        for part in self._answer:
            if self._clock() >= self._bound:
                raise _PastBound
            yield part

    def _finish(self, ended: str) -> None:
        if self._finished:
            return
        self._finished = True
        try:
            self._answer.close()
            self._meter.extend(self._clock() - self._streamed_from)
            if self._metrics is not None and ended != "done":
                self._metrics.count({"broken": "StreamBroken", "bound": "StreamTimedOut"}.get(ended, "StreamAbandoned"))
            log.info("chat stream ended", extra={"ended": ended, "endpoint_s": round(self._meter.seconds, 3)})
        finally:
            self._release.close()  # the tenant's place and reservation, whatever failed above


class _PastBound(Exception):
    pass
