"""Each tenant's spend: reserved before the work, settled after it, summed by day and entry.

A tenant may have a monthly budget (`TenantLimits.monthly_budget_usd`) and a rate of work
(`endpoint_seconds_per_minute`). Many function instances spend at once, so both live on
the store's shared tallies (DynamoDB in AWS, the SQLite file locally):

- before any backend call, a request reserves on the month's tally its worst case (every
  second until its deadline, on the dearest endpoint it may be sent to:
  `EndpointPool.worst_case`), since a budget must not be overspent; and on the minute's
  its expected endpoint time: its deadline, but no more than the pool's ordinary one (a
  58 s request on the streaming routes reserves 25 s). A rate is not a budget: reserving
  a long request's whole deadline would let a tenant at 60 s a minute start nothing
  beside one long request, and a rate low enough to protect other tenants could never
  admit one. Each is admitted only while its tally is under the limit (one conditional
  write each);
- when the work ends, however it ends, the reservation is replaced by what it spent
  (the pool's meter: every attempt's endpoint time, failed ones included).

Each admission sees every write before it, so the month's tally passes its budget by at
most the last admitted request's worst case, however many instances spend at once; the
minute's passes its rate by at most the last request's reservation, plus what a long
request runs past the ordinary deadline (settled in the minute it started; a tenant has
one long request at a time). A request over a limit is refused with 429 naming it before
the backend is asked: the month's with `insufficient_quota` and Retry-After at the
month's end (UTC), the minute's with Retry-After at the next minute.

The settled figures are also added to the tenant's usage by day (UTC) and entry, which
`GET /v1/usage` reads: the day's total, and a request's cost split evenly among the
entries it names (each catalog entry, `(inline)` for questions that named none, `(chat)`
for a chat), where a request naming two entries counts once in each. What a tenant writes
to the stores is added there too (`stored_bytes`): each decision's record in the day's
total (in the same write as the decision's spend: the record is written before it settles),
each catalog version in the day's total and under its entry.
"""

from __future__ import annotations

import calendar
import logging
import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from gateway.auth.store import CounterStore, TenantLimits, UsageRow
from gateway.decisions.cost import Cost, Meter
from gateway.errors import AnsweredLater, BudgetExhausted, InvalidRequest, RateLimited
from gateway.services.throttle import checked

log = logging.getLogger("gateway.spending")

NANO_PER_USD = 1_000_000_000  # tallies hold integers, so concurrent additions never round
USAGE_RETENTION_DAYS = 400  # a year of usage by day, and the month before it
MAX_USAGE_DAYS = 92  # one GET /v1/usage reads at most this many days
INLINE_ENTRY, CHAT_ENTRY = "(inline)", "(chat)"
ALL_ENTRIES = "(all)"  # each day's total: a request naming two entries is one request, not two
# A decision may name hundreds of catalog entries: each is a write when it settles, so past
# this many the rest share one row (the writes a request makes stay bounded).
MAX_USAGE_ENTRIES, MORE_ENTRIES = 8, "(more entries)"


def nano_usd(usd: float) -> int:
    return math.ceil(usd * NANO_PER_USD)


@dataclass(frozen=True, slots=True)
class Reservation:
    name: str
    amount: int


class Spending:
    def __init__(self, counters: CounterStore, limits: Callable[[str], TenantLimits], *,
                 clock: Callable[[], float] = time.time) -> None:
        self.counters = counters
        self.limits = limits
        self.clock = clock

    @contextmanager
    def spend(self, tenant_id: str, worst: Cost, entries: Sequence[str], expected_s: float | None = None, *,
              bulk: bool = False, price_factor: float = 1.0) -> Iterator[Meter]:
        """Reserve `worst` within the tenant's monthly budget and at most `expected_s` of endpoint
        time (None: the worst case's) within its minute (or 429), and yield the meter the work
        adds its endpoint time to; when the work ends, settle what the meter holds. Bulk work (a
        batch line) reserves within the budget only: the minute's rate is the tenant's
        interactive work's, which a batch never takes. `price_factor` scales the endpoints' price."""
        now = self.clock()
        limits = _checked(lambda: self.limits(tenant_id))
        if bulk:
            limits = replace(limits, endpoint_seconds_per_minute=None)
        seconds = worst.endpoint_seconds if expected_s is None else min(worst.endpoint_seconds, expected_s)
        worst = replace(worst, endpoint_usd=worst.endpoint_usd * price_factor)
        reserved = self._reserve(tenant_id, limits, worst, seconds, now)
        meter = Meter(price_factor=price_factor)
        try:
            yield meter
        except AnsweredLater:  # taken down for an asynchronous pool: no request yet, nothing to count
            self._give_back(reserved)
            raise
        except Exception:
            self._settle(tenant_id, reserved, meter, entries, now)
            raise
        # Not on a BaseException (the process is ending: an interrupt, an exit): nothing more
        # runs, as when it is killed, and a batch's worker that resumes a line it was running
        # counts on no settlement having been made (gateway.batches.worker).
        self._settle(tenant_id, reserved, meter, entries, now)

    def _reserve(self, tenant_id: str, limits: TenantLimits, worst: Cost, seconds: float,
                 now: float) -> list[Reservation]:
        reserved: list[Reservation] = []
        if limits.monthly_budget_usd is not None and limits.monthly_budget_usd <= 0:
            raise self._over_budget(tenant_id, limits.monthly_budget_usd, now)  # suspended: not even a first request
        if limits.monthly_budget_usd is not None:
            month = Reservation(f"spend:{tenant_id}:{_month(now)}", nano_usd(worst.usd))
            if not _checked(lambda: self.counters.add_within(month.name, month.amount, nano_usd(limits.monthly_budget_usd),
                                                          _next_month(now) + 35 * 86400)):
                raise self._over_budget(tenant_id, limits.monthly_budget_usd, now)
            reserved.append(month)
        if limits.endpoint_seconds_per_minute is not None:
            start = math.floor(now / 60) * 60
            minute = Reservation(f"work:{tenant_id}:{start:.0f}", math.ceil(seconds * 1000))
            if not _checked(lambda: self.counters.add_within(minute.name, minute.amount,
                                                          round(limits.endpoint_seconds_per_minute * 1000), start + 3600)):
                self._give_back(reserved)
                raise RateLimited(
                    f"this tenant may use {limits.endpoint_seconds_per_minute:g} s of model endpoint time a minute, and"
                    f" this minute's is used or reserved (each request reserves up to {seconds:g} s, its deadline or"
                    " the ordinary one, until it ends); retry in the next minute", max(1, math.ceil(start + 60 - now)))
            reserved.append(minute)
        return reserved

    def _over_budget(self, tenant_id: str, budget: float, now: float) -> BudgetExhausted:
        try:
            spent = f"{self.counters.tally(f'spend:{tenant_id}:{_month(now)}') / NANO_PER_USD:.4f} USD"
        except Exception:  # the figure is a courtesy; the refusal stands without it
            spent = "all"
        ends = _next_month(now)
        return BudgetExhausted(
            f"this tenant's budget is {budget:.2f} USD a month and {spent} of {_month(now)}'s is spent or"
            f" reserved by work in flight; it renews on {time.strftime('%Y-%m-%d', time.gmtime(ends))} (UTC),"
            " or an operator can raise it", max(1, math.ceil(ends - now)))

    def month_spent_usd(self, tenant_id: str, now: float | None = None) -> float:
        """This month's tally: spent, and reserved by work in flight."""
        when = self.clock() if now is None else now
        return _checked(lambda: self.counters.tally(f"spend:{tenant_id}:{_month(when)}")) / NANO_PER_USD

    def _settle(self, tenant_id: str, reserved: list[Reservation], meter: Meter, entries: Sequence[str],
                started: float) -> None:
        cost = meter.cost()
        actual = {"spend": nano_usd(cost.usd), "work": math.ceil(cost.endpoint_seconds * 1000)}
        try:
            for reservation in reserved:
                change = actual[reservation.name.partition(":")[0]] - reservation.amount
                self.counters.add_within(reservation.name, change, None, started + 86400)
            self._add_usage(tenant_id, entries or (INLINE_ENTRY,), started,
                            UsageRow("", ALL_ENTRIES, 1, actual["spend"], actual["work"], meter.stored_bytes,
                                     meter.input_tokens, meter.cached_tokens))
        except Exception:  # the answer is not lost for it; a reservation left over over-counts, never under
            log.exception("spend could not be settled", extra={"tenant_id": tenant_id})

    def _add_usage(self, tenant_id: str, entries: Sequence[str], started: float, whole: UsageRow) -> None:
        """The request's figures (`whole`, on the all-entries row of its day), and each entry's even
        share of its cost, time and tokens (its stored bytes are the record's: on the whole only)."""
        day, kept_until = _usage_day(started)
        self.counters.add_usage(tenant_id, replace(whole, day=day), kept_until)
        names = sorted(set(entries))
        # Each entry its even share; past the eighth, one row holds the rest's shares together.
        kept = names if len(names) <= MAX_USAGE_ENTRIES else names[:MAX_USAGE_ENTRIES - 1]
        weights = {name: 1 for name in kept}
        if len(kept) < len(names):
            weights[MORE_ENTRIES] = len(names) - len(kept)
        for position, (entry, weight) in enumerate(weights.items()):
            first = position == 0  # what an even split leaves over goes to the first entry
            share = UsageRow(day, entry, 1, **{figure: _part(getattr(whole, figure), weight, len(names), first)
                                               for figure in SHARED_FIGURES})
            self.counters.add_usage(tenant_id, share, kept_until)

    def count_stored(self, tenant_id: str, size: int, entry: str) -> None:
        """Add `size` bytes written for the tenant outside a decision (a version of catalog entry
        `entry`) to its usage; a decision's record is settled with its spend (Meter.stored_bytes).
        What was written stands whatever happens here: a failure is logged."""
        day, kept_until = _usage_day(self.clock())
        try:
            for name in (ALL_ENTRIES, entry):
                self.counters.add_usage(tenant_id, UsageRow(day, name, 0, 0, 0, size), kept_until)
        except Exception:
            log.exception("stored bytes not counted", extra={"tenant_id": tenant_id})

    def _give_back(self, reserved: list[Reservation]) -> None:
        for reservation in reserved:
            _checked(lambda r=reservation: self.counters.add_within(r.name, -r.amount, None, self.clock() + 86400))

    def usage(self, tenant_id: str, first_day: str, last_day: str, limits: TenantLimits) -> dict[str, Any]:
        """The tenant's usage between two days (inclusive): totals, by day, by entry, and its budgets."""
        first, last = _day(first_day, "from"), _day(last_day, "to")
        if last < first or (last - first) / 86400 >= MAX_USAGE_DAYS:
            raise InvalidRequest.at(["query", "from"], f"'from' must not be after 'to', and one request reads at most"
                                    f" {MAX_USAGE_DAYS} days")
        rows = _checked(lambda: self.counters.usage(tenant_id, first_day, last_day))
        days = [r for r in rows if r.entry == ALL_ENTRIES]
        entries = [r for r in rows if r.entry != ALL_ENTRIES]
        return {"object": "usage", "from": first_day, "to": last_day, "currency": "USD",
                "total": _figures(days), "by_day": _grouped(days, "day"), "by_entry": _grouped(entries, "entry"),
                "budget": {"monthly_usd": limits.monthly_budget_usd, "month": _month(self.clock()),
                           "month_spent_usd": round(self.month_spent_usd(tenant_id), 9),
                           "endpoint_seconds_per_minute": limits.endpoint_seconds_per_minute}}


# The figures a request's entries share evenly (its stored bytes are its record's: the whole's only).
SHARED_FIGURES = ("cost_nano_usd", "endpoint_ms", "input_tokens", "cached_tokens")


def _part(total: int, weight: int, among: int, first: bool) -> int:
    """`weight` of `among` even shares of a whole figure; what the split leaves over goes to the first."""
    return total * weight // among + (total % among if first else 0)


def _figures(rows: Sequence[UsageRow]) -> dict[str, Any]:
    return {"requests": sum(r.requests for r in rows),
            "cost_usd": round(sum(r.cost_nano_usd for r in rows) / NANO_PER_USD, 9),
            "endpoint_seconds": round(sum(r.endpoint_ms for r in rows) / 1000, 3),
            "stored_bytes": sum(r.stored_bytes for r in rows),
            "input_tokens": sum(r.input_tokens for r in rows), "cached_tokens": sum(r.cached_tokens for r in rows)}


def _grouped(rows: Sequence[UsageRow], by: str) -> list[dict[str, Any]]:
    groups: dict[str, list[UsageRow]] = {}
    for row in rows:  # one pass: a tenant with thousands of entries is still one scan
        groups.setdefault(getattr(row, by), []).append(row)
    return [{by: key, **_figures(groups[key])} for key in sorted(groups)]


def _day(text: str, name: str) -> float:
    try:
        return calendar.timegm(time.strptime(text, "%Y-%m-%d"))
    except ValueError:
        raise InvalidRequest.at(["query", name], f"{name!r} must be a day as YYYY-MM-DD") from None


def _usage_day(when: float) -> tuple[str, float]:
    """The day (UTC) usage at `when` is added to, and until when that day's rows are kept."""
    return time.strftime("%Y-%m-%d", time.gmtime(when)), when + USAGE_RETENTION_DAYS * 86400


def _month(when: float) -> str:
    return time.strftime("%Y-%m", time.gmtime(when))


def _next_month(when: float) -> float:
    year, month = time.gmtime(when)[:2]
    return calendar.timegm((year + month // 12, month % 12 + 1, 1, 0, 0, 0))


def _checked(call: Callable[[], Any]) -> Any:
    return checked(call, "budgets")
