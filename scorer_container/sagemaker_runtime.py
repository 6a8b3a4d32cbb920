"""A local stand-in for what SageMaker's runtime API makes of a container's answer.

The scorer serves `/endpoints/{name}/invocations` (InvokeEndpoint) and
`/endpoints/{name}/invocations-response-stream` (InvokeEndpointWithResponseStream) so
that a SageMaker runtime client (the gateway's own, or botocore's), pointed here with
`endpoint_url`, works unchanged in development and tests; this module gives both their shape in AWS: a
container's error as `ModelError`, and a stream as AWS event-stream messages, each piece
the container wrote in a `PayloadPart` event (pieces do not align with lines or events:
SageMaker forwards what the container flushed), and a failure after the stream began as a
`ModelStreamError` exception message (the codec is `systemone.eventstream`, which the
gateway reads with).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from starlette.responses import JSONResponse, Response, StreamingResponse

from scorer_container.streaming import ClosingStreamingResponse
from systemone.eventstream import model_stream_error, payload_part
from systemone.sidechannel import ORIGINAL_MESSAGE, ORIGINAL_STATUS


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
        ORIGINAL_STATUS: response.status_code,
        ORIGINAL_MESSAGE: original,
        "LogStreamArn": f"arn:aws:logs:local:000000000000:log-group:/aws/sagemaker/Endpoints/{endpoint}",
    }
    headers = {"x-amzn-ErrorType": "ModelError:http://internal.amazon.com/coral/com.amazonaws.sagemaker/"}
    headers.update({k: v for k, v in response.headers.items() if k.lower() in ("x-request-id", "retry-after")})
    return JSONResponse(body, status_code=424, headers=headers)


EVENT_STREAM = "application/vnd.amazon.eventstream"


def as_response_stream(response: Response) -> Response:
    """What InvokeEndpointWithResponseStream makes of a container's answer: an error (already
    shaped by `as_sagemaker_runtime`) as it is, before any event; otherwise every piece of the
    body in a `PayloadPart`, and the container's content type in a header."""
    if response.status_code >= 400:
        return response
    parts = response.body_iterator if isinstance(response, StreamingResponse) else _whole(bytes(response.body))
    headers = {k: v for k, v in response.headers.items() if k.lower() in ("x-request-id", "x-typesafe-request-id")}
    headers["X-Amzn-SageMaker-Content-Type"] = response.headers.get("content-type", "application/json")
    return ClosingStreamingResponse(_events(parts), media_type=EVENT_STREAM, headers=headers,
                                    background=response.background, on_close=getattr(response, "on_close", None))


async def _whole(body: bytes) -> AsyncIterator[bytes]:
    yield body


async def _events(parts: AsyncIterator[bytes | str]) -> AsyncIterator[bytes]:
    try:
        async for part in parts:
            data = part.encode() if isinstance(part, str) else bytes(part)
            if data:
                yield payload_part(data)
    except Exception as exc:  # the container broke off after the stream began
        yield model_stream_error(f"the model container failed mid-stream ({type(exc).__name__})")
    finally:
        close = getattr(parts, "aclose", None)
        if close is not None:  # a caller gone cancels this generator: the container's stream stops too
            await close()
