"""The API reference the gateway serves: the OpenAPI document and Swagger UI at /v1/openapi,
public where enabled (the local runner; opt-in in AWS), absent otherwise."""

from __future__ import annotations

from devkit.fake_backend import UniformBackend
from devkit.gateway_stack import event, install
from tests.gateway_helpers import call


def test_the_document_and_swagger_ui_are_served_without_credentials_when_enabled():
    install(UniformBackend(), openapi=True)
    status, _, document = call(event("GET", "/v1/openapi?format=json", principal=None))
    assert status == 200
    assert {"/v1/systemone", "/v1/decisions", "/v1/records/{decision_id}", "/v1/catalogs/{name}"} <= set(document["paths"])
    request = document["paths"]["/v1/systemone"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert request["$ref"].endswith("/SystemOneRequest")
    assert document["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert document["security"] == [{"bearer": []}]
    status, headers, page = call(event("GET", "/v1/openapi", principal=None))
    assert status == 200 and headers["content-type"].startswith("text/html") and "swagger" in page.lower()


def test_without_the_setting_there_is_no_reference_and_no_public_path():
    install(UniformBackend())
    assert call(event("GET", "/v1/openapi", principal=None))[0] == 401
    assert call(event("GET", "/v1/openapi"))[0] == 404
