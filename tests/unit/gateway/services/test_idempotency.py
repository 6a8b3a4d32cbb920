"""Idempotency-Key on decisions, through the handler, on a real SQLite store."""

from __future__ import annotations

import threading

import pytest

from devkit.fake_backend import UniformBackend
from devkit.gateway_stack import PRINCIPAL, event, install
from gateway.auth.authenticate import Authenticator
from gateway.backends.base import ANONYMOUS, EndpointFailed
from tests.gateway_helpers import call, dynamodb_tenant_store, register_credentials, tenant_store

GLOBEX = {**PRINCIPAL, "principalId": "globex", "tenant_id": "globex", "credential_id": "k2"}
SYSTEM_ONE = {"model": "jev-latest", "state": "I was charged twice.",
              "questions": {"refund": {"type": "noul", "instructions": "Does the customer ask for a refund?"}}}
OPENAI = {"model": "decision-default", "input": "I was charged twice.",
          "questions": [{"type": "predicate", "name": "refund", "instructions": "The customer asks for a refund."}]}
ROUTES = [("/v1/systemone", SYSTEM_ONE), ("/v1/decisions", OPENAI)]


@pytest.fixture
def store(tmp_path):
    store = tenant_store(tmp_path / "g.db", "acme", "globex")
    register_credentials(store, PRINCIPAL, GLOBEX)
    return store


def stack(store, backend=None):
    backend = backend or UniformBackend()
    install(backend, stores=store, authenticator=Authenticator(store))
    return backend


def decide(path, body, key=None, principal=PRINCIPAL):
    return call(event("POST", path, body, headers={"Idempotency-Key": key} if key else None, principal=principal))


def records(store, tenant="acme"):
    return list(store.records.scan_records(tenant))


@pytest.mark.parametrize(("path", "body"), ROUTES)
def test_a_retry_with_the_same_key_gets_the_first_answer_and_leaves_one_record(store, path, body):
    # Given a decision sent with an Idempotency-Key, when it is sent again with the same key
    # (a client that never saw the first reply), then the reply is the first one, byte for
    # byte, marked as replayed; the backend was asked once and one record was written.
    backend = stack(store)
    first = decide(path, body, key="order-4411-try")
    second = decide(path, body, key="order-4411-try")
    assert first[0] == second[0] == 200
    assert second[2] == first[2] and second[1]["x-decision-id"] == first[1]["x-decision-id"]
    assert second[1]["idempotent-replayed"] == "true" and "idempotent-replayed" not in first[1]
    assert len(backend.calls) == 1 and len(records(store)) == 1
    # Without a key, each request is a decision of its own.
    decide(path, body)
    decide(path, body)
    assert len(backend.calls) == 3 and len(records(store)) == 3


def test_a_key_is_the_tenants_and_the_routes_own(store):
    backend = stack(store)
    decide("/v1/systemone", SYSTEM_ONE, key="shared-key")
    decide("/v1/systemone", SYSTEM_ONE, key="shared-key", principal=GLOBEX)
    decide("/v1/decisions", OPENAI, key="shared-key")
    assert len(backend.calls) == 3 and len(records(store, "globex")) == 1


def test_another_credential_of_the_tenant_never_gets_a_replay(store):
    # Given a key that may use every model and one that may use another model only, when
    # the narrow one replays the wide one's Idempotency-Key and body, then it is refused as
    # it is without the header (404: the model does not exist for it), never handed the
    # answer: a replay skips the checks that differ between credentials.
    narrow = {**PRINCIPAL, "credential_id": "k9", "models": '["chat-default"]'}
    register_credentials(store, narrow)
    stack(store)
    assert decide("/v1/systemone", SYSTEM_ONE, key="k")[0] == 200
    status, headers, _ = decide("/v1/systemone", SYSTEM_ONE, key="k", principal=narrow)
    assert status == 404 and "idempotent-replayed" not in headers


def test_the_same_request_in_another_order_is_another_request(store):
    # Options are listed to the model in the order they are sent: a reordered request is
    # not the one the first answer was for.
    stack(store)
    body = {**SYSTEM_ONE, "questions": {"queue": {"type": "choice", "criteria": {"a": None, "b": None, "c": None}}}}
    assert decide("/v1/systemone", body, key="k")[0] == 200
    reordered = {**body, "questions": {"queue": {"type": "choice", "criteria": {"c": None, "b": None, "a": None}}}}
    status, _, reply = decide("/v1/systemone", reordered, key="k")
    assert status == 422 and reply["detail"][0]["type"] == "idempotency_key_reused"


def test_the_same_key_for_another_request_is_refused(store):
    stack(store)
    assert decide("/v1/systemone", SYSTEM_ONE, key="k")[0] == 200
    status, headers, body = decide("/v1/systemone", {**SYSTEM_ONE, "state": "Another ticket."}, key="k")
    assert status == 422 and body["detail"][0]["type"] == "idempotency_key_reused"
    assert headers["x-should-retry"] == "false"


class Gate(UniformBackend):
    def __init__(self) -> None:
        super().__init__()
        self.inside, self.opened = threading.Event(), threading.Event()

    def invoke(self, endpoint, body, route, caller=ANONYMOUS):
        self.inside.set()
        assert self.opened.wait(30)
        return super().invoke(endpoint, body, route, caller)


@pytest.mark.parametrize(("path", "request_body"), ROUTES)
def test_a_retry_while_the_first_still_runs_is_409_and_then_gets_the_first_answer(store, path, request_body):
    gate = stack(store, Gate())
    first: dict = {}
    worker = threading.Thread(target=lambda: first.setdefault("reply", decide(path, request_body, key="k")))
    worker.start()
    assert gate.inside.wait(30)
    status, headers, body = decide(path, request_body, key="k")
    message = body["detail"]["message"] if path == "/v1/systemone" else body["error"]["message"]
    assert status == 409 and "still running" in message
    assert "x-should-retry" not in headers  # the SDKs retry a 409 after a backoff: by then it has ended
    gate.opened.set()
    worker.join(30)
    replay = decide(path, request_body, key="k")
    assert replay[0] == 200 and replay[2] == first["reply"][2] and len(gate.calls) == 1


def test_a_failed_first_try_is_not_kept_so_a_retry_runs_afresh(store):
    class FailsOnce(UniformBackend):
        def invoke(self, endpoint, body, route, caller=ANONYMOUS):
            if not self.calls:
                self.calls.append(None)
                raise EndpointFailed(endpoint.name, "container_500")
            return super().invoke(endpoint, body, route, caller)

    stack(store, FailsOnce())
    assert decide("/v1/systemone", SYSTEM_ONE, key="k")[0] == 502
    assert decide("/v1/systemone", SYSTEM_ONE, key="k")[0] == 200
    assert len(records(store)) == 1


@pytest.mark.parametrize("key", ["x" * 256, "caf\u00e9", "tab\there"])
def test_a_malformed_key_is_a_422_before_any_work(store, key):
    backend = stack(store)
    status, _, body = decide("/v1/systemone", SYSTEM_ONE, key=key)
    assert status == 422 and body["detail"][0]["loc"] == ["header", "idempotency-key"]
    assert backend.calls == []


@pytest.fixture(params=["sqlite", "dynamodb"])
def either_store(request, tmp_path, monkeypatch):
    """The tenants acme and globex, on the embedded store and on DynamoDB (moto)."""
    if request.param == "sqlite":
        store = tenant_store(tmp_path / "g.db", "acme", "globex")
        register_credentials(store, PRINCIPAL, GLOBEX)
        yield store
        return
    with dynamodb_tenant_store(monkeypatch, "acme", "globex") as store:
        register_credentials(store, PRINCIPAL, GLOBEX)
        yield store


def test_a_replay_is_refused_once_the_callers_role_no_longer_reaches_the_model(either_store):
    # Given a decision answered with a key, when the caller's role is narrowed to another
    # model (the same principal: its mapping changed), then its replay is refused as a fresh
    # request is (404), not handed the first answer for the rest of the day
    backend = stack(either_store)
    assert decide("/v1/systemone", SYSTEM_ONE, key="k")[0] == 200
    narrowed = {**PRINCIPAL, "models": '["chat-default"]'}
    status, headers, _ = decide("/v1/systemone", SYSTEM_ONE, key="k", principal=narrowed)
    assert status == 404 and "idempotent-replayed" not in headers and len(backend.calls) == 1
    assert decide("/v1/systemone", SYSTEM_ONE, key="k")[0] == 200  # and the role as it was still replays


def test_a_replay_is_refused_once_the_tenant_takes_catalog_questions_only(either_store):
    from gateway.auth.tenants import create_tenant

    stack(either_store)
    assert decide("/v1/decisions", OPENAI, key="k")[0] == 200
    create_tenant(either_store.tenants, "acme", catalog_only=True)
    stack(either_store)  # a fresh instance: its tenant cache reads the mode now
    status, headers, _ = decide("/v1/decisions", OPENAI, key="k")
    assert status == 403 and "idempotent-replayed" not in headers
