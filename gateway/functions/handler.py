"""The Lambda entry point (`gateway.functions.handler.lambda_handler`), REST API proxy events (v1).

Before routing, the body is made plain JSON text: base64 undone (API Gateway sends
binary media that way), `Content-Encoding: gzip` or `zstd` inflated with a bound (a
small compressed body cannot become a large one), and the size limit enforced. After
routing, every response gets the request id (`x-request-id`, and
`x-typesafe-request-id` on System One routes).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import logging
import os
import random
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from gateway.api.paths import OPENAPI_PATH, PUBLIC_PATHS, route_path, takes_form
from gateway.auth.caller import principal_of
from gateway.errors import BackendUnavailable, InvalidRequest, PayloadTooLarge, RequestError, ServiceError
from gateway.streaming.integration import prelude, whole_body
from gateway.streaming.response import StreamedBody, streamed_body
from systemone import body as body_reader

if TYPE_CHECKING:
    from gateway.auth.credentials import Principal
    from gateway.batches.worker import LineCall
    from gateway.services.instance import InstanceServices

log = logging.getLogger("gateway.functions.handler")


class GatewayFunction:
    """The function with its services: tests, the local runner and benchmarks build their
    own; Lambda gets the one `lambda_handler` builds from the environment."""

    def __init__(self, services: InstanceServices) -> None:
        from gateway.api.app import build_app

        self.services = services
        self.app = build_app(services)

    def __call__(self, event: dict[str, Any], context: Any) -> dict[str, Any]:
        """A buffered invocation (API Gateway's default integration): the whole response."""
        result, body = self.respond(event, context, streaming=False)
        if body is not None:  # no route streams here; were one to, its work must not outlive the call
            body.close()
        return result

    def stream(self, event: dict[str, Any], context: Any) -> Iterator[bytes]:
        """A streaming invocation (the streaming integration, `gateway.streaming.integration`): the
        response as the HTTP integration's byte stream, its status and headers first, then the
        body as it is produced. Closing this generator (the caller gone) stops the body's work."""
        result, body = self.respond(event, context, streaming=True)
        with contextlib.closing(body) if body is not None else contextlib.nullcontext():
            yield prelude(result)  # closed here (the caller gone at once), the body is closed too
            if body is None:
                yield whole_body(result)
            else:
                yield from body

    def respond(self, event: dict[str, Any], context: Any, *, streaming: bool) -> tuple[dict[str, Any], StreamedBody | None]:
        """The proxy result, and the events of a route's EventStream (a route returns one only when `streaming`)."""
        from gateway.observability import configure_logging

        configure_logging()
        started = time.perf_counter()
        request_id = ((event.get("requestContext") or {}).get("requestId")) or _new_request_id()
        path = event.get("path") or "/"
        body = None
        try:
            refuse_credentials_in_query(event)
            # Who calls, first: an anonymous request is refused before its body is even decoded.
            principal = None if self.is_public(path) else self._principal(event)
            if principal is not None and self.services.throttle is not None:
                self.services.throttle.admit(principal.tenant_id)  # the tenant's own rate, before its body is read
            prepared = prepare_event(event, self.services.settings.max_body_bytes)
        except ServiceError as exc:
            from gateway.api.responses import proxy_error  # Powertools' response type: loaded with the app

            result = proxy_error(exc, path)
        else:
            self.app.append_context(request_id=request_id, principal=principal, streaming=streaming)
            result = self.app.resolve(prepared, context)
            body = streamed_body(result)  # a route's EventStream: its events, sent after the prelude
        _stamp_request_id(result, request_id, path)
        status = int(result.get("statusCode", 500))
        log.info("request", extra={"path": path, "method": event.get("httpMethod"), "status": status,
                                   "request_id": request_id, "streams": body is not None,
                                   "duration_ms": round((time.perf_counter() - started) * 1000, 2)})
        _count_request(status)
        return result, body

    def run_line(self, principal: Principal, call: LineCall) -> tuple[int, dict[str, str], Any]:
        """A batch line (`gateway.batches.worker`) through its route, as `principal`, as a request
        with its body runs (the same validation, services, records and errors), as bulk work: its
        status, headers and JSON body."""
        event = line_event(call)
        try:
            prepared = prepare_event(event, self.services.settings.max_body_bytes)
        except ServiceError as exc:
            from gateway.api.responses import proxy_error

            result = proxy_error(exc, call.url)
        else:
            self.app.append_context(request_id=call.request_id, principal=principal, streaming=False, batch_line=call)
            result = self.app.resolve(prepared, None)
        headers = {**(result.get("headers") or {}),
                   **{k: v[-1] for k, v in (result.get("multiValueHeaders") or {}).items() if v}}
        text = result.get("body") or ""
        if result.get("isBase64Encoded"):
            text = base64.b64decode(text).decode("utf-8", "replace")
        try:
            body = json.loads(text) if text else None
        except ValueError:
            body = {"error": {"message": "the route answered something that is not JSON", "type": "server_error"}}
        return int(result.get("statusCode", 500)), headers, body

    def is_public(self, path: str) -> bool:
        path = route_path(path)
        return path in PUBLIC_PATHS or (self.services.settings.openapi and path == OPENAPI_PATH)

    def _principal(self, event: dict[str, Any]) -> Any:
        """The caller, or a ServiceError: a store that cannot be read is a 503, never an escaped exception."""
        try:
            return principal_of(event, self.services.authenticator, time.time())
        except ServiceError:
            raise
        except Exception:
            log.exception("the caller's credential could not be checked")
            raise BackendUnavailable("credentials cannot be checked right now; retry shortly", retry_after=2) from None


def build_function() -> GatewayFunction:
    """The function as this deployment's settings describe it (stores, clients, routes)."""
    from gateway.functions.composition import build_services
    from gateway.settings import GatewaySettings

    return GatewayFunction(build_services(GatewaySettings.from_env()))


def _built_in_init_phase() -> tuple[GatewayFunction | None, float]:
    """In Lambda, the function is built while the module loads: the init phase (and a
    SnapStart snapshot) carries the settings, stores and SageMaker clients, not the first
    caller. It calls no endpoint and no store; its network calls are the models parameter,
    when the settings name one in SSM, and the credentials botocore's store clients resolve
    when they are built. Anything it cannot build is built again on the
    first request, which then answers with the error (and the log says why)."""
    if not os.environ.get("AWS_LAMBDA_FUNCTION_NAME"):
        return None, 0.0  # tests, the local runner and benchmarks build their own
    started = time.perf_counter()
    try:
        function = build_function()
        if os.environ.get("AWS_LAMBDA_INITIALIZATION_TYPE") == "snap-start":
            build_deferred_models()
        return function, time.perf_counter() - started
    except Exception:
        log.exception("the function could not be built in the init phase; the first request tries again")
        return None, time.perf_counter() - started


def build_deferred_models() -> None:
    """The gateway's models build their validators on first use (`defer_build`): a cold
    start pays only for those its first request reads. A SnapStart snapshot is taken once,
    so it carries them all, built here: the models, and the modules' own TypeAdapters."""
    import sys

    from pydantic import TypeAdapter

    for model in declared_models():
        if not model.__pydantic_complete__:
            model.model_rebuild()
    for name, module in list(sys.modules.items()):
        if name.startswith(("gateway.", "systemone.")):
            for value in list(vars(module).values()):
                if isinstance(value, TypeAdapter) and not value.pydantic_complete:
                    value.rebuild()


def declared_models() -> Iterator[type]:
    """Every pydantic model of the gateway and of the contract that is loaded."""
    from pydantic import BaseModel

    pending = list(BaseModel.__subclasses__())
    while pending:
        model = pending.pop()
        pending.extend(model.__subclasses__())
        if model.__module__.startswith(("gateway.", "systemone.")):
            yield model


def after_restore() -> None:
    """What a SnapStart snapshot must not share between the instances resumed from it: the
    random generators (seeded once, in the init phase). Secrets are read on first use, never
    in the init phase, and botocore refreshes the container's credentials by their expiry."""
    random.seed()
    if _function is not None:
        _function.services.registry.reseed()


def _register_restore_hook() -> None:
    """Lambda's managed Python runtime ships `snapshot_restore_py` (the local base image too);
    elsewhere there is no snapshot to resume from."""
    try:
        from snapshot_restore_py import register_after_restore
    except ImportError:
        return
    register_after_restore(after_restore)


_function, INIT_SECONDS = _built_in_init_phase()  # kept while the container is warm
_register_restore_hook()


def lambda_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    return built_function()(event, context)


def streaming_handler(event: dict[str, Any], context: Any) -> Iterator[bytes]:
    """The streaming routes' entry point (`gateway.functions.runtime_loop` in AWS, the local runner here)."""
    return built_function().stream(event, context)


def built_function() -> GatewayFunction:
    """The function this instance built (in the init phase, in Lambda), built now if it was not."""
    global _function
    if _function is None:
        _function = build_function()
    return _function


def _count_request(status: int) -> None:
    from gateway.observability import metrics, metrics_enabled

    if not metrics_enabled():
        return
    recorder = metrics()
    recorder.add_metric(name="Requests", unit="Count", value=1)
    if status >= 500:
        recorder.add_metric(name="ServerErrors", unit="Count", value=1)
    elif status >= 400:
        recorder.add_metric(name="ClientErrors", unit="Count", value=1)
    recorder.flush_metrics()


_CREDENTIAL_PARAMS = {"api_key", "apikey", "api-key", "key", "token", "access_token", "auth", "authorization", "bearer"}


def refuse_credentials_in_query(event: dict[str, Any]) -> None:
    """Credentials travel in the Authorization header only: URLs end up in logs and histories."""
    for name, values in (event.get("multiValueQueryStringParameters") or {}).items():
        if name.lower() in _CREDENTIAL_PARAMS or any(isinstance(v, str) and v.startswith(("dgk_", "dgt_")) for v in values):
            raise RequestError("credentials are never accepted in the query string; send Authorization: Bearer ...")


def prepare_event(event: dict[str, Any], max_body_bytes: int) -> dict[str, Any]:
    """A copy of the event whose body is JSON text (a form route's: its bytes as they came), or a
    ServiceError for the caller."""
    body = event.get("body")
    headers = {k.lower(): v for k, v in (event.get("headers") or {}).items() if isinstance(v, str)}
    encoding = headers.get("content-encoding", "").strip().lower()
    if (event.get("httpMethod") or "GET").upper() in ("GET", "HEAD", "OPTIONS"):
        return event
    if takes_form(event.get("httpMethod") or "", event.get("path") or ""):
        return event if body is None else _form_event(event, body, encoding, max_body_bytes)
    if body is None:  # no body: rewritten as JSON's all the same, so the multipart parser never sees a form's type
        raw = b""
    elif event.get("isBase64Encoded"):
        try:
            raw = base64.b64decode(body, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidRequest.at([], "the body is not valid base64", "body_encoding") from None
    else:
        raw = body.encode("utf-8", "surrogatepass")
    if len(raw) > max_body_bytes and encoding in ("", "identity"):
        raise PayloadTooLarge(f"the body is larger than {max_body_bytes} bytes")
    text = body_reader.decode(body_reader.inflate(raw, encoding, max_body_bytes))
    replaced = ("content-encoding", "content-type")
    new_headers = {k: v for k, v in (event.get("headers") or {}).items() if k.lower() not in replaced}
    new_headers["content-type"] = "application/json"  # every body of this API is JSON, whatever curl -d says
    multi = {k: v for k, v in (event.get("multiValueHeaders") or {}).items() if k.lower() not in replaced}
    multi["content-type"] = ["application/json"]
    return {**event, "body": text, "isBase64Encoded": False, "headers": new_headers, "multiValueHeaders": multi}


def line_event(call: LineCall) -> dict[str, Any]:
    """The proxy event of a batch line: a POST of its body to its endpoint, JSON."""
    headers = {"content-type": "application/json"}
    return {"resource": "/{proxy+}", "path": call.url, "httpMethod": "POST", "headers": headers,
            "multiValueHeaders": {k: [v] for k, v in headers.items()}, "queryStringParameters": None,
            "multiValueQueryStringParameters": None, "pathParameters": {"proxy": call.url.lstrip("/")},
            "requestContext": {"requestId": call.request_id, "httpMethod": "POST", "path": call.url,
                               "resourcePath": "/{proxy+}", "identity": {}},
            "body": call.body, "isBase64Encoded": False}


def _form_event(event: dict[str, Any], body: str, encoding: str, max_body_bytes: int) -> dict[str, Any]:
    """A form route's body (a file, an upload's part) stays the bytes API Gateway sent (base64),
    for its route to read (`gateway.api.batches`): it is not JSON, and a file's bytes need not be text."""
    if encoding not in ("", "identity"):
        raise RequestError("a multipart body is sent without Content-Encoding")
    size = len(body) * 3 // 4 if event.get("isBase64Encoded") else len(body.encode("utf-8", "surrogatepass"))
    if size > max_body_bytes:
        raise PayloadTooLarge(f"the body is larger than {max_body_bytes} bytes, what one request carries: a file goes"
                              " whole up to 4 MiB, and larger ones through the Uploads API (POST /v1/uploads) in parts"
                              " of at most 4 MiB")
    return event


def _stamp_request_id(result: dict[str, Any], request_id: str, path: str) -> None:
    names = ["x-request-id"]
    if route_path(path).startswith("/v1/systemone"):
        names.append("x-typesafe-request-id")
    if "multiValueHeaders" in result:
        for name in names:
            result["multiValueHeaders"][name] = [request_id]
    else:
        result.setdefault("headers", {})
        for name in names:
            result["headers"][name] = request_id


def _new_request_id() -> str:
    import uuid

    return uuid.uuid4().hex
