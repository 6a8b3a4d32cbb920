"""The local stand-in for SageMaker's runtime API (devkit/sagemaker_standin.py) in front of a
small ASGI app playing the container: what SageMaker makes of the container's answers."""

from __future__ import annotations

import json

from botocore.eventstream import EventStreamBuffer
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from devkit.sagemaker_standin import EVENT_STREAM, SageMakerStandIn, encode, model_stream_error, payload_part


async def invocations(request: Request):
    body = await request.json()
    if body.get("fail"):
        return JSONResponse({"detail": "busy", "x_state": "queue_timeout"}, status_code=503,
                            headers={"Retry-After": "3", "x-request-id": "r-1"})
    if body.get("stream"):
        async def pieces():
            yield b"data: 1\n\n"
            yield b"data: 2\n\n"
            if body.get("break"):
                raise RuntimeError("the model failed")
        return StreamingResponse(pieces(), media_type="text/event-stream", headers={"x-request-id": "r-2"})
    return JSONResponse({"seen": request.headers.get("accept"), "path": request.url.path})


CLIENT = TestClient(SageMakerStandIn(Starlette(routes=[Route("/invocations", invocations, methods=["POST"])])),
                    raise_server_exceptions=False)


def events(data: bytes) -> list[tuple[dict, bytes]]:
    buffer = EventStreamBuffer()
    buffer.add_data(data)
    return [(dict(m.headers), m.payload) for m in buffer]


def test_invoke_endpoint_is_the_containers_invocations_and_its_error_a_model_error():
    answer = CLIENT.post("/endpoints/dg-cpu/invocations", json={}, headers={"Accept": "application/json"})
    assert answer.status_code == 200 and answer.json() == {"seen": "application/json", "path": "/invocations"}
    failed = CLIENT.post("/endpoints/dg-cpu/invocations", json={"fail": True})
    assert failed.status_code == 424 and failed.headers["x-amzn-errortype"].startswith("ModelError:")
    assert failed.headers["retry-after"] == "3" and failed.headers["x-request-id"] == "r-1"
    error = failed.json()
    assert error["OriginalStatusCode"] == 503 and json.loads(error["OriginalMessage"])["x_state"] == "queue_timeout"
    assert "/aws/sagemaker/Endpoints/dg-cpu" in error["LogStreamArn"]


def test_a_stream_is_payload_parts_its_type_beside_it_and_a_late_failure_a_model_stream_error():
    answer = CLIENT.post("/endpoints/dg-cpu/invocations-response-stream", json={"stream": True},
                         headers={"X-Amzn-SageMaker-Accept": "text/event-stream"})
    assert answer.status_code == 200 and answer.headers["content-type"] == EVENT_STREAM
    assert answer.headers["x-amzn-sagemaker-content-type"].startswith("text/event-stream")
    assert answer.headers["x-request-id"] == "r-2"
    assert [payload for _, payload in events(answer.content)] == [b"data: 1\n\n", b"data: 2\n\n"]
    broken = CLIENT.post("/endpoints/dg-cpu/invocations-response-stream", json={"stream": True, "break": True})
    (*parts, (headers, payload)) = events(broken.content)
    assert len(parts) == 2 and headers[":exception-type"] == "ModelStreamError" and b"RuntimeError" in payload
    # An error before the stream began is the same ModelError as InvokeEndpoint's
    assert CLIENT.post("/endpoints/dg-cpu/invocations-response-stream", json={"fail": True}).status_code == 424


def test_other_paths_reach_the_container_and_other_methods_on_the_runtime_paths_are_refused():
    assert CLIENT.post("/invocations", json={}).json()["path"] == "/invocations"
    assert CLIENT.get("/endpoints/dg-cpu/invocations").status_code == 405
    assert CLIENT.post("/endpoints/a/b/invocations", json={}).status_code == 404


# -- the event-stream messages it writes, as botocore reads them (the gateway reads them with
# botocore's own reader, as it reads AWS's) ----------------------------------------------

def by_botocore(data: bytes) -> list[tuple[dict, bytes]]:
    buffer = EventStreamBuffer()
    buffer.add_data(data)
    return [(dict(m.headers), m.payload) for m in buffer]


def test_what_the_stand_in_writes_botocore_reads():
    stream = payload_part(b"data: {}\n\n") + payload_part(b"") + model_stream_error("it broke", "ModelInvocationTimeExceeded")
    (part, empty, error) = by_botocore(stream)
    assert part == ({":event-type": "PayloadPart", ":content-type": "application/octet-stream",
                     ":message-type": "event"}, b"data: {}\n\n")
    assert empty[1] == b""
    assert error[0][":exception-type"] == "ModelStreamError" and b"ModelInvocationTimeExceeded" in error[1]


def test_encode_writes_string_headers_botocore_reads():
    assert by_botocore(encode({"a": "é", ":message-type": "event"}, b"p")) == [({"a": "é", ":message-type": "event"}, b"p")]
