"""The SageMaker invoker: botocore `sagemaker-runtime` InvokeEndpoint, and
InvokeEndpointWithResponseStream for answers that stream.

botocore's own retries are off (one attempt) and timeouts are explicit, so the gateway
owns the retry budget. Errors are classified as SageMaker documents them:
a container 503 arrives as ModelError (HTTP 424) with OriginalStatusCode 503, a
container timeout as ModelError with OriginalStatusCode 0; ThrottlingException is an
HTTP 400 that means "busy", not "bad request". What the scorer says of its own errors
(`x_state`, `x_retry_after`: systemone.sidechannel) decides between "busy" (another
endpoint, or later) and "out of time" (never re-sent).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Iterator
from typing import Any

from gateway.backends.base import (
    Endpoint,
    EndpointBusy,
    EndpointFailed,
    EndpointRejected,
    EndpointTimedOut,
    Route,
    StreamBroken,
    StreamedAnswer,
)
from systemone.sidechannel import attributes, hints_of, original_error, safe_request_id

# SageMaker error codes that mean "try elsewhere or later".
_BUSY_CODES = {"ServiceUnavailable", "ModelNotReadyException", "ThrottlingException", "InternalFailure"}
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
    """Creates one client per endpoint configuration, lazily: no I/O at import or construction."""

    def __init__(self, client_factory: Any = None) -> None:
        self._client_factory = client_factory or _default_client
        self._clients: dict[tuple, Any] = {}
        self._lock = threading.Lock()

    def prepare(self, endpoints: Iterable[Endpoint]) -> None:
        """Build the clients of these endpoints now (Lambda's init phase), not on their first call."""
        for endpoint in endpoints:
            self.client_for(endpoint)

    def client_for(self, endpoint: Endpoint) -> Any:
        key = (endpoint.region, endpoint.endpoint_url, endpoint.connect_timeout_s, endpoint.read_timeout_s)
        with self._lock:
            client = self._clients.get(key)
            if client is None:
                client = self._clients[key] = self._client_factory(endpoint)
        return client

    def invoke(self, endpoint: Endpoint, body: bytes, route: Route, request_id: str = "") -> bytes:
        client = self.client_for(endpoint)
        with _translated(endpoint.name):
            response = client.invoke_endpoint(**_request(endpoint, body, route, request_id, deadline_ms(endpoint)))
            return response["Body"].read()

    def invoke_stream(self, endpoint: Endpoint, body: bytes, route: Route, request_id: str,
                      deadline_s: float) -> StreamedAnswer:
        """InvokeEndpointWithResponseStream: each `PayloadPart` is a piece of the container's
        answer. The read timeout bounds each wait between pieces; the scorer is given the
        stream's whole deadline. Errors before the first piece are classified as `invoke`'s."""
        client = self.client_for(endpoint)
        timeout_ms = max(100, int((deadline_s - _DEADLINE_MARGIN_S) * 1000))
        with _translated(endpoint.name):
            response = client.invoke_endpoint_with_response_stream(
                **_request(endpoint, body, route, request_id, timeout_ms))
        events = response["Body"]
        stream = iter(events)
        try:
            with _translated(endpoint.name):  # until the first piece, errors are classified as invoke's
                first = _first_part(endpoint.name, stream)
        except BaseException:
            events.close()
            raise
        return StreamedAnswer(first, _payload_parts(endpoint.name, stream), events.close)


def _request(endpoint: Endpoint, body: bytes, route: Route, request_id: str, timeout_ms: int) -> dict[str, Any]:
    # The scorer abandons the job when this attempt's time is up, instead of finishing
    # work nobody reads while the request moves to another endpoint; and it logs the
    # gateway's request id, so one id follows a request through both deployables.
    request_id = safe_request_id(request_id)
    # SageMaker's own logs and data capture key on the inference id.
    extra = {"InferenceId": request_id} if request_id else {}
    return {"EndpointName": endpoint.name, "Body": body, "ContentType": "application/json",
            "Accept": "application/json", "CustomAttributes": attributes(route, timeout_ms, request_id), **extra}


@contextlib.contextmanager
def _translated(name: str) -> Iterator[None]:
    """botocore's exceptions as the backend's errors (the domain never sees botocore)."""
    from botocore.exceptions import (
        ClientError,
        ConnectionClosedError,
        ConnectTimeoutError,
        EndpointConnectionError,
        ReadTimeoutError,
    )

    try:
        yield
    except ClientError as exc:
        raise _classify(name, exc.response) from None
    except (ConnectTimeoutError, EndpointConnectionError) as exc:
        raise EndpointBusy(name, "connect_failed") from exc
    except ReadTimeoutError as exc:
        # The work may still be running there: sending it elsewhere would double it.
        raise EndpointTimedOut(name, "read_timeout", answered=False) from exc
    except ConnectionClosedError as exc:
        raise EndpointBusy(name, "connection_closed") from exc


def _first_part(name: str, events: Iterator[dict[str, Any]]) -> bytes:
    from botocore.eventstream import ParserError

    try:
        for event in events:
            part = event.get("PayloadPart")
            if part and part.get("Bytes"):
                return part["Bytes"]
    except ParserError:
        raise EndpointFailed(name, "bad_event_stream") from None
    raise EndpointFailed(name, "empty_stream")


def _payload_parts(name: str, events: Iterator[dict[str, Any]]) -> Iterator[bytes]:
    """The bytes of each `PayloadPart`; anything that ends the stream early is StreamBroken
    (a `ModelStreamError` or `InternalStreamFailure` event, a read timeout, a dropped connection)."""
    from botocore.eventstream import ParserError
    from botocore.exceptions import BotoCoreError, ClientError
    from urllib3.exceptions import HTTPError

    while True:
        try:
            event = next(events)
        except StopIteration:
            return
        except ClientError as exc:  # botocore's EventStreamError: an exception event in the stream
            raise StreamBroken(name, exc.response.get("Error", {}).get("Code") or "stream_error") from None
        except (BotoCoreError, ParserError, HTTPError, OSError) as exc:
            raise StreamBroken(name, type(exc).__name__) from None
        part = event.get("PayloadPart")
        if part and part.get("Bytes"):
            yield part["Bytes"]


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
        if status in _BUSY_ORIGINAL:
            reason = {"not_ready": "container_not_ready", "queue_timeout": "container_queue_timeout"}.get(
                hints.state or "", f"container_{status}")
            return EndpointBusy(name, reason, retry_after=hints.retry_after)
        if 400 <= status < 500:
            return EndpointRejected(name, status, message.encode() if isinstance(message, str) else bytes(message))
        return EndpointFailed(name, f"container_{status}")
    if code in _BUSY_CODES:
        return EndpointBusy(name, code)
    # ValidationError here means the gateway or its configuration is wrong (an endpoint
    # that does not exist, a body the gateway should have refused): not the caller's fault,
    # and the same on every endpoint, so it is neither a 4xx nor a reason to fall back.
    return EndpointFailed(name, code or "unknown_error")


def _default_client(endpoint: Endpoint) -> Any:
    from botocore.config import Config

    config = Config(
        # One attempt: the pool decides what happens next (the next endpoint, within the
        # request's deadline). botocore reads `max_attempts` as retries, so 1 meant two calls.
        retries={"total_max_attempts": 1, "mode": "standard"},
        connect_timeout=endpoint.connect_timeout_s,
        read_timeout=endpoint.read_timeout_s,
        tcp_keepalive=True,
        max_pool_connections=16,
    )
    from gateway import aws

    return aws.session().create_client("sagemaker-runtime", region_name=endpoint.region,
                                       endpoint_url=endpoint.endpoint_url, config=config)
