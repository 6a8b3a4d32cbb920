"""The streaming function's runtime loop: the Lambda Runtime API, with streamed responses.

Lambda's managed Python runtime answers every invocation in one piece (its runtime client
has no streaming mode yet: aws/aws-lambda-roadmap#39), so the streaming routes run this
loop instead, in the same managed runtime: `AWS_LAMBDA_EXEC_WRAPPER` points at
`gateway/bin/streaming-runtime`, which starts it in place of the runtime's own client.
It is the documented custom-runtime protocol, nothing more (about 200 lines to delete
when the managed runtime streams):

    GET  /2018-06-01/runtime/invocation/next            the next event (long poll)
    POST /2018-06-01/runtime/invocation/{id}/response   the response, chunked, with
         Lambda-Runtime-Function-Response-Mode: streaming; a failure after the first
         byte is said in the trailers Lambda-Runtime-Function-Error-Type and -Body
    POST /2018-06-01/runtime/invocation/{id}/error      a failure before the first byte
    POST /2018-06-01/runtime/init/error                 the function could not be built
    GET  /2018-06-01/runtime/restore/next               SnapStart: the snapshot is taken
         during this call, which returns in each instance resumed from it
    POST /2018-06-01/runtime/restore/error              a failure after the restore

The response is the HTTP integration's byte stream (`gateway.streaming.integration`): API Gateway
reads the status and headers from its prelude and passes the body on as it comes. When
Lambda stops reading (the invocation's timeout, or the caller gone), the write fails
and the handler's generator is closed, which hangs up on the model endpoint.
"""

from __future__ import annotations

import base64
import http.client
import json
import logging
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from gateway.streaming.integration import CONTENT_TYPE

log = logging.getLogger("gateway.functions.runtime_loop")
API = "/2018-06-01/runtime"
ERROR_TYPE_TRAILER = "Lambda-Runtime-Function-Error-Type"
ERROR_BODY_TRAILER = "Lambda-Runtime-Function-Error-Body"
# What a client's failure is called in Lambda's logs and metrics; never the exception's
# text, which may quote the request.
_UNHANDLED = "Function.Unhandled"


@dataclass(frozen=True, slots=True)
class Invocation:
    request_id: str
    event: dict[str, Any]
    deadline_ms: int  # epoch milliseconds
    function_arn: str
    trace_id: str | None


class LambdaContext:
    """The context object a handler gets, as the managed runtime builds it."""

    def __init__(self, invocation: Invocation) -> None:
        self.aws_request_id = invocation.request_id
        self.invoked_function_arn = invocation.function_arn
        self.function_name = os.environ.get("AWS_LAMBDA_FUNCTION_NAME", "")
        self.function_version = os.environ.get("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
        self.memory_limit_in_mb = os.environ.get("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "")
        self.log_group_name = os.environ.get("AWS_LAMBDA_LOG_GROUP_NAME", "")
        self.log_stream_name = os.environ.get("AWS_LAMBDA_LOG_STREAM_NAME", "")
        self._deadline_ms = invocation.deadline_ms

    def get_remaining_time_in_millis(self) -> int:
        return max(0, self._deadline_ms - int(time.time() * 1000))


class RuntimeApi:
    def __init__(self, address: str) -> None:
        host, _, port = address.rpartition(":")
        self.host, self.port = host, int(port)

    def next(self) -> Invocation:
        status, headers, body = self._call("GET", f"{API}/invocation/next")
        if status != 200:
            raise RuntimeError(f"the Runtime API answered {status} for the next invocation")
        if headers.get("lambda-runtime-trace-id"):
            os.environ["_X_AMZN_TRACE_ID"] = headers["lambda-runtime-trace-id"]
        else:
            os.environ.pop("_X_AMZN_TRACE_ID", None)  # never the last invocation's trace
        return Invocation(headers["lambda-runtime-aws-request-id"], json.loads(body),
                          int(headers.get("lambda-runtime-deadline-ms", "0")),
                          headers.get("lambda-runtime-invoked-function-arn", ""), headers.get("lambda-runtime-trace-id"))

    def stream_response(self, request_id: str, chunks: Iterator[bytes]) -> bool:
        """Post `chunks` as they come; False when Lambda stopped reading (the stream was cut)."""
        connection = http.client.HTTPConnection(self.host, self.port)
        try:
            self._connected(connection)
            connection.putrequest("POST", f"{API}/invocation/{request_id}/response", skip_accept_encoding=True)
            for name, value in (("Content-Type", CONTENT_TYPE), ("Lambda-Runtime-Function-Response-Mode", "streaming"),
                                ("Transfer-Encoding", "chunked"), ("Trailer", f"{ERROR_TYPE_TRAILER}, {ERROR_BODY_TRAILER}")):
                connection.putheader(name, value)
            connection.endheaders()
            trailers = b""
            while True:
                try:
                    chunk = next(chunks)
                except StopIteration:
                    break
                except Exception as exc:  # the body failed after its first byte: said in the trailers
                    log.exception("the response failed mid-stream")
                    trailers = (f"{ERROR_TYPE_TRAILER}: {_UNHANDLED}\r\n{ERROR_BODY_TRAILER}: "
                                f"{base64.b64encode(_error_body(exc)).decode()}\r\n").encode()
                    break
                if chunk:  # a zero-length chunk would end the stream
                    connection.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            connection.send(b"0\r\n" + trailers + b"\r\n")
            response = connection.getresponse()
            response.read()
            return response.status < 300
        except (OSError, http.client.HTTPException):
            log.warning("the Runtime API stopped reading the response stream")
            return False
        finally:
            connection.close()

    def invocation_error(self, request_id: str, exc: BaseException) -> None:
        self._error(f"{API}/invocation/{request_id}/error", exc, _UNHANDLED)

    def init_error(self, exc: BaseException) -> None:
        self._error(f"{API}/init/error", exc, "Runtime.InitError")

    def restore_next(self) -> None:
        status, _, _ = self._call("GET", f"{API}/restore/next")
        if status != 200:
            raise RuntimeError(f"the Runtime API answered {status} for restore/next")

    def restore_error(self, exc: BaseException) -> None:
        self._error(f"{API}/restore/error", exc, "Runtime.AfterRestoreError")

    def _error(self, path: str, exc: BaseException, error_type: str) -> None:
        self._call("POST", path, _error_body(exc), {"Lambda-Runtime-Function-Error-Type": error_type,
                                                   "Content-Type": "application/json"})

    def _call(self, method: str, path: str, body: bytes | None = None,
              headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        connection = self._connect()
        try:
            connection.request(method, path, body=body, headers=headers or {})
            response = connection.getresponse()
            return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
        finally:
            connection.close()

    def _connect(self) -> http.client.HTTPConnection:
        connection = http.client.HTTPConnection(self.host, self.port)  # no timeout: `next` waits for work
        self._connected(connection)
        return connection

    @staticmethod
    def _connected(connection: http.client.HTTPConnection) -> None:
        connection.connect()
        connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # each chunk leaves when written


def _error_body(exc: BaseException) -> bytes:
    return json.dumps({"errorType": type(exc).__name__, "errorMessage": "the function failed on this request",
                       "stackTrace": []}).encode()


def serve(api: RuntimeApi, invocation: Invocation,
          handler: Callable[[dict[str, Any], Any], Iterator[bytes]]) -> None:
    """One invocation: its response streamed, or its error posted before the first byte."""
    try:
        chunks = handler(invocation.event, LambdaContext(invocation))
        first = next(chunks)  # the prelude: the function has answered, with some status
    except Exception as exc:
        log.exception("the function failed before its response began")
        api.invocation_error(invocation.request_id, exc)
        return
    try:
        api.stream_response(invocation.request_id, _prepended(first, chunks))
    finally:
        chunks.close()  # a stream cut short stops its work (and releases what it holds)


def _prepended(first: bytes, rest: Iterator[bytes]) -> Iterator[bytes]:
    yield first
    yield from rest


def main() -> int:
    api = RuntimeApi(os.environ["AWS_LAMBDA_RUNTIME_API"])
    try:
        from gateway.functions import handler  # the init phase: importing it builds the function
    except Exception as exc:
        api.init_error(exc)
        return 1
    if os.environ.get("AWS_LAMBDA_INITIALIZATION_TYPE") == "snap-start":
        api.restore_next()  # the snapshot is taken here; in a resumed instance, this returns
        try:
            handler.after_restore()
        except Exception as exc:
            api.restore_error(exc)
            return 65
    while True:
        serve(api, api.next(), handler.streaming_handler)


if __name__ == "__main__":
    sys.exit(main())
