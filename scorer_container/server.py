"""The HTTP server: SageMaker's container contract plus the same handlers on /v1 paths.

Routes
    GET  /ping, /health                 200 when the model is loaded and verified, else 503
    POST /invocations                   decision or chat, chosen by the body or the
                                        X-Amzn-SageMaker-Custom-Attributes header
    POST /endpoints/{name}/invocations  the same, so boto3's sagemaker-runtime client
                                        with endpoint_url pointed here works unchanged
    POST /v1/systemone                  System One decisions
    POST /v1/chat/completions           OpenAI chat (stream and non-stream)
    GET  /v1/models                     one body in both the OpenAI and System One shape

The model loads in a background thread after the socket is open, so /ping answers
(503) within milliseconds and never waits behind inference: inference runs in worker
threads, and llama.cpp releases the GIL while it computes.

Every request gets a deadline when it arrives (`timeout_ms` in the custom attributes,
capped by SCORER_DEADLINE_S) and a watcher that notices when its caller hangs up; a
decision's cost is counted and checked against the budget before it takes a place in
line, so an over-budget request gets 413 at once even while the model is busy.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from scorer_container.admission import Admission, Ticket
from scorer_container.budget import Budget, budget_for
from scorer_container.chat import ChatGenerator, ChatUsage, chunk, new_completion_id
from scorer_container.deadline import Deadline
from scorer_container.engine import DecisionEngine, Fit
from scorer_container.errors import (
    DeadlineExceeded,
    InvalidRequest,
    ModelNotReady,
    OverBudget,
    Overloaded,
    PayloadTooLarge,
    RequestError,
    ScorerError,
    UnsupportedMedia,
)
from scorer_container.model_files import ModelManifest, locate_model, verify_model
from scorer_container.prompts import PROMPT_VERSIONS, PromptFormat
from scorer_container.schema import ChatRequest, DecisionRequest, parse
from scorer_container.settings import ScorerSettings
from systemone.body import BodyRefused, read_json
from systemone.errors import openai_body, system_one_body
from systemone.sidechannel import (
    CUSTOM_ATTRIBUTES,
    ErrorHints,
    error_hints,
    parse_attributes,
    request_id_of,
    route_of,
    safe_request_id,
    timeout_of,
)

log = logging.getLogger("scorer")
Flavor = Literal["systemone", "openai"]


@dataclass
class Loaded:
    manifest: ModelManifest
    engine: DecisionEngine
    chat: ChatGenerator
    model_name: str
    budget: Budget


class ScorerService:
    """Holds the model once loaded, and why it is not when it is not."""

    def __init__(self, settings: ScorerSettings) -> None:
        self.settings = settings
        self.admission = Admission(settings.max_waiting)
        self.planning = Admission(settings.max_waiting)  # counting a request's work, before admission
        self.loaded: Loaded | None = None
        self.status = "loading"
        self.reason = "the model is loading"
        self.started = int(time.time())

    def load(self) -> None:
        """Locate, verify and load the model; on any failure stay unhealthy and say why."""
        from scorer_container.llama_runtime import Runtime  # llama.cpp only once loading

        try:
            path = locate_model(self.settings.model, self.settings.model_dir)
            manifest = verify_model(path, self.settings.expected_sha256, self.settings.expected_manifest_sha256)
            runtime = Runtime(path, self.settings.runtime)
            prompts = PromptFormat.for_runtime(runtime)
            name = self.settings.alias or manifest.name
            engine = DecisionEngine.for_manifest(
                runtime, prompts, manifest, model_name=name,
                # The manifest's readout and fitted temperatures unless the deployment sets them.
                readout=self.settings.readout, temperature=self.settings.temperature,
                prior_cache_size=self.settings.prior_cache_size, max_labels=self.settings.max_labels,
            )
            budget = budget_for(engine, self.settings.max_request_tokens, self.settings.budget_s)
            self.loaded = Loaded(manifest, engine, ChatGenerator(runtime, prompts, name), name, budget)
            self.status, self.reason = "ready", ""
            log.info("model ready: %s (%s, readout %s); budget %s", name, manifest.sha256[:12], engine.default_readout,
                     budget.describe())
        except ScorerError as exc:
            self.status, self.reason = "failed", exc.message
            log.error("model refused: %s", exc.message)
        except Exception:  # a bug or an unreadable file: stay up and unhealthy, never serve
            self.status, self.reason = "failed", "the model could not be loaded (see the container log)"
            log.exception("model load failed")

    def require(self) -> Loaded:
        if self.loaded is None:
            raise ModelNotReady(self.reason)
        return self.loaded


def create_app(settings: ScorerSettings, *, load_in_background: bool = True) -> Starlette:
    service = ScorerService(settings)
    if settings.ignored_options:
        log.warning("ignoring SM_LLAMA_CPP options this engine does not use: %s", ", ".join(settings.ignored_options))

    async def ping(request: Request) -> Response:
        loaded = service.loaded
        if service.status == "ready" and loaded is not None:
            return JSONResponse({"status": "ready", "model": loaded.model_name, **loaded.budget.figures()})
        return JSONResponse({"status": service.status, "reason": service.reason}, status_code=503)

    async def models(request: Request) -> Response:
        loaded = service.require()
        manifest = loaded.manifest
        return JSONResponse(
            {
                "object": "list",
                "data": [{"id": loaded.model_name, "object": "model", "created": service.started, "owned_by": "scorer"}],
                "models": [
                    {
                        "name": loaded.model_name,
                        "description": manifest.description or manifest.name,
                        "release_date": manifest.release_date or "1970-01-01",
                    }
                ],
            }
        )

    async def systemone(request: Request) -> Response:
        return await _handle(request, "systemone", lambda body, deadline: _decide(service, body, deadline))

    async def chat_completions(request: Request) -> Response:
        return await _handle(request, "openai", lambda body, deadline: _chat(service, body, deadline))

    async def invocations(request: Request) -> Response:
        route = route_of(_attributes(request))

        async def dispatch(body: Any, deadline: Deadline) -> Response:
            chosen = route or _route_from_body(body)
            if chosen == "chat":
                return await _chat(service, body, deadline)
            return await _decide(service, body, deadline)

        flavor: Flavor = "openai" if route == "chat" else "systemone"
        response = await _handle(request, flavor, dispatch)
        if "endpoint" in request.path_params:
            return as_sagemaker_runtime(response, request.path_params["endpoint"])
        return response

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        if load_in_background:
            threading.Thread(target=service.load, name="model-loader", daemon=True).start()
        yield

    app = Starlette(
        routes=[
            Route("/ping", ping, methods=["GET"]),
            Route("/health", ping, methods=["GET"]),
            Route("/invocations", invocations, methods=["POST"]),
            Route("/endpoints/{endpoint}/invocations", invocations, methods=["POST"]),
            Route("/v1/systemone", systemone, methods=["POST"]),
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
        ],
        lifespan=lifespan,
    )
    app.state.service = service
    if not load_in_background:
        service.load()
    return app


# -- request handling ----------------------------------------------------------------------


async def _handle(request: Request, flavor: Flavor, handler) -> Response:
    request_id = _request_id(request)
    service: ScorerService = request.app.state.service
    deadline = Deadline(timeout_of(_attributes(request), service.settings.deadline_s))
    watcher: asyncio.Task | None = None
    started = time.perf_counter()
    try:
        body = await _read_json(request, service.settings.max_body_bytes)
        watcher = asyncio.create_task(_watch_disconnect(request, deadline))
        response = await handler(body, deadline)
    except ScorerError as exc:
        if not isinstance(exc, RequestError):
            log.warning("request %s: %s", request_id, exc.message)
        response = error_response(exc, flavor)
    except Exception:
        log.exception("request %s failed", request_id)
        response = error_response(ScorerError("the scorer failed on this request"), flavor)
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
    try:
        return read_json(b"".join(chunks), request.headers.get("content-encoding", ""), limit)
    except BodyRefused as refused:
        if refused.status == 413:
            raise PayloadTooLarge(refused.message) from None
        if refused.status == 415:
            raise UnsupportedMedia(refused.message) from None
        raise InvalidRequest.at([], refused.message, refused.kind) from None


def as_sagemaker_runtime(response: Response, endpoint: str) -> Response:
    """What SageMaker's InvokeEndpoint makes of a container's error: HTTP 424 `ModelError`
    carrying the container's status and body, so boto3 pointed here raises exactly what
    it raises against AWS (a container 503 is ModelError with OriginalStatusCode 503)."""
    if response.status_code < 400:
        return response
    original = bytes(response.body).decode("utf-8", "replace")
    kind = "client" if response.status_code < 500 else "server"
    body = {
        "ErrorCode": f"{kind.upper()}_ERROR_FROM_MODEL",
        "message": f"Received {kind} error ({response.status_code}) from primary with message \"{original}\".",
        "OriginalStatusCode": response.status_code,
        "OriginalMessage": original,
        "LogStreamArn": f"arn:aws:logs:local:000000000000:log-group:/aws/sagemaker/Endpoints/{endpoint}",
    }
    headers = {"x-amzn-ErrorType": "ModelError:http://internal.amazon.com/coral/com.amazonaws.sagemaker/"}
    headers.update({k: v for k, v in response.headers.items() if k.lower() in ("x-request-id", "retry-after")})
    return JSONResponse(body, status_code=424, headers=headers)


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
    return parse_attributes(request.headers.get(CUSTOM_ATTRIBUTES, ""))


def _route_from_body(body: Any) -> str:
    if isinstance(body, dict) and "messages" in body and "questions" not in body:
        return "chat"
    return "systemone"


async def _decide(service: ScorerService, body: Any, deadline: Deadline) -> Response:
    request = parse(DecisionRequest, body)
    loaded = service.require()
    budget = loaded.budget
    # Planned before it takes a place in line, so an over-budget request costs the others
    # nothing; one plan at a time (the rest wait in a short line, within their deadlines),
    # so a flood of hostile states cannot take the machine from the job that runs. Whether
    # the work fits is judged on the time the caller gave (413: it never will), not on what
    # waiting left of it: time lost in line is load (503, retry later).
    with service.planning.admit() as planner:
        async with planner.running(deadline):
            try:
                fitted = await asyncio.to_thread(_fit, loaded, request, deadline)
            except DeadlineExceeded as exc:
                raise exc if deadline.gone else planner.timed_out() from None
    units = fitted.cost.units(budget.row_cost)
    with service.admission.admit() as ticket:
        async with ticket.running(deadline):
            if not budget.fixed and budget.seconds_for(units) > deadline.remaining():
                raise ticket.timed_out()  # it waited in line too long to finish: busy, not too big
            started = time.perf_counter()
            result = await asyncio.to_thread(loaded.engine.decide, request, deadline, fitted.settings)
            # What decisions really cost here keeps the estimate honest (budget.WorkRate).
            budget.rate.observe(units, time.perf_counter() - started)
    # What produced the answer, for the gateway's decision records.
    result["x_model_sha256"] = loaded.manifest.sha256
    result["x_prompt_version"] = PROMPT_VERSIONS[result["x_framing"]]
    if service.settings.image_digest:
        result["x_image_digest"] = service.settings.image_digest
    return JSONResponse(result)


def _fit(loaded: Loaded, request: DecisionRequest, deadline: Deadline) -> Fit:
    """The request's settings inside the budget for the caller's whole deadline, or a refusal:
    413 when it does not fit, or 503 when it would at the rate measured at load (decisions
    here ran slower of late: a passing load, which a retry can outlast)."""
    budget, engine = loaded.budget, loaded.engine
    try:
        return engine.fit(request, budget.max_units(deadline.seconds), budget.row_cost, deadline,
                          budget.rate.seconds_per_unit())
    except OverBudget:
        at_load = budget.max_units(deadline.seconds, at_load=True)
        if at_load <= budget.max_units(deadline.seconds):
            raise
        engine.fit(request, at_load, budget.row_cost, deadline, budget.rate.measured)  # OverBudget: it never fits
        raise Overloaded("this machine runs decisions slower than usual right now; retry later", 5) from None


async def _chat(service: ScorerService, body: Any, deadline: Deadline) -> Response:
    request = parse(ChatRequest, body)
    loaded = service.require()
    if not request.stream:
        with service.admission.admit() as ticket:
            async with ticket.running(deadline):
                result = await asyncio.to_thread(loaded.chat.completion, request, deadline)
        return JSONResponse(result)
    tokens, budget = loaded.chat.prepare(request)
    ticket = service.admission.admit()
    include_usage = request.include_usage()
    events = _stream_chat(loaded, request, tokens, budget, ticket, include_usage, deadline)
    return StreamingResponse(events, media_type="text/event-stream", background=BackgroundTask(ticket.release))


async def _stream_chat(
    loaded: Loaded, request: ChatRequest, tokens: list[int], budget: int, ticket: Ticket, include_usage: bool,
    deadline: Deadline,
):
    """Server-sent events; generation runs in a worker thread that stops when the client goes."""
    completion_id, created, model = new_completion_id(), int(time.time()), loaded.model_name
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    stop = threading.Event()
    usage = ChatUsage()
    done = object()

    def work() -> None:
        try:
            for piece in loaded.chat.generate(request, tokens, budget, usage, stop, deadline):
                loop.call_soon_threadsafe(queue.put_nowait, piece)
        except Exception as exc:
            loop.call_soon_threadsafe(queue.put_nowait, exc)
        finally:
            loop.call_soon_threadsafe(queue.put_nowait, done)

    try:
        async with ticket.running(deadline):
            worker = loop.run_in_executor(None, work)
            try:
                yield _sse(chunk(completion_id, model, created, {"role": "assistant", "content": ""}, None))
                while (item := await queue.get()) is not done:
                    if isinstance(item, Exception):
                        log.error("chat stream failed: %s", type(item).__name__)
                        yield _sse({"error": {"message": "generation failed", "type": "server_error"}})
                        break
                    if item.text:
                        yield _sse(chunk(completion_id, model, created, {"content": item.text}, None))
                    if item.finish_reason:
                        yield _sse(chunk(completion_id, model, created, {}, item.finish_reason))
                if include_usage:
                    final = chunk(completion_id, model, created, {}, None)
                    final["choices"], final["usage"] = [], usage.as_dict()
                    yield _sse(final)
                yield "data: [DONE]\n\n"
            finally:
                stop.set()
                await asyncio.shield(worker)
    except DeadlineExceeded:
        # Out of time in line, after the 200 went out: say so in the stream, and end it properly.
        yield _sse({"error": {"message": "the request's deadline passed while it waited for the model",
                              "type": "server_error", "code": "timeout"}})
        yield "data: [DONE]\n\n"
    finally:
        ticket.release()


def _sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


# -- errors ------------------------------------------------------------------------------

_OPENAI_TYPES = {
    422: ("invalid_request_error", "invalid_request"),
    413: ("invalid_request_error", "context_length_exceeded"),
    415: ("invalid_request_error", "unsupported_encoding"),
    503: ("server_error", "overloaded"),
    504: ("server_error", "timeout"),
}


def error_response(exc: ScorerError, flavor: Flavor) -> JSONResponse:
    """The one place where errors become HTTP: System One or OpenAI body, status, Retry-After.

    InvokeEndpoint passes a container's error body on (OriginalMessage) but not its headers:
    the body repeats the Retry-After and says what kind of failure it is (`x_state`), so a
    gateway in front can tell "busy, retry later" from "this work does not fit"."""
    headers = {} if exc.retry_after is None else {"Retry-After": str(exc.retry_after)}
    details = exc.details if isinstance(exc, InvalidRequest) else None
    if flavor == "systemone":
        body: dict[str, Any] = system_one_body(exc.error_type, exc.message, details)
    else:
        kind, code = _OPENAI_TYPES.get(exc.status, ("server_error", "internal_error"))
        body = openai_body(exc.message, kind, code, details)
    return JSONResponse(error_hints(body, ErrorHints(exc.retry_after, exc.state)), status_code=exc.status,
                        headers=headers)
