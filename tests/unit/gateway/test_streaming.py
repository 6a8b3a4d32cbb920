"""Streaming through the gateway, at the lowest layers: whole events from misaligned pieces,
the relay's ends, SageMaker's event stream through botocore's services client, and the handler's streaming
entry point (the one the runtime loop and the local runner run)."""

from __future__ import annotations

import contextlib
import gc
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from devkit.fake_backend import PIECE_BYTES, FakeBackendServer, UniformBackend
from devkit.gateway_stack import PRINCIPAL, event, install
from devkit.sagemaker_standin import EVENT_STREAM, model_stream_error, payload_part
from gateway import aws
from gateway.backends.base import ANONYMOUS, Caller, Endpoint, EndpointBusy, EndpointFailed, StreamBroken, StreamedAnswer
from gateway.backends.sagemaker import SageMakerInvoker
from gateway.decisions.cost import Meter
from gateway.functions.composition import sagemaker_client
from gateway.streaming.events import DONE, MAX_EVENT_BYTES, events
from gateway.streaming.integration import read_prelude
from gateway.streaming.relay import ChatRelay
from tests.fakes import FailingBackend

CHAT = {"model": "chat-default", "messages": [{"role": "user", "content": "hi"}], "stream": True,
        "stream_options": {"include_usage": True}}


def _sse(*payloads) -> bytes:
    return b"".join(b"data: " + (p if isinstance(p, bytes) else json.dumps(p).encode()) + b"\n\n" for p in payloads)


# -- whole events from pieces -------------------------------------------------------------


def test_events_are_put_back_together_from_pieces_of_any_size():
    stream = (b": keep-alive\r\n\r\n" + _sse({"a": 1}).replace(b"\n", b"\r\n") + _sse({"b": "x\ny"})
              + b'data: {"c":\ndata: 3}\n\n' + _sse(b"[DONE]"))
    for size in (1, 2, 3, 7, len(stream)):
        pieces = [stream[i:i + size] for i in range(0, len(stream), size)]
        # An event split over several data lines reaches the caller on one
        assert list(events(pieces, "dg-cpu")) == [b'data: {"a": 1}\n\n', b'data: {"b": "x\\ny"}\n\n', b'data: {"c":3}\n\n', DONE]


@pytest.mark.parametrize("stream", [
    _sse({"a": 1}),  # it ended without [DONE]
    _sse(b"not json", b"[DONE]"),
    _sse(b"[1, 2]", b"[DONE]"),  # JSON, but not an event object
    b"data: " + b"x" * (MAX_EVENT_BYTES + 1),  # one event without end
], ids=["no-done", "not-json", "not-an-object", "unbounded"])
def test_a_stream_that_is_not_a_completions_events_is_broken(stream):
    with pytest.raises(StreamBroken):
        list(events([stream[i:i + 4096] for i in range(0, len(stream), 4096)], "dg-cpu"))


# -- the relay's ends -----------------------------------------------------------------------


class _Released:
    def __init__(self) -> None:
        self.times = 0
        self.stack = contextlib.ExitStack()
        self.stack.callback(self._release)

    def _release(self) -> None:
        self.times += 1


def _relay(pieces, *, bound: float = 1e9, fail_after: int | None = None):
    hung_up = []

    def rest():
        for i, piece in enumerate(pieces[1:]):
            if i == fail_after:
                raise StreamBroken("ep", "ModelStreamError")
            yield piece

    released, meter = _Released(), Meter()
    meter.add("ep", 0.5, 1.0)
    clock = iter(range(1000)).__next__
    relay = ChatRelay(StreamedAnswer("dg-cpu", pieces[0], rest(), lambda: hung_up.append(True)), released.stack, meter, bound,
                      lambda: float(clock()), _Counted())
    return relay, released, meter, hung_up


class _Counted:
    names: list[str]

    def __init__(self) -> None:
        self.names = []
        _Counted.last = self

    def count(self, name: str) -> None:
        self.names.append(name)


def test_a_stream_that_breaks_off_ends_with_an_error_event_and_done_and_releases_everything():
    relay, released, meter, hung_up = _relay([_sse({"a": 1}), _sse({"b": 2}), _sse(b"[DONE]")], fail_after=1)
    sent = list(relay)
    assert sent[0] == b'data: {"a": 1}\n\n' and sent[-1] == DONE
    assert json.loads(sent[-2][6:])["error"]["code"] == "stream_broken"
    assert released.times == 1 and hung_up and meter.seconds > 0.5  # the stream's time is charged too
    assert _Counted.last.names == ["StreamBroken"]


def test_a_stream_past_its_bound_is_ended_by_the_gateway():
    relay, released, _, hung_up = _relay([_sse({"a": i}) for i in range(50)] + [DONE], bound=3)
    sent = list(relay)
    assert len(sent) < 10 and sent[-1] == DONE and json.loads(sent[-2][6:])["error"]["code"] == "timeout"
    assert released.times == 1 and hung_up and _Counted.last.names == ["StreamTimedOut"]


def test_a_relay_dropped_on_its_way_to_the_caller_still_releases_and_hangs_up():
    # An error after the route returned its EventStream drops the events unread and unclosed:
    # the tenant's place and reservation must not wait for their expiry.
    relay, released, _, hung_up = _relay([_sse({"a": 1}), DONE])
    del relay
    gc.collect()
    assert released.times == 1 and hung_up


def test_a_relay_closed_before_it_was_read_still_releases_and_hangs_up():
    # A generator never started runs no `finally`: the relay must release on close regardless
    relay, released, _, hung_up = _relay([_sse({"a": 1}), DONE])
    relay.close()
    relay.close()
    assert released.times == 1 and hung_up


def test_a_relay_closed_mid_stream_by_its_caller_releases_once():
    relay, released, _, hung_up = _relay([_sse({"a": i}) for i in range(10)] + [DONE])
    next(relay)
    relay.close()
    assert released.times == 1 and hung_up and _Counted.last.names == ["StreamAbandoned"]


# -- SageMaker's event stream through the runtime client -----------------------------------


class _EventStreamServer:
    """Answers InvokeEndpointWithResponseStream with the given bytes (or a status and body)."""

    def __init__(self, body: bytes, status: int = 200, headers: dict[str, str] | None = None) -> None:
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(status)
                for name, value in {"Content-Type": EVENT_STREAM, **(headers or {})}.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def aws_env(monkeypatch):
    for name, value in (("AWS_ACCESS_KEY_ID", "test"), ("AWS_SECRET_ACCESS_KEY", "test"), ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(name, value)
    aws.reset_session()
    yield
    aws.reset_session()


def _stream(url: str) -> StreamedAnswer:
    return SageMakerInvoker(sagemaker_client).invoke_stream(Endpoint("ep", region="us-east-1", endpoint_url=url),
                                            json.dumps(CHAT).encode(), "chat", Caller("rid-1"), 30.0)


def test_payload_parts_reach_the_gateway_as_the_bytes_the_container_wrote(aws_env):
    # Given a streamed chat through SageMaker's runtime path, in 7-byte parts (the gateway's decoder reads them)
    with FakeBackendServer() as backend:
        answer = _stream(backend.url)
        pieces = list(answer)
    assert pieces and all(len(p) <= PIECE_BYTES for p in pieces)
    sent = list(events(pieces, "dg-cpu"))
    assert sent[-1] == DONE and b'"usage"' in sent[-2]


def test_a_model_stream_error_after_the_first_part_is_a_broken_stream(aws_env):
    server = _EventStreamServer(payload_part(_sse({"a": 1})) + model_stream_error("timed out", "ModelInvocationTimeExceeded"))
    try:
        answer = _stream(server.url)
        assert next(answer) == _sse({"a": 1})
        with pytest.raises(StreamBroken) as broken:
            next(answer)
    finally:
        server.close()
    assert broken.value.reason == "ModelStreamError"


def test_an_error_before_the_first_part_is_classified_as_for_invoke(aws_env):
    # A container's 503 before the stream began (ModelError 424 carrying it): busy, another endpoint may answer
    body = json.dumps({"ErrorCode": "SERVER_ERROR_FROM_MODEL", "OriginalStatusCode": 503,
                       "OriginalMessage": '{"error": "busy"}', "message": "busy"}).encode()
    server = _EventStreamServer(body, 424, {"Content-Type": "application/json", "x-amzn-ErrorType": "ModelError"})
    try:
        with pytest.raises(EndpointBusy):
            _stream(server.url)
    finally:
        server.close()
    empty = _EventStreamServer(b"")
    try:
        with pytest.raises(EndpointFailed):
            _stream(empty.url)
    finally:
        empty.close()


# -- the handler's streaming entry point ----------------------------------------------------


def _streamed(ev) -> tuple[dict, bytes, list[bytes]]:
    from devkit.gateway_stack import stream_installed

    chunks = list(stream_installed(ev, None))
    meta, body = read_prelude(b"".join(chunks))
    return meta, body, chunks


def test_a_streamed_chat_is_the_backends_events_after_a_prelude():
    backend = UniformBackend()
    install(backend)
    meta, body, chunks = _streamed(event("POST", "/v1/chat/completions", CHAT))
    assert meta["statusCode"] == 200 and meta["multiValueHeaders"]["Content-Type"] == ["text/event-stream"]
    assert len(chunks) > 3  # the prelude, then each event on its own
    sent = [json.loads(line[6:]) for line in body.decode().split("\n\n") if line and line != "data: [DONE]"]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in sent if c["choices"]) == "hello"
    assert sent[-1]["usage"]["total_tokens"] == 4 and body.endswith(DONE)
    _, asked, route = backend.calls[0]
    assert route == "chat" and asked["stream"] is True and asked["stream_options"] == {"include_usage": True}


def test_a_refusal_before_the_stream_is_a_status_and_a_whole_body():
    install(UniformBackend())
    meta, body, _ = _streamed(event("POST", "/v1/chat/completions", {**CHAT, "model": "no-such-model"}))
    assert meta["statusCode"] == 404 and json.loads(body)["error"]["code"]


def test_a_busy_endpoint_before_the_first_byte_hands_the_stream_to_the_next_one():
    backend = FailingBackend({"dg-gpu": EndpointBusy("dg-gpu", "container_503")})
    install(backend, endpoints=("dg-gpu", "dg-cpu"))
    meta, body, _ = _streamed(event("POST", "/v1/chat/completions", CHAT))
    assert meta["statusCode"] == 200 and body.endswith(DONE)
    assert sorted(name for name, _, _ in backend.calls) == ["dg-cpu", "dg-gpu"]


class _Timed(UniformBackend):
    """Remembers the read timeout of each attempt."""

    def __init__(self) -> None:
        super().__init__()
        self.read_timeouts: list[float] = []

    def invoke(self, endpoint, body, route, caller=ANONYMOUS):
        self.read_timeouts.append(endpoint.read_timeout_s)
        return super().invoke(endpoint, body, route, caller)


DECISION = {"model": "jev-latest", "state": "Where is my parcel?",
            "questions": {"late": {"type": "noul", "instructions": "Is it late?"}}}


LONG = {"Prefer": "wait=58"}


def test_a_request_on_a_streaming_route_may_ask_for_the_longer_deadline():
    backend = _Timed()
    install(backend)
    from tests.gateway_helpers import call

    # Given the same decision: buffered, streamed without asking, and streamed asking for 58 s
    assert call(event("POST", "/v1/systemone", DECISION, headers=LONG))[0] == 200
    assert _streamed(event("POST", "/v1/systemone", DECISION))[0]["statusCode"] == 200
    meta, body, _ = _streamed(event("POST", "/v1/systemone", DECISION, headers={"prefer": "respond-async, wait=58"}))
    assert meta["statusCode"] == 200 and json.loads(body)["answers"]["late"]["type"] == "noul"
    # Then only the last may read past API Gateway's 29 s, up to SageMaker's 60 s
    buffered, ordinary, long = backend.read_timeouts
    assert buffered < 29 and ordinary < 29 and 29 < long < 60
    # And so may an unstreamed chat on the streaming route that asks
    meta, _, _ = _streamed(event("POST", "/v1/chat/completions", {**CHAT, "stream": False}, headers=LONG))
    assert meta["statusCode"] == 200 and 29 < backend.read_timeouts[-1] < 60
    # And a shorter wait shortens the deadline; one that does not parse is ignored
    _streamed(event("POST", "/v1/systemone", DECISION, headers={"Prefer": "wait=5"}))
    _streamed(event("POST", "/v1/systemone", DECISION, headers={"Prefer": "wait=soon"}))
    assert backend.read_timeouts[-2] <= 5 and 5 < backend.read_timeouts[-1] < 29


def test_a_tenant_has_one_long_request_at_a_time_and_its_minute_caps_the_deadline(tmp_path):
    from gateway.auth.tenant_cache import TenantCache
    from gateway.auth.tenants import create_tenant, set_limits
    from gateway.services.throttle import TenantThrottle
    from gateway.stores.sqlite import open_sqlite

    store = open_sqlite(tmp_path / "gateway.db")
    create_tenant(store.tenants, "acme")
    backend = _Timed()
    services = install(backend)
    services.decide.throttle = TenantThrottle(store.counters, services.decide.limits, hold_s=58)
    services.decide.tenants = TenantCache(store.tenants)
    # Given a long request of the tenant in flight
    with services.decide.throttle.long_work("acme"):
        meta, _, _ = _streamed(event("POST", "/v1/systemone", DECISION, headers=LONG))
        # Then a second one is refused at once (429 with Retry-After), before any backend call
        assert meta["statusCode"] == 429 and not backend.read_timeouts
        # While an ordinary one is served
        assert _streamed(event("POST", "/v1/systemone", DECISION))[0]["statusCode"] == 200
    # And a tenant allowed 30 s of endpoint time a minute gets at most a 30 s deadline
    set_limits(store.tenants, "acme", endpoint_seconds_per_minute=30.0)
    services.decide.tenants = TenantCache(store.tenants)
    assert _streamed(event("POST", "/v1/systemone", DECISION, headers=LONG))[0]["statusCode"] == 200
    assert backend.read_timeouts[-1] <= 28


class _Breaking(UniformBackend):
    """Streams the first events of a chat, then breaks off as SageMaker's ModelStreamError would."""

    def invoke_stream(self, endpoint, body, route, caller, deadline_s):
        whole = super().invoke_stream(endpoint, body, route, caller, deadline_s)
        data = b"".join(whole)
        head = data[: data.index(b"\n\n") + 2]  # the role chunk only

        def rest():
            yield b""
            raise StreamBroken(endpoint.name, "ModelStreamError")

        return StreamedAnswer(endpoint.name, head, rest(), lambda: None)


def test_the_openai_sdk_sees_a_stream_that_broke_off_as_an_api_error_over_the_local_runner():
    import openai

    from tests.gateway_helpers import served

    install(_Breaking())
    with served(PRINCIPAL) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="dgk_x", max_retries=0)
        with client.chat.completions.create(model="chat-default", messages=CHAT["messages"], stream=True) as stream:
            with pytest.raises(openai.APIError) as raised:
                list(stream)
        # Its event generator finalized here, not by whichever later test the collector runs in
        # (its clean-up reads httpx, which a test importing httpx then may hold half-imported)
        del stream
        gc.collect()
    assert raised.value.body["code"] == "stream_broken"


def test_a_decision_too_large_for_its_deadline_is_told_how_to_ask_for_more_time_where_it_can():
    from gateway.backends.base import EndpointRejected
    from tests.gateway_helpers import call

    over = json.dumps({"detail": {"error_type": "max_tokens_exceeded", "message": "this request needs more work"}})
    install(FailingBackend({"dg-cpu": EndpointRejected("dg-cpu", 413, over.encode())}))
    # On a streaming route, with the ordinary deadline: the scorer's refusal, and how to ask for more
    meta, body, _ = _streamed(event("POST", "/v1/systemone", DECISION))
    message = json.loads(body)["detail"]["message"]
    assert meta["statusCode"] == 413 and message.startswith("this request needs more work") and "Prefer: wait=58" in message
    # On the buffered routes, or once the longest deadline was asked for, there is no more time to ask for
    for status, _, reply in (call(event("POST", "/v1/systemone", DECISION)),
                             _whole(_streamed(event("POST", "/v1/systemone", DECISION, headers=LONG)))):
        assert status == 413 and "Prefer" not in reply["detail"]["message"]


def _whole(streamed):
    meta, body, _ = streamed
    return meta["statusCode"], meta, json.loads(body)
