"""The SageMaker invoker classifies what InvokeEndpoint raises (botocore Stubber, no network)."""

from __future__ import annotations

import io

import boto3
import pytest
from botocore.exceptions import ConnectionClosedError, ConnectTimeoutError, ReadTimeoutError
from botocore.stub import Stubber

from gateway.backends.base import Endpoint, EndpointBusy, EndpointFailed, EndpointRejected, EndpointTimedOut
from gateway.backends.sagemaker import SageMakerInvoker

ENDPOINT = Endpoint("dg-cpu", region="us-east-1")


@pytest.fixture
def stubbed():
    client = boto3.client("sagemaker-runtime", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    with Stubber(client) as stubber:
        yield SageMakerInvoker(client_factory=lambda endpoint: client), stubber


def test_an_answer_is_returned_as_bytes_and_route_and_deadline_travel_in_custom_attributes(stubbed):
    # The endpoint's read timeout is 25 s (the default): the scorer gets it less a 250 ms margin.
    invoker, stubber = stubbed
    stubber.add_response("invoke_endpoint", {"Body": io.BytesIO(b'{"ok": 1}'), "ContentType": "application/json"},
                         {"EndpointName": "dg-cpu", "Body": b"{}", "ContentType": "application/json",
                          "Accept": "application/json", "CustomAttributes": "route=systemone;timeout_ms=24750"})
    assert invoker.invoke(ENDPOINT, b"{}", "systemone") == b'{"ok": 1}'


@pytest.mark.parametrize(("given", "sent"), [
    ("c0ffee00-1111-2222-3333-444455556666", "c0ffee00-1111-2222-3333-444455556666"),
    ("id;route=chat\nforged", "idroutechatforged"),  # never a second attribute, never a second log line
    ("x" * 100, "x" * 64),
])
def test_the_request_id_travels_as_a_custom_attribute_and_the_inference_id(stubbed, given, sent):
    invoker, stubber = stubbed
    stubber.add_response("invoke_endpoint", {"Body": io.BytesIO(b"{}"), "ContentType": "application/json"},
                         {"EndpointName": "dg-cpu", "Body": b"{}", "ContentType": "application/json",
                          "Accept": "application/json", "InferenceId": sent,
                          "CustomAttributes": f"route=systemone;timeout_ms=24750;request_id={sent}"})
    invoker.invoke(ENDPOINT, b"{}", "systemone", given)


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
        ("ModelError", 424, {"OriginalStatusCode": 0, "OriginalMessage": ""}, EndpointTimedOut, "container_timeout"),
        ("ModelError", 424, {"OriginalStatusCode": 422, "OriginalMessage": '{"detail": []}'}, EndpointRejected, "container_422"),
        ("ModelError", 424, {"OriginalStatusCode": 500, "OriginalMessage": "boom"}, EndpointFailed, "container_500"),
        ("ServiceUnavailable", 503, {}, EndpointBusy, "ServiceUnavailable"),
        ("ModelNotReadyException", 429, {}, EndpointBusy, "ModelNotReadyException"),
        ("ThrottlingException", 400, {}, EndpointBusy, "ThrottlingException"),
        ("InternalFailure", 500, {}, EndpointBusy, "InternalFailure"),
        ("ValidationError", 400, {}, EndpointFailed, "ValidationError"),
        ("InternalDependencyException", 530, {}, EndpointFailed, "InternalDependencyException"),
    ],
)
def test_errors_are_classified_as_sagemaker_documents_them(stubbed, code, http, fields, expected, reason):
    invoker, stubber = stubbed
    stubber.add_client_error("invoke_endpoint", service_error_code=code, service_message="m", http_status_code=http,
                             modeled_fields=fields)
    with pytest.raises(expected) as raised:
        invoker.invoke(ENDPOINT, b"{}", "systemone")
    assert type(raised.value) is expected and raised.value.reason == reason
    if expected is EndpointTimedOut:  # only the scorer's own word says it answered (and is healthy)
        assert raised.value.answered is (reason == "container_deadline")
    if "x_retry_after" in fields.get("OriginalMessage", ""):
        assert raised.value.retry_after == 4
    if expected is EndpointRejected:
        assert raised.value.status == 422 and raised.value.body.startswith(b'{"detail": []')


class _TimingOut:
    def __init__(self, error):
        self.error = error

    def invoke_endpoint(self, **kwargs):
        raise self.error


@pytest.mark.parametrize(
    ("error", "expected", "reason"),
    [(ConnectTimeoutError(endpoint_url="http://x"), EndpointBusy, "connect_failed"),
     (ConnectionClosedError(endpoint_url="http://x"), EndpointBusy, "connection_closed"),
     (ReadTimeoutError(endpoint_url="http://x"), EndpointTimedOut, "read_timeout")],
)
def test_a_connection_that_never_started_is_busy_but_a_read_timeout_is_work_that_ran_out_of_time(error, expected,
                                                                                                   reason):
    # A connect failure sent nothing: another endpoint may answer. A read timeout may leave
    # the work running there: it is never sent again.
    invoker = SageMakerInvoker(client_factory=lambda endpoint: _TimingOut(error))
    with pytest.raises(expected) as raised:
        invoker.invoke(ENDPOINT, b"{}", "chat")
    assert type(raised.value) is expected and raised.value.reason == reason


def test_clients_are_made_lazily_once_per_configuration():
    made = []
    invoker = SageMakerInvoker(client_factory=lambda endpoint: made.append(endpoint) or object())
    assert made == []
    first = invoker.client_for(ENDPOINT)
    assert invoker.client_for(Endpoint("other", region="us-east-1")) is first
    assert invoker.client_for(Endpoint("x", region="us-east-1", read_timeout_s=5)) is not first
    assert len(made) == 2


def test_the_default_client_calls_an_endpoint_once_and_leaves_retrying_to_the_pool(monkeypatch):
    """botocore would repeat a 503 (or a timed-out read) by itself, past the pool's deadline
    and before it could try the next endpoint: a failing endpoint is called exactly once."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from gateway.backends.sagemaker import _default_client

    hits = []

    class Unavailable(BaseHTTPRequestHandler):
        def do_POST(self):
            hits.append(self.path)
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(503)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"__type": "ServiceUnavailable", "message": "busy"}')

        def log_message(self, *args):
            pass

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    server = ThreadingHTTPServer(("127.0.0.1", 0), Unavailable)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        endpoint = Endpoint("dg-cpu", region="us-east-1", endpoint_url=f"http://127.0.0.1:{server.server_address[1]}")
        with pytest.raises(EndpointBusy):
            SageMakerInvoker(client_factory=_default_client).invoke(endpoint, b"{}", "chat")
    finally:
        server.shutdown()
        server.server_close()
    assert hits == ["/endpoints/dg-cpu/invocations"]
