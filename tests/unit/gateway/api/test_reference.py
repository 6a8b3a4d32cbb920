"""The statuses the OpenAPI document declares (gateway.api.reference), driven through the real
handler on a real SQLite store: the refusals every route shares, on every route that declares
them. What only some routes send (a 403 for a scope, a 404, a 409, a 504...) is driven by
those routes' own tests; the suite's recorder (tests/declared_statuses.py) fails a run in
which some declared status was never answered, and a test in which one undeclared was."""

from __future__ import annotations

import json
from typing import Any

import pytest

from devkit import api_examples
from devkit.api_examples import EXAMPLES, PLACEHOLDERS, Example
from devkit.fake_backend import UniformBackend
from devkit.gateway_stack import PRINCIPAL, event, install
from gateway.api import reference
from gateway.api.paths import takes_form
from gateway.auth.tenants import set_limits
from gateway.backends.base import EndpointFailed, EndpointTimedOut
from scripts import openapi_doc
from tests.fakes import FailingBackend
from tests.gateway_helpers import call, multipart, register_credentials, tenant_store, unthrottled

OPERATIONS = sorted(reference.DECLARED)
MAX_BODY = 2048
ALL_SCOPES = {**PRINCIPAL, "scopes": "chat decide catalogs:read catalogs:write outcomes:train admin"}


@pytest.fixture
def store(tmp_path):
    store = tenant_store(tmp_path / "gateway.sqlite", "acme")
    unthrottled(store, "acme")
    register_credentials(store, ALL_SCOPES)
    install(UniformBackend(), stores=store, max_body_bytes=MAX_BODY, openapi=True)
    return store


def example_of(operation: tuple[str, str]) -> Example:
    return next(e for e in EXAMPLES if (e.method, e.template) == operation)


def valid_request(operation: tuple[str, str], headers: dict[str, str] | None = None) -> dict[str, Any]:
    """The operation's example as an event: a request its route's own checks accept."""
    example = example_of(operation)
    path = example.request_path(PLACEHOLDERS)
    if example.query:
        path += "?" + "&".join(f"{k}={v}" for k, v in example.query.items())
    if example.form is not None:
        fields = {k: v.encode() for k, v in example.form.items() if isinstance(v, str)}
        raw, content_type = multipart(fields, {k: v for k, v in example.form.items() if isinstance(v, tuple)})
        return event(example.method, path, raw=raw, headers={"Content-Type": content_type, **(headers or {})},
                     principal=ALL_SCOPES)
    return event(example.method, path, example.request_body(PLACEHOLDERS), principal=ALL_SCOPES, headers=headers)


def declaring(status: int) -> list[tuple[str, str]]:
    return [op for op in OPERATIONS if status in reference.DECLARED[op]]


def test_every_operation_the_gateway_serves_declares_its_statuses_and_has_an_example(store):
    served = call(event("GET", "/v1/openapi?format=json", principal=None))[2]
    operations = {(method.upper(), path) for path, ops in served["paths"].items() for method in ops}
    assert operations == set(reference.DECLARED)
    assert {(e.method, e.template) for e in EXAMPLES} == operations


def test_the_document_gives_each_status_its_apis_error_shape_and_headers(store):
    served = call(event("GET", "/v1/openapi?format=json", principal=None))[2]
    def body_of(method: str, path: str, status: int) -> str:
        answer = served["paths"][path][method]["responses"][str(status)]
        return answer["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[-1]

    assert body_of("post", "/v1/systemone", 422) == "SystemOneProblems"
    assert body_of("post", "/v1/systemone", 429) == "SystemOneError"
    assert body_of("post", "/v1/decisions", 422) == "OpenAIError"
    assert body_of("post", "/v1/batches", 400) == "OpenAIError"
    assert body_of("get", "/v1/models", 401) == "EitherError"
    throttled = served["paths"]["/v1/chat/completions"]["post"]["responses"]["429"]["headers"]
    assert {"Retry-After", "x-should-retry", "x-request-id"} <= set(throttled)
    assert "Retry-After" not in served["paths"]["/v1/chat/completions"]["post"]["responses"]["413"]["headers"]
    chat = served["paths"]["/v1/chat/completions"]["post"]
    assert set(chat["responses"]["200"]["content"]) == {"application/json", "text/event-stream"}
    assert "Prefer" in {p["name"] for p in chat["parameters"]}
    assert "HTTPValidationError" not in served["components"]["schemas"]


@pytest.mark.parametrize("operation", declaring(400), ids=" ".join)
def test_a_credential_in_the_query_string_is_400_on_every_route(store, operation):
    request = valid_request(operation)
    request["multiValueQueryStringParameters"] = {"api_key": ["dgk_x"]}
    request["queryStringParameters"] = {"api_key": "dgk_x"}
    status, _, body = call(request)
    assert status == 400, body


@pytest.mark.parametrize("operation", declaring(401), ids=" ".join)
def test_no_credential_is_401(store, operation):
    request = valid_request(operation)
    del request["requestContext"]["authorizer"]
    assert call(request)[0] == 401


@pytest.mark.parametrize("operation", declaring(503), ids=" ".join)
def test_a_credential_store_that_cannot_be_read_is_503_with_retry_after(store, operation, monkeypatch):
    def unreadable(*args: Any) -> None:
        raise OSError("the store is down")

    monkeypatch.setattr("gateway.functions.handler.principal_of", unreadable)
    status, headers, _ = call(valid_request(operation))
    assert status == 503 and int(headers["retry-after"]) > 0


@pytest.mark.parametrize("operation", declaring(429), ids=" ".join)
def test_a_tenant_over_its_rate_is_429_before_its_body_is_read(store, operation):
    set_limits(store.tenants, "acme", rate_per_s=0.01, burst=1)
    call(valid_request(operation))
    status, headers, _ = call(valid_request(operation))
    assert status == 429 and int(headers["retry-after"]) > 0


BODY_OPERATIONS = [op for op in OPERATIONS if op[0] not in ("GET",) and 413 in reference.DECLARED[op]]


@pytest.mark.parametrize("operation", BODY_OPERATIONS, ids=" ".join)
def test_a_body_over_the_limit_is_413(store, operation):
    request = valid_request(operation)
    request["body"], request["isBase64Encoded"] = json.dumps({"pad": "x" * MAX_BODY}), False
    status, _, body = call(request)
    assert status == 413 and str(MAX_BODY) in json.dumps(body)


@pytest.mark.parametrize("operation", BODY_OPERATIONS, ids=" ".join)
def test_an_unknown_content_encoding_is_415_and_any_on_a_form_400(store, operation):
    status, _, body = call(valid_request(operation, headers={"Content-Encoding": "br"}))
    assert status == (400 if takes_form(*operation) else 415), body


@pytest.mark.parametrize("operation", BODY_OPERATIONS, ids=" ".join)
def test_a_body_that_cannot_be_decoded_is_refused_in_the_routes_shape(store, operation):
    request = valid_request(operation)
    request["body"], request["isBase64Encoded"] = "not base64!", True
    status, _, body = call(request)
    expected = 400 if operation[1].startswith(("/v1/files", "/v1/uploads", "/v1/batches")) else 422
    assert status == expected and status in reference.DECLARED[operation], body


# A path or query parameter out of its contract, for each operation that reads one.
BAD_PARAMETERS = {
    ("GET", "/v1/records"): "/v1/records?limit=0",
    ("GET", "/v1/records/{decision_id}"): "/v1/records/not%20an%20id",
    ("GET", "/v1/catalogs"): "/v1/catalogs?limit=0",
    ("GET", "/v1/catalogs/{name}"): "/v1/catalogs/Not_A_Name",
    ("GET", "/v1/catalogs/{name}/versions"): "/v1/catalogs/support-routing/versions?after=-1",
    ("GET", "/v1/catalogs/{name}/versions/{version}"): "/v1/catalogs/support-routing/versions/0",
    ("GET", "/v1/usage"): "/v1/usage?from=yesterday",
    ("GET", "/v1/files"): "/v1/files?limit=0",
    ("GET", "/v1/files/{file_id}"): "/v1/files/not.an.id",
    ("GET", "/v1/files/{file_id}/content"): "/v1/files/not.an.id/content",
    ("GET", "/v1/batches"): "/v1/batches?limit=0",
    ("GET", "/v1/batches/{batch_id}"): "/v1/batches/not.an.id",
}


def test_every_operation_that_reads_parameters_has_a_bad_one_here():
    with_parameters = {op for op in OPERATIONS if op[0] == "GET" and ("{" in op[1] or example_of(op).query)}
    assert with_parameters <= set(BAD_PARAMETERS)


@pytest.mark.parametrize("operation", sorted(BAD_PARAMETERS), ids=" ".join)
def test_a_parameter_out_of_its_contract_is_refused_in_the_routes_shape(store, operation):
    status, _, body = call(event("GET", BAD_PARAMETERS[operation], principal=ALL_SCOPES))
    expected = 400 if operation[1].startswith(("/v1/files", "/v1/batches")) else 422
    assert status == expected and status in reference.DECLARED[operation], body


ROUTE_MODULES = ("operations", "decisions", "chat", "records", "catalogs", "tokens", "usage", "batches")


@pytest.mark.parametrize("operation", declaring(500), ids=" ".join)
def test_a_defect_behind_a_route_is_500_with_nothing_of_it_in_the_body(store, operation, monkeypatch):
    def defect(*args: Any) -> None:
        raise RuntimeError("secret internals")

    for module in ROUTE_MODULES:  # every route asks who calls first, once its request is valid
        monkeypatch.setattr(f"gateway.api.{module}.caller", defect)
    status, _, body = call(valid_request(operation))
    assert status == 500, body
    assert "secret" not in json.dumps(body)


def test_the_error_bodies_match_the_declared_schemas(store):
    """A refusal of each shape (a 422 or 400, a 401), held to the schema its status declares."""
    served = call(event("GET", "/v1/openapi?format=json", principal=None))[2]
    for operation in (("POST", "/v1/systemone"), ("POST", "/v1/decisions"), ("GET", "/v1/models"), ("POST", "/v1/batches"),
                      ("PUT", "/v1/catalogs/{name}")):
        invalid = valid_request(operation)
        if operation[0] != "GET":
            invalid["body"] = json.dumps({"model": 1})
        anonymous = valid_request(operation)
        del anonymous["requestContext"]["authorizer"]
        for request in (invalid, anonymous):
            status, _, body = call(request)
            declared = served["paths"][operation[1]][operation[0].lower()]["responses"][str(status)]
            openapi_doc.validate(served, declared["content"]["application/json"]["schema"], body)


def test_without_a_store_the_records_and_catalogs_routes_say_so_with_404():
    install(UniformBackend())  # no store: a gateway that keeps no records or catalogs
    for method, path, body in (("GET", "/v1/records", None), ("GET", "/v1/catalogs", None),
                               ("PUT", "/v1/catalogs/support-routing", api_examples.CATALOG_ENTRY)):
        status, _, reply = call(event(method, path, body, principal=ALL_SCOPES))
        assert status == 404 and "not configured" in json.dumps(reply), reply


@pytest.mark.parametrize("operation", declaring(403), ids=" ".join)
def test_a_credential_without_the_routes_scope_is_403(store, operation):
    """A credential with no scope at all (register_credentials keeps the key live): every route
    that needs one refuses it before reading anything."""
    bare = {**ALL_SCOPES, "scopes": "", "credential_id": "k-bare"}
    register_credentials(store, bare)
    request = valid_request(operation)
    request["requestContext"]["authorizer"] = dict(bare)
    status, _, body = call(request)
    assert status == 403, body


def upload_a_file(lines: int = 1) -> str:
    example = example_of(("POST", "/v1/files"))
    data = "".join(json.dumps(line) + "\n" for line in api_examples.BATCH_LINES[:lines]).encode()
    raw, content_type = multipart({"purpose": b"batch"}, {"file": ("tickets.jsonl", data)})
    status, _, reply = call(event("POST", example.path, raw=raw, headers={"Content-Type": content_type},
                                  principal=ALL_SCOPES))
    assert status == 200, reply
    return reply["id"]


def test_a_file_larger_than_a_buffered_answer_is_413_there(store, monkeypatch):
    monkeypatch.setattr("gateway.api.batches.MAX_BUFFERED_BYTES", 10)
    status, _, body = call(event("GET", f"/v1/files/{upload_a_file()}/content", principal=ALL_SCOPES))
    assert status == 413 and "streaming" in json.dumps(body)


def test_cancelling_a_batch_that_ended_is_409(store):
    status, _, batch = call(event("POST", "/v1/batches", {"input_file_id": upload_a_file(), "endpoint": "/v1/systemone",
                                                          "completion_window": "24h"}, principal=ALL_SCOPES))
    assert status == 200, batch
    stored = store.batches.get_batch("acme", batch["id"])
    stored.status = "completed"
    assert store.batches.update_batch(stored, "validating")
    status, _, body = call(event("POST", f"/v1/batches/{batch['id']}/cancel", principal=ALL_SCOPES))
    assert status == 409 and "completed" in json.dumps(body)


def new_upload() -> tuple[str, str]:
    data = "".join(json.dumps(line) + "\n" for line in api_examples.BATCH_LINES[:1]).encode()
    status, _, upload = call(event("POST", "/v1/uploads", {"filename": "a.jsonl", "purpose": "batch", "bytes": len(data),
                                                           "mime_type": "application/jsonl"}, principal=ALL_SCOPES))
    assert status == 200, upload
    raw, content_type = multipart({}, {"data": ("part", data)})
    status, _, part = call(event("POST", f"/v1/uploads/{upload['id']}/parts", raw=raw,
                                 headers={"Content-Type": content_type}, principal=ALL_SCOPES))
    assert status == 200, part
    return upload["id"], part["id"]


def test_an_upload_another_request_ended_meanwhile_is_409_to_complete_or_cancel(store, monkeypatch):
    """The store's conditional write is what loses the race: it is made to lose it here."""
    upload_id, part_id = new_upload()

    def lost(*args: Any) -> Any:
        raise ValueError("the upload is no longer pending")

    monkeypatch.setattr(type(store.batches), "complete_upload", lost)
    status, _, body = call(event("POST", f"/v1/uploads/{upload_id}/complete", {"part_ids": [part_id]},
                                 principal=ALL_SCOPES))
    assert status == 409, body
    monkeypatch.setattr(type(store.batches), "set_upload", lambda *args: False)
    status, _, body = call(event("POST", f"/v1/uploads/{upload_id}/cancel", principal=ALL_SCOPES))
    assert status == 409, body


def test_cancelling_a_pending_upload_answers_it_cancelled(store):
    upload_id, _ = new_upload()
    status, _, body = call(event("POST", f"/v1/uploads/{upload_id}/cancel", principal=ALL_SCOPES))
    assert status == 200 and body["status"] == "cancelled"


SCORED_ROUTES = [("POST", "/v1/systemone"), ("POST", "/v1/decisions"), ("POST", "/v1/chat/completions")]


@pytest.mark.parametrize("operation", SCORED_ROUTES, ids=" ".join)
@pytest.mark.parametrize(("failure", "expected"), [(EndpointFailed("dg-cpu", "container_500"), 502),
                                                   (EndpointTimedOut("dg-cpu", "scorer_deadline", answered=True), 504)],
                         ids=["an endpoint failing", "the scorer cutting the work"])
def test_a_models_failure_reaches_every_scored_route_in_its_shape(tmp_path, operation, failure, expected):
    store = tenant_store(tmp_path / "gateway.sqlite", "acme")
    unthrottled(store, "acme")
    register_credentials(store, ALL_SCOPES)
    install(FailingBackend({"dg-cpu": failure}), stores=store)
    status, headers, body = call(valid_request(operation))
    assert status == expected, body
    assert ("error" in body) == (operation[1] != "/v1/systemone")
    if expected == 504:
        assert headers["x-should-retry"] == "false"  # the same work would run out again


def test_a_refit_that_an_edit_overtook_is_409_in_both_shapes(store, monkeypatch):
    from gateway.errors import Conflict

    def overtaken(*args: Any, **kwargs: Any) -> Any:  # what CatalogService.put raises for a refit's stale base
        raise Conflict("the catalog entry 'support-routing' changed while this was computed from version 1")

    monkeypatch.setattr("gateway.services.learning.LearningService.refit", overtaken)
    status, _, body = call(valid_request(("POST", "/v1/catalogs/{name}/refit")))
    assert status == 409 and body["error"]["code"] == "conflict" and body["detail"]["error_type"] == "conflict"
