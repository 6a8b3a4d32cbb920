"""How much work one request may ask of the model: seconds of this machine, in units.

A request's work is what the engine will evaluate (`planning.Plan.cost`): its tokens,
plus its logits rows, each counted as `row_cost` tokens. A row is not free: with
gemma's 262k-word vocabulary, computing one and reading it (a log-softmax over the
whole vocabulary) costs about as much as a token, and the likelihood readout reads one
per option token. Both are measured when the model loads.

What a unit costs in seconds is measured on the engine's own work, not on a plain
prefill: at load, a real decision of the engine's usual shape (one choice question,
the model's own readout and debiasing) is timed against its counted units, and from
then on every decision the scorer answers is too (`WorkRate.observe`). A plain prefill
runs faster per token than the many short branches of a decision, and a rate measured
once at load drifts on a shared machine (docs/concepts/bounded-work.md): an estimate
built on either admitted work its deadline then cut. The
rate used is the recent decisions' (their own time: waits for other jobs' turns are not
work), read per tenant (`WorkRate`): slower than at load as soon as the tenants typically
say so, faster only once `MIN_TO_RAISE` decisions are in and every tenant agrees, and never
past `MAX_SLOWDOWN` or `MAX_SPEEDUP` times the load measurement. A scorer that loaded
beside other work measured a rate too slow, and would otherwise keep a budget several
times too small for life (413, "never retry", for what it answers a minute later); one
that loaded on a quiet machine is corrected down
when the machine gets busy, so the estimate still errs on the side of refusing.

A request may take `SCORER_BUDGET_S` (default 22 s: the gateway's first attempt may
read for 23 s, of which it gives the scorer 22.75) less a 15% margin, and never more
than what is left of its own deadline. A request whose deadline is longer than any
buffered API Gateway request can have (29 s: it came by the gateway's streaming routes,
or straight from SageMaker, which allows 60 s) may take up to `SCORER_LONG_BUDGET_S`
(default 55 s) less the margin; such a request is long work, which shares the model with
other work at long work's share (`scheduler.py`). `SCORER_MAX_REQUEST_TOKENS` instead fixes the
budget in units, the operator's word over the measurement: requests up to it are
admitted whatever time they take, and cut at their deadline (504) when it runs out.
The figures are logged and shown on /ping.
"""

from __future__ import annotations

import collections
import math
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scorer_container.llama import LlamaModel
from scorer_container.prefix_tree import log_probs
from systemone.limits import API_GATEWAY_TIMEOUT_S

if TYPE_CHECKING:
    from scorer_container.engine import DecisionEngine

_SAMPLE_TEXT = (
    "The customer writes that the parcel arrived late and damaged, asks for a refund of the shipping fee, "
    "and wants to know whether the replacement will be sent by express delivery this time. "
)
_SAMPLE_TOKENS = 256
_SAMPLE_ROWS = 32  # the most rows the engine reads in one decode
# A budget-sized job should end before its deadline despite the estimate's own error.
MARGIN = 0.85
# Decisions smaller than this say more about fixed overheads than about the rate.
_MIN_OBSERVED_UNITS = 64
_WINDOW = 16  # recent decisions of each tenant the rate is read from
_MAX_TENANTS = 64  # tenants whose decisions are kept; the one heard from least recently goes first
MAX_AGE_S = 600.0  # older decisions say nothing of the machine now
MAX_SLOWDOWN = 2.0  # the observed rate is never taken as more than this many times slower than at load
MAX_SPEEDUP = 4.0  # ... nor faster than this many times (a load beside other work: docs/concepts/bounded-work.md)
MIN_TO_RAISE = 4  # recent decisions that must agree before the rate is taken as faster than at load
MIN_TO_VOTE = 3  # a tenant's decisions before its median counts while another tenant's does
_MIN_UNITS = 256  # no budget below this: the smallest decision must still fit
# No buffered request through API Gateway has a longer deadline: one that does may do long work.
BUFFERED_LIMIT_S = API_GATEWAY_TIMEOUT_S


@dataclass(frozen=True)
class Prefill:
    tokens_per_s: float  # a plain prefill of 256 tokens
    row_cost: float  # one logits row, in tokens' worth


class WorkRate:
    """Seconds one unit of the engine's work takes on this machine: measured at load, then
    corrected, both ways, by the decisions it runs.

    What decisions say is read robustly, since anyone can send them: the median of the
    recent decisions' own rates (one decision slow or fast for reasons of its own moves
    nothing), only decisions large enough that their time is mostly work, none older than
    `MAX_AGE_S` (a busy hour passes), never more than `MAX_SLOWDOWN` times slower than the
    load measurement (whatever the machine does, the budget keeps a floor) and never more
    than `MAX_SPEEDUP` times faster, and faster only once `MIN_TO_RAISE` decisions say so;
    per tenant, the slowest tenant's median counting. Thread-safe."""

    def __init__(self, seconds_per_unit: float, window: int = _WINDOW,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.measured = seconds_per_unit
        # Each tenant's recent decisions, (when, seconds a unit): one that sends many cannot push
        # the others' out of the window.
        self._window = window
        self._recent: dict[str, collections.deque[tuple[float, float]]] = {}
        self._clock = clock
        self._lock = threading.Lock()

    def observe(self, units: float, seconds: float, tenant: str = "") -> None:
        if units >= _MIN_OBSERVED_UNITS and seconds > 0 and math.isfinite(seconds):
            with self._lock:
                if tenant not in self._recent and len(self._recent) >= _MAX_TENANTS:
                    stalest = min(self._recent, key=lambda t: self._recent[t][-1][0])
                    del self._recent[stalest]
                self._recent.setdefault(tenant, collections.deque(maxlen=self._window)).append(
                    (self._clock(), seconds / units))

    def _rates(self) -> list[tuple[float, str]]:
        now = self._clock()
        with self._lock:
            return [(rate, tenant) for tenant, recent in self._recent.items() for when, rate in recent
                    if now - when <= MAX_AGE_S]

    def _medians(self) -> tuple[dict[str, float], dict[str, int]]:
        by_tenant: dict[str, list[float]] = {}
        for rate, tenant in self._rates():
            by_tenant.setdefault(tenant, []).append(rate)
        return ({t: statistics.median(r) for t, r in by_tenant.items()}, {t: len(r) for t, r in by_tenant.items()})

    def observed(self) -> float | None:
        """What recent decisions typically say, within the caps; None when there are none: the
        median of the tenants' medians, each tenant one vote, and only tenants with
        `MIN_TO_VOTE` decisions vote while any has (one decision, or one tenant's few, slow for
        reasons of their own move nothing)."""
        medians, counts = self._medians()
        if not medians:
            return None
        voters = [m for t, m in medians.items() if counts[t] >= MIN_TO_VOTE] or list(medians.values())
        return min(max(statistics.median(voters), self.measured / MAX_SPEEDUP), MAX_SLOWDOWN * self.measured)

    def seconds_per_unit(self) -> float:
        """Slower than at load as soon as the decisions typically say so (`observed`); faster only
        once MIN_TO_RAISE recent decisions say so and every tenant's own median agrees (a tenant
        whose decisions run fast per unit, a long state and one small question, cannot make the
        others' look cheaper), and then no faster than the slowest tenant's."""
        observed = self.observed()
        if observed is None:
            return self.measured
        if observed >= self.measured:
            return observed
        medians, counts = self._medians()
        slowest = max(medians.values())
        if slowest >= self.measured or sum(counts.values()) < MIN_TO_RAISE:
            return self.measured
        return max(slowest, self.measured / MAX_SPEEDUP)


@dataclass
class Budget:
    seconds: float  # what one request may take, the margin taken off
    prefill: Prefill
    rate: WorkRate
    fixed_units: int | None = None  # SCORER_MAX_REQUEST_TOKENS: the budget, whatever the time
    long_seconds: float = 0.0  # what a request with a longer deadline may take (0: as `seconds`)

    @property
    def fixed(self) -> bool:
        return self.fixed_units is not None

    @property
    def row_cost(self) -> float:
        return self.prefill.row_cost

    def max_units(self, seconds: float | None = None, *, at_load: bool = False) -> int:
        """The units a request may ask for: the budget's seconds, or fewer when its own
        deadline gives fewer, at the rate in use (or the one measured at load; or the fixed
        budget)."""
        if self.fixed_units is not None:
            return self.fixed_units
        ceiling = max(self.seconds, self.long_seconds) if seconds is not None and seconds > BUFFERED_LIMIT_S else self.seconds
        within = self.seconds if seconds is None else min(ceiling, seconds * MARGIN)
        rate = self.rate.measured if at_load else self.rate.seconds_per_unit()
        return max(_MIN_UNITS, int(within / rate))

    def seconds_for(self, units: float) -> float:
        return units * self.rate.seconds_per_unit()

    def describe(self) -> str:
        units_per_s = 1 / self.rate.seconds_per_unit()
        how = ("fixed by SCORER_MAX_REQUEST_TOKENS" if self.fixed else
               f"{units_per_s:.0f} units/s on decisions x {self.seconds:.1f} s")
        return (f"{self.max_units()} units per request ({how}; a plain prefill runs {self.prefill.tokens_per_s:.0f}"
                f" tokens/s, a logits row costs {self.prefill.row_cost:.2f} tokens)")

    def figures(self) -> dict[str, Any]:
        """What /ping shows."""
        observed = self.rate.observed()
        return {"max_request_tokens": self.max_units(), "budget_s": round(self.seconds, 2),
                "max_long_request_tokens": self.max_units(math.inf),
                "long_budget_s": round(max(self.seconds, self.long_seconds), 2),
                "units_per_s": round(1 / self.rate.seconds_per_unit(), 1),
                "units_per_s_at_load": round(1 / self.rate.measured, 1),
                "units_per_s_observed": round(1 / observed, 1) if observed else None,
                "tokens_per_s": round(self.prefill.tokens_per_s, 1), "row_cost": round(self.prefill.row_cost, 3)}


def measure_prefill(llama: LlamaModel, repeat: int = 2) -> Prefill:
    """A plain prefill's rate and the cost of one logits row in tokens, best of `repeat`."""
    base = llama.tokenize(_SAMPLE_TEXT)
    tokens = (base * (_SAMPLE_TOKENS // len(base) + 1))[:_SAMPLE_TOKENS]
    last_piece = (len(tokens) - 1) // llama.n_batch * llama.n_batch  # rows are read from the last decode
    rows = frozenset(range(max(last_piece, len(tokens) - _SAMPLE_ROWS), len(tokens)))
    candidates = (tokens[0],)

    def timed(wanted: frozenset[int]) -> float:
        llama.clear()
        start = time.perf_counter()
        llama.prefill(tokens, rows=wanted)
        for position in sorted(wanted) or [len(tokens) - 1]:
            log_probs(llama.logits(position - last_piece), candidates)  # as the engine reads a row
        return time.perf_counter() - start

    with llama.lock:
        try:
            plain = min(timed(frozenset()) for _ in range(repeat))
            with_rows = min(timed(rows) for _ in range(repeat))
        finally:
            llama.clear()
    per_token = plain / len(tokens)
    return Prefill(len(tokens) / plain, max(0.0, (with_rows - plain) / (len(rows) - 1)) / per_token)


def calibration_request() -> Any:
    """A decision of the usual shape: one choice of 12 options of about 45 characters over
    a short ticket, as the model's own readout and debiasing answer it."""
    from scorer_container.schema import DecisionRequest

    options = {f"queue {k:02d}": f"tickets about {topic}, routed to that team" for k, topic in enumerate(
        ("refunds and charges", "late deliveries", "damaged parcels", "account access", "address changes",
         "invoices and receipts", "product defects", "warranty claims", "subscription plans", "gift cards",
         "privacy requests", "anything else"))}
    return DecisionRequest.model_validate({
        "model": "calibration", "state": _SAMPLE_TEXT * 2,
        "questions": {"queue": {"type": "choice", "instructions": "Which team should handle this ticket?",
                                "criteria": options}}})


def measure_decisions(engine: DecisionEngine, row_cost: float, repeat: int = 2) -> float:
    """Seconds per unit of a real decision (`calibration_request`), the slowest of `repeat`
    runs (the first computes its content-free priors, the next reads them from the cache;
    each is counted as it runs)."""
    request = calibration_request()
    slowest = 0.0
    for _ in range(repeat):
        plan = engine.fit(request, math.inf, row_cost)
        started = time.perf_counter()
        engine.decide(plan)
        slowest = max(slowest, (time.perf_counter() - started) / max(1.0, plan.cost.units(row_cost)))
    return slowest


MIN_STEP_TOKENS = 32  # fewer tokens a decode and the fixed cost of a decode outweighs the work


def step_tokens_for(tokens_per_s: float, step_s: float, n_batch: int) -> int:
    """The tokens one turn at the model decodes: about `step_s` of prefill at the measured rate,
    a power of two (so that the figure, and the batch shapes with it, stay put when the
    measurement wobbles), within [MIN_STEP_TOKENS, n_batch]."""
    wanted = max(1.0, tokens_per_s * step_s)
    return max(MIN_STEP_TOKENS, min(n_batch, 1 << int(math.log2(wanted))))


def budget_for(engine: DecisionEngine, fixed_units: int | None, seconds: float, long_seconds: float = 0.0,
               step_s: float | None = None) -> Budget:
    """The budget measured here; a fixed one (`fixed_units`) skips timing a decision at load
    and reads its rate from the prefill alone (it only informs /ping and the log). With
    `step_s`, the model's turn is sized from the prefill rate first, so that the decisions
    timed at load run in the pieces they are served in."""
    prefill = measure_prefill(engine.llama)
    if step_s is not None:
        engine.llama.step_tokens = step_tokens_for(prefill.tokens_per_s, step_s, engine.llama.n_batch)
    at_load = 1 / prefill.tokens_per_s if fixed_units is not None else measure_decisions(engine, prefill.row_cost)
    return Budget(seconds * MARGIN, prefill, WorkRate(at_load), fixed_units, long_seconds * MARGIN)
