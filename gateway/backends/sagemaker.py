"""The SageMaker invoker: InvokeEndpoint, and InvokeEndpointWithResponseStream for answers
that stream, through botocore's `sagemaker-runtime` client (built by the composition root,
one per endpoint configuration, with explicit timeouts and one attempt: the endpoint pool
is the one retry loop).

What botocore does not do by default, done here: an answer is read with a size cap
(MAX_ANSWER_BYTES; an event's payload is capped at 24 MiB by botocore's event-stream
reader), and a credential that cannot be found or fetched is the deployment's failure
(`no_credentials`), never the endpoint's, and never a client kept without one. An error
answer is read whole by botocore, as SageMaker sends it (its ModelError carries the
container's body, which the scorer keeps small).

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
import io
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from botocore import exceptions as boto
from botocore.eventstream import ParserError
from urllib3 import exceptions as transport

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
from systemone.sidechannel import OWN_REFUSALS, attributes, hints_of, original_error, safe_request_id

log = logging.getLogger("gateway.backends.sagemaker")

# An answer past this is not a decision or a chat completion (SageMaker's own cap on a
# real-time response is 25 MB): the read stops instead of filling the function's memory.
MAX_ANSWER_BYTES = 32 * 1024 * 1024
# botocore's credential failures: none configured, a source that failed, an expired SSO login.
_CREDENTIAL_ERRORS = (boto.NoCredentialsError, boto.PartialCredentialsError, boto.CredentialRetrievalError,
                      boto.TokenRetrievalError, boto.SSOError, boto.RefreshWithMFAUnsupportedError)
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
    """One botocore client per endpoint configuration (region, URL, timeouts), made by
    `client_factory` when first needed, or all at once by `prepare` (Lambda's init phase)."""

    def __init__(self, client_factory: Callable[[Endpoint], Any]) -> None:
        self._client_factory = client_factory
        self._clients: dict[tuple, Any] = {}
        self._lock = threading.Lock()

    def prepare(self, endpoints: Iterable[Endpoint]) -> None:
        """Build and prime the clients of these endpoints now (Lambda's init phase, which a
        SnapStart snapshot carries), not on their first call. One that cannot be built (no
        credential yet, a region botocore refuses) is logged and tried again by its first
        call; the other endpoints are served meanwhile."""
        primed: set[int] = set()
        for endpoint in endpoints:
            try:
                client = self.client_for(endpoint)
            except EndpointFailed as exc:
                log.warning("no SageMaker client for %s yet: %s", endpoint.name, exc.reason)
                continue
            if id(client) not in primed:
                primed.add(id(client))
                _prime(client, endpoint)

    def client_for(self, endpoint: Endpoint) -> Any:
        """The endpoint's client; EndpointFailed (never cached) when it cannot be built."""
        key = (endpoint.region, endpoint.endpoint_url, endpoint.connect_timeout_s, endpoint.read_timeout_s)
        with self._lock:
            client = self._clients.get(key)
            if client is None:
                try:
                    client = self._clients[key] = self._client_factory(endpoint)
                except _CREDENTIAL_ERRORS as exc:  # the deployment's, the same on every endpoint
                    raise EndpointFailed(endpoint.name, "no_credentials") from exc
                except (boto.BotoCoreError, ValueError) as exc:  # no region, or one botocore refuses
                    log.error("the SageMaker client for %s cannot be built: %s", endpoint.name, exc)
                    raise EndpointFailed(endpoint.name, "client_configuration") from exc
        return client

    def invoke(self, endpoint: Endpoint, body: bytes, route: Route, caller: Caller = ANONYMOUS) -> bytes:
        client = self.client_for(endpoint)
        with _translated(endpoint.name):
            answer = client.invoke_endpoint(EndpointName=endpoint.name, Body=body,
                                            **_parameters(route, caller, deadline_ms(endpoint), _routing_hint(client)))
            return _read_bounded(answer)

    def invoke_stream(self, endpoint: Endpoint, body: bytes, route: Route, caller: Caller,
                      deadline_s: float) -> StreamedAnswer:
        """Each `PayloadPart` is a piece of the container's answer. The read timeout bounds
        each wait between pieces; the scorer is given the stream's whole deadline. Errors
        before the first piece are classified as `invoke`'s."""
        client = self.client_for(endpoint)
        timeout_ms = max(100, int((deadline_s - _DEADLINE_MARGIN_S) * 1000))
        with _translated(endpoint.name):
            events = client.invoke_endpoint_with_response_stream(
                EndpointName=endpoint.name, Body=body, **_parameters(route, caller, timeout_ms, _routing_hint(client)))["Body"]
        parts = _payload_parts(events)
        try:
            with _translated(endpoint.name):  # until the first piece, errors are classified as invoke's
                first = next(parts, None)
        except BaseException:
            events.close()
            raise
        if first is None:
            events.close()
            raise EndpointFailed(endpoint.name, "empty_stream")
        return StreamedAnswer(endpoint.name, first, _broken_as_stream_errors(endpoint.name, parts), events.close)


def _prime(client: Any, endpoint: Endpoint) -> None:
    """Run both operations once on a canned answer that never leaves the process. botocore
    does part of its work on a client's first call of an operation (the endpoint's rules,
    the operation's shapes, the signer, the handlers of each event): done here, the first
    caller does not wait for it. The canned answer is given at `before-send`, botocore's own
    hook for an answer that replaces the network (what its Stubber builds on)."""
    from botocore.awsrequest import AWSResponse

    def canned(request: Any, **_: Any) -> AWSResponse:
        stream = request.url.endswith("-response-stream")
        headers = {"Content-Type": "application/vnd.amazon.eventstream" if stream else "application/json"}
        return AWSResponse(request.url, 200, headers, _CannedBody(b"" if stream else b"{}"))

    events = client.meta.events
    events.register_first("before-send.sagemaker-runtime", canned, unique_id="decision-gateway-prime")
    try:
        parameters = _parameters("systemone", ANONYMOUS, deadline_ms(endpoint))
        client.invoke_endpoint(EndpointName=endpoint.name, Body=b"{}", **parameters)["Body"].read()
        list(client.invoke_endpoint_with_response_stream(EndpointName=endpoint.name, Body=b"{}", **parameters)["Body"])
    except Exception:  # priming is an optimisation: the first call does the same work, and says what fails
        log.warning("the SageMaker client for %s could not be primed", endpoint.name, exc_info=True)
    finally:
        events.unregister("before-send.sagemaker-runtime", unique_id="decision-gateway-prime")


class _CannedBody(io.BytesIO):
    """A canned answer's body as urllib3's response reads it (`read`, and `stream` for events)."""

    def stream(self, amt: int = 64 * 1024, decode_content: bool | None = None) -> Iterator[bytes]:
        while piece := self.read(amt):
            yield piece


def _parameters(route: Route, caller: Caller, timeout_ms: int, hint: bool = False) -> dict[str, str]:
    # The scorer abandons the job when this attempt's time is up, instead of finishing
    # work nobody reads while the request moves to another endpoint; it logs the gateway's
    # request id, so one id follows a request through both deployables; and it serves
    # tenants in turn by their tags, so one tenant's burst queues behind its own work.
    request_id = safe_request_id(caller.request_id)
    parameters = {"ContentType": "application/json", "Accept": "application/json",
                  "CustomAttributes": attributes(route, timeout_ms, request_id, tenant=caller.tenant_tag,
                                                 work=caller.work, weight=caller.weight)}
    if request_id:  # SageMaker's own logs and data capture key on the inference id
        parameters["InferenceId"] = request_id
    if caller.tenant_tag and hint:
        # Prefix-aware routing sends a request whose body starts as another's (the state comes
        # first: backends.scorer) to the instance that read that state, where its scorer keeps
        # it: the tag keeps tenants' states apart there too (their caches are theirs anyway).
        parameters["PrefixAwareId"] = caller.tenant_tag
    return parameters


def _routing_hint(client: Any) -> bool:
    """Whether this client's botocore sends InvokeEndpoint's routing hint (`PrefixAwareId`): the
    one this gateway is built with does; an older one would refuse the parameter, and routing
    by the body's prefix works without it."""
    members = client.meta.service_model.operation_model("InvokeEndpoint").input_shape.members
    return "PrefixAwareId" in members


def _read_bounded(answer: dict[str, Any]) -> bytes:
    """The whole answer's body, or AnswerTooLarge past MAX_ANSWER_BYTES (read no further)."""
    body = answer["Body"]
    declared = _length(answer["ResponseMetadata"]["HTTPHeaders"].get("content-length"))  # None when chunked
    if declared is not None and declared > MAX_ANSWER_BYTES:
        body.close()
        raise AnswerTooLarge(f"{declared} bytes (at most {MAX_ANSWER_BYTES})")
    data = body.read(MAX_ANSWER_BYTES + 1)
    if len(data) > MAX_ANSWER_BYTES:
        body.close()
        raise AnswerTooLarge(f"more than {MAX_ANSWER_BYTES} bytes")
    body.read()  # nothing is left: botocore checks the length against Content-Length, and frees the connection
    return data


def _length(header: str | None) -> int | None:
    """A Content-Length as urllib3 reads it (`5, 5` is 5); None when there is none or it is not a number."""
    try:
        return int(header.split(",")[0]) if header else None
    except ValueError:
        return None


class AnswerTooLarge(Exception):
    """The answer is past MAX_ANSWER_BYTES."""


@contextlib.contextmanager
def _translated(name: str) -> Iterator[None]:
    """botocore's and the transport's exceptions as the backend's errors."""
    try:
        yield
    except boto.EventStreamError as exc:  # an exception event before the first piece
        raise EndpointFailed(name, exc.response.get("Error", {}).get("Code") or "stream_error") from None
    except boto.ClientError as exc:
        raise _classify(name, exc.response) from None
    except _CREDENTIAL_ERRORS as exc:  # a deployment's fault, the same on every endpoint: never the caller's
        raise EndpointFailed(name, "no_credentials") from exc
    except boto.ConnectionError as exc:  # refused, unreachable, timed out, TLS or a proxy refused: nothing was sent
        raise EndpointBusy(name, "connect_failed") from exc
    except (boto.ReadTimeoutError, transport.ReadTimeoutError) as exc:
        # The work may still be running there: sending it elsewhere would double it.
        raise EndpointTimedOut(name, "read_timeout", answered=False) from exc
    except (boto.HTTPClientError, boto.IncompleteReadError, transport.HTTPError) as exc:  # dropped after sending
        raise EndpointBusy(name, "connection_closed") from exc
    except ParserError:
        raise EndpointFailed(name, "bad_event_stream") from None
    except AnswerTooLarge:
        raise EndpointFailed(name, "answer_too_large") from None


def _payload_parts(events: Any) -> Iterator[bytes]:
    for event in events:
        if data := event.get("PayloadPart", {}).get("Bytes"):
            yield data


def _broken_as_stream_errors(name: str, parts: Iterator[bytes]) -> Iterator[bytes]:
    """After the first piece, anything that ends the stream early is StreamBroken (a
    `ModelStreamError` or `InternalStreamFailure` event, a read timeout, a dropped
    connection, bytes that are not event-stream messages)."""
    try:
        yield from parts
    except boto.EventStreamError as exc:
        raise StreamBroken(name, exc.response.get("Error", {}).get("Code") or "stream_error") from None
    except (boto.BotoCoreError, transport.HTTPError, ParserError) as exc:
        raise StreamBroken(name, type(exc).__name__) from None


def deadline_ms(endpoint: Endpoint) -> int:
    """What the scorer gets of this attempt's time: its read timeout, less a margin."""
    return max(100, int((endpoint.read_timeout_s - _DEADLINE_MARGIN_S) * 1000))


def _classify(name: str, response: dict[str, Any]) -> Exception:
    error = response.get("Error", {})
    code = error.get("Code", "")
    if code == "ModelError":
        return container_error(name, *original_error(response))
    if code in _BUSY_CODES or code in _BUSY_STATUSES:  # a code, or only the status of a busy answer
        return EndpointBusy(name, code)
    # ValidationError here means the gateway or its configuration is wrong (an endpoint
    # that does not exist, a body the gateway should have refused): not the caller's fault,
    # and the same on every endpoint, so it is neither a 4xx nor a reason to fall back.
    return EndpointFailed(name, code or "unknown_error")


def container_error(name: str, status: int, message: str | bytes) -> Exception:
    """The error a scorer's answer of `status` (its body `message`) is, whatever carried it: an
    InvokeEndpoint's ModelError, or one line of an asynchronous invocation's output."""
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
