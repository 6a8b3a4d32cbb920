"""The SageMaker invoker: InvokeEndpoint, and InvokeEndpointWithResponseStream for
answers that stream, through the gateway's own runtime client
(`gateway.backends.sagemaker_runtime`: one attempt, explicit timeouts, so the gateway owns
the retry budget).

Errors are classified as SageMaker documents them: a container 503 arrives as ModelError
(HTTP 424) with OriginalStatusCode 503, a container timeout as ModelError with
OriginalStatusCode 0; ThrottlingException is an HTTP 400 that means "busy", not "bad
request". What the scorer says of its own errors (`x_state`, `x_retry_after`:
systemone.sidechannel) decides between "busy" (another endpoint, or later), "out of
time" (never re-sent) and "refused its share" (this tenant's or this request's, which
says nothing of the endpoint's saturation).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from gateway.backends import sagemaker_runtime as runtime
from gateway.backends.base import (
    ANONYMOUS,
    Caller,
    Endpoint,
    EndpointBusy,
    EndpointFailed,
    EndpointRefused,
    EndpointRejected,
    EndpointTimedOut,
    Route,
    StreamBroken,
    StreamedAnswer,
)
from gateway.backends.sagemaker_runtime import SageMakerRuntime
from gateway.sigv4 import prepare_credentials
from systemone.sidechannel import (
    CUSTOM_ATTRIBUTES,
    OWN_REFUSALS,
    attributes,
    hints_of,
    original_error,
    safe_request_id,
)

# SageMaker error codes that mean "try elsewhere or later".
_BUSY_CODES = {"ServiceUnavailable", "ModelNotReadyException", "ThrottlingException", "InternalFailure"}
# An error with no code (a proxy or load balancer's): its HTTP status alone says busy.
_BUSY_STATUSES = {"429", "503"}
# Original container statuses that mean the same.
_BUSY_ORIGINAL = {429, 503}
# The container did not answer within SageMaker's limit.
_TIMED_OUT_ORIGINAL = 0
# What a scorer that cut a job at its deadline answers (504; 503 before the cut had a status
# of its own): only then is its x_state read as a cut, never on a 4xx or a 500.
_CUT_ORIGINAL = {503, 504}
# The scorer is told to give up this much before the attempt's read timeout, so its
# answer (a 503 saying so) arrives before the gateway stops listening.
_DEADLINE_MARGIN_S = 0.25


class SageMakerInvoker:
    """Creates one runtime client per endpoint configuration, lazily: no I/O at import or construction."""

    def __init__(self, client_factory: Callable[[Endpoint], SageMakerRuntime] | None = None) -> None:
        self._client_factory = client_factory or _default_client
        self._clients: dict[tuple, SageMakerRuntime] = {}
        self._lock = threading.Lock()

    def prepare(self, endpoints: Iterable[Endpoint]) -> None:
        """Build the clients of these endpoints now (Lambda's init phase), not on their first
        call, and the credential chain when the environment has no credentials."""
        for endpoint in endpoints:
            self.client_for(endpoint)
        prepare_credentials()

    def client_for(self, endpoint: Endpoint) -> SageMakerRuntime:
        key = (endpoint.region, endpoint.endpoint_url, endpoint.connect_timeout_s, endpoint.read_timeout_s)
        with self._lock:
            client = self._clients.get(key)
            if client is None:
                client = self._clients[key] = self._client_factory(endpoint)
        return client

    def invoke(self, endpoint: Endpoint, body: bytes, route: Route, caller: Caller = ANONYMOUS) -> bytes:
        client = self.client_for(endpoint)
        with _translated(endpoint.name):
            return client.invoke_endpoint(endpoint.name, body, _headers(route, caller, deadline_ms(endpoint)))

    def invoke_stream(self, endpoint: Endpoint, body: bytes, route: Route, caller: Caller,
                      deadline_s: float) -> StreamedAnswer:
        """Each `PayloadPart` is a piece of the container's answer. The read timeout bounds
        each wait between pieces; the scorer is given the stream's whole deadline. Errors
        before the first piece are classified as `invoke`'s."""
        client = self.client_for(endpoint)
        timeout_ms = max(100, int((deadline_s - _DEADLINE_MARGIN_S) * 1000))
        with _translated(endpoint.name):
            events = client.invoke_endpoint_with_response_stream(
                endpoint.name, body, _headers(route, caller, timeout_ms, accept="X-Amzn-SageMaker-Accept"))
        parts = _payload_parts(events)
        try:
            with _translated(endpoint.name):  # until the first piece, errors are classified as invoke's
                first = next(parts, None)
        except BaseException:
            events.close()
            raise
        if first is None:
            raise EndpointFailed(endpoint.name, "empty_stream")
        return StreamedAnswer(first, _broken_as_stream_errors(endpoint.name, parts), events.close)


def _headers(route: Route, caller: Caller, timeout_ms: int, accept: str = "Accept") -> dict[str, str]:
    # The scorer abandons the job when this attempt's time is up, instead of finishing
    # work nobody reads while the request moves to another endpoint; it logs the gateway's
    # request id, so one id follows a request through both deployables; and it serves
    # tenants in turn by their tags, so one tenant's burst queues behind its own work.
    request_id = safe_request_id(caller.request_id)
    headers = {"Content-Type": "application/json", accept: "application/json",
               CUSTOM_ATTRIBUTES: attributes(route, timeout_ms, request_id, tenant=caller.tenant_tag, work=caller.work,
                                             weight=caller.weight)}
    if request_id:  # SageMaker's own logs and data capture key on the inference id
        headers["X-Amzn-SageMaker-Inference-Id"] = request_id
    return headers


@contextlib.contextmanager
def _translated(name: str) -> Iterator[None]:
    """The runtime client's exceptions as the backend's errors."""
    try:
        yield
    except runtime.ServiceError as exc:
        raise _classify(name, exc.response) from None
    except runtime.ConnectFailed as exc:
        raise EndpointBusy(name, "connect_failed") from exc
    except runtime.ReadTimedOut as exc:
        # The work may still be running there: sending it elsewhere would double it.
        raise EndpointTimedOut(name, "read_timeout", answered=False) from exc
    except runtime.ConnectionClosed as exc:
        raise EndpointBusy(name, "connection_closed") from exc
    except runtime.BrokenEventStream:
        raise EndpointFailed(name, "bad_event_stream") from None
    except runtime.StreamException as exc:  # an exception event before the first piece
        raise EndpointFailed(name, exc.code) from None
    except runtime.AnswerTooLarge:
        raise EndpointFailed(name, "answer_too_large") from None
    except runtime.NoCredentials as exc:  # a deployment's fault, the same on every endpoint: never the caller's
        raise EndpointFailed(name, "no_credentials") from exc


def _payload_parts(events: runtime.EventStream) -> Iterator[bytes]:
    for message in events:
        if message.event_type == "PayloadPart" and message.payload:
            yield message.payload


def _broken_as_stream_errors(name: str, parts: Iterator[bytes]) -> Iterator[bytes]:
    """After the first piece, anything that ends the stream early is StreamBroken (a
    `ModelStreamError` or `InternalStreamFailure` event, a read timeout, a dropped connection)."""
    try:
        yield from parts
    except runtime.StreamException as exc:
        raise StreamBroken(name, exc.code) from None
    except runtime.RuntimeCallError as exc:
        raise StreamBroken(name, type(exc).__name__) from None


def deadline_ms(endpoint: Endpoint) -> int:
    """What the scorer gets of this attempt's time: its read timeout, less a margin."""
    return max(100, int((endpoint.read_timeout_s - _DEADLINE_MARGIN_S) * 1000))


def _classify(name: str, response: dict[str, Any]) -> Exception:
    error = response.get("Error", {})
    code = error.get("Code", "")
    if code == "ModelError":
        status, message = original_error(response)
        hints = hints_of(message)
        if status == _TIMED_OUT_ORIGINAL:
            return EndpointTimedOut(name, "container_timeout", answered=False)
        if hints.state == "deadline_exceeded" and status in _CUT_ORIGINAL:
            return EndpointTimedOut(name, "container_deadline", answered=True)
        if status in _BUSY_ORIGINAL and hints.state in OWN_REFUSALS:  # this tenant's or request's share: not busy
            return EndpointRefused(name, hints.state, hints.retry_after)
        if status in _BUSY_ORIGINAL:
            reason = {"not_ready": "container_not_ready", "queue_timeout": "container_queue_timeout"}.get(
                hints.state or "", f"container_{status}")
            return EndpointBusy(name, reason, retry_after=hints.retry_after)
        if 400 <= status < 500:
            return EndpointRejected(name, status, message.encode() if isinstance(message, str) else bytes(message))
        return EndpointFailed(name, f"container_{status}")
    if code in _BUSY_CODES or code in _BUSY_STATUSES:  # a code, or only the status of a busy answer
        return EndpointBusy(name, code)
    # ValidationError here means the gateway or its configuration is wrong (an endpoint
    # that does not exist, a body the gateway should have refused): not the caller's fault,
    # and the same on every endpoint, so it is neither a 4xx nor a reason to fall back.
    return EndpointFailed(name, code or "unknown_error")


def _default_client(endpoint: Endpoint) -> SageMakerRuntime:
    region = endpoint.region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if not region:
        if not endpoint.endpoint_url:
            raise ValueError(f"endpoint {endpoint.name!r}: no region (set it, or AWS_REGION) and no endpoint_url")
        region = "us-east-1"  # a local stand-in: only the signature names it
    return SageMakerRuntime(region, endpoint.endpoint_url, connect_timeout_s=endpoint.connect_timeout_s,
                            read_timeout_s=endpoint.read_timeout_s)
