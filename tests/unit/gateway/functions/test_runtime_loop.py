"""The streaming function's runtime loop against a stand-in of the Lambda Runtime API that
follows AWS's documented protocol (`devkit.runtime_api`): `sam local` cannot stream."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from devkit.fake_backend import FakeBackendServer
from devkit.gateway_stack import PRINCIPAL, event
from devkit.runtime_api import RuntimeApiStandIn
from gateway.functions.runtime_loop import RuntimeApi, serve
from gateway.streaming.integration import CONTENT_TYPE, read_prelude

ROOT = Path(__file__).resolve().parents[4]


class Handler:
    """A streaming handler that remembers whether its generator was closed."""

    def __init__(self, chunks: list[bytes], *, fail_at: int | None = None, pause_s: float = 0.0) -> None:
        self.chunks, self.fail_at, self.pause_s = chunks, fail_at, pause_s
        self.closed = threading.Event()
        self.sent = 0

    def __call__(self, event, context):
        try:
            for i, chunk in enumerate(self.chunks):
                if i == self.fail_at:
                    raise RuntimeError("the model endpoint vanished; secret=hunter2")
                if i:
                    time.sleep(self.pause_s)
                self.sent += 1
                yield chunk
        finally:
            self.closed.set()


def _serve_one(stand_in: RuntimeApiStandIn, handler: Handler):
    api = RuntimeApi(stand_in.address)
    runner = threading.Thread(target=lambda: serve(api, api.next(), handler), daemon=True)
    runner.start()
    posted = stand_in.invoke({"path": "/health"})
    runner.join(timeout=10)
    return posted


PRELUDE = json.dumps({"statusCode": 200, "headers": {"content-type": "text/event-stream"}}).encode() + b"\0" * 8


def test_a_response_streams_chunk_by_chunk_with_the_documented_headers():
    # Given a handler whose body comes in three pieces, 0.2 s apart
    with RuntimeApiStandIn() as stand_in:
        posted = _serve_one(stand_in, Handler([PRELUDE, b"data: 1\n\n", b"data: 2\n\n"], pause_s=0.2))
    # Then Lambda got one streamed response: the streaming mode, chunked, the HTTP
    # integration's content type, the error trailers declared up front
    assert posted.kind == "response"
    assert posted.headers["lambda-runtime-function-response-mode"] == "streaming"
    assert posted.headers["transfer-encoding"] == "chunked"
    assert posted.headers["content-type"] == CONTENT_TYPE
    assert posted.headers["trailer"] == "Lambda-Runtime-Function-Error-Type, Lambda-Runtime-Function-Error-Body"
    # And each piece arrived as its own chunk, when it was produced, not at the end
    assert [data for _, data in posted.chunks] == [PRELUDE, b"data: 1\n\n", b"data: 2\n\n"]
    times = [t for t, _ in posted.chunks]
    assert times[2] - times[0] >= 0.35
    assert read_prelude(posted.body)[0]["statusCode"] == 200
    assert posted.trailers == {}


def test_a_failure_after_the_first_byte_is_said_in_the_trailers_without_its_text():
    with RuntimeApiStandIn() as stand_in:
        posted = _serve_one(stand_in, Handler([PRELUDE, b"data: 1\n\n", b"never"], fail_at=2))
    assert posted.kind == "response" and posted.body == PRELUDE + b"data: 1\n\n"
    assert posted.trailers["Lambda-Runtime-Function-Error-Type"] == "Function.Unhandled"
    error = json.loads(base64.b64decode(posted.trailers["Lambda-Runtime-Function-Error-Body"]))
    assert error["errorType"] == "RuntimeError" and "hunter2" not in json.dumps(error)


def test_a_failure_before_the_first_byte_is_the_invocations_error():
    with RuntimeApiStandIn() as stand_in:
        posted = _serve_one(stand_in, Handler([PRELUDE], fail_at=0))
    assert posted.kind == "error"
    assert posted.headers["lambda-runtime-function-error-type"] == "Function.Unhandled"
    assert posted.error["errorType"] == "RuntimeError" and "hunter2" not in json.dumps(posted.error)


def test_a_stream_lambda_stops_reading_closes_the_handlers_generator():
    # Given Lambda stops reading after two chunks (the caller gone, or the time up)
    handler = Handler([PRELUDE] + [b"data: x\n\n"] * 50, pause_s=0.02)
    with RuntimeApiStandIn() as stand_in:
        stand_in.cut_after = 2
        posted = _serve_one(stand_in, handler)
        # Then the handler's generator is closed (which hangs up on the model endpoint) long
        # before it would have ended
        assert handler.closed.wait(5)
    assert posted.cut and handler.sent < 50


def _loop_process(stand_in: RuntimeApiStandIn, backend_url: str, **env: str) -> subprocess.Popen:
    """The streaming function as Lambda starts it: the exec wrapper, in front of a runtime command it ignores."""
    models = {"models": [{"name": "chat-default", "serves": ["chat"],
                          "endpoints": [{"name": "dg-cpu", "endpoint_url": backend_url}]}]}
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "GATEWAY_", "DG_"))}
    return subprocess.Popen(
        [str(ROOT / "gateway" / "bin" / "streaming-runtime"), "/var/runtime/bootstrap"],
        env={**clean, "AWS_LAMBDA_RUNTIME_API": stand_in.address, "LAMBDA_TASK_ROOT": str(ROOT),
             "GATEWAY_RUNTIME_PYTHON": sys.executable, "AWS_LAMBDA_FUNCTION_NAME": "streaming",
             "GATEWAY_MODELS": json.dumps(models), "AWS_DEFAULT_REGION": "us-east-1",
             "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", **env},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


CHAT = {"model": "chat-default", "messages": [{"role": "user", "content": "hi"}], "stream": True,
        "stream_options": {"include_usage": True}}


@pytest.mark.parametrize("snap_start", [False, True], ids=["on-demand", "snap-start"])
def test_the_wrapper_runs_the_loop_and_a_chat_streams_through_it(snap_start):
    # Given the wrapper started as Lambda starts it (with SnapStart: the snapshot taken, then restored)
    with FakeBackendServer() as backend, RuntimeApiStandIn(snap_start=snap_start) as stand_in:
        process = _loop_process(stand_in, backend.url,
                                **({"AWS_LAMBDA_INITIALIZATION_TYPE": "snap-start"} if snap_start else {}))
        try:
            if snap_start:
                assert stand_in.snapshot_taken.wait(60), "the loop never asked for restore/next"
                stand_in.restore()
            # When a chat stream and a health check are invoked
            chat = stand_in.invoke(event("POST", "/v1/chat/completions", CHAT, principal=PRINCIPAL), timeout_s=60)
            health = stand_in.invoke(event("GET", "/health", principal=None), timeout_s=60)
        finally:
            process.kill()
            stderr = process.communicate()[1].decode()
    # Then each is a streamed response: its prelude, then its body
    meta, body = read_prelude(chat.body)
    assert meta["statusCode"] == 200, stderr[-2000:]
    assert body.endswith(b"data: [DONE]\n\n") and b'"usage"' in body
    assert [data for _, data in chat.chunks][1:], "the body came after the prelude, in chunks of its own"
    assert read_prelude(health.body)[0]["statusCode"] == 200
    assert stand_in.restore_error is None and stand_in.init_error is None
