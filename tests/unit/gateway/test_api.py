"""Bad input from anyone, with or without credentials, never a 5xx; nothing half-written.

Each test here failed before the change it guards (deep nesting and huge numbers were
500s or silently infinite, an anonymous bad body was a 422, a record that could not be
stored was answered anyway, catalog contention was a 500, a bad token to revoke a 401).
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from devkit.gateway_stack import event, install, installed
from gateway.auth.authenticate import Authenticator
from gateway.auth.tenants import create_tenant, set_limits
from gateway.auth.tokens import CachedKeyRing, new_key_document
from gateway.catalogs.store import VersionTaken
from gateway.stores.sqlite import open_sqlite
from gateway.stores.sqlite.records import SQLiteRecords
from tests.fakes import FixedBackend
from tests.gateway_helpers import call, register_credentials, tenant_store

ACME = {"principalId": "acme", "tenant_id": "acme", "scopes": "decide chat catalogs:read catalogs:write admin",
        "models": "*", "credential_id": "k-acme"}
DECISION = {"model": "jev-latest", "state": "A ticket.", "questions": {"q": {"type": "noul", "instructions": "Refund?"}}}


@pytest.fixture
def store(tmp_path):
    return tenant_store(tmp_path / "g.db", "acme")


@pytest.fixture
def backend(store):
    backend = FixedBackend(choice={"billing": 0.9})
    document = new_key_document()
    install(backend, stores=store, authenticator=Authenticator(store, CachedKeyRing(lambda: document)))
    register_credentials(store, ACME)
    return backend


def raw_decision(fragment: bytes) -> bytes:
    return b'{"model":"jev-latest","questions":{"q":{"type":"noul","instructions":"?"}},"state":' + fragment + b"}"


@pytest.mark.parametrize(("fragment", "reason"), [
    (b"[" * 100_000 + b"]" * 100_000, "deeper than 64 levels"),  # a RecursionError in json.loads
    (b'{"a":' * 65 + b"1" + b"}" * 65, "deeper than 64 levels"),  # parses, but deeper than any state needs
    (b'{"score": 1e400}', "too large for a 64-bit float"),  # json.loads makes it inf
    (b'{"n": ' + b"9" * 5000 + b"}", "more than 100 digits"),  # a ValueError past 4300 digits
    (b'{"x": NaN}', "NaN is not valid JSON"),
])
def test_bodies_no_json_model_can_hold_are_422_with_the_reason(backend, fragment, reason):
    status, _, body = call(event("POST", "/v1/systemone", raw=raw_decision(fragment), principal=ACME))
    assert status == 422 and body["detail"][0]["type"] == "json_invalid" and reason in body["detail"][0]["msg"]
    assert backend.calls == []


def test_a_state_nested_64_deep_is_still_a_state(backend):
    status, _, _ = call(event("POST", "/v1/systemone", raw=raw_decision(b'{"a":' * 63 + b"1" + b"}" * 63), principal=ACME))
    assert status == 200


@pytest.mark.parametrize("raw", [b"{bad", raw_decision(b"[" * 100_000), b"\xff\xfe", b"A" * 1000])
def test_an_anonymous_request_gets_401_before_its_body_is_read(backend, raw):
    for principal in (None, {"tenant_id": "", "reason": "invalid credentials"}):
        status, _, body = call(event("POST", "/v1/systemone", raw=raw, principal=principal))
        assert status == 401 and body["detail"]["error_type"] == "authentication_error"


def test_a_gzip_bomb_from_an_anonymous_caller_is_never_inflated(backend, monkeypatch):
    import gzip

    from gateway.functions import handler

    inflated = []
    monkeypatch.setattr(handler.body_reader, "inflate", lambda *a: inflated.append(a) or b"{}")
    bomb = gzip.compress(b"[" * 5_000_000)
    status, _, _ = call(event("POST", "/v1/systemone", raw=bomb, headers={"Content-Encoding": "gzip"}, principal=None))
    assert status == 401 and inflated == []


class FailingRecords(SQLiteRecords):
    def __init__(self, db, failures: int) -> None:
        super().__init__(db)
        self.failures, self.attempts = failures, 0

    def put_record(self, *args, **kwargs):
        self.attempts += 1
        if self.attempts <= self.failures:
            raise OSError("the records table is unavailable")
        return super().put_record(*args, **kwargs)


@pytest.mark.parametrize(("failures", "status"), [(1, 200), (2, 200), (3, 503)])
def test_a_decision_is_answered_only_once_its_record_is_stored(tmp_path, failures, status):
    store = open_sqlite(tmp_path / "g.db")
    records = FailingRecords(store.records.db, failures)
    store = replace(store, records=records)
    create_tenant(store.tenants, "acme")
    document = new_key_document()
    services = install(FixedBackend(), stores=store, authenticator=Authenticator(store, CachedKeyRing(lambda: document)))
    services.decide.recorder.sleep = lambda s: None
    register_credentials(store, ACME)
    got, headers, body = call(event("POST", "/v1/systemone", DECISION, principal=ACME))
    assert got == status and records.attempts == min(failures + 1, 3)
    if status == 503:
        assert headers["retry-after"] and "not answered" in body["detail"]["message"]
        assert call(event("GET", "/v1/records", principal=ACME))[2]["records"] == []
    else:
        assert call(event("GET", f"/v1/records/{body['x_decision_id']}", principal=ACME))[0] == 200


def test_an_outcome_names_an_answer_the_question_allows(backend):
    body = call(event("POST", "/v1/systemone", {**DECISION, "questions": {
        "q": {"type": "noul", "instructions": "Refund?"},
        "queue": {"type": "choice", "criteria": {"billing": None, "delivery": None}},
        "anger": {"type": "score", "criteria": ["calm", "angry"]}}}, principal=ACME))[2]
    path = f"/v1/decisions/{body['x_decision_id']}/outcome"
    for answers in ({"q": "yes"}, {"queue": "x" * 1000}, {"queue": True}, {"anger": 2}, {"anger": "1"}, {"queue": "y" * 2000}):
        status, _, reply = call(event("POST", path, {"answers": answers}, principal=ACME))
        assert status == 422, (answers, reply)
    status, _, _ = call(event("POST", path, {"answers": {"q": False, "queue": "delivery", "anger": 1}}, principal=ACME))
    assert status == 200


def test_a_record_too_large_for_its_store_is_refused_before_the_backend_is_called(backend, store):
    set_limits(store.tenants, "acme", max_options=102_000, max_text_bytes=6 * 1024 * 1024)
    long_keys = {f"{'x' * 3000}-{k}": None for k in range(120)}
    questions = {f"q{i}": {"type": "choice", "criteria": long_keys} for i in range(2)}
    status, _, body = call(event("POST", "/v1/systemone", {**DECISION, "questions": questions}, principal=ACME))
    assert status == 413 and "audit record" in body["detail"]["message"] and backend.calls == []


def test_a_catalog_entry_larger_than_its_limit_is_413(backend):
    options = [{"name": f"option {k}", "description": "d" * 1100} for k in range(250)]
    status, _, body = call(event("PUT", "/v1/catalogs/big", {"type": "choice", "instructions": "?", "options": options},
                                 principal=ACME))
    assert status == 413 and "at most 262144" in body["detail"]["message"]


def test_catalog_writers_that_keep_colliding_get_409(backend, store, monkeypatch):
    def always_taken(version, **_):
        raise VersionTaken(version.ref)

    monkeypatch.setattr(store.catalogs, "insert_catalog_version", always_taken)
    status, _, body = call(event("PUT", "/v1/catalogs/routing", {"type": "noul", "instructions": "?"}, principal=ACME))
    assert status == 409 and body["detail"]["error_type"] == "conflict"


@pytest.mark.parametrize("token", ["dgt_x.y", "not a token", "dgt_" + "A" * 40 + "." + "B" * 43, "dgk_0123456789abcdef_" + "A" * 43])
def test_revoking_with_a_bad_token_is_a_422_naming_the_field(backend, token):
    status, _, body = call(event("POST", "/v1/tokens/revoke", {"token": token}, principal=ACME))
    assert status == 422 and "token" in json.dumps(body)


@pytest.mark.parametrize("body", [{}, {"token_id": "x"}, {"token": "dgt_x.y", "token_id": "0" * 32}, {"all_tokens": False}])
def test_a_revocation_names_exactly_one_thing(backend, body):
    assert call(event("POST", "/v1/tokens/revoke", body, principal=ACME))[0] == 422


def test_tenant_budgets_refuse_before_the_backend(backend, store):
    set_limits(store.tenants, "acme", max_options=10, max_text_bytes=2048, max_chat_tokens=64)
    install_again = backend  # the services caches tenants for a minute: a fresh services reads the new limits
    document = new_key_document()
    install(install_again, stores=store, authenticator=Authenticator(store, CachedKeyRing(lambda: document)))
    many = {"queue": {"type": "choice", "criteria": {f"o{k}": None for k in range(11)}}}
    status, _, body = call(event("POST", "/v1/systemone", {**DECISION, "questions": many}, principal=ACME))
    assert status == 413 and "at most 10" in body["detail"]["message"]
    status, _, body = call(event("POST", "/v1/systemone", {**DECISION, "state": "x" * 3000}, principal=ACME))
    assert status == 413 and "at most 2048" in body["detail"]["message"]
    chat = {"model": "chat-default", "messages": [{"role": "user", "content": "hi"}]}
    status, _, body = call(event("POST", "/v1/chat/completions", {**chat, "max_tokens": 65}, principal=ACME))
    assert status == 413 and body["error"]["code"] == "context_length_exceeded" and "at most 64" in body["error"]["message"]
    assert backend.calls == []
    assert call(event("POST", "/v1/chat/completions", chat, principal=ACME))[0] == 200
    assert backend.calls[-1][1]["max_tokens"] == 64  # no max_tokens: the tenant's ceiling, not the scorer's default


def test_the_request_id_reaches_the_backend_and_the_record(backend):
    ev = event("POST", "/v1/systemone", DECISION, principal=ACME)
    status, headers, body = call(ev)
    request_id = ev["requestContext"]["requestId"]
    assert status == 200 and headers["x-request-id"] == request_id and backend.request_ids[-1] == request_id
    record = call(event("GET", f"/v1/records/{body['x_decision_id']}", principal=ACME))[2]
    assert record["request_id"] == request_id


def test_a_state_hash_uses_the_records_own_key_binds_the_tenant_and_verifies_on_the_last_day():
    # Given a record made on day 0, and the signing keys rotated every day since (they are
    # not used), and the record key rotated on day 1 (kept for the retention), when checked on
    # the retention's last day, then the state verifies, another state or tenant does not.
    from gateway.auth.credentials import Principal
    from gateway.auth.tokens import CachedKeyRing, new_key_document
    from gateway.decisions.model import Decision, DecisionResult, Usage
    from gateway.decisions.records import DecisionRecorder, state_matches

    day, retention_days = 86400.0, 90
    document = new_key_document(None, now=0.0)
    ring = CachedKeyRing(lambda: document, ttl_s=0)
    recorder = DecisionRecorder(None, ring, retention_days, clock=lambda: 0.0)
    decision = Decision("m", "the state under audit", (), {}, True)
    result = DecisionResult("m", (), Usage(0, 0, 0), "e", 1, {})
    record = recorder.record("r1", principal=Principal("acme", frozenset(), None, "k"), route="systemone", request_id="q",
                             decision=decision, result=result, latency_ms=1.0)
    document = new_key_document(document, now=1 * day, keep_s=(retention_days + 1) * day)
    document = new_key_document(document, now=(retention_days - 1) * day, keep_s=(retention_days + 1) * day)
    assert state_matches(ring, record, "the state under audit")
    assert not state_matches(ring, record, "another state")
    assert not state_matches(ring, {**record, "tenant_id": "globex"}, "the state under audit")


def test_a_store_that_fails_while_checking_the_caller_is_a_shaped_503(backend, store, monkeypatch):
    monkeypatch.setattr(store.tenants, "get_api_key", lambda key_id: (_ for _ in ()).throw(OSError("throttled")))
    status, headers, body = call(event("POST", "/v1/systemone", DECISION, principal=ACME))
    assert status == 503 and headers["retry-after"] and headers["x-request-id"]
    assert body["detail"]["error_type"] == "overloaded" and backend.calls == []


def test_a_record_key_that_cannot_be_read_is_a_503_not_an_answer(backend, store):
    class Broken:
        def current(self):
            raise OSError("secrets manager is unavailable")

    installed().decide.recorder.hash_keys = Broken()
    status, headers, body = call(event("POST", "/v1/systemone", DECISION, principal=ACME))
    assert status == 503 and headers["retry-after"] and "not answered" in body["detail"]["message"]
