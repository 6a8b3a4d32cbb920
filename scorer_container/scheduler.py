"""Tenants share one model fairly: a bounded line, memory in turn, and the model a step at a time.

A request passes three gates, each served in a fair order, and gives everything back when it ends:

    line      `admit` at arrival, never waiting: at most `max_jobs` admitted, one tenant at most
              its share of them (`tenant_share`: refused 429 `tenant_share`, a refusal of that
              tenant alone; untagged calls are no tenant, and may fill the line), long work at
              most all but one resident place (429 `long_share`);
              a full line is 503 + Retry-After (the endpoint is busy for everyone).
    planning  `planning()`: one request counts its work at a time (a hostile state costs CPU
              before any decode), the next chosen fairly, within its deadline.
    memory    `resident(cells, seqs)`: the job's own llama.cpp sequences and KV cells, taken
              when they are free, in fair order, within its deadline (else 503 queue_timeout).
              No tenant, and no long or bulk work, may hold memory that leaves no room for
              one more job of someone else's: a flood or a long job never locks the others out.
    turns     `step()`: one decode (a prefill piece, a token, a batch of leaves) and its reads;
              between steps the model goes to whichever ready job comes next in fair order,
              so nobody waits behind another's running job for more than one step.

The fair order is start-time fair queueing on two levels, by the seconds each step really took:
first the kind of work (ordinary, long, bulk, weighted so that long work gets `long_share` of the
model while ordinary work waits, bulk `bulk_share`), then, within it, tenants by their weight
(the gateway's `weight`). A tenant or kind that becomes active starts level with the active ones,
less what it saved by idling, up to `IDLE_CREDIT_S` of service: a tenant that decides now and
then gets its decision through at about its speed alone beside a tenant that works all the time
(which never idles, so never saves), and one that sends requests back to back saves nothing.
It is work-conserving: a job alone gets every step, long work included, and nothing is kept
idle while anyone is ready.

Whoever can reach the container picks its tenant tag: the scorer trusts its caller (the
gateway), and untagged calls share one lane of their own.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import math
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from scorer_container.deadline import Deadline
from scorer_container.errors import (
    CallerGone,
    DeadlineExceeded,
    LongOverShare,
    Overloaded,
    QueueTimeout,
    TenantOverShare,
)
from systemone.sidechannel import WORKS, Work

UNTAGGED = "-"  # the lane of calls without a tenant tag (direct callers of the container)
# Service a tenant or kind saves by idling, at most: about one ordinary decision's worth, so an
# occasional decision runs at its speed alone, and no one banks minutes of priority.
IDLE_CREDIT_S = 1.0
MAX_LANES = 1024  # idle lanes remembered (what each saved), the least recently active forgotten first
_ORDER = {work: rank for rank, work in enumerate(WORKS)}  # ties go to ordinary, then long, then bulk
_POLL_S = 0.25  # a job waiting for its turn notices a caller that left within this
QUEUED_SHARE = 0.05  # waiting this part of its deadline for others' plans or memory makes a cut load, not size
MAX_TURN_RESERVE_S = 2.0  # the most of a job's deadline kept back for a turn it could not finish (twice a step)


@dataclass
class _Share:
    """One class's or one lane's place in the fair order."""

    weight: float
    vtime: float = 0.0  # seconds of service, divided by the weight
    jobs: int = 0  # jobs admitted in it: it is active while this is above zero
    last_active: float = 0.0


@dataclass(eq=False)
class Job:
    """One request's place: in line, in memory, at the model. Released exactly once."""

    scheduler: Scheduler
    tenant: str
    work: Work
    deadline: Deadline
    number: int
    seqs: tuple[int, ...] = ()
    cells: int = 0
    resident_now: bool = False
    own_s: float = 0.0  # seconds of the model's time its steps took
    waited_s: float = 0.0  # seconds it waited, resident, for others' steps
    queued_s: float = 0.0  # seconds it waited for others' planning or memory, before it was resident
    released: bool = False
    working: bool = False  # a worker thread runs it: it is released when that ends
    abandoned: bool = False  # released while working: its next wait for a turn ends it
    _grant: asyncio.Future | None = field(default=None, repr=False)
    _need: tuple[int, int] = (0, 0)

    @property
    def step_tokens(self) -> int:
        return self.scheduler.step_tokens

    @property
    def shared(self) -> bool:
        """Others took a noticeable part of its time: a cut at its deadline is load, which a
        retry on a freer model can outlast, not size. Their steps between its own, at all (0.1 s:
        more than a clock's noise); or their plans and memory before it began, for a part of its
        deadline (QUEUED_SHARE) that its admission estimate could not have left as margin."""
        return self.waited_s > 0.1 or self.queued_s > QUEUED_SHARE * self.deadline.seconds

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        """Hold the model for one decode and its reads, once it is this job's turn."""
        self.scheduler._take_turn(self)
        started = self.scheduler.clock()
        try:
            with self.scheduler.model_lock:
                yield
        finally:
            self.scheduler._end_turn(self, self.scheduler.clock() - started)

    def planning(self) -> contextlib.AbstractAsyncContextManager[None]:
        return self.scheduler._planning(self)

    async def resident(self, cells: int, seqs: int) -> None:
        await self.scheduler._resident(self, cells, seqs)

    def run(self, func: Callable[..., Any], *args: Any) -> asyncio.Future:
        """`func(*args)` on one of the resident jobs' threads (there are as many as resident places).
        A release asked for while it runs waits for it to end (`Scheduler._release`)."""
        with self.scheduler._lock:
            self.working = True

        def work() -> Any:
            try:
                return func(*args)
            finally:
                with self.scheduler._turns:
                    self.working = False
                    abandoned = self.abandoned
                    self.scheduler._turns.notify_all()  # bulk work held back for it may go on
                if abandoned:
                    self.release()

        # Shielded: a caller cancelled before the thread picked it up must not cancel the work
        # item too, or nothing would ever run the `finally` that releases the job.
        return asyncio.shield(asyncio.get_running_loop().run_in_executor(self.scheduler.workers, work))

    def timed_out(self) -> Exception:
        """Its deadline passed before the model could finish it, for waiting (in line, for memory,
        or for turns the others took): busy, retry later (503); or its caller left."""
        return self.scheduler._late(self)

    def release(self) -> None:
        self.scheduler._release(self)

    def __enter__(self) -> Job:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class Scheduler:
    def __init__(self, *, cells: int, seqs: int, job_cells: int, max_jobs: int = 8, max_resident: int = 4,
                 tenant_share: float = 0.5, long_share: float = 0.25, bulk_share: float = 0.05,
                 step_tokens: int = 512, model_lock: Any = None, window_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not (0 < long_share < 1 and 0 < bulk_share < 1 and 0 < tenant_share <= 1):
            raise ValueError("shares are fractions between 0 and 1")
        self.cells, self.seqs, self.job_cells = cells, seqs, job_cells
        self.max_jobs, self.max_resident = max_jobs, max(1, max_resident)
        self.tenant_cap = max(1, int(max_jobs * tenant_share))
        self.step_tokens = step_tokens
        self.model_lock = model_lock if model_lock is not None else threading.Lock()
        self.clock = clock
        self.window_s = window_s
        self.workers = ThreadPoolExecutor(self.max_resident, thread_name_prefix="job")
        # Ordinary work weighs 1; long work's weight gives it `long_share` of the model beside it.
        self._classes = {"ordinary": _Share(1.0), "long": _Share(long_share / (1 - long_share)),
                         "bulk": _Share(bulk_share / (1 - bulk_share))}
        self._lanes: dict[tuple[Work, str], _Share] = {}
        # Each level's virtual time: where a share that becomes active starts (less its credit).
        self._class_clock = 0.0
        self._lane_clock: dict[Work, float] = {work: 0.0 for work in WORKS}
        self._jobs: list[Job] = []  # admitted, in arrival order
        self._numbers = itertools.count()
        self._lock = threading.Lock()
        self._turns = threading.Condition(self._lock)
        self._holder: Job | None = None
        self._ready: list[Job] = []
        self._memory_waiting: list[Job] = []
        self._planning_waiting: list[tuple[Job, asyncio.Future]] = []
        self._planner: Job | None = None
        self._free_seqs = collections.deque(range(seqs))
        self._mean_job_s = 1.0
        # The longest of the recent turns: a job whose deadline is nearer than that does not start
        # (or wait for) another, since it could not end before its deadline, and its caller stops
        # listening at it. Cut before it instead, the job's 503 reaches the caller in time.
        self._turns_s: collections.deque[float] = collections.deque(maxlen=16)
        self._busy: collections.deque[tuple[float, str, Work, float]] = collections.deque(maxlen=20_000)
        # The model's seconds by kind of work since the scorer started: counters that only grow,
        # so that any span's share of interactive and bulk work is the difference of two readings.
        self._busy_total: dict[Work, float] = {work: 0.0 for work in WORKS}

    # -- the line ---------------------------------------------------------------------

    def admit(self, tenant: str, work: Work, deadline: Deadline, weight: float = 1.0) -> Job:
        """A place in line, or a refusal at once: this tenant's share (429), long work's share (429),
        a full line (503). Never waits."""
        tenant = tenant or UNTAGGED
        with self._lock:
            # The untagged lane is everyone who calls the container directly, not a tenant: it
            # takes turns as one, but its share of the line is the whole line.
            capped = tenant != UNTAGGED and self.tenant_cap < self.max_jobs
            if capped and sum(1 for j in self._jobs if j.tenant == tenant) >= self.tenant_cap:
                raise TenantOverShare(
                    f"this tenant has {self.tenant_cap} requests in this model's line, its share of the"
                    f" {self.max_jobs} places; retry when one has ended", self._retry_after())
            if len(self._jobs) >= self.max_jobs:
                raise Overloaded("the model is busy; retry later", self._retry_after())
            if work == "long" and self._classes["long"].jobs >= self._room(self.max_resident):
                raise LongOverShare(
                    "long work's share of this instance is taken by other long requests; retry later, or ask for"
                    " less (an ordinary deadline)", self._retry_after())
            job = Job(self, tenant, work, deadline, next(self._numbers))
            lane = self._lanes.get((work, tenant))
            if lane is None:
                self._forget_idle_lanes()
                lane = self._lanes[(work, tenant)] = _Share(weight)
            lane.weight = weight  # the tenant's latest weight
            self._join(job)
            for share in (self._classes[work], lane):
                share.jobs += 1
                share.last_active = self.clock()
            self._jobs.append(job)
            return job

    @property
    def admitted(self) -> int:
        return len(self._jobs)

    def retry_after(self) -> int:
        with self._lock:
            return self._retry_after()

    def _retry_after(self) -> int:
        resident = max(1, min(self.max_resident, len(self._jobs)))
        return max(1, min(60, math.ceil(self._mean_job_s * len(self._jobs) / resident)))

    def _room(self, places: int) -> int:
        """What one tenant, or long and bulk work together, may hold of `places`: all but one,
        so that someone else's next job always has room (all of it where there is just one)."""
        return max(1, places - 1)

    def _join(self, job: Job) -> None:
        """Level the job's kind and lane with those competing for the model now (ready for a turn,
        or holding it), unless one of their jobs competes already: called when a job is admitted
        (for the order of planning and memory) and whenever it asks for a turn. A share that did
        not compete (idle, or waiting for memory or a plan) fell behind while the others were
        served; it keeps at most IDLE_CREDIT_S of that, never more, so nothing waited for is
        banked as priority, and a newcomer is never levelled with a share's frozen figure."""
        competing = [j for j in (*self._ready, self._holder) if j is not None and j is not job]
        if not any(j.work == job.work for j in competing):
            self._level(self._classes[job.work], [self._classes[j.work] for j in competing], self._class_clock)
        if not any(j.work == job.work and j.tenant == job.tenant for j in competing):
            peers = [self._lanes[(j.work, j.tenant)] for j in competing if j.work == job.work]
            self._level(self._lanes[(job.work, job.tenant)], peers, self._lane_clock[job.work])

    @staticmethod
    def _level(share: _Share, competing: list[_Share], clock: float) -> None:
        """At least level with the competing shares (with none, where the service last given at
        its level ended: `clock`), less IDLE_CREDIT_S of service; never less than it has."""
        level = min((p.vtime for p in competing if p is not share), default=clock)
        share.vtime = max(share.vtime, level - IDLE_CREDIT_S / share.weight)

    def _forget_idle_lanes(self) -> None:
        """Past MAX_LANES, the least recently active idle lanes are forgotten (a forgotten lane
        starts level with the active ones, less the whole credit, when it comes back)."""
        if len(self._lanes) >= MAX_LANES:
            idle = sorted((s.last_active, key) for key, s in self._lanes.items() if s.jobs == 0)
            for _, key in idle[: len(self._lanes) - MAX_LANES + 1]:
                del self._lanes[key]

    def _release(self, job: Job) -> None:
        grants: list[Job] = []
        with self._lock:
            if job.released:
                return
            if job.working:
                # Its thread still runs (a stream's caller left): the thread releases it when it
                # ends, its sequences dropped; until then nothing of it may be handed to another.
                job.abandoned = True
                self._turns.notify_all()
                return
            job.released = True
            if job in self._ready:
                self._ready.remove(job)
            if job in self._memory_waiting:
                self._memory_waiting.remove(job)
            self._jobs.remove(job)
            self._classes[job.work].jobs -= 1
            lane = self._lanes[(job.work, job.tenant)]
            lane.jobs -= 1
            lane.last_active = self.clock()
            self._classes[job.work].last_active = lane.last_active
            if job.resident_now:
                job.resident_now = False
                self._free_seqs.extend(job.seqs)
                job.seqs = ()
                self._mean_job_s = 0.8 * self._mean_job_s + 0.2 * job.own_s
            grants = self._grant_memory()  # a waiter that left may have been the one in the way
            self._turns.notify_all()
        _wake(grants)

    # -- the fair order ---------------------------------------------------------------

    def _next(self, jobs: list[Job]) -> Job | None:
        """The job that comes next among `jobs`: the kind of work with the least service for its
        weight, then the tenant with the least within it, then the earliest."""
        if not jobs:
            return None
        return min(jobs, key=lambda j: (self._classes[j.work].vtime, _ORDER[j.work],
                                        self._lanes[(j.work, j.tenant)].vtime, j.number))

    def _charge(self, job: Job, seconds: float, model: bool = True) -> None:
        """The service a turn (or a plan) gave, on its kind's and its lane's account; each level's
        clock moves to where that service ended, for shares that become active with no peer."""
        kind, lane = self._classes[job.work], self._lanes[(job.work, job.tenant)]
        kind.vtime += seconds / kind.weight
        lane.vtime += seconds / lane.weight
        self._class_clock = max(self._class_clock, kind.vtime)
        self._lane_clock[job.work] = max(self._lane_clock[job.work], lane.vtime)
        if model:  # a plan's seconds count in the order, not as the model's busy time
            job.own_s += seconds
            self._busy.append((self.clock(), job.tenant, job.work, seconds))
            self._busy_total[job.work] += seconds

    # -- planning ----------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _planning(self, job: Job):
        """One request plans at a time; the next is chosen fairly; a wait past the deadline is 503."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._planner is None:
                self._planner = job
                waiter = None
            else:
                waiter = loop.create_future()
                self._planning_waiting.append((job, waiter))
        if waiter is not None:
            asked = self.clock()
            try:
                await _granted(waiter, job.deadline)
                job.queued_s += self.clock() - asked
            except (TimeoutError, asyncio.CancelledError) as exc:
                with self._lock:
                    granted = self._planner is job
                    self._planning_waiting = [(j, f) for j, f in self._planning_waiting if j is not job]
                if granted:
                    self._end_planning(job)
                if isinstance(exc, asyncio.CancelledError):
                    raise
                raise self._late(job) from None
        started = self.clock()
        try:
            yield
        finally:
            with self._lock:
                self._charge(job, self.clock() - started, model=False)
            self._end_planning(job)

    def _end_planning(self, job: Job) -> None:
        with self._lock:
            if self._planner is not job:
                return
            waiting = [j for j, _ in self._planning_waiting]
            chosen = self._next(waiting)
            self._planner = chosen
            future = None
            if chosen is not None:
                future = next(f for j, f in self._planning_waiting if j is chosen)
                self._planning_waiting = [(j, f) for j, f in self._planning_waiting if j is not chosen]
        if future is not None:
            _resolve(future)

    # -- memory -------------------------------------------------------------------------

    async def _resident(self, job: Job, cells: int, seqs: int) -> None:
        """Wait until the job's cells and sequences are free and its turn in the fair order comes."""
        if cells > self.cells or seqs > self.seqs:
            raise ValueError("a job larger than the whole context is never admitted")
        job._grant = asyncio.get_running_loop().create_future()
        job._need = (cells, seqs)
        with self._lock:
            self._memory_waiting.append(job)
            grants = self._grant_memory()
        _wake(grants)
        asked = self.clock()
        try:
            await _granted(job._grant, job.deadline)
            job.queued_s += self.clock() - asked
        except (TimeoutError, asyncio.CancelledError) as exc:
            with self._lock:
                if job in self._memory_waiting:
                    self._memory_waiting.remove(job)
                grants = self._grant_memory()  # it may have been the one in the way
            _wake(grants)
            if isinstance(exc, asyncio.CancelledError):
                raise
            raise self._late(job) from None

    def _grant_memory(self) -> list[Job]:
        """Give memory to waiting jobs in fair order while the next one fits (caller holds the lock)."""
        granted = []
        while True:
            eligible = [j for j in self._memory_waiting if self._may_hold(j)]
            job = self._next(eligible)
            if job is None or not self._fits(job):
                return granted
            cells, seqs = job._need
            job.seqs = tuple(self._free_seqs.popleft() for _ in range(seqs))
            job.cells, job.resident_now = cells, True
            self._memory_waiting.remove(job)
            granted.append(job)

    def _resident_jobs(self) -> list[Job]:
        return [j for j in self._jobs if j.resident_now]

    def _fits(self, job: Job) -> bool:
        cells, seqs = job._need
        resident = self._resident_jobs()
        return (len(resident) < self.max_resident and len(self._free_seqs) >= seqs
                and sum(j.cells for j in resident) + cells <= self.cells)

    def _may_hold(self, job: Job) -> bool:
        """No tenant, and no long or bulk work, holds memory that leaves no room for someone else's
        next job (a whole job's context, and a resident place)."""
        resident = self._resident_jobs()
        cells = job._need[0]
        mine = [j for j in resident if j.tenant == job.tenant]
        if not self._leaves_room(mine, cells):
            return False
        if job.work != "ordinary":
            return self._leaves_room([j for j in resident if j.work != "ordinary"], cells)
        return True

    def _leaves_room(self, held: list[Job], cells: int) -> bool:
        room_cells = self.cells - self.job_cells if self.cells >= 2 * self.job_cells else self.cells
        return len(held) + 1 <= self._room(self.max_resident) and sum(j.cells for j in held) + cells <= room_cells

    # -- turns ------------------------------------------------------------------------------

    def _take_turn(self, job: Job) -> None:
        """Block (a worker thread) until the model is free and this job comes next among the ready."""
        asked = self.clock()
        with self._turns:
            if job.abandoned:  # released while its thread ran: no more turns, even a free one
                raise CallerGone("the caller closed the connection; the job was abandoned")
            self._join(job)
            self._ready.append(job)
            try:
                while True:
                    if job.abandoned:
                        raise CallerGone("the caller closed the connection; the job was abandoned")
                    left = job.deadline.remaining() - self._turn_reserve()
                    if job.deadline.expired() or left <= 0:  # no time for a turn before its deadline
                        job.deadline.check()
                        raise DeadlineExceeded("the request's deadline passed before the model finished")
                    if self._holder is None and self._next(self._ready) is job and not self._held_back(job):
                        break
                    self._turns.wait(min(_POLL_S, left))
            finally:
                self._ready.remove(job)
            self._holder = job
        job.waited_s += self.clock() - asked

    def _held_back(self, job: Job) -> bool:
        """Bulk work (batch lines) does not take the model from a job of another kind that is
        between two of its steps (its thread works on it: reading what the last step gave, making
        the next), unless bulk is owed its share (`bulk_share`): else each of an interactive
        decision's steps would wait behind one of the batch's, and batches are to use the time
        interactive work leaves, not to slow it. The job's thread ending wakes the waiters."""
        if job.work != "bulk":
            return False
        owed = self._classes["bulk"].vtime
        return any(j.working and j.work != "bulk" and self._classes[j.work].vtime <= owed for j in self._jobs)

    def _turn_reserve(self) -> float:
        """The time a turn may take: the longest of the recent ones, at most MAX_TURN_RESERVE_S (a
        turn is sized to about SCORER_STEP_S; one a hiccup made longer must not cut everyone early)."""
        return min(MAX_TURN_RESERVE_S, max(self._turns_s, default=0.0))

    def _end_turn(self, job: Job, seconds: float) -> None:
        with self._turns:
            self._holder = None
            self._turns_s.append(seconds)
            self._charge(job, seconds)
            self._turns.notify_all()

    # -- figures ------------------------------------------------------------------------------

    def figures(self) -> dict[str, Any]:
        """The model's busy seconds in the last window, by tenant tag and kind of work; the line now."""
        now = self.clock()
        with self._lock:
            recent = [(tenant, work, s) for when, tenant, work, s in self._busy if now - when <= self.window_s]
            resident = self._resident_jobs()
            line = {"admitted": len(self._jobs), "resident": len(resident), "max_jobs": self.max_jobs,
                    "max_resident": self.max_resident, "tenant_cap": self.tenant_cap,
                    "cells_held": sum(j.cells for j in resident), "cells": self.cells}
        by_tenant: dict[str, float] = collections.defaultdict(float)
        by_work: dict[str, float] = collections.defaultdict(float)
        for tenant, work, seconds in recent:
            by_tenant[tenant] += seconds
            by_work[work] += seconds
        return {"window_s": self.window_s, "busy_s": round(sum(by_work.values()), 3),
                "busy_s_by_tenant": {t: round(s, 3) for t, s in by_tenant.items()},
                "busy_s_by_work": {w: round(s, 3) for w, s in by_work.items()},
                "busy_s_total_by_work": {w: round(s, 3) for w, s in self._busy_total.items()}, "line": line}

    def _late(self, job: Job) -> Exception:
        """Its deadline passed before it got what it waited for: the caller left, or busy (503)."""
        if job.deadline.gone:
            return CallerGone("the caller closed the connection; the job was abandoned")
        return QueueTimeout("the request's deadline passed while it waited for the model, shared with other work;"
                            " retry later", self.retry_after())


async def _granted(future: asyncio.Future, deadline: Deadline) -> None:
    """Wait for `future`, or TimeoutError once the deadline passes or the caller leaves (checked
    every _POLL_S: a caller that hung up gives its place back within that)."""
    while True:
        if deadline.expired():
            raise TimeoutError
        try:
            await asyncio.wait_for(asyncio.shield(future), min(_POLL_S, max(0.0, deadline.remaining())))
            return
        except TimeoutError:
            continue


def _resolve(future: asyncio.Future) -> None:
    def settle() -> None:
        if not future.done():
            future.set_result(None)

    future.get_loop().call_soon_threadsafe(settle)


def _wake(jobs: list[Job]) -> None:
    for job in jobs:
        if job._grant is not None:
            _resolve(job._grant)
