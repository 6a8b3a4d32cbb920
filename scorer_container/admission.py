"""Bounded admission: one job on the model at a time, a short line behind it, then 503.

A request that would wait behind more than `max_waiting` others is refused at once
with a Retry-After estimated from recent job durations, instead of joining an
unbounded queue that would only time out later (SageMaker gives a container 60 s per
invocation). A request whose deadline passes while it waits, or whose caller hangs up,
is dropped without running. Scale comes from more instances, not from a longer line.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from scorer_container.deadline import Deadline
from scorer_container.errors import DeadlineExceeded, Overloaded, QueueTimeout


class Ticket:
    """A place in line, taken at admission; released exactly once."""

    def __init__(self, admission: Admission) -> None:
        self._admission = admission
        self._released = False

    @asynccontextmanager
    async def running(self, deadline: Deadline | None = None) -> AsyncIterator[None]:
        """Wait for the model (no longer than the deadline), then hold it for the job."""
        semaphore = self._admission._running
        wait = None if deadline is None or deadline.remaining() == math.inf else max(0.0, deadline.remaining())
        try:
            await asyncio.wait_for(semaphore.acquire(), wait)
        except TimeoutError:
            raise self.timed_out() from None
        if deadline is not None:
            try:
                deadline.check()  # expired or abandoned while it waited: it never runs
            except DeadlineExceeded as exc:
                semaphore.release()
                raise exc if deadline.gone else self.timed_out() from None
        started = time.monotonic()
        try:
            yield
        finally:
            semaphore.release()
            self._admission._observe(time.monotonic() - started)

    def timed_out(self) -> QueueTimeout:
        """Busy, not too big: the job never ran, so a later retry can succeed."""
        return QueueTimeout("the request's deadline passed while it waited for the model; retry later",
                            self._admission.retry_after())

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._admission._admitted -= 1

    def __enter__(self) -> Ticket:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class Admission:
    def __init__(self, max_waiting: int) -> None:
        self.max_waiting = max_waiting
        self._running = asyncio.Semaphore(1)
        self._admitted = 0
        # Exponential moving average of job seconds, for Retry-After.
        self._mean_job_s = 1.0

    @property
    def admitted(self) -> int:
        return self._admitted

    def admit(self, *, alone: bool = False) -> Ticket:
        """A ticket, or Overloaded at once when one job runs and `max_waiting` wait. Long work
        (`alone`: past the ordinary budget) is admitted only when no job runs or waits: it would
        hold the model for longer than the others' deadlines, so it never goes ahead of them,
        and a retry (Retry-After) finds the model idle once the line has gone."""
        if self._admitted >= 1 + self.max_waiting or (alone and self._admitted):
            message = "this long request needs the model to itself, and it is busy" if alone else "the model is busy"
            raise Overloaded(f"{message}; retry later", self.retry_after())
        self._admitted += 1
        return Ticket(self)

    def retry_after(self) -> int:
        return max(1, min(60, math.ceil(self._mean_job_s * self._admitted)))

    def _observe(self, seconds: float) -> None:
        self._mean_job_s = 0.8 * self._mean_job_s + 0.2 * seconds
