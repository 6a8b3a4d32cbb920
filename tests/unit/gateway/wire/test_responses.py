"""Every body a route renders is the response model the OpenAPI document declares for it
(unknown fields refused), so the served document and the wire cannot drift apart."""

from __future__ import annotations

import pytest

from devkit.gateway_stack import event, install
from gateway.auth.authenticate import Authenticator
from gateway.auth.tokens import CachedKeyRing, new_key_document
from gateway.wire import responses
from tests.fakes import FixedBackend
from tests.gateway_helpers import call, register_credentials, tenant_store
from tests.unit.gateway.test_catalogs import ACME, ROUTING, STATE

QUESTIONS = {
    "refund": {"type": "noul", "instructions": "Asks for a refund?"},
    "queue": {"type": "choice", "criteria": {"billing": "payments", "delivery": None}},
    "anger": {"type": "score", "criteria": ["calm", "annoyed", "angry"]},
    "routed": {"catalog": "support-routing"},
}
OPENAI_QUESTIONS = [
    {"type": "predicate", "name": "refund", "instructions": "Asks for a refund?"},
    {"type": "choice", "name": "queue", "instructions": "Which queue?", "choices": [{"value": "billing"}, {"value": True}]},
    {"type": "score", "name": "anger", "instructions": "How angry?", "levels": [{"label": "calm"}, {"label": "angry"}]},
    {"catalog": "support-routing", "name": "routed"},
]


@pytest.fixture
def gateway(tmp_path):
    store = tenant_store(tmp_path / "g.db", "acme")
    document = new_key_document()
    install(FixedBackend(choice={"billing": 0.9}), stores=store, authenticator=Authenticator(store, CachedKeyRing(lambda: document)))
    register_credentials(store, ACME)
    assert call(event("PUT", "/v1/catalogs/support-routing", ROUTING, principal=ACME))[0] == 201


def ok(method: str, path: str, body=None, status: int = 200):
    got, _, reply = call(event(method, path, body, principal=ACME))
    assert got == status, reply
    return reply


def test_decision_answers_are_their_declared_models(gateway):
    one = responses.SystemOneResponse.model_validate(
        ok("POST", "/v1/systemone", {"model": "jev-latest", "state": STATE, "questions": QUESTIONS}))
    assert {a.type for a in one.answers.values()} == {"noul", "choice", "score"}
    assert one.answers["routed"].x_catalog == "support-routing@1" and one.answers["routed"].x_action is not None
    openai = responses.DecisionsResponse.model_validate(
        ok("POST", "/v1/decisions", {"model": "jev-latest", "input": STATE, "questions": OPENAI_QUESTIONS}))
    assert [a.type for a in openai.answers] == ["predicate", "choice", "score", "choice"]
    reported = ok("POST", f"/v1/decisions/{openai.id}/outcome", {"answers": {"refund": True}})
    responses.OutcomeReply.model_validate(reported)
    record = responses.DecisionRecord.model_validate(ok("GET", f"/v1/records/{openai.id}"))
    assert record.outcome["answers"] == {"refund": True} and len(record.questions) == 4
    responses.RecordList.model_validate(ok("GET", "/v1/records"))
    usage = responses.UsageReport.model_validate(ok("GET", "/v1/usage"))
    assert usage.total.requests == 2 and [e.entry for e in usage.by_entry] == ["(inline)", "support-routing"]


def test_answers_changed_by_a_suspected_injection_are_their_declared_models(tmp_path):
    store = tenant_store(tmp_path / "g.db", "acme")
    document = new_key_document()
    signal = {"suspicion": 0.9, "probe": 0.9, "patterns": ["ignore_instructions"], "neutralised": ["invisible_characters"]}
    install(FixedBackend(choice={"billing": 0.9}, injection=signal, framing="spotlight"),
            stores=store, authenticator=Authenticator(store, CachedKeyRing(lambda: document)))
    register_credentials(store, ACME)
    ok("PUT", "/v1/catalogs/support-routing", ROUTING, status=201)
    one = responses.SystemOneResponse.model_validate(
        ok("POST", "/v1/systemone", {"model": "jev-latest", "state": STATE, "questions": QUESTIONS}))
    assert one.answers["routed"].x_action_reason == "injection_suspected" and one.x_injection.suspicion == 0.9
    openai = responses.DecisionsResponse.model_validate(
        ok("POST", "/v1/decisions", {"model": "jev-latest", "input": STATE, "questions": OPENAI_QUESTIONS}))
    assert openai.answers[-1].x_action_reason == "injection_suspected"
    record = responses.DecisionRecord.model_validate(ok("GET", f"/v1/records/{openai.id}"))
    assert record.injection.patterns == ["ignore_instructions"] and record.questions[-1].action_reason == "injection_suspected"
    with pytest.raises(ValueError, match="surprise"):
        responses.SystemOneResponse.model_validate({**one.model_dump(), "x_injection": {**signal, "surprise": 1}})


def test_models_and_catalog_answers_are_their_declared_models(gateway):
    responses.ModelList.model_validate(ok("GET", "/v1/models"))
    responses.CatalogList.model_validate(ok("GET", "/v1/catalogs"))
    responses.CatalogEntry.model_validate(ok("GET", "/v1/catalogs/support-routing"))
    responses.VersionList.model_validate(ok("GET", "/v1/catalogs/support-routing/versions"))


def test_a_field_the_models_lack_is_refused():
    # The check is real: a renderer that added a field would fail the tests above.
    usage = {"input_tokens": 1, "input_tokens_details": {}, "output_tokens": 0, "output_tokens_details": {},
             "total_tokens": 1}
    body = {"id": "decision_x", "object": "decision", "model": "m", "usage": usage,
            "answers": [{"type": "predicate", "name": "q", "probability": 0.5}]}
    responses.DecisionsResponse.model_validate(body)
    with pytest.raises(ValueError, match="surprise"):
        responses.DecisionsResponse.model_validate({**body, "answers": [{**body["answers"][0], "surprise": 1}]})


def test_the_document_carries_each_routes_response_schema(gateway):
    install(FixedBackend(), openapi=True)
    document = call(event("GET", "/v1/openapi?format=json", principal=None))[2]
    schema = document["paths"]["/v1/decisions"]["post"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert schema["$ref"].endswith("/DecisionsResponse")
    assert "SystemOneResponse" in document["components"]["schemas"]
