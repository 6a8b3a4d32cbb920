"""The API reference's examples: the run that records them (over HTTP, against the in-process
gateway), and the recorded ones (docs/reference/examples.json, written by `make api-examples`
against the local stack and its real model), each held to the schemas of the document the
gateway serves."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest

from devkit import api_examples
from devkit.fake_backend import UniformBackend
from devkit.gateway_stack import PRINCIPAL, install
from gateway.api import reference
from scripts import openapi_doc
from tests.gateway_helpers import register_credentials, served, tenant_store, unthrottled

DEV = {**PRINCIPAL, "scopes": "chat decide catalogs:read catalogs:write outcomes:train"}  # what make up's dev key holds


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    return openapi_doc.document()


def check_example(document: dict[str, Any], example: dict[str, Any]) -> None:
    """The request's body against the operation's request schema, the answer against its status's."""
    method, path = example["operation"].split(" ", 1)
    operation = document["paths"][path][method.lower()]
    body = example["request"]["body"]
    if body is not None:
        openapi_doc.validate(document, operation["requestBody"]["content"]["application/json"]["schema"], body)
    status = str(example["response"]["status"])
    assert status in operation["responses"], f"{example['operation']} answered {status}, which it does not declare"
    content = operation["responses"][status]["content"]
    media = example["response"]["headers"]["content-type"].split(";")[0]
    assert media in content, f"{example['operation']} answered {media}, which its {status} does not declare"
    openapi_doc.validate(document, content[media]["schema"], example["response"]["body"])


def test_the_run_sends_every_example_in_order_and_each_answer_fits_its_schema(tmp_path, document):
    store = tenant_store(tmp_path / "gateway.sqlite", "acme")
    unthrottled(store, "acme")
    register_credentials(store, DEV)
    install(UniformBackend(), stores=store)
    said: list[str] = []
    with served(DEV) as url, httpx.Client(base_url=url, headers={"Authorization": "Bearer dgk_unused"}) as client:
        recorded = api_examples.run(client.request, said.append)
    assert [e["operation"] for e in recorded] == [f"{e.method} {e.template}" for e in api_examples.EXAMPLES]
    assert len(said) == len(api_examples.EXAMPLES) and said[0].startswith("[api-examples] 1/")
    by_operation = {e["operation"]: e for e in recorded}
    # Each id an answer gave reached the requests after it.
    decision_id = by_operation["POST /v1/systemone"]["response"]["body"]["x_decision_id"]
    assert by_operation["GET /v1/records/{decision_id}"]["request"]["path"] == f"/v1/records/{decision_id}"
    assert by_operation["GET /v1/records/{decision_id}"]["response"]["status"] == 200
    assert by_operation["POST /v1/batches"]["response"]["status"] == 200
    assert by_operation["POST /v1/uploads/{upload_id}/complete"]["response"]["body"]["status"] == "completed"
    for example in recorded:
        check_example(document, example)


EXAMPLES_FILE = api_examples.OUT


@pytest.fixture(scope="module")
def written() -> dict[str, Any]:
    return json.loads(EXAMPLES_FILE.read_text())


def test_the_reference_has_a_recorded_example_of_every_operation(written):
    assert written["written_by"] == "make api-examples"
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", written["date"])
    assert written["model"]  # the model that answered, named
    assert {e["operation"] for e in written["examples"]} == {f"{m} {p}" for m, p in reference.DECLARED}


def test_every_recorded_example_fits_the_schemas_the_gateway_serves(written, document):
    for example in written["examples"]:
        check_example(document, example)


def test_no_recorded_example_holds_a_credential():
    text = EXAMPLES_FILE.read_text()
    assert not re.search(r"dg[kt]_[A-Za-z0-9]{8}", text)


def test_the_recorder_refuses_a_gateway_off_this_machine(capsys):
    code = api_examples.main([], {"DG_URL": "https://abc.execute-api.us-east-1.amazonaws.com/prod", "DG_API_KEY": "dgk_x"})
    assert code == 2 and "local stack" in capsys.readouterr().err


def test_the_recording_names_no_key_and_not_its_id():
    key = "dgk_5f3a9c0d1e2b4a6c_" + "S" * 43
    text = api_examples.redacted('{"credential_id": "5f3a9c0d1e2b4a6c", "recorded_by": "key:5f3a9c0d1e2b4a6c"}', key)
    assert "5f3a9c0d1e2b4a6c" not in text and "0000000000000000" in text
    for leaked in (key, key.rsplit("_", 1)[1]):  # the key, or its secret alone
        with pytest.raises(RuntimeError):
            api_examples.redacted(f'{{"echo": "{leaked}"}}', key)
