"""The decide use case: one decision, from a caller's request to its stored record.

In order: the model must be one the credential may use; the tenant's policy
(catalog-only, limits) is read; catalog references are resolved into questions; the
request must fit the model's work limits; its worst case is reserved within the tenant's spend
budgets (`gateway.services.spending`); the model's endpoint pool is asked, in System One
(`gateway.backends.scorer`); catalog questions are calibrated and judged by their
policy; the record is written, and the decision is answered only once it is stored.
Chat completions take the same first steps, without catalogs or a record.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from gateway.auth.credentials import Principal
from gateway.auth.store import DEFAULT_LIMITS, MIN_ENDPOINT_SECONDS_PER_MINUTE, Tenant, TenantLimits
from gateway.auth.tenant_cache import TenantCache
from gateway.backends.base import Caller, InferenceBackend
from gateway.backends.pools import EndpointPool, Invocation, MetricsSink
from gateway.backends.routing import ModelRegistry, ModelRoute
from gateway.backends.scorer import backend_request, json_bytes, json_object, read_result
from gateway.catalogs.model import INJECTION_THRESHOLD
from gateway.catalogs.policy import apply_catalogs
from gateway.catalogs.resolve import POLICY_OVERRIDE_SCOPE, expand_references
from gateway.catalogs.service import CatalogService
from gateway.decisions.cost import Meter
from gateway.decisions.model import Decision, DecisionResult, Question, cost_fields
from gateway.decisions.records import DecisionRecorder
from gateway.decisions.work_limits import check_chat_work, check_decision_work
from gateway.errors import BackendFailed, NotFound, PayloadTooLarge, RateLimited
from gateway.services.spending import CHAT_ENTRY, INLINE_ENTRY, Spending
from gateway.services.tenant_tags import TenantTags
from gateway.services.throttle import TenantThrottle
from gateway.streaming.relay import ChatRelay


class DecisionMetrics(MetricsSink, Protocol):
    def value(self, name: str, value: float, unit: str = "None") -> None: ...

    def values_by(self, dimensions: Mapping[str, str], values: Mapping[str, tuple[float, str]]) -> None: ...


def measure_cost(result: DecisionResult, tenant_id: str, metrics: DecisionMetrics | None) -> None:
    """What the decision cost and the endpoint time it was charged, once by tenant and once by
    the endpoint that answered: a tenant's spend and a pool's load are each one CloudWatch
    query, and the series grow with tenants plus endpoints, not with their product."""
    if metrics is None:
        return
    figures = {"DecisionCostUSD": (result.cost.usd, "None"), "EndpointSeconds": (result.cost.endpoint_seconds, "Seconds")}
    metrics.values_by({"tenant": tenant_id}, figures)
    metrics.values_by({"endpoint": result.endpoint}, figures)


def measure_injection(result: DecisionResult, metrics: DecisionMetrics | None) -> None:
    """The scorer's injection suspicion, when it sent one: its distribution, and (as 0 or 1)
    how often it reaches the default threshold, so a campaign shows before anyone reads records."""
    if metrics is None:
        return
    if result.injection is None:  # an older scorer or another backend: policies cannot act on it
        metrics.count("InjectionSignalMissing")
        return
    suspicion = result.injection.suspicion
    metrics.value("InjectionSuspicion", suspicion)
    metrics.value("InjectionSuspected", 1 if suspicion >= INJECTION_THRESHOLD else 0, unit="Count")


def usage_entries(decision: Decision) -> list[str]:
    """The entries a decision's spend is counted under: each catalog entry it names, and
    `(inline)` when a question named none."""
    return sorted({q.binding.name if isinstance(q, Question) and q.binding is not None else INLINE_ENTRY
                   for q in decision.questions})


@dataclass(frozen=True, slots=True)
class BulkWork:
    """A batch line (`gateway.batches`), run as its creator's request is, but as bulk work: at the
    scorer's lowest priority, outside the tenant's interactive rate and places in flight, and
    charged at the batch price (`price_factor` of the pool's). `decision_id` is the id its
    record takes (the batch's ledger chose it); `keep` is given the answer before the record is
    written (a decision) or the spend settled (a chat), so that a worker that dies after that
    point never runs the line again."""

    decision_id: str | None  # None for a chat, which keeps no record
    # Given the answer (a DecisionResult, or a chat's completion) at the point past which the line
    # must never run again: the route renders it and the worker writes it to the batch's ledger.
    keep: Callable[[Any], None]


class HeldWork(contextlib.ExitStack):
    """What one backend call holds until it ends (`DecideService.work`), and its meter."""

    meter: Meter


def more_time_may_fit(refused: PayloadTooLarge, pool: EndpointPool, streaming: bool, deadline: float) -> PayloadTooLarge:
    """A decision too large for its deadline, told how to ask for the longer one where its route has it."""
    longest = pool.deadline(streaming, math.inf)
    if longest <= deadline:
        return refused
    return PayloadTooLarge(f"{refused.message}; or give it more time: send the header Prefer: wait={math.floor(longest)}"
                           f" (up to {longest:g} s; work past the ordinary deadline gets a share of the model beside other work)")


def require_model(principal: Principal, model: str) -> None:
    """A model outside the credential's list does not exist for it (404, never 403: no oracle)."""
    if not principal.may_use(model):
        raise NotFound(f"the model {model!r} does not exist; GET /v1/models lists the available models")


class DecideService:
    def __init__(self, registry: ModelRegistry, backend: InferenceBackend, recorder: DecisionRecorder, *,
                 catalogs: CatalogService | None = None, tenants: TenantCache | None = None,
                 throttle: TenantThrottle | None = None, spending: Spending | None = None,
                 tags: TenantTags | None = None, bulk_price_factor: float = 1.0,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.registry = registry
        self.backend = backend
        self.recorder = recorder
        self.catalogs = catalogs
        self.tenants = tenants
        self.throttle = throttle
        self.spending = spending
        self.tags = tags or TenantTags(None)
        self.bulk_price_factor = bulk_price_factor
        self.clock = clock

    def in_flight(self, tenant_id: str, pool: EndpointPool, bulk: BulkWork | None = None
                  ) -> contextlib.AbstractContextManager[None]:
        """One of the tenant's places in flight for the backend call (429 when all are held): its
        own limit, or what the pool's scorers let one tenant hold. A batch line takes none."""
        if self.throttle is None or bulk is not None:
            return contextlib.nullcontext()
        return self.throttle.in_flight(tenant_id, pool.policy.tenant_in_flight())

    def deadline(self, tenant_id: str, pool: EndpointPool, streaming: bool, wait_s: float | None) -> float:
        """The request's deadline: the ordinary one, or what the caller asked for (`Prefer: wait`)
        up to the route's longest, and never more than the tenant's endpoint time a minute (one
        request never uses more than a minute's worth). A minute's worth too short for an attempt
        to answer in (set before its minimum, or written to the store by hand) is refused with
        429 naming the figures: every request would otherwise fail as if the model were down."""
        deadline = pool.deadline(streaming, wait_s)
        per_minute = self.limits(tenant_id).endpoint_seconds_per_minute
        if per_minute is None or per_minute >= deadline:
            return deadline
        if per_minute < MIN_ENDPOINT_SECONDS_PER_MINUTE:
            raise RateLimited(f"this tenant may use {per_minute:g} s of model endpoint time a minute, and a request"
                              f" needs at least {MIN_ENDPOINT_SECONDS_PER_MINUTE:g} s of it for the model to answer; an"
                              " operator can raise its endpoint_seconds_per_minute", 60)
        return per_minute

    def caller(self, tenant_id: str, pool: EndpointPool, deadline_s: float, request_id: str,
               bulk: BulkWork | None = None) -> Caller:
        """Whom the backend call is for, as the scorer's scheduler reads it: the tenant's tag and
        weight, and the kind of work: bulk for a batch line, long when its deadline is past the
        pool's ordinary one."""
        work = "bulk" if bulk is not None else "long" if pool.is_long(deadline_s) else "ordinary"
        return Caller(request_id, self.tags.tag(tenant_id), work, self.limits(tenant_id).share_weight)

    def work(self, tenant_id: str, pool: EndpointPool, body: bytes, entries: list[str], deadline_s: float,
             bulk: BulkWork | None = None) -> HeldWork:
        """What a backend call holds: the tenant's one place for long work (a deadline past the
        ordinary one), and its spend reserved within its budgets (429 when over one: its worst
        case within the month's, no more than the ordinary deadline within the minute's, which a
        batch line leaves alone), settled with the meter's figures when the stack closes.
        `enter_context` order: long work, spend."""
        held = HeldWork()
        price_factor = self.bulk_price_factor if bulk is not None else 1.0
        try:
            if pool.is_long(deadline_s) and self.throttle is not None:
                held.enter_context(self.throttle.long_work(tenant_id))
            held.meter = (held.enter_context(self.spending.spend(tenant_id, pool.worst_case(len(body), deadline_s),
                                                                 entries, pool.policy.deadline_s, bulk=bulk is not None,
                                                                 price_factor=price_factor))
                          if self.spending is not None else Meter(price_factor=price_factor))
        except BaseException:
            held.close()
            raise
        return held

    def tenant(self, tenant_id: str) -> Tenant | None:
        return self.tenants.get(tenant_id) if self.tenants is not None else None

    def limits(self, tenant_id: str) -> TenantLimits:
        return self.tenants.limits(tenant_id) if self.tenants is not None else DEFAULT_LIMITS

    def decide(self, principal: Principal, decision: Decision, *, route: str, request_id: str = "",
               metrics: DecisionMetrics | None = None, streaming: bool = False,
               wait_s: float | None = None, bulk: BulkWork | None = None) -> tuple[DecisionResult, str]:
        """The result and the id of its record (stored before this returns). On a streaming
        route (`streaming`) the caller may ask for a longer deadline (`wait_s`) for more work."""
        require_model(principal, decision.model)
        model = self.registry.route_for(decision.model, "decisions")
        started = self.clock()
        decision_id = bulk.decision_id if bulk is not None and bulk.decision_id else self.recorder.new_id()

        def record(asked: Decision, result: DecisionResult, meter: Meter) -> None:
            if bulk is not None:
                bulk.keep(result)
            self.recorder.record(decision_id, principal=principal, route=route, request_id=request_id, decision=asked,
                                 result=result, latency_ms=(self.clock() - started) * 1000, meter=meter)

        with self.in_flight(principal.tenant_id, model.pool, bulk):
            result = self._ask(principal, model, decision, record, request_id=request_id, metrics=metrics,
                               streaming=streaming, wait_s=wait_s, bulk=bulk)
        measure_injection(result, metrics)
        measure_cost(result, principal.tenant_id, metrics)
        return result, decision_id

    def admit(self, principal: Principal, decision: Decision) -> Decision:
        """The checks a decision passes before any work, as the caller stands now: its
        credential's models, its tenant's mode and limits, the catalog entries it names and the
        policies it may override. The decision as asked (references resolved), or the error a
        fresh request gets. An idempotent replay is held to them too: a role narrowed or a
        tenant made catalog-only since the first answer refuses the replay as it would the request."""
        require_model(principal, decision.model)
        model = self.registry.route_for(decision.model, "decisions")
        tenant = self.tenant(principal.tenant_id)
        asked = expand_references(decision, principal.tenant_id, self.catalogs, bool(tenant and tenant.catalog_only),
                                  POLICY_OVERRIDE_SCOPE in principal.scopes)
        check_decision_work(asked, model.max_request_tokens, tenant.limits if tenant is not None else DEFAULT_LIMITS)
        return asked

    def _ask(self, principal: Principal, model: ModelRoute, decision: Decision,
             record: Callable[[Decision, DecisionResult, Meter], None], *, request_id: str = "",
             metrics: MetricsSink | None = None, streaming: bool = False, wait_s: float | None = None,
             bulk: BulkWork | None = None) -> DecisionResult:
        """The result, calibrated and judged, once `record` has stored it (with the decision as
        asked, catalog references resolved) before the work settles: the record's bytes are
        counted in the same usage write as its spend."""
        asked = self.admit(principal, decision)
        body = json_bytes(backend_request(asked, model.name))
        deadline = self.deadline(principal.tenant_id, model.pool, streaming, wait_s)
        with self.work(principal.tenant_id, model.pool, body, usage_entries(asked), deadline, bulk) as held:
            try:
                invocation = model.pool.ask(self.backend, body, "systemone", metrics,
                                            self.caller(principal.tenant_id, model.pool, deadline, request_id, bulk),
                                            held.meter, deadline_s=deadline)
            except PayloadTooLarge as exc:  # the scorer's "too much work for this deadline", or the pool's own
                # "no endpoint takes a body this large" before any attempt, which no time mends
                raise (more_time_may_fit(exc, model.pool, streaming, deadline) if held.meter.attempts else exc) from None
            result = read_result(asked, invocation, held.meter)
            result = apply_catalogs(result) if asked.calibrate else result
            record(asked, result, held.meter)
        return result

    def chat(self, principal: Principal, request: dict[str, Any], *, request_id: str = "",
             metrics: MetricsSink | None = None, streaming: bool = False,
             wait_s: float | None = None, bulk: BulkWork | None = None) -> tuple[dict[str, Any], Invocation]:
        """One chat completion, asked of the backend whole (on a streaming route, within the
        deadline the caller may ask for); its usage says what it cost."""
        model, body = self._chat_request(principal, request, stream=False)
        deadline = self.deadline(principal.tenant_id, model.pool, streaming, wait_s)
        with (self.in_flight(principal.tenant_id, model.pool, bulk),
              self.work(principal.tenant_id, model.pool, body, [CHAT_ENTRY], deadline, bulk) as held):
            invocation = model.pool.ask(self.backend, body, "chat", metrics,
                                        self.caller(principal.tenant_id, model.pool, deadline, request_id, bulk),
                                        held.meter, deadline_s=deadline)
            completion = json_object(invocation.body)
            if not isinstance(completion.get("choices"), list) or not completion["choices"]:
                raise BackendFailed("the model endpoint answered without a completion")
            if isinstance(completion.get("usage"), dict):
                completion["usage"] = {**completion["usage"], **cost_fields(invocation.cost)}
            if bulk is not None:
                bulk.keep(completion)
        return completion, invocation

    def chat_stream(self, principal: Principal, request: dict[str, Any], *, request_id: str = "",
                    metrics: MetricsSink | None = None, wait_s: float | None = None) -> tuple[ChatRelay, Invocation]:
        """A chat completion's server-sent events as the backend generates them. Everything
        that can refuse the request (model, work limits, spend, the tenant's places in flight, the
        pool's endpoints) refuses it here, before the first event; the tenant's place and its
        reserved spend are held until the events end (`ChatRelay`), within its deadline."""
        model, body = self._chat_request(principal, request, stream=True)
        deadline_s = self.deadline(principal.tenant_id, model.pool, True, wait_s)
        started = self.clock()
        with contextlib.ExitStack() as held:
            held.enter_context(self.in_flight(principal.tenant_id, model.pool))
            meter = held.enter_context(self.work(principal.tenant_id, model.pool, body, [CHAT_ENTRY], deadline_s)).meter
            caller = self.caller(principal.tenant_id, model.pool, deadline_s, request_id)
            answer, invocation = model.pool.ask_stream(self.backend, body, "chat", deadline_s, metrics, caller, meter)
            release = held.pop_all()  # from here, the events' end releases them
        relay = ChatRelay(answer, release, meter, started + deadline_s, self.clock, metrics)
        return relay, invocation

    def _chat_request(self, principal: Principal, request: dict[str, Any], *, stream: bool) -> tuple[ModelRoute, bytes]:
        require_model(principal, str(request.get("model")))
        model = self.registry.route_for(request["model"], "chat")
        payload = {**request, "stream": stream, **check_chat_work(request, self.limits(principal.tenant_id))}
        if not stream:
            payload.pop("stream_options", None)
        return model, json_bytes(payload)
