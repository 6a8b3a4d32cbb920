"""A local stand-in for SageMaker's runtime API in front of the scorer, so that the
gateway's `sagemaker-runtime` client (botocore's), pointed here with `endpoint_url` or
`AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME`, works unchanged in development and tests.

    POST /endpoints/{name}/invocations                  InvokeEndpoint
    POST /endpoints/{name}/invocations-response-stream  InvokeEndpointWithResponseStream

Each is the container's `/invocations`, reshaped as SageMaker reshapes it: a container's
error becomes HTTP 424 `ModelError` carrying the container's status and body (a container
503 is ModelError with OriginalStatusCode 503, as boto3 raises it against AWS); a stream
becomes AWS event-stream messages, each piece the container wrote in a `PayloadPart` event
(pieces do not align with lines or events: SageMaker forwards what the container
flushed), and a failure after the stream began a `ModelStreamError` exception message.
Every other path reaches the scorer as it is (`/ping`, `/invocations`, `/v1/...`).

The scorer image carries none of this: in AWS, SageMaker is the runtime API.
`python -m devkit.sagemaker_standin --port 8080` serves the scorer (its model from the
scorer's own settings, SM_LLAMA_CPP_MODEL_DIR and the rest) behind the stand-in.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import struct
import zlib
from typing import Any

from starlette.requests import ClientDisconnect

from systemone.sidechannel import ORIGINAL_MESSAGE, ORIGINAL_STATUS

EVENT_STREAM = "application/vnd.amazon.eventstream"
_PATH = re.compile(r"/endpoints/(?P<name>[^/]+)/invocations(?P<stream>-response-stream)?")
# The container's headers SageMaker passes back beside its answer.
_KEPT_ON_ERROR = (b"x-request-id", b"retry-after")
_KEPT_ON_STREAM = (b"x-request-id", b"x-typesafe-request-id")

Scope = dict[str, Any]


class SageMakerStandIn:
    """An ASGI app: the runtime API's two paths in front of `scorer`, every other path passed through."""

    def __init__(self, scorer: Any) -> None:
        self.scorer = scorer

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        found = _PATH.fullmatch(scope.get("path", "")) if scope["type"] == "http" else None
        if found is None:
            await self.scorer(scope, receive, send)
            return
        if scope["method"] != "POST":  # as the runtime API answers another method on its paths
            await send({"type": "http.response.start", "status": 405,
                        "headers": [(b"allow", b"POST"), (b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": b'{"message": "only POST is allowed here"}'})
            return
        inner = {**scope, "path": "/invocations", "raw_path": b"/invocations"}
        if found["stream"]:
            # SageMaker hands the container the caller's X-Amzn-SageMaker-Accept as Accept.
            headers = [(k, v) for k, v in scope["headers"] if k not in (b"accept", b"x-amzn-sagemaker-accept")]
            accept = dict(scope["headers"]).get(b"x-amzn-sagemaker-accept")
            inner["headers"] = headers + ([(b"accept", accept)] if accept else [])
            await _Streamed(found["name"], send).run(self.scorer, inner, receive)
        else:
            await _Buffered(found["name"], send).run(self.scorer, inner, receive)


class _Buffered:
    """InvokeEndpoint: the container's answer as it is, its error as a ModelError."""

    def __init__(self, endpoint: str, send: Any) -> None:
        self.endpoint, self.send = endpoint, send
        self.error: dict[str, Any] | None = None  # the container's failed answer, read whole
        self.error_body = bytearray()

    async def run(self, scorer: Any, scope: Scope, receive: Any) -> None:
        await scorer(scope, receive, self.intercept)

    async def intercept(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start" and message["status"] >= 400:
            self.error = message
            return
        if self.error is None:
            await self.answer(message)
            return
        self.error_body += message.get("body", b"")
        if not message.get("more_body", False):
            await _send_model_error(self.send, self.endpoint, self.error, bytes(self.error_body))

    async def answer(self, message: dict[str, Any]) -> None:
        await self.send(message)


class _Streamed(_Buffered):
    """InvokeEndpointWithResponseStream: each piece of the container's answer in a PayloadPart."""

    def __init__(self, endpoint: str, send: Any) -> None:
        super().__init__(endpoint, send)
        self.started = False

    async def run(self, scorer: Any, scope: Scope, receive: Any) -> None:
        try:
            await scorer(scope, receive, self.intercept)
        except (ClientDisconnect, OSError):
            return  # the caller hung up: the container's stream stopped, and nobody is left to tell
        except Exception as exc:  # the container broke off after the stream began
            if not self.started:
                raise
            await self.send({"type": "http.response.body", "more_body": False,
                             "body": model_stream_error(f"the model container failed mid-stream ({type(exc).__name__})")})

    async def answer(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.started = True
            given = dict(message.get("headers", []))
            headers = [(k, v) for k, v in message.get("headers", []) if k in _KEPT_ON_STREAM]
            headers += [(b"content-type", EVENT_STREAM.encode()),
                        (b"x-amzn-sagemaker-content-type", given.get(b"content-type", b"application/json"))]
            await self.send({"type": "http.response.start", "status": 200, "headers": headers})
            return
        body = message.get("body", b"")
        more = message.get("more_body", False)
        if body or not more:
            await self.send({"type": "http.response.body", "body": payload_part(body) if body else b"",
                             "more_body": more})


async def _send_model_error(send: Any, endpoint: str, start: dict[str, Any], body: bytes) -> None:
    """What SageMaker makes of a container's error: HTTP 424 `ModelError` with its status and body."""
    status, original = start["status"], body.decode("utf-8", "replace")
    kind = "client" if status < 500 else "server"
    error = json.dumps({
        "ErrorCode": f"{kind.upper()}_ERROR_FROM_MODEL",
        "message": f"Received {kind} error ({status}) from primary with message \"{original}\".",
        ORIGINAL_STATUS: status,
        ORIGINAL_MESSAGE: original,
        "LogStreamArn": f"arn:aws:logs:local:000000000000:log-group:/aws/sagemaker/Endpoints/{endpoint}",
    }).encode()
    headers = [(k, v) for k, v in start.get("headers", []) if k in _KEPT_ON_ERROR]
    headers += [(b"content-type", b"application/json"), (b"content-length", str(len(error)).encode()),
                (b"x-amzn-errortype", b"ModelError:http://internal.amazon.com/coral/com.amazonaws.sagemaker/")]
    await send({"type": "http.response.start", "status": 424, "headers": headers})
    await send({"type": "http.response.body", "body": error})


# -- AWS event-stream messages, as the runtime API writes them --------------------------------
# A message: a prelude (total length, headers length, the prelude's CRC32), the headers
# (name, type, value), the payload, and the CRC32 of everything before it. botocore reads
# them in the tests (tests/unit/devkit/test_sagemaker_standin.py), so this writer cannot drift from AWS's
# format unnoticed.

_PRELUDE = struct.Struct("!II")
_CRC = struct.Struct("!I")
_STRING = 7  # the header value type of a UTF-8 string (the only one written here)


def encode(headers: dict[str, str], payload: bytes) -> bytes:
    """One message, its headers all strings."""
    encoded = b"".join(
        struct.pack("!B", len(name.encode())) + name.encode() + struct.pack("!BH", _STRING, len(value.encode()))
        + value.encode() for name, value in headers.items())
    prelude = _PRELUDE.pack(_PRELUDE.size + _CRC.size + len(encoded) + len(payload) + _CRC.size, len(encoded))
    message = prelude + _CRC.pack(zlib.crc32(prelude)) + encoded + payload
    return message + _CRC.pack(zlib.crc32(message))


def payload_part(data: bytes) -> bytes:
    """A `PayloadPart` event: a piece of the container's answer."""
    return encode({":event-type": "PayloadPart", ":content-type": "application/octet-stream",
                   ":message-type": "event"}, data)


def model_stream_error(message: str, code: str = "ModelStreamError") -> bytes:
    """A `ModelStreamError` exception: the container failed after the stream began."""
    body = json.dumps({"Message": message, "ErrorCode": code}).encode()
    return encode({":exception-type": "ModelStreamError", ":content-type": "application/json",
                   ":message-type": "exception"}, body)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="devkit.sagemaker_standin", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    args = parser.parse_args(argv)
    import logging

    import uvicorn

    from scorer_container.server import create_app
    from scorer_container.settings import ScorerSettings

    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s %(message)s")
    signal.signal(signal.SIGINT, signal.default_int_handler)
    uvicorn.run(SageMakerStandIn(create_app(ScorerSettings.from_env())), host=args.host, port=args.port,
                log_level="warning", timeout_graceful_shutdown=25)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
