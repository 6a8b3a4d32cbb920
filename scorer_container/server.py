"""The HTTP server: SageMaker's container contract plus the same handlers on /v1 paths.

Routes
    GET  /ping, /health                 200 when the model is loaded and verified, else 503
    POST /invocations                   decision or chat, chosen by the body or the
                                        X-Amzn-SageMaker-Custom-Attributes header
    POST /v1/systemone                  System One decisions
    POST /v1/chat/completions           OpenAI chat (stream and non-stream)
    GET  /v1/models                     one body in both the OpenAI and System One shape

SageMaker's runtime API (`/endpoints/{name}/invocations`) is SageMaker's, not the
container's: locally, `devkit.sagemaker_standin` plays it in front of this app.

The model loads in a background thread after the socket is open, so /ping answers
(503) within milliseconds and never waits behind inference: inference runs in worker
threads, and llama.cpp releases the GIL while it computes.

Every request gets a deadline when it arrives (`timeout_ms` in the custom attributes,
capped by SCORER_DEADLINE_S) and a watcher that notices when its caller hangs up, and a
place in the scheduler's line for its tenant (`tenant`, `work` and `weight` in the custom
attributes; scheduler.py): a tenant over its share is refused 429 at once, a full line
503. A decision's cost is counted and checked against the budget before it takes the
model's memory, so an over-budget request gets 413 at once even while the model is busy.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from scorer_container.budget import BUFFERED_LIMIT_S
from scorer_container.deadline import Deadline
from scorer_container.errors import (
    CallerGone,
    DeadlineExceeded,
    ModelNotReady,
    OverBudget,
    Overloaded,
    PayloadTooLarge,
    QueueTimeout,
    RequestError,
    ServiceError,
)
from scorer_container.lines import InLine, is_lines, pieces, read_lines, spooled
from scorer_container.planning import Plan
from scorer_container.prefix_tree import cells_for
from scorer_container.prompts import PROMPT_VERSIONS
from scorer_container.scheduler import UNTAGGED, Job
from scorer_container.schema import ChatRequest, DecisionRequest, parse
from scorer_container.service import Loaded, ScorerService
from scorer_container.settings import ScorerSettings
from scorer_container.streaming import ClosingStreamingResponse, stream_chat
from systemone.body import read_json
from systemone.errors import Flavor, error_parts
from systemone.lines import MAX_INVOCATION_BYTES, MAX_INVOCATION_S, out_line
from systemone.sidechannel import (
    CUSTOM_ATTRIBUTES,
    ErrorHints,
    Work,
    error_hints,
    parse_attributes,
    request_id_of,
    route_of,
    safe_request_id,
    tenant_of,
    timeout_of,
    weight_of,
    work_of,
)

MIN_LINE_S = 1.0  # a line that would start with less of the invocation left is not run (503 queue_timeout)
log = logging.getLogger("scorer")
# Sequences a decision's prefix tree may use: its deepest path (a handful of nodes) and a batch
# of sibling leaves (at most 32: a decode's logits rows), so that two decisions and a few chats
# fit the context's 128 at once.
DECISION_SEQS = 48


def create_app(settings: ScorerSettings, *, load_in_background: bool = True) -> Starlette:
    service = ScorerService(settings)
    if settings.ignored_options:
        log.warning("ignoring SM_LLAMA_CPP options this engine does not use: %s", ", ".join(settings.ignored_options))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        if load_in_background:
            threading.Thread(target=service.load, name="model-loader", daemon=True).start()
        yield

    app = Starlette(
        routes=[
            Route("/ping", _ping, methods=["GET"]),
            Route("/health", _ping, methods=["GET"]),
            Route("/invocations", _invocations, methods=["POST"]),
            Route("/v1/systemone", _systemone, methods=["POST"]),
            Route("/v1/chat/completions", _chat_completions, methods=["POST"]),
            Route("/v1/models", _models, methods=["GET"]),
            Route("/stats", _stats, methods=["GET"]),
        ],
        lifespan=lifespan,
    )
    app.state.service = service
    if not load_in_background:
        service.load()
    return app


# -- routes --------------------------------------------------------------------------------


def _service(request: Request) -> ScorerService:
    return request.app.state.service


async def _ping(request: Request) -> Response:
    service = _service(request)
    loaded = service.loaded
    if service.status == "ready" and loaded is not None:
        if loaded.engine.states is not None:  # SageMaker asks every few seconds: an idle instance forgets too
            loaded.engine.states.sweep()
        return JSONResponse({"status": "ready", "model": loaded.model_name, **loaded.budget.figures()})
    return JSONResponse({"status": service.status, "reason": service.reason}, status_code=503)


async def _stats(request: Request) -> Response:
    """The scheduler's figures: the model's busy seconds by tenant tag and kind of work in the last
    minute, and the line now; the state cache's (for benchmarks and operators; SageMaker routes only /ping and
    /invocations, so it is reachable only beside the container)."""
    loaded = _service(request).loaded
    if loaded is None:  # still loading, or refused its model: /ping says why
        return error_response(ModelNotReady(_service(request).reason), "systemone")
    states = loaded.engine.states
    return JSONResponse({**loaded.scheduler.figures(), "state_cache": states.figures() if states is not None else None})


async def _models(request: Request) -> Response:
    service = _service(request)
    loaded = service.require()
    manifest = loaded.manifest
    return JSONResponse({
        "object": "list",
        "data": [{"id": loaded.model_name, "object": "model", "created": service.started, "owned_by": "scorer"}],
        "models": [{"name": loaded.model_name, "description": manifest.description or manifest.name,
                    "release_date": manifest.release_date or "1970-01-01"}],
    })


async def _systemone(request: Request) -> Response:
    service = _service(request)
    return await _handle(request, "systemone", lambda body, deadline: _decide(service, body, deadline,
                                                                              _caller(request)))


async def _chat_completions(request: Request) -> Response:
    service = _service(request)
    return await _handle(request, "openai", lambda body, deadline: _chat(service, body, deadline, _caller(request)))


async def _invocations(request: Request) -> Response:
    """SageMaker's one route: the custom attributes' `route`, else the body's shape, picks the
    handler; a body of lines (an asynchronous invocation's) is answered line by line (`_lines`)."""
    if is_lines(request.headers.get("content-type", "")):
        return await _lines(request)
    service, route = _service(request), route_of(_attributes(request))

    async def dispatch(body: Any, deadline: Deadline) -> Response:
        if (route or _route_from_body(body)) == "chat":
            return await _chat(service, body, deadline, _caller(request))
        return await _decide(service, body, deadline, _caller(request))

    flavor: Flavor = "openai" if route == "chat" else "systemone"
    return await _handle(request, flavor, dispatch)


# -- an invocation of many requests (scorer_container.lines) --------------------------------


async def _lines(request: Request) -> Response:
    """Each line answered in turn, within the invocation's deadline (its custom attributes'
    `timeout_ms`, at most MAX_INVOCATION_S: SageMaker's hour for an asynchronous invocation). A
    line that starts past it is answered 503 (`queue_timeout`: resend it). The body is read first, to a file past a
    few MiB (the answers stream out while a response's own task reads the connection, which a
    body still arriving would lose), then a line at a time."""
    service = _service(request)
    invocation = Deadline(timeout_of(_attributes(request), MAX_INVOCATION_S))
    request_id = _request_id(request)
    try:
        body = await spooled(request.stream(), MAX_INVOCATION_BYTES)
    except ServiceError as exc:
        return error_response(exc, "systemone")

    async def answers():
        counts = {"lines": 0, "answered": 0}
        with body:
            async for line in read_lines(pieces(body), service.settings.max_body_bytes):
                started = time.perf_counter()
                status, answer = await _line(service, line, invocation)
                counts["lines"] += 1
                counts["answered"] += status < 400
                # The line's time on this machine, which serves the invocation's lines one at a
                # time: what its sender charges it (a chat's answer says no time of its own)
                busy_ms = round((time.perf_counter() - started) * 1000)
                yield out_line(line.id, line.number, status, answer, busy_ms)
        log.info("request %s: %d lines, %d answered", request_id, counts["lines"], counts["answered"])

    return ClosingStreamingResponse(answers(), media_type="application/jsonlines")


async def _line(service: ScorerService, line: InLine, invocation: Deadline) -> tuple[int, Any]:
    """One line's status and body, as its route answers it on its own."""
    flavor: Flavor = "openai" if line.route == "chat" else "systemone"
    if line.refused is not None:
        status, message = line.refused
        exc = PayloadTooLarge(message) if status == 413 else RequestError(message)
        response = error_response(exc, flavor)
        return response.status_code, json.loads(response.body)
    pairs = parse_attributes(line.attributes)
    seconds = min(timeout_of(pairs, service.settings.deadline_s), invocation.remaining())
    if seconds < MIN_LINE_S:  # not run: busy, in the contract's words (queue_timeout), for its sender to resend
        response = error_response(QueueTimeout("the invocation's time ran out before this line ran", 1), flavor)
        return response.status_code, json.loads(response.body)
    caller = Caller(tenant_of(pairs), work_of(pairs) if "work" in pairs else "bulk", weight_of(pairs))
    deadline = Deadline(seconds, given=timeout_of(pairs, math.inf) != math.inf)
    try:
        if line.route == "chat":
            if isinstance(line.body, dict) and line.body.get("stream"):
                raise RequestError("a line's chat is answered whole: stream is not taken here")
            response = await _chat(service, line.body, deadline, caller)
        else:
            response = await _decide(service, line.body, deadline, caller)
    except ServiceError as exc:
        response = error_response(exc, flavor)
    except Exception:
        log.exception("a line (%d) failed", line.number)
        response = error_response(ServiceError("the scorer failed on this line"), flavor)
    return response.status_code, json.loads(response.body)


# -- request handling ----------------------------------------------------------------------


async def _handle(request: Request, flavor: Flavor, handler) -> Response:
    request_id = _request_id(request)
    service: ScorerService = request.app.state.service
    given = timeout_of(_attributes(request), math.inf)  # inf: the caller set no deadline of its own
    deadline = Deadline(min(given, service.settings.deadline_s), given=given != math.inf)
    watcher: asyncio.Task | None = None
    started = time.perf_counter()
    try:
        body = await _read_json(request, service.settings.max_body_bytes)
        watcher = asyncio.create_task(_watch_disconnect(request, deadline))
        response = await handler(body, deadline)
    except ServiceError as exc:
        if not isinstance(exc, RequestError):
            log.warning("request %s: %s", request_id, exc.message)
        response = error_response(exc, flavor)
    except Exception:
        log.exception("request %s failed", request_id)
        response = error_response(ServiceError("the scorer failed on this request"), flavor)
    finally:
        if watcher is not None:
            watcher.cancel()
    response.headers["x-request-id"] = request_id
    if flavor == "systemone":
        response.headers["x-typesafe-request-id"] = request_id
    log.info("request %s: %s %d in %.0f ms", request_id, flavor, response.status_code,
             (time.perf_counter() - started) * 1000)
    return response


async def _read_json(request: Request, limit: int) -> Any:
    """The body's JSON value, read with the contract's bounded reader (`systemone.body`)."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"the body is larger than {limit} bytes")
    chunks, size = [], 0
    async for part in request.stream():
        size += len(part)
        if size > limit:
            raise PayloadTooLarge(f"the body is larger than {limit} bytes")
        chunks.append(part)
    return read_json(b"".join(chunks), request.headers.get("content-encoding", ""), limit)


async def _watch_disconnect(request: Request, deadline: Deadline) -> None:
    """Mark the job abandoned when the caller closes the connection (the body is read by now)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            deadline.caller_gone()
            return


def _request_id(request: Request) -> str:
    """The caller's request id, so one id follows a request through the gateway and here:
    `request_id=` in the custom attributes (what the gateway sends), SageMaker's
    inference id, or X-Request-Id (sidechannel.safe_request_id: it reaches log lines)."""
    candidates = (request_id_of(_attributes(request)), request.headers.get("x-amzn-sagemaker-inference-id", ""),
                  request.headers.get("x-request-id", ""))
    for candidate in candidates:
        cleaned = safe_request_id(candidate)
        if cleaned:
            return cleaned
    return uuid.uuid4().hex


def _attributes(request: Request) -> dict[str, str]:
    """The custom attributes, parsed once a request (the route, the deadline and the id read them)."""
    if not hasattr(request.state, "attributes"):
        request.state.attributes = parse_attributes(request.headers.get(CUSTOM_ATTRIBUTES, ""))
    return request.state.attributes


@dataclass(frozen=True)
class Caller:
    """Whose work a request is, and what kind, as the custom attributes say (systemone.sidechannel)."""

    tenant: str
    work: Work
    weight: float

    def work_for(self, deadline: Deadline) -> Work:
        """The kind of work the scheduler counts it as: what is claimed, but long when its deadline
        is past any buffered request's, given or not (the budget lets such a request do long
        work: a caller cannot dodge long work's share by claiming less); bulk stays bulk, the
        lowest priority of all."""
        if self.work == "ordinary" and deadline.seconds > BUFFERED_LIMIT_S:
            return "long"
        return self.work

    def admit(self, loaded: Loaded, deadline: Deadline) -> Job:
        return loaded.scheduler.admit(self.tenant, self.work_for(deadline), deadline, self.weight)


def _caller(request: Request) -> Caller:
    pairs = _attributes(request)
    return Caller(tenant_of(pairs), work_of(pairs), weight_of(pairs))


def _route_from_body(body: Any) -> str:
    if isinstance(body, dict) and "messages" in body and "questions" not in body:
        return "chat"
    return "systemone"


async def _decide(service: ScorerService, body: Any, deadline: Deadline, caller: Caller) -> Response:
    request = parse(DecisionRequest, body)
    loaded = service.require()
    budget = loaded.budget
    # A place in line first (a tenant over its share is refused before it costs anything); then
    # planned, one plan at a time in fair order, so a flood of hostile states cannot take the
    # machine; an over-budget request is refused (413) before it takes the model's memory. Whether
    # the work fits is judged on the time the caller gave (413: it never will), not on what
    # waiting left of it: time lost in line is load (503, retry later).
    with caller.admit(loaded, deadline) as job:
        async with job.planning():
            planning = time.perf_counter()
            try:
                # Untagged calls (direct callers of the container) are no tenant: nothing is kept for them.
                tenant = job.tenant if job.tenant != UNTAGGED else None
                plan = await asyncio.to_thread(_fit, loaded, request, deadline, tenant)
            except DeadlineExceeded as exc:
                raise exc if deadline.gone else job.timed_out() from None
            busy_s = time.perf_counter() - planning
        units = plan.cost.units(budget.row_cost)
        llama = loaded.engine.llama
        await job.resident(cells_for(llama, plan.cost.cells), min(DECISION_SEQS, llama.n_seq_max))
        if not budget.fixed and budget.seconds_for(units) > deadline.remaining():
            raise job.timed_out()  # it waited in line too long to finish: busy, not too big
        started = time.perf_counter()
        try:
            result = await job.run(loaded.engine.decide, plan, deadline, job)
        except DeadlineExceeded as exc:
            if isinstance(exc, (CallerGone, QueueTimeout)) or budget.fixed or not job.shared:
                raise
            # Cut while other jobs took part of its time (their plans, memory or turns), though it
            # was admitted on the estimate that it fits its deadline alone: load, which a retry can outlast, not work
            # too large. (A fixed budget is the operator's word, not an estimate: a cut is a cut.)
            raise job.timed_out() from None
        # Its own time, waits for others' turns excluded: what a decision costs here keeps the
        # estimate honest (budget.WorkRate), and is what the gateway charges it. Restored tokens
        # are not work: a cache hit must not read as a faster machine.
        own_s = time.perf_counter() - started - job.waited_s
        usage = result["usage"]
        budget.rate.observe(usage["input_tokens"] - usage["x_cached_tokens"] + plan.cost.rows * budget.row_cost, own_s,
                            job.tenant)
        busy_s += own_s
    # The time this machine worked on the request, its waits excluded: what the gateway charges
    # a decision on an instance that serves others while it waits.
    result["usage"]["x_busy_ms"] = round(busy_s * 1000)
    # What produced the answer, for the gateway's decision records.
    result["x_model_sha256"] = loaded.manifest.sha256
    result["x_prompt_version"] = PROMPT_VERSIONS[result["x_framing"]]
    if service.settings.image_digest:
        result["x_image_digest"] = service.settings.image_digest
    return JSONResponse(result)


def _fit(loaded: Loaded, request: DecisionRequest, deadline: Deadline, tenant: str | None) -> Plan:
    """The request's plan inside the budget for the caller's whole deadline, or a refusal:
    413 when it does not fit, or 503 when it would at the rate measured at load (decisions
    here ran slower of late: a passing load, which a retry can outlast). The state's tokens
    the tenant's cache holds are not work (planning.Planner.fit)."""
    budget, engine = loaded.budget, loaded.engine
    try:
        return engine.fit(request, budget.max_units(deadline.seconds), budget.row_cost, deadline,
                          budget.rate.seconds_per_unit(), tenant)
    except OverBudget:
        at_load = budget.max_units(deadline.seconds, at_load=True)
        if at_load <= budget.max_units(deadline.seconds):
            raise
        engine.fit(request, at_load, budget.row_cost, deadline, budget.rate.measured, tenant)  # OverBudget: never fits
        raise Overloaded("this machine runs decisions slower than usual right now; retry later", 5) from None


async def _chat(service: ScorerService, body: Any, deadline: Deadline, caller: Caller) -> Response:
    request = parse(ChatRequest, body)
    loaded = service.require()
    job = caller.admit(loaded, deadline)
    try:
        # Rendering and tokenizing up to a 6 MB body is CPU work: off the event loop, one request
        # at a time in fair order, as a decision's planning.
        async with job.planning():
            tokens, budget = await asyncio.to_thread(loaded.chat.prepare, request)
        # Its cells: the prompt and every token it may generate, held from its first turn to its last.
        cells = min(loaded.engine.llama.cells, len(tokens) + budget)
        if request.stream:
            events = stream_chat(loaded, request, tokens, budget, job, cells, request.include_usage(), deadline)
            return ClosingStreamingResponse(events, media_type="text/event-stream", on_close=job.release)
        await job.resident(cells, 1)
        result = await job.run(loaded.chat.completion, request, deadline, job, (tokens, budget))
    except BaseException:
        job.release()
        raise
    job.release()
    return JSONResponse(result)


# -- errors ------------------------------------------------------------------------------

def error_response(exc: ServiceError, flavor: Flavor) -> JSONResponse:
    """The one place where errors become HTTP: System One or OpenAI body, status, Retry-After.

    InvokeEndpoint passes a container's error body on (OriginalMessage) but not its headers:
    the body repeats the Retry-After and says what kind of failure it is (`x_state`), so a
    gateway in front can tell "busy, retry later" from "this work does not fit"."""
    status, body, headers = error_parts(exc, flavor)
    return JSONResponse(error_hints(body, ErrorHints(exc.retry_after, exc.state)), status_code=status, headers=headers)
