"""The SageMaker invoker over real HTTP, through botocore's `sagemaker-runtime` client as the
composition root builds it: what it sends (signed, the route and deadline in custom
attributes), how it classifies what SageMaker answers, and its connections (one attempt,
kept alive, never a dropped one reused). A local server plays SageMaker's runtime API,
answering what each test scripts."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import botocore.utils
import pytest

from devkit.sagemaker_standin import payload_part
from gateway import aws
from gateway.backends import sagemaker
from gateway.backends.base import (
    Caller,
    Endpoint,
    EndpointBusy,
    EndpointFailed,
    EndpointRefused,
    EndpointRejected,
    EndpointTimedOut,
)
from gateway.backends.pools import Circuits, EndpointPool, PoolEndpoint, PoolPolicy
from gateway.backends.sagemaker import SageMakerInvoker
from gateway.errors import RateLimited
from gateway.functions.composition import sagemaker_client
from systemone.sidechannel import parse_attributes, request_id_of, tenant_of, tenant_tag, weight_of, work_of


class Runtime:
    """A local SageMaker runtime API: each request gets the next scripted answer
    (status, headers, body, and a delay or a cut), and is recorded with its connection."""

    def __init__(self) -> None:
        self.answers: list[dict] = []
        self.requests: list[dict] = []
        self.connections: set[int] = set()
        runtime = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # kept alive, as SageMaker's are

            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                runtime.connections.add(self.client_address[1])
                runtime.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
                answer = runtime.answers.pop(0) if runtime.answers else {}
                time.sleep(answer.get("delay", 0))
                data = answer.get("body", b'{"ok": 1}')
                self.send_response(answer.get("status", 200))
                for name, value in answer.get("headers", {"Content-Type": "application/json"}).items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if answer.get("cut"):  # the connection drops halfway through the answer
                    self.wfile.write(data[:len(data) // 2])
                    self.wfile.flush()
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    return
                self.wfile.write(data)
                if answer.get("close"):
                    self.close_connection = True

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True  # kept-alive connections of earlier tests do not hold its closing
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def credentials(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    aws.reset_session()  # botocore reads the environment as a session and its clients are made
    yield
    aws.reset_session()


def invoker() -> SageMakerInvoker:
    return SageMakerInvoker(sagemaker_client)


@pytest.fixture(scope="module")
def _server():
    server = Runtime()
    yield server
    server.close()


@pytest.fixture
def runtime(credentials, _server):
    _server.answers.clear()
    _server.requests.clear()
    _server.connections.clear()
    return _server


def endpoint(server: Runtime, **options) -> Endpoint:
    return Endpoint("dg-cpu", region="us-east-1", endpoint_url=server.url, **options)


def test_an_answer_is_returned_as_bytes_and_route_and_deadline_travel_in_custom_attributes(runtime):
    # The endpoint's read timeout is 25 s (the default): the scorer gets it less a 250 ms margin.
    runtime.answers.append({"body": b'{"ok": 1}'})
    assert invoker().invoke(endpoint(runtime), b"{}", "systemone") == b'{"ok": 1}'
    (sent,) = runtime.requests
    assert sent["path"] == "/endpoints/dg-cpu/invocations" and sent["body"] == b"{}"
    assert sent["headers"]["X-Amzn-SageMaker-Custom-Attributes"] == "route=systemone;timeout_ms=24750"
    assert sent["headers"]["Content-Type"] == sent["headers"]["Accept"] == "application/json"
    assert "X-Amzn-SageMaker-Inference-Id" not in sent["headers"]
    assert "X-Amzn-SageMaker-Prefix-Aware-Id" not in sent["headers"]  # no tenant: no routing hint
    # Signed for SageMaker in the endpoint's region, every header that carries a member signed
    authorization = sent["headers"]["Authorization"]
    assert authorization.startswith("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/")
    assert "/us-east-1/sagemaker/aws4_request" in authorization
    assert "SignedHeaders=accept;content-type;host;x-amz-date;x-amzn-sagemaker-custom-attributes," in authorization


@pytest.mark.parametrize(("given", "sent"), [
    ("c0ffee00-1111-2222-3333-444455556666", "c0ffee00-1111-2222-3333-444455556666"),
    ("id;route=chat\nforged", "idroutechatforged"),  # never a second attribute, never a second log line
    ("x" * 100, "x" * 64),
])
def test_the_request_id_travels_as_a_custom_attribute_and_the_inference_id(runtime, given, sent):
    invoker().invoke(endpoint(runtime), b"{}", "systemone", Caller(given))
    headers = runtime.requests[0]["headers"]
    assert headers["X-Amzn-SageMaker-Inference-Id"] == sent
    assert headers["X-Amzn-SageMaker-Custom-Attributes"] == f"route=systemone;timeout_ms=24750;request_id={sent}"


def _error(code: str | None, status: int, fields: dict, *, in_body: bool = False) -> dict:
    body = {"message": "m", **fields}
    headers = {"Content-Type": "application/json"}
    if code and in_body:
        body["__type"] = f"com.amazonaws.sagemaker#{code}"
    elif code:
        headers["x-amzn-ErrorType"] = f"{code}:http://internal.amazon.com/coral/com.amazonaws.sagemaker/"
    return {"status": status, "headers": headers, "body": json.dumps(body).encode()}


@pytest.mark.parametrize(
    ("code", "http", "fields", "expected", "reason"),
    [
        ("ModelError", 424, {"OriginalStatusCode": 503, "OriginalMessage": "busy"}, EndpointBusy, "container_503"),
        ("ModelError", 424, {"OriginalStatusCode": 503, "OriginalMessage": '{"detail": {}, "x_retry_after": 4}'}, EndpointBusy, "container_503"),
        ("ModelError", 424, {"OriginalStatusCode": 503, "OriginalMessage": '{"detail": {}, "x_state": "not_ready"}'}, EndpointBusy, "container_not_ready"),
        ("ModelError", 424, {"OriginalStatusCode": 503, "OriginalMessage": '{"detail": {}, "x_state": "queue_timeout", "x_retry_after": 4}'}, EndpointBusy, "container_queue_timeout"),
        ("ModelError", 424, {"OriginalStatusCode": 504, "OriginalMessage": '{"detail": {}, "x_state": "deadline_exceeded"}'}, EndpointTimedOut, "container_deadline"),
        ("ModelError", 424, {"OriginalStatusCode": 503, "OriginalMessage": '{"detail": {}, "x_state": "deadline_exceeded"}'}, EndpointTimedOut, "container_deadline"),
        # A cut is read only from a 503 or 504: a buggy body on another status says nothing.
        ("ModelError", 424, {"OriginalStatusCode": 500, "OriginalMessage": '{"detail": {}, "x_state": "deadline_exceeded"}'}, EndpointFailed, "container_500"),
        ("ModelError", 424, {"OriginalStatusCode": 422, "OriginalMessage": '{"detail": [], "x_state": "deadline_exceeded"}'}, EndpointRejected, "container_422"),
        ("ModelError", 424, {"OriginalStatusCode": 429, "OriginalMessage": "slow down"}, EndpointBusy, "container_429"),
        # A refusal of this tenant or this request its share: never "busy" (saturation).
        ("ModelError", 424, {"OriginalStatusCode": 429, "OriginalMessage": '{"detail": {}, "x_state": "tenant_share", "x_retry_after": 4}'}, EndpointRefused, "container_tenant_share"),
        ("ModelError", 424, {"OriginalStatusCode": 429, "OriginalMessage": '{"detail": {}, "x_state": "long_share", "x_retry_after": 4}'}, EndpointRefused, "container_long_share"),
        ("ModelError", 424, {"OriginalStatusCode": 503, "OriginalMessage": '{"detail": {}, "x_state": "long_share"}'}, EndpointRefused, "container_long_share"),
        # Read only from a 429 or 503: a buggy body on another status says nothing.
        ("ModelError", 424, {"OriginalStatusCode": 500, "OriginalMessage": '{"detail": {}, "x_state": "tenant_share"}'}, EndpointFailed, "container_500"),
        ("ModelError", 424, {"OriginalStatusCode": 0, "OriginalMessage": ""}, EndpointTimedOut, "container_timeout"),
        ("ModelError", 424, {"OriginalStatusCode": 422, "OriginalMessage": '{"detail": []}'}, EndpointRejected, "container_422"),
        ("ModelError", 424, {"OriginalStatusCode": 500, "OriginalMessage": "boom"}, EndpointFailed, "container_500"),
        ("ServiceUnavailable", 503, {}, EndpointBusy, "ServiceUnavailable"),
        ("ModelNotReadyException", 429, {}, EndpointBusy, "ModelNotReadyException"),
        ("ThrottlingException", 400, {}, EndpointBusy, "ThrottlingException"),
        ("InternalFailure", 500, {}, EndpointBusy, "InternalFailure"),
        ("ValidationError", 400, {}, EndpointFailed, "ValidationError"),
        ("InternalDependencyException", 530, {}, EndpointFailed, "InternalDependencyException"),
        # No code at all (a load balancer's or proxy's answer): its status alone.
        (None, 503, {}, EndpointBusy, "503"),
        (None, 429, {}, EndpointBusy, "429"),
        (None, 502, {}, EndpointFailed, "502"),
    ],
)
@pytest.mark.parametrize("in_body", [False, True], ids=["code-in-header", "code-in-body"])
def test_errors_are_classified_as_sagemaker_documents_them(runtime, code, http, fields, expected, reason, in_body):
    runtime.answers.append(_error(code, http, fields, in_body=in_body))
    with pytest.raises(expected) as raised:
        invoker().invoke(endpoint(runtime), b"{}", "systemone")
    assert type(raised.value) is expected and raised.value.reason == reason
    if expected is EndpointTimedOut:  # only the scorer's own word says it answered (and is healthy)
        assert raised.value.answered is (reason == "container_deadline")
    if "x_retry_after" in fields.get("OriginalMessage", ""):
        assert raised.value.retry_after == 4
    if expected is EndpointRefused:
        assert raised.value.state == reason.removeprefix("container_")
    if expected is EndpointRejected:
        assert raised.value.status == 422 and raised.value.body.startswith(b'{"detail": []')


def test_an_error_that_is_not_json_is_classified_by_its_status(runtime):
    runtime.answers.append({"status": 502, "headers": {"Content-Type": "text/html"}, "body": b"<html>Bad Gateway</html>"})
    with pytest.raises(EndpointFailed) as raised:
        invoker().invoke(endpoint(runtime), b"{}", "chat")
    assert raised.value.reason == "502"


def test_a_connection_that_never_started_is_busy(credentials):
    # A connect failure sent nothing: another endpoint may answer.
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]  # nothing listens there once this closes
    gone = Endpoint("dg-cpu", region="us-east-1", endpoint_url=f"http://127.0.0.1:{port}")
    with pytest.raises(EndpointBusy) as raised:
        invoker().invoke(gone, b"{}", "chat")
    assert raised.value.reason == "connect_failed"


def test_a_read_timeout_is_work_that_ran_out_of_time_and_is_never_sent_again(runtime):
    # The work may still be running there: it is never sent again.
    runtime.answers.append({"delay": 1.0})
    with pytest.raises(EndpointTimedOut) as raised:
        invoker().invoke(endpoint(runtime, read_timeout_s=0.3), b"{}", "chat")
    assert raised.value.reason == "read_timeout" and raised.value.answered is False
    assert len(runtime.requests) == 1


def test_a_connection_cut_mid_answer_is_busy_and_is_not_reused(runtime):
    runtime.answers += [{"body": b'{"answer": "' + b"x" * 1000 + b'"}', "cut": True}, {"body": b"{}"}]
    invoker = SageMakerInvoker(sagemaker_client)
    with pytest.raises(EndpointBusy) as raised:
        invoker.invoke(endpoint(runtime), b"{}", "chat")
    assert raised.value.reason == "connection_closed"
    assert invoker.invoke(endpoint(runtime), b"{}", "chat") == b"{}"  # a fresh connection


def test_connections_are_kept_alive_and_one_the_server_closed_is_never_reused(runtime):
    invoker = SageMakerInvoker(sagemaker_client)
    for _ in range(3):
        invoker.invoke(endpoint(runtime), b"{}", "systemone")
    assert len(runtime.requests) == 3 and len(runtime.connections) == 1
    # The server closes its end after this answer: the next call notices before it writes, and connects again.
    runtime.answers.append({"body": b"{}", "close": True})
    invoker.invoke(endpoint(runtime), b"{}", "systemone")
    time.sleep(0.1)
    assert invoker.invoke(endpoint(runtime), b"{}", "systemone") == b'{"ok": 1}'
    assert len(runtime.connections) == 2


def test_an_answer_past_the_bound_is_refused_not_read_into_memory(runtime, monkeypatch):
    monkeypatch.setattr(sagemaker, "MAX_ANSWER_BYTES", 1000)
    runtime.answers.append({"body": b"x" * 1001})
    with pytest.raises(EndpointFailed) as raised:
        invoker().invoke(endpoint(runtime), b"{}", "chat")
    assert raised.value.reason == "answer_too_large"


def test_an_error_body_of_any_size_keeps_the_containers_status(runtime):
    # A large 422 (one detail per problem of a large request) is still the caller's fault,
    # and a large 503 still falls back: the body is read whole, within the answer's bound.
    detail = json.dumps({"detail": [{"loc": ["body", "state"], "msg": "x" * 100}] * 12000})
    assert len(detail) > 1024 * 1024
    runtime.answers.append(_error("ModelError", 424, {"OriginalStatusCode": 422, "OriginalMessage": detail}))
    with pytest.raises(EndpointRejected) as raised:
        invoker().invoke(endpoint(runtime), b"{}", "systemone")
    assert raised.value.status == 422


@pytest.mark.parametrize("source", ["none", "container-endpoint-down"])
def test_no_credentials_is_the_deployments_failure_and_nothing_is_sent(runtime, monkeypatch, tmp_path, source):
    # Given no credential anywhere (no variables, no files, no instance metadata), or a
    # container credential endpoint that refuses, a call fails as the deployment's fault.
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    if source == "container-endpoint-down":
        with socket.socket() as unused:
            unused.bind(("127.0.0.1", 0))
            port = unused.getsockname()[1]
        monkeypatch.setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", f"http://127.0.0.1:{port}/creds")
        # botocore's retries of a refused endpoint, without its second between them
        monkeypatch.setattr(botocore.utils.ContainerMetadataFetcher, "SLEEP_TIME", 0)
    aws.reset_session()
    calls = invoker()
    calls.prepare([endpoint(runtime)])  # the init phase goes on: the first call tries again
    with pytest.raises(EndpointFailed) as raised:
        calls.invoke(endpoint(runtime), b"{}", "systemone")
    assert raised.value.reason == "no_credentials" and runtime.requests == []
    # And once a credential is there, the next call finds it: no client was kept without one.
    monkeypatch.delenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDLATER")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    assert calls.invoke(endpoint(runtime), b"{}", "systemone") == b'{"ok": 1}'
    assert "Credential=AKIDLATER/" in runtime.requests[0]["headers"]["Authorization"]


def test_a_connection_refused_by_tls_is_busy_and_a_region_botocore_refuses_fails_only_its_endpoint(credentials):
    # Given a server that speaks no TLS, an https endpoint is a connect failure (busy: another
    # endpoint may answer), never an escaped exception.
    plain = Runtime()
    try:
        tls = Endpoint("dg-cpu", region="us-east-1", endpoint_url=plain.url.replace("http://", "https://"))
        with pytest.raises(EndpointBusy) as raised:
            invoker().invoke(tls, b"{}", "chat")
        assert raised.value.reason == "connect_failed"
    finally:
        plain.close()
    # A region botocore refuses fails that endpoint, at init and on its calls, and nothing else.
    calls, bad = invoker(), Endpoint("dg-cpu", region="not a region!")
    calls.prepare([bad])
    with pytest.raises(EndpointFailed) as failed:
        calls.invoke(bad, b"{}", "chat")
    assert failed.value.reason == "client_configuration"


def test_the_xray_trace_travels_as_botocore_sends_it(runtime, monkeypatch):
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", "gateway")  # botocore forwards the trace inside Lambda
    monkeypatch.setenv("_X_AMZN_TRACE_ID", "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1")
    invoker().invoke(endpoint(runtime), b"{}", "systemone")
    headers = runtime.requests[0]["headers"]
    assert headers["X-Amzn-Trace-Id"] == "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"
    assert "x-amzn-trace-id" not in headers["Authorization"]  # never signed: X-Ray may rewrite it


def test_a_stream_read_whole_leaves_its_connection_for_the_next_call(runtime):
    for _ in range(3):
        runtime.answers.append({"body": payload_part(b"data: {}\n\n"),
                                "headers": {"Content-Type": "application/vnd.amazon.eventstream"}})
    invoker = SageMakerInvoker(sagemaker_client)
    for _ in range(3):
        assert list(invoker.invoke_stream(endpoint(runtime), b"{}", "chat", Caller("rid"), 10.0)) == [b"data: {}\n\n"]
    assert len(runtime.requests) == 3 and len(runtime.connections) == 1


def test_clients_are_made_lazily_once_per_configuration():
    made = []
    invoker = SageMakerInvoker(client_factory=lambda endpoint: made.append(endpoint) or object())
    assert made == []
    first = invoker.client_for(Endpoint("dg-cpu", region="us-east-1"))
    assert invoker.client_for(Endpoint("other", region="us-east-1")) is first
    assert invoker.client_for(Endpoint("x", region="us-east-1", read_timeout_s=5)) is not first
    assert len(made) == 2


def test_a_failing_endpoint_is_called_exactly_once_and_retrying_is_left_to_the_pool(runtime):
    """Another attempt here would run past the pool's deadline and before it could try the
    next endpoint: a 503 is answered once."""
    runtime.answers.append(_error("ServiceUnavailable", 503, {}))
    with pytest.raises(EndpointBusy):
        invoker().invoke(endpoint(runtime), b"{}", "chat")
    assert [r["path"] for r in runtime.requests] == ["/endpoints/dg-cpu/invocations"]


@pytest.mark.parametrize(("region", "url"), [
    ("eu-west-3", "https://runtime.sagemaker.eu-west-3.amazonaws.com"),
    ("cn-north-1", "https://runtime.sagemaker.cn-north-1.amazonaws.com.cn"),
])
def test_an_endpoint_without_a_url_is_called_in_its_region(credentials, region, url):
    assert sagemaker_client(Endpoint("dg-cpu", region=region)).meta.endpoint_url == url


def test_botocores_endpoint_variable_takes_buffered_and_streamed_calls_to_a_stand_in(runtime, monkeypatch):
    # Given AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME (a VPC endpoint, a local stand-in) and an
    # endpoint named by region only, both kinds of call go there.
    monkeypatch.setenv("AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME", runtime.url)
    aws.reset_session()
    runtime.answers += [{"body": b'{"ok": 2}'}, {"body": payload_part(b"data: {}\n\n"),
                                                 "headers": {"Content-Type": "application/vnd.amazon.eventstream"}}]
    by_region = Endpoint("dg-cpu", region="eu-west-1")
    calls = invoker()
    assert calls.invoke(by_region, b"{}", "systemone") == b'{"ok": 2}'
    assert list(calls.invoke_stream(by_region, b"{}", "chat", Caller("rid"), 10.0)) == [b"data: {}\n\n"]
    assert [r["path"] for r in runtime.requests] == ["/endpoints/dg-cpu/invocations",
                                                     "/endpoints/dg-cpu/invocations-response-stream"]
    assert "/eu-west-1/sagemaker/aws4_request" in runtime.requests[0]["headers"]["Authorization"]


def test_an_endpoint_url_with_a_path_keeps_it_and_a_region_is_required_without_one(runtime, monkeypatch):
    prefixed = Endpoint("dg-cpu", region="us-east-1", endpoint_url=f"{runtime.url}/prefix/")
    invoker().invoke(prefixed, b"{}", "systemone")
    assert runtime.requests[0]["path"] == "/prefix/endpoints/dg-cpu/invocations"
    with pytest.raises(ValueError, match="no region"):
        sagemaker_client(Endpoint("dg-cpu"))


def test_whose_work_it_is_travels_in_the_custom_attributes_as_the_scorer_reads_them(runtime):
    # Given a caller with a tenant tag, long work and a weight, when the invoker sends its call
    # (whole or streamed), then the scorer's own readers find each of them, and never a tenant id
    caller = Caller("r-1", tenant_tag("acme", b"k" * 32), "long", 2.5)
    runtime.answers += [{"body": b"{}"}, {"body": payload_part(b"data: {}\n\n"),
                                          "headers": {"Content-Type": "application/vnd.amazon.eventstream"}}]
    invoker = SageMakerInvoker(sagemaker_client)
    invoker.invoke(endpoint(runtime), b"{}", "chat", caller)
    list(invoker.invoke_stream(endpoint(runtime), b"{}", "chat", caller, 40.0))
    for sent in runtime.requests:
        header = sent["headers"]["X-Amzn-SageMaker-Custom-Attributes"]
        pairs = parse_attributes(header)
        assert (request_id_of(pairs), tenant_of(pairs), work_of(pairs), weight_of(pairs)) == (
            "r-1", caller.tenant_tag, "long", 2.5)
        assert "acme" not in header
        # The routing hint of a prefix-aware endpoint: requests about one state of one tenant
        # go to the instance that keeps it.
        assert sent["headers"]["X-Amzn-SageMaker-Prefix-Aware-Id"] == caller.tenant_tag


def _refusal(state: str, retry_after: int = 3) -> dict:
    """What SageMaker passes on of a scorer's 429 refusing a share: a ModelError with its body."""
    body = {"detail": {"error_type": "rate_limit_error", "message": "refused"}, "x_state": state,
            "x_retry_after": retry_after}
    return _error("ModelError", 424, {"OriginalStatusCode": 429, "OriginalMessage": json.dumps(body)})


def _pool(*endpoints: Endpoint) -> EndpointPool:
    policy = PoolPolicy(failure_threshold=3, extra_attempts=1)
    return EndpointPool(tuple(PoolEndpoint(e, tier=i) for i, e in enumerate(endpoints)), policy, Circuits(policy))


@pytest.mark.parametrize(("state", "caller"), [("long_share", Caller("long", "aa" * 12, "long")),
                                               ("tenant_share", Caller("burst", "aa" * 12))])
def test_refused_shares_never_open_the_circuit_and_another_tenants_request_still_reaches_the_scorer(runtime, state,
                                                                                                    caller):
    # Given a scorer that refuses three requests their share (long work's, or one tenant's), as
    # a 429 ModelError whose body says so (the failure threshold is 3)
    pool, invoker = _pool(endpoint(runtime)), SageMakerInvoker(sagemaker_client)
    runtime.answers += [_refusal(state)] * 3
    deadline = 40.0 if caller.work == "long" else None
    for _ in range(3):
        # When each is asked, then the caller gets 429 with the scorer's Retry-After, asked once
        with pytest.raises(RateLimited) as raised:
            pool.ask(invoker, b"{}", "chat", caller=caller, deadline_s=deadline)
        assert raised.value.retry_after == 3
    assert len(runtime.requests) == 3
    # Then another tenant's ordinary request still reaches the scorer, and is answered
    other = Caller("other", "bb" * 12)
    assert pool.ask(invoker, b"{}", "chat", caller=other).body == b'{"ok": 1}'
    assert len(runtime.requests) == 4 and pool.circuits.allow("dg-cpu")


def test_a_tenants_share_taken_is_answered_at_once_and_long_works_tries_the_next_endpoint(runtime):
    # Given two endpoints (both served here), the first refusing its share
    first, second = endpoint(runtime), Endpoint("dg-gpu", region="us-east-1", endpoint_url=runtime.url)
    invoker = SageMakerInvoker(sagemaker_client)
    # When this tenant's share is taken, then no other endpoint is asked: 429 at once
    runtime.answers += [_refusal("tenant_share", 5)]
    with pytest.raises(RateLimited, match="holds its share") as raised:
        _pool(first, second).ask(invoker, b"{}", "chat", caller=Caller("t", "aa" * 12))
    assert raised.value.retry_after == 5 and len(runtime.requests) == 1
    # When long work's share is taken on the first, then the second answers it
    runtime.answers += [_refusal("long_share"), {"body": b'{"ok": 2}'}]
    invocation = _pool(first, second).ask(invoker, b"{}", "chat", caller=Caller("l", work="long"), deadline_s=40.0)
    assert (invocation.body, invocation.endpoint, invocation.attempts) == (b'{"ok": 2}', "dg-gpu", 2)
    # And when neither has room for it, 429 with the longest Retry-After, each asked once
    runtime.answers += [_refusal("long_share", 2), _refusal("long_share", 7)]
    with pytest.raises(RateLimited, match="long work's share") as raised:
        _pool(first, second).ask(invoker, b"{}", "chat", caller=Caller("l", work="long"), deadline_s=40.0)
    assert raised.value.retry_after == 7 and len(runtime.requests) == 5


@pytest.mark.parametrize(("header", "length"), [(None, None), ("12", 12), ("5, 5", 5), ("lots", None), ("", None)])
def test_a_content_length_is_read_as_urllib3_reads_it_and_a_bad_one_is_no_length(header, length):
    assert sagemaker._length(header) == length


def test_prepare_primes_each_client_without_a_request_and_its_calls_then_reach_the_endpoint(runtime):
    # Given the init phase's prepare, both operations have run once on a canned answer: nothing
    # reached the endpoint; then real calls, buffered and streamed, do (the canned answer is gone).
    calls = invoker()
    calls.prepare([endpoint(runtime), Endpoint("dg-gpu", region="us-east-1", endpoint_url=runtime.url)])
    assert runtime.requests == [] and len(calls._clients) == 1  # one configuration, one client, primed once
    runtime.answers += [{"body": b'{"ok": 3}'}, {"body": payload_part(b"data: {}\n\n"),
                                                 "headers": {"Content-Type": "application/vnd.amazon.eventstream"}}]
    assert calls.invoke(endpoint(runtime), b"{}", "systemone") == b'{"ok": 3}'
    assert list(calls.invoke_stream(endpoint(runtime), b"{}", "chat", Caller("rid"), 10.0)) == [b"data: {}\n\n"]
    assert len(runtime.requests) == 2


def test_an_ordinary_requests_first_attempt_uses_a_client_the_init_phase_built_and_primed(runtime):
    # Given a pool whose deadline cuts the endpoint's read timeout (25 s, the deadline 25 s),
    # when the init phase prepares its first attempts, then the first request's attempt is
    # made on that client: no client is built on a caller's time.
    only = endpoint(runtime)
    policy = PoolPolicy(failure_threshold=3, extra_attempts=1, deadline_s=25.0)
    pool = EndpointPool((PoolEndpoint(only, tier=0),), policy, Circuits(policy))
    calls = invoker()
    calls.prepare(pool.first_attempts())
    built = dict(calls._clients)
    assert [key[3] for key in built] == [22.0]  # the read timeout a first attempt gets under a 25 s deadline
    assert pool.ask(calls, b"{}", "systemone").body == b'{"ok": 1}'
    assert calls._clients == built and len(runtime.requests) == 1
