"""Endpoint pools: which endpoint gets a request, how long it may take, when to give up.

One request makes at most one pass over its pool plus `extra_attempts`, inside one
deadline (below API Gateway's 29 s). A busy endpoint hands the request to the next one
at once; a second pass waits a jittered, capped backoff first, and never goes back to
an endpoint that said it is saturated: that one answered "later", so the caller gets
429 with its Retry-After at once instead of the gateway queueing on its behalf (client
SDKs retry 429 themselves; retrying here too would multiply the load). Work that ran out
of time is never sent again, to another endpoint or the same: it may still run there,
and would hold a second model while others wait. Cut by the scorer at its deadline, it
would run out of time anywhere (504, and the caller is told not to retry); with no answer
at all, the endpoint is more likely hung than the work too large (503, retry later,
and the endpoint's circuit counts it). An endpoint that is busy
`failure_threshold` times in a row is skipped for `cooldown_s` (its circuit is open),
then gets one probe request (half-open): a dead endpoint costs no latency, and a burst
never turns into a retry storm. A container's 4xx goes straight back to the caller.

A scorer that refuses this tenant its share of its line (`tenant_share`) ends the request
at once with 429 and the scorer's Retry-After: another endpoint or pool would only hand
the tenant more than its share. One that refuses long work its share (`long_share`) hands
the request to the next endpoint, and it is 429 when none has room. Neither is the
endpoint's saturation, so neither counts toward its circuit; and a long request never
takes a half-open endpoint's probe, which is left to ordinary requests.

Circuit state lives in the warm function instance, as every instance learns the same
facts from its own traffic within a few requests.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol, TypeVar

from gateway.backends.base import (
    ANONYMOUS,
    Caller,
    Endpoint,
    EndpointBusy,
    EndpointFailed,
    EndpointRefused,
    EndpointRejected,
    EndpointTimedOut,
    InferenceBackend,
    Route,
    StreamedAnswer,
)
from gateway.decisions.cost import Cost, Meter, worst_case
from gateway.errors import (
    BackendFailed,
    BackendUnavailable,
    InvalidRequest,
    NoAnswerInTime,
    PayloadTooLarge,
    RateLimited,
    RequestError,
    ServiceError,
    WorkTimedOut,
)
from gateway.settings import MAX_STREAM_DEADLINE_S
from systemone.errors import read_error_body

log = logging.getLogger("gateway.pools")

# Busy reasons that mean "saturated" (the caller should slow down: 429), as opposed to
# unreachable, starting or failing (503).
SATURATED = {"container_503", "container_429", "container_queue_timeout", "ServiceUnavailable", "ThrottlingException",
             "429", "503"}  # the last two: an answer with no code, only its status (a proxy's or load balancer's)
# Read timeouts an attempt may be given when the deadline is closer than the endpoint's
# own timeout: few values, so the invoker keeps few clients (botocore fixes the read
# timeout per client), yet fine enough at the top that a first attempt under the 25 s
# deadline gets 23 s, not 16.
_TIMEOUT_STEPS = (23.0, 22.0, 20.0, 18.0, 16.0, 12.0, 8.0, 4.0, 2.0, 1.0)
MIN_ATTEMPT_S = 0.5  # the least time an attempt is started with
# What a request has spent on itself (its body, its checks, its work limits) before its first attempt.
_SPENT_BEFORE_FIRST_ATTEMPT_S = 0.01
_Answer = TypeVar("_Answer")


class MetricsSink(Protocol):
    def count(self, name: str) -> None: ...


class NoMetrics:
    def count(self, name: str) -> None:
        pass


@dataclass(frozen=True, slots=True)
class PoolPolicy:
    deadline_s: float = 25.0
    stream_deadline_s: float = MAX_STREAM_DEADLINE_S  # the longest a caller may ask for on the streaming routes
    extra_attempts: int = 1
    backoff_base_s: float = 0.1
    backoff_max_s: float = 2.0
    failure_threshold: int = 3
    cooldown_s: float = 15.0
    default_retry_after_s: int = 2
    line: int = 8  # the jobs one scorer instance admits at once (half of them one tenant's at most)
    min_instances: int = 1  # the least instances the pool's first tier runs

    def tenant_in_flight(self) -> int:
        """What one tenant may have in flight on the pool when its limits do not say: half a
        scorer's line on each of the pool's least instances, what the scorers let one tenant
        hold (more would only be refused there, after a call), and never less than one."""
        return max(1, (self.line // 2) * self.min_instances)


@dataclass(frozen=True, slots=True)
class PoolEndpoint:
    endpoint: Endpoint
    tier: int  # lower tiers first; endpoints sharing a tier are ordered by weighted chance
    weight: float = 1.0


@dataclass(frozen=True, slots=True)
class Invocation:
    body: bytes
    endpoint: str
    attempts: int
    cost: Cost = field(default_factory=Cost)  # every attempt's time on an endpoint, at each one's price


class Circuits:
    """Per-endpoint circuit breakers: closed -> open after repeated busy -> half-open probe."""

    def __init__(self, policy: PoolPolicy, clock: Callable[[], float] = time.monotonic) -> None:
        self.policy = policy
        self.clock = clock
        self._lock = threading.Lock()
        self._failures: dict[str, int] = {}
        self._open_until: dict[str, float] = {}
        self._reason: dict[str, str] = {}  # why the circuit last opened
        self._probing: set[str] = set()

    def allow(self, name: str, may_probe: bool = True) -> bool:
        """May a request go to the endpoint: its circuit closed, or half-open and this request
        the probe (never one that `may_probe` not: it skips a half-open endpoint instead)."""
        with self._lock:
            until = self._open_until.get(name)
            if until is None:
                return True
            if self.clock() < until or name in self._probing or not may_probe:
                return False
            self._probing.add(name)  # half-open: this request is the probe
            return True

    def open_reason(self, name: str) -> str | None:
        with self._lock:
            return self._reason.get(name) if name in self._open_until else None

    def succeeded(self, name: str) -> None:
        with self._lock:
            self._failures.pop(name, None)
            self._open_until.pop(name, None)
            self._reason.pop(name, None)
            self._probing.discard(name)

    def release(self, name: str) -> None:
        """A granted probe was not used: let the next request probe instead."""
        with self._lock:
            self._probing.discard(name)

    def failed(self, name: str, reason: str = "", hold_s: float | None = None) -> bool:
        """Record a busy outcome; True when this opened the circuit.

        A saturated endpoint that said when to come back (`hold_s`, its Retry-After) is
        skipped for that long; otherwise for the cooldown.
        """
        hold = self.policy.cooldown_s if hold_s is None else min(hold_s, self.policy.cooldown_s)
        with self._lock:
            if name in self._probing:
                self._probing.discard(name)
                self._open_until[name], self._reason[name] = self.clock() + hold, reason
                return True
            self._failures[name] = self._failures.get(name, 0) + 1
            if self._failures[name] >= self.policy.failure_threshold and name not in self._open_until:
                self._open_until[name], self._reason[name] = self.clock() + hold, reason
                return True
            return False

    def seconds_until_probe(self, names: list[str]) -> float:
        with self._lock:
            now = self.clock()
            waits = [self._open_until[n] - now for n in names if n in self._open_until]
        return max(0.0, min(waits)) if waits else 0.0


class EndpointPool:
    def __init__(
        self,
        members: tuple[PoolEndpoint, ...],
        policy: PoolPolicy,
        circuits: Circuits,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
    ) -> None:
        self.members = members
        self.policy = policy
        self.circuits = circuits
        self.clock = clock
        self.sleep = sleep
        self.rng = rng or random.Random()

    def order(self) -> list[Endpoint]:
        """Tiers ascending; within a tier, a weighted random order (weighted sampling without replacement)."""
        ordered: list[Endpoint] = []
        for tier in sorted({m.tier for m in self.members}):
            group = [m for m in self.members if m.tier == tier]
            keyed = sorted(group, key=lambda m: self.rng.random() ** (1.0 / m.weight), reverse=True)
            ordered.extend(m.endpoint for m in keyed)
        return ordered

    def deadline(self, streaming: bool, wait_s: float | None = None) -> float:
        """A request's time: the ordinary deadline, or what the caller asked for (`wait_s`, its
        `Prefer: wait`), up to the streaming routes' longer one on those routes."""
        longest = self.policy.stream_deadline_s if streaming else self.policy.deadline_s
        return min(longest, wait_s) if wait_s is not None else min(longest, self.policy.deadline_s)

    def worst_case(self, size: int, deadline_s: float | None = None) -> Cost:
        """The most a request of `size` bytes can cost here (a budget reserves it before the call)."""
        deadline = self.policy.deadline_s if deadline_s is None else deadline_s
        return worst_case(deadline, max(e.usd_per_second for e in self._taking(size)))

    def first_attempts(self) -> list[Endpoint]:
        """Each member as an ordinary request's first attempt calls it: its read timeout cut to
        what is left of the deadline (`_within`) once the request has spent a few milliseconds
        on itself. The clients the init phase builds and primes; another attempt's (a shorter
        read timeout, long work's longer one) is built on its first use."""
        remaining = self.policy.deadline_s - _SPENT_BEFORE_FIRST_ATTEMPT_S
        return list(dict.fromkeys(_within(member.endpoint, remaining) for member in self.members))

    def is_long(self, deadline_s: float) -> bool:
        """Work with a deadline past the ordinary one: the streaming routes' longer requests."""
        return deadline_s > self.policy.deadline_s

    def ask(self, backend: InferenceBackend, body: bytes, route: Route, metrics: MetricsSink | None = None,
            caller: Caller = ANONYMOUS, meter: Meter | None = None, *, deadline_s: float | None = None) -> Invocation:
        """The first answer of the pool's endpoints, in their order, within the deadline (the
        policy's, or `deadline_s`); each attempt's endpoint time is added to `meter` (a new one
        when None) as it ends. Past the policy's deadline (a streaming route's longer one), an
        attempt may read for what is left of it, past the endpoint's own read timeout."""
        meter = meter if meter is not None else Meter()
        deadline = self.policy.deadline_s if deadline_s is None else deadline_s
        long = self.is_long(deadline)
        answer, endpoint, attempts = self._first_answer(
            lambda endpoint, remaining: backend.invoke(_stretched(endpoint, remaining) if long else endpoint,
                                                       body, route, caller),
            len(body), route, deadline, metrics, meter)
        return Invocation(answer, endpoint, attempts, meter.cost())

    def ask_stream(self, backend: InferenceBackend, body: bytes, route: Route, deadline_s: float,
                   metrics: MetricsSink | None = None, caller: Caller = ANONYMOUS,
                   meter: Meter | None = None) -> tuple[StreamedAnswer, Invocation]:
        """The first endpoint whose answer starts streaming, with the same order, fallback and
        circuits as `ask`: everything that can refuse the request happens before its first
        piece arrives. `deadline_s` bounds the whole stream; the attempt's time in `meter`
        runs to its first piece, and the caller adds the rest (`Meter.extend`) when it ends."""
        meter = meter if meter is not None else Meter()
        long = self.is_long(deadline_s)
        answer, endpoint, attempts = self._first_answer(
            lambda endpoint, remaining: backend.invoke_stream(_stretched(endpoint, remaining) if long else endpoint,
                                                              body, route, caller, remaining),
            len(body), route, deadline_s, metrics, meter)
        return answer, Invocation(b"", endpoint, attempts, meter.cost())

    def _first_answer(self, call: Callable[[Endpoint, float], _Answer], size: int, route: Route, deadline_s: float,
                      metrics: MetricsSink | None, meter: Meter) -> tuple[_Answer, str, int]:
        """(The first answer, the endpoint that gave it, the attempts made.) A long request never
        takes a half-open endpoint's probe: it is the likeliest to be refused its share (which
        proves nothing either way), and it would hold the probe for up to a minute."""
        metrics = metrics or NoMetrics()
        deadline = self.clock() + deadline_s
        may_probe = not self.is_long(deadline_s)
        first_pass = self._taking(size)
        plan = first_pass + [e for _ in range(self.policy.extra_attempts) for e in first_pass][: self.policy.extra_attempts]
        attempts = 0
        busy: list[EndpointBusy] = []
        refused: list[EndpointRefused] = []
        skipped: list[str] = []
        said_later: set[str] = set()  # saturated, or refused long work: not asked again in this request
        for position, endpoint in enumerate(plan):
            if endpoint.name in said_later:
                continue
            if not self.circuits.allow(endpoint.name, may_probe):
                skipped.append(endpoint.name)
                metrics.count("EndpointSkipped")
                continue
            if position >= len(first_pass) and busy:  # a second try (the endpoint was busy): back off first
                wait = self._backoff(position - len(first_pass))
                if self.clock() + wait + MIN_ATTEMPT_S > deadline:
                    self.circuits.release(endpoint.name)
                    continue
                self.sleep(wait)
            remaining = deadline - self.clock()
            if remaining < MIN_ATTEMPT_S:
                self.circuits.release(endpoint.name)
                break
            attempts += 1
            started = self.clock()
            try:
                answer = call(_within(endpoint, remaining), remaining)
            except EndpointBusy as exc:
                busy.append(exc)
                if exc.reason in SATURATED:
                    said_later.add(endpoint.name)
                self._busy(endpoint, exc, attempts, metrics)
                continue
            except EndpointRefused as exc:
                refused.append(self._refused(endpoint, exc, attempts, metrics))  # this tenant's share: 429 at once
                said_later.add(endpoint.name)
                continue
            except EndpointTimedOut as exc:
                raise self._timed_out(endpoint, exc, attempts, route, metrics) from None
            except EndpointRejected as exc:
                raise self._rejected(endpoint, exc, metrics) from None
            except EndpointFailed as exc:
                raise self._failed(endpoint, exc, attempts, metrics) from None
            except BaseException:
                self.circuits.release(endpoint.name)  # whatever escaped, a probe never holds its endpoint shut
                raise
            finally:  # an attempt that failed held the endpoint too
                meter.add(endpoint.name, self.clock() - started, endpoint.usd_per_second, endpoint.billed_by_duration)
            self._answered(endpoint, attempts > 1 or bool(skipped), metrics)
            return answer, endpoint.name, attempts
        raise self._exhausted(busy, refused, skipped, metrics)

    def _taking(self, size: int) -> list[Endpoint]:
        """The endpoints in the order to ask them, those that take a body this large; a body none
        takes is refused at once (413 with the figures), never sent to be refused."""
        ordered = self.order()
        taking = [e for e in ordered if e.max_body_bytes is None or size <= e.max_body_bytes]
        if not taking:
            largest = max(e.max_body_bytes or 0 for e in ordered)
            raise PayloadTooLarge(f"this request reaches the model as {size} bytes; this model's endpoints take at most"
                                  f" {largest} (SageMaker Serverless Inference): shorten the state or split the request")
        return taking

    def _refused(self, endpoint: Endpoint, exc: EndpointRefused, attempt: int, metrics: MetricsSink) -> EndpointRefused:
        """The scorer refused this tenant or this request its share: it answered, so it is alive,
        and it is not full for others, so its circuit never counts it (a probe it held is
        released for the next request to make). This tenant's share taken ends the request at
        once (429): another endpoint or pool would only hand the tenant more than its share.
        Long work's share taken is this request's alone: the next endpoint may have room."""
        self.circuits.release(endpoint.name)
        metrics.count("AttemptRefused")
        log.info("endpoint refused a share", extra={"endpoint": endpoint.name, "reason": exc.reason, "attempt": attempt})
        if exc.state == "tenant_share":
            metrics.count("TenantShareRefused")
            raise RateLimited("this tenant holds its share of this model's capacity already (its requests in flight"
                              " on it); retry when one has ended",
                              exc.retry_after or self.policy.default_retry_after_s) from None
        return exc

    def _answered(self, endpoint: Endpoint, fallback: bool, metrics: MetricsSink) -> None:
        self.circuits.succeeded(endpoint.name)
        metrics.count("AttemptOk")
        if fallback:
            metrics.count("Fallback")

    def _rejected(self, endpoint: Endpoint, exc: EndpointRejected, metrics: MetricsSink) -> RequestError:
        self.circuits.succeeded(endpoint.name)  # it answered: healthy, the request was not
        metrics.count("AttemptRejected")
        return rejection_error(exc)

    def _failed(self, endpoint: Endpoint, exc: EndpointFailed, attempt: int, metrics: MetricsSink) -> ServiceError:
        self.circuits.release(endpoint.name)  # a probe that failed this way proves nothing either way
        metrics.count("AttemptFailed")
        log.error("endpoint failed", extra={"endpoint": exc.endpoint, "reason": exc.reason, "attempt": attempt})
        return BackendFailed("the model endpoint failed on this request")

    def _busy(self, endpoint: Endpoint, exc: EndpointBusy, attempt: int, metrics: MetricsSink) -> None:
        metrics.count("AttemptBusy")
        hold = float(exc.retry_after) if exc.retry_after and exc.reason in SATURATED else None
        if self.circuits.failed(endpoint.name, exc.reason, hold):
            metrics.count("CircuitOpened")
            log.warning("circuit opened", extra={"endpoint": endpoint.name, "reason": exc.reason})
        log.warning("endpoint busy", extra={"endpoint": endpoint.name, "reason": exc.reason, "attempt": attempt})

    def _timed_out(self, endpoint: Endpoint, exc: EndpointTimedOut, attempt: int, route: Route,
                   metrics: MetricsSink) -> ServiceError:
        """The work ran out of time: it is not sent again. A scorer that cut the job itself is
        healthy, and the caller is told not to retry (504); one that said nothing counts toward
        its circuit, and the caller may retry later, when another endpoint may answer (503)."""
        metrics.count("AttemptTimedOut")
        log.warning("endpoint ran out of time", extra={"endpoint": endpoint.name, "reason": exc.reason,
                                                      "attempt": attempt})
        if not exc.answered:
            if self.circuits.failed(endpoint.name, exc.reason):
                metrics.count("CircuitOpened")
            return NoAnswerInTime("the model endpoint did not answer in time; retry later",
                                  max(1, round(self.policy.cooldown_s)))
        self.circuits.succeeded(endpoint.name)
        less = "a shorter completion (max_tokens)" if route == "chat" else (
            "less work per request (fewer questions or options, a shorter state)")
        return WorkTimedOut(f"the model ran out of time on this request; retrying it would too: ask for {less}")

    def _backoff(self, retry: int) -> float:
        """Full jitter: uniform in [0, min(cap, base * 2^retry)]."""
        return self.rng.uniform(0, min(self.policy.backoff_max_s, self.policy.backoff_base_s * 2**retry))

    def _exhausted(self, busy: list[EndpointBusy], refused: list[EndpointRefused], skipped: list[str],
                   metrics: MetricsSink) -> Exception:
        hinted = [exc.retry_after for exc in [*busy, *refused] if exc.retry_after]
        probe_in = self.circuits.seconds_until_probe(skipped)
        retry_after = max(1, round(max(hinted, default=0) or probe_in or self.policy.default_retry_after_s))
        if refused:  # an endpoint that refused long work its share is alive: never an outage
            metrics.count("LongShareRefused")
            return RateLimited("long work's share of this model is taken by other long requests; retry later, or ask"
                               " for no more than the ordinary deadline", retry_after)
        # An endpoint that is saturated is alive: if any is, the caller is being rate
        # limited (429, retry later), not facing an outage (503).
        reasons = [exc.reason for exc in busy] + [self.circuits.open_reason(name) or "" for name in skipped]
        if any(reason in SATURATED for reason in reasons):
            metrics.count("Saturated")
            return RateLimited("every endpoint for this model is saturated; retry later", retry_after)
        metrics.count("Unavailable")
        return BackendUnavailable("no endpoint for this model can answer now; retry later", retry_after)


def _within(endpoint: Endpoint, remaining: float) -> Endpoint:
    """The endpoint with a read timeout that ends before the request's deadline."""
    budget = remaining - endpoint.connect_timeout_s
    if endpoint.read_timeout_s <= budget:
        return endpoint
    step = next((s for s in _TIMEOUT_STEPS if s <= budget), _TIMEOUT_STEPS[-1])
    return replace(endpoint, read_timeout_s=step)


def _stretched(endpoint: Endpoint, remaining: float) -> Endpoint:
    """The endpoint with a read timeout up to what is left of a long deadline, in whole seconds
    (the invoker keeps a client per read timeout: few values)."""
    budget = math.floor(remaining - endpoint.connect_timeout_s)
    return replace(endpoint, read_timeout_s=float(budget)) if budget > endpoint.read_timeout_s else endpoint


def rejection_error(exc: EndpointRejected) -> RequestError:
    """A container's 4xx, in the gateway's own error types (its messages are written for callers)."""
    body = read_error_body(exc.body)
    if exc.status == 422 and body.details is not None:
        return InvalidRequest(body.details)
    message = body.message or "the model refused this request"
    if exc.status == 413:
        return PayloadTooLarge(message)
    if exc.status == 422:
        return InvalidRequest.at([], message)
    return RequestError(message)
