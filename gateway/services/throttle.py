"""Per-tenant limits that every function instance shares: request rate and work in flight.

API Gateway's usage plans throttle in AWS too, but they are a coarse outer guard: a
region holds 300 plans by default, so tenants without a plan of their own share one
bucket (one busy tenant throttles all the quiet ones), and the SigV4 routes have no
authorizer to key a plan by. So the gateway enforces each tenant's own numbers
(`TenantLimits`) itself, on the store's shared counters (DynamoDB in AWS, the SQLite
file locally), so many Lambda instances count as one:

- rate: at most `burst` requests in each window of `burst / rate_per_s` seconds (at
  least 1 s, and never fewer than a window's worth at the rate), so the average stays at
  `rate_per_s`; checked on every authenticated request, before its body is read. Windows
  are fixed (one conditional write a request), so a burst straddling a window's edge can
  reach twice `burst` within a moment: a bound on the sum, not a smoothed rate;
- in flight: at most `max_in_flight` decisions and chats of one tenant at once, each a
  place held until it ends (or, if its function died, until its deadline passed). A
  tenant without a figure of its own may have what the model's scorers let one tenant
  hold: half a scorer's line on each of the pool's least instances (`line // 2 *
  min_instances`, 4 for one instance of 8), so a tenant past its share gets 429 here,
  before a call, rather than the scorer's own refusal after one. The places are counted
  across the tenant's models; the limit is that of the model asked.

Each refusal is a 429 naming the limit, with a Retry-After. A store that cannot be
reached is a 503: nothing is admitted unchecked.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from gateway.auth.store import CounterStore, TenantLimits
from gateway.errors import BackendUnavailable, RateLimited

log = logging.getLogger("gateway.throttle")
T = TypeVar("T")

# A place is held at most this long past the work's own deadline (a function that died).
HOLD_MARGIN_S = 30.0


class TenantThrottle:
    def __init__(self, counters: CounterStore, limits: Callable[[str], TenantLimits], *, hold_s: float,
                 clock: Callable[[], float] = time.time) -> None:
        self.counters = counters
        self.limits = limits
        self.hold_s = hold_s + HOLD_MARGIN_S  # the request's deadline, and a margin
        self.clock = clock

    def admit(self, tenant_id: str) -> None:
        """Count one request of the tenant's rate, or RateLimited (429)."""
        limits = self._store(lambda: self.limits(tenant_id))
        window = max(1.0, limits.burst / limits.rate_per_s)
        allowed = max(limits.burst, math.ceil(limits.rate_per_s * window))
        now = self.clock()
        start = math.floor(now / window) * window
        counted = self._store(lambda: self.counters.count_within(f"rate:{tenant_id}:{window:g}:{start:.0f}",
                                                              allowed, start + 2 * window))
        if not counted:
            raise RateLimited(f"this tenant may send {allowed} requests every {window:g} s"
                              f" ({limits.rate_per_s:g} a second on average); retry later",
                              max(1, math.ceil(start + window - now)))

    @contextmanager
    def in_flight(self, tenant_id: str, model_share: int) -> Iterator[None]:
        """Hold one of the tenant's places in flight for the work inside, or RateLimited (429):
        its own `max_in_flight`, or else `model_share` (what the model's scorers let one tenant
        hold: `PoolPolicy.tenant_in_flight`)."""
        limits = self._store(lambda: self.limits(tenant_id))
        limit = limits.max_in_flight if limits.max_in_flight is not None else model_share
        why = "" if limits.max_in_flight is not None else " on this model (half of what its scorers run at once)"
        with self._held(f"inflight:{tenant_id}", limit, tenant_id,
                        f"this tenant may have {limit} decisions or chats in flight at once{why}"):
            yield

    @contextmanager
    def long_work(self, tenant_id: str) -> Iterator[None]:
        """Hold the tenant's one place for long work (past the ordinary deadline), or RateLimited
        (429): a model runs long work alone, so one tenant must not queue it back to back."""
        with self._held(f"inflight-long:{tenant_id}", 1, tenant_id,
                        "this tenant may have one request past the ordinary deadline in flight at once"):
            yield

    @contextmanager
    def one_refit(self, tenant_id: str) -> Iterator[None]:
        """Hold the tenant's one place for a refit, or RateLimited (429): a refit reads
        megabytes of records and fits for seconds in the function that answers decisions."""
        with self._held(f"refit:{tenant_id}", 1, tenant_id, "this tenant may run one refit at a time"):
            yield

    @contextmanager
    def _held(self, name: str, limit: int, tenant_id: str, refusal: str) -> Iterator[None]:
        holder, now = uuid.uuid4().hex, self.clock()
        if not self._store(lambda: self.counters.hold(name, holder, limit, now + self.hold_s, now)):
            raise RateLimited(f"{refusal}; retry when one has ended", 1)
        try:
            yield
        finally:
            try:
                self.counters.release(name, holder)
            except Exception:  # the place expires by itself: the answer is not lost for it
                log.exception("a place in flight could not be released", extra={"tenant_id": tenant_id})

    @staticmethod
    def _store(call: Callable[[], T]) -> T:
        return checked(call, "limits")


def checked(call: Callable[[], T], what: str) -> T:
    """A shared counter's answer; a store that cannot be reached is a 503 (nothing is
    admitted unchecked), the cause logged, never sent."""
    try:
        return call()
    except Exception:
        log.exception("a tenant's shared counters could not be read", extra={"checking": what})
        raise BackendUnavailable(f"{what} cannot be checked right now; retry shortly", retry_after=2) from None
