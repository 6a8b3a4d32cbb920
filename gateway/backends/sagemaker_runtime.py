"""SageMaker's runtime API over HTTP: InvokeEndpoint and InvokeEndpointWithResponseStream,
signed with SigV4 (`gateway.sigv4`), on kept-alive connections.

The gateway's whole use of SageMaker is these two POSTs, so it speaks them itself instead of
building botocore's `sagemaker-runtime` client, whose import and set-up were most of the
function's cold start (`make bench-gateway`). What this client knows of the protocol is what
botocore's service model says of those two operations: the headers each member travels in,
rest-json errors (the code in `x-amzn-ErrorType`, else the body's `__type`), and AWS
event-stream messages for the stream (`systemone.eventstream`). The endpoint is
`https://runtime.sagemaker.{region}.amazonaws.com` (`.com.cn` in China's regions), or the
endpoint's `endpoint_url` (FIPS, dual-stack, the isolated partitions, a VPC endpoint, a
local stand-in): botocore's variables for those (`AWS_USE_FIPS_ENDPOINT`,
`AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME`, proxies) are not read; `AWS_CA_BUNDLE` and X-Ray's
trace header are.

It only transports: one attempt, no retry, and errors as this module's exceptions, which
`gateway.backends.sagemaker` classifies (busy, timed out, rejected, failed).
"""

from __future__ import annotations

import http.client
import json
import os
import select
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any, NoReturn
from urllib.parse import quote, urlsplit

from gateway.sigv4 import Credentials, current_credentials, sign
from systemone.eventstream import Decoder, EventStreamError, Message

SIGNING_NAME = "sagemaker"
USER_AGENT = "decision-gateway (sagemaker-runtime; sigv4)"
# An answer past this is not a decision or a chat completion (SageMaker's own cap on a
# real-time response is 25 MB): the read stops instead of filling the function's memory.
MAX_ANSWER_BYTES = 32 * 1024 * 1024
_READ_PIECE = 64 * 1024
# Idle connections kept per endpoint URL (botocore's pool for this client held 16).
MAX_IDLE_CONNECTIONS = 16


class RuntimeCallError(Exception):
    """The call did not return an answer; subclasses say how."""


class NoCredentials(RuntimeCallError):
    """No credentials to sign with (none configured, or their source failed): nothing was sent."""


class ConnectFailed(RuntimeCallError):
    """No connection (refused, unreachable, timed out, TLS failed): nothing was sent."""


class ReadTimedOut(RuntimeCallError):
    """Sent, and no answer within the read timeout: the work may still be running there."""


class ConnectionClosed(RuntimeCallError):
    """The connection dropped after the request went out (reset, cut mid-answer)."""


class AnswerTooLarge(RuntimeCallError):
    """The answer is past MAX_ANSWER_BYTES."""


class BrokenEventStream(RuntimeCallError):
    """The stream's bytes are not well-formed event-stream messages."""


class ServiceError(RuntimeCallError):
    """SageMaker answered with an error. `response` has botocore's ClientError shape
    (`Error.Code`, `Error.Message`, the body's other fields at the top, e.g. a ModelError's
    `OriginalStatusCode`), so one classifier reads both."""

    def __init__(self, response: dict[str, Any]) -> None:
        super().__init__(response["Error"]["Code"])
        self.response = response


class StreamException(RuntimeCallError):
    """An exception or error message inside the stream (`ModelStreamError`, `InternalStreamFailure`)."""

    def __init__(self, code: str, message: bytes) -> None:
        super().__init__(code)
        self.code = code
        self.message = message


def default_base_url(region: str) -> str:
    suffix = "amazonaws.com.cn" if region.startswith("cn-") else "amazonaws.com"
    return f"https://runtime.sagemaker.{region}.{suffix}"


class SageMakerRuntime:
    """One region's (or one `endpoint_url`'s) runtime API, with one pair of timeouts."""

    def __init__(self, region: str, endpoint_url: str | None = None, *, connect_timeout_s: float = 2.0,
                 read_timeout_s: float = 25.0, credentials: Callable[[], Credentials] = current_credentials) -> None:
        url = urlsplit(endpoint_url or default_base_url(region))
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"not an http(s) endpoint URL: {endpoint_url!r}")
        self.region = region
        self._credentials = credentials
        self._host = url.netloc.rsplit("@", 1)[-1]  # as signed and sent (a port when it is not the scheme's)
        self._base_path = url.path.rstrip("/")
        self._connections = _Connections(url.scheme, url.hostname, url.port, connect_timeout_s, read_timeout_s)

    def invoke_endpoint(self, name: str, body: bytes, headers: dict[str, str]) -> bytes:
        """The container's answer. `headers`: Content-Type, Accept, X-Amzn-SageMaker-*."""
        response, connection = self._post(f"/endpoints/{quote(name, safe='')}/invocations", body, headers)
        whole = False
        try:
            answer = _read(response, MAX_ANSWER_BYTES)
            whole = True
            return answer
        finally:
            self._connections.release(connection, response, whole)

    def invoke_endpoint_with_response_stream(self, name: str, body: bytes, headers: dict[str, str]) -> EventStream:
        """The answer's event-stream messages as they arrive. `headers` as `invoke_endpoint`'s
        (the answer's type goes in X-Amzn-SageMaker-Accept here)."""
        response, connection = self._post(f"/endpoints/{quote(name, safe='')}/invocations-response-stream", body,
                                          headers)
        return EventStream(response, lambda finished: self._connections.release(connection, response, finished))

    def _post(self, path: str, body: bytes, headers: dict[str, str]) -> tuple[http.client.HTTPResponse, Any]:
        path = self._base_path + path
        try:
            credentials = self._credentials()
        except Exception as exc:  # none anywhere, or the container's endpoint failed: nothing was sent
            raise NoCredentials(type(exc).__name__) from exc
        signed = sign("POST", self._host, path, headers, body, region=self.region, service=SIGNING_NAME,
                      credentials=credentials)
        signed["User-Agent"] = USER_AGENT
        if trace := os.environ.get("_X_AMZN_TRACE_ID"):  # X-Ray's trace, as botocore forwards it (unsigned)
            signed["X-Amzn-Trace-Id"] = quote(trace, safe="-=;:+&[]{}\"',")
        connection = self._connections.take()
        try:
            connection.request("POST", path, body=body, headers=signed)
            response = connection.getresponse()
        except BaseException as exc:
            connection.close()
            _raise_transport_error(exc)
        if response.status >= 300:
            whole = False
            try:
                # Read whole (a cut JSON body would lose the container's status): bounded as an answer.
                error = ServiceError(_error_response(response, _read(response, MAX_ANSWER_BYTES, cut=True)))
                whole = True
            finally:
                self._connections.release(connection, response, whole)
            raise error
        return response, connection


class EventStream:
    """The messages of a streamed answer; `close()` hangs up (the container's work stops)."""

    def __init__(self, response: http.client.HTTPResponse, release: Callable[[bool], None]) -> None:
        self._response = response
        self._release = release
        self._decoder = Decoder()
        self._closed = False

    def __iter__(self) -> Iterator[Message]:
        """Each message, in order; an exception message raises StreamException."""
        try:
            while True:
                try:
                    data = self._response.read1(_READ_PIECE)
                except BaseException as exc:
                    _raise_transport_error(exc)
                if not data:
                    self._decoder.close()
                    break
                for message in self._decoder.feed(data):
                    if message.message_type in ("exception", "error"):
                        raise StreamException(message.error_code or "stream_error", message.payload)
                    yield message
        except EventStreamError as exc:
            self.close()
            raise BrokenEventStream(str(exc)) from None
        except BaseException:
            self.close()
            raise
        self._finish(True)

    def close(self) -> None:
        self._finish(False)

    def _finish(self, whole: bool) -> None:
        if not self._closed:
            self._closed = True
            self._release(whole)


def _read(response: http.client.HTTPResponse, limit: int, *, cut: bool = False) -> bytes:
    """The whole body, at most `limit` bytes (past it: AnswerTooLarge, or the first `limit`
    bytes when `cut`). A body shorter than its Content-Length is a connection that dropped."""
    expected = response.length  # None when chunked or read to the connection's end
    if expected is not None and expected > limit and not cut:
        raise AnswerTooLarge(f"{expected} bytes (at most {limit})")
    pieces, size = [], 0
    try:
        while size <= limit:
            piece = response.read(min(_READ_PIECE, limit + 1 - size))
            if not piece:
                break
            pieces.append(piece)
            size += len(piece)
    except BaseException as exc:
        _raise_transport_error(exc)
    data = b"".join(pieces)
    if size > limit:
        if not cut:
            raise AnswerTooLarge(f"more than {limit} bytes")
        return data[:limit]
    if expected is not None and size < expected:
        raise ConnectionClosed(f"the answer ended after {size} of its {expected} bytes")
    return data


def _raise_transport_error(exc: BaseException) -> NoReturn:
    """What a failure of the socket means for the call: a timeout after the connection was
    made is a read timeout (the request may be running); a connection that drops is closed.
    Anything else (KeyboardInterrupt, a bug) is raised as it is."""
    if isinstance(exc, TimeoutError):  # socket.timeout is TimeoutError
        raise ReadTimedOut("no answer within the read timeout") from exc
    if isinstance(exc, (http.client.HTTPException, ConnectionError, OSError)):
        raise ConnectionClosed(type(exc).__name__) from exc
    raise exc


def _error_response(response: http.client.HTTPResponse, body: bytes) -> dict[str, Any]:
    """A rest-json error as botocore parses it: the code from `x-amzn-ErrorType` (before any
    `:`), else the body's `__type` (after any `#`) or `code`, else the HTTP status."""
    try:
        parsed = json.loads(body) if body.strip() else {}
    except ValueError:
        parsed = {}
    if not isinstance(parsed, dict):
        parsed = {}
    code = (response.getheader("x-amzn-ErrorType") or "").split(":")[0].strip()
    if not code:
        code = str(parsed.get("__type") or parsed.get("code") or parsed.get("Code") or "").rsplit("#", 1)[-1]
    message = parsed.get("message") or parsed.get("Message") or ""
    fields = {k: v for k, v in parsed.items() if k not in ("__type", "code", "Code", "message", "Message")}
    return {**fields, "Error": {"Code": code or str(response.status), "Message": str(message)},
            "ResponseMetadata": {"HTTPStatusCode": response.status}}


class _Connections:
    """Kept-alive connections to one host, at most MAX_IDLE_CONNECTIONS idle. A connection
    is reused only after its answer was read whole, and only if the server has not closed
    it meanwhile (readable while idle means closed, or bytes nobody asked for)."""

    def __init__(self, scheme: str, host: str, port: int | None, connect_timeout_s: float,
                 read_timeout_s: float) -> None:
        self._scheme, self._host, self._port = scheme, host, port
        self._connect_timeout_s, self._read_timeout_s = connect_timeout_s, read_timeout_s
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def take(self) -> http.client.HTTPConnection:
        while True:
            with self._lock:
                connection = self._idle.pop() if self._idle else None
            if connection is None:
                return self._connect()
            if not _dropped(connection):
                return connection
            connection.close()

    def _connect(self) -> http.client.HTTPConnection:
        if self._scheme == "https":
            connection: http.client.HTTPConnection = http.client.HTTPSConnection(
                self._host, self._port, timeout=self._connect_timeout_s, context=_tls_context())
        else:
            connection = http.client.HTTPConnection(self._host, self._port, timeout=self._connect_timeout_s)
        try:
            connection.connect()
        except OSError as exc:  # refused, unreachable, no such host, timed out, TLS refused
            connection.close()
            raise ConnectFailed(f"{type(exc).__name__}: {exc}") from exc
        connection.sock.settimeout(self._read_timeout_s)  # each wait for the answer, from now on
        connection.sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        return connection

    def release(self, connection: http.client.HTTPConnection, response: http.client.HTTPResponse,
                reusable: bool) -> None:
        # Read whole: closed at its end, or every byte of its Content-Length read (read1 leaves
        # it open, and a connection whose last answer is open takes no next request).
        whole = response.isclosed() or response.length == 0
        if reusable and not response.will_close and whole:
            response.close()
            with self._lock:
                if len(self._idle) < MAX_IDLE_CONNECTIONS:
                    self._idle.append(connection)
                    return
        response.close()
        connection.close()


def _dropped(connection: http.client.HTTPConnection) -> bool:
    sock = connection.sock
    if sock is None:
        return True
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


_TLS: Any = None
_TLS_LOCK = threading.Lock()


def _tls_context() -> Any:
    """One TLS context for every connection (loading the system's CA certificates is the
    expensive part), made on the first HTTPS connection."""
    global _TLS
    with _TLS_LOCK:
        if _TLS is None:
            import ssl

            _TLS = ssl.create_default_context(cafile=os.environ.get("AWS_CA_BUNDLE") or None)  # botocore's variable
        return _TLS
