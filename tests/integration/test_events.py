"""Every events/*.json through the real `lambda_handler`, the real boto3 SageMaker
client and a real scorer (smollm2) behind `endpoint_url`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.gateway_helpers import call, register_credentials

pytestmark = pytest.mark.model
EVENTS = Path(__file__).resolve().parents[2] / "events"

EXPECTED = {
    "health": 200,
    "models": 200,
    "systemone": 200,
    "systemone-gzip": 200,
    "systemone-invalid": 422,
    "systemone-unauthenticated": 401,
    "decisions": 200,
    "decisions-forbidden": 403,
    "chat": 200,
    "chat-stream": 200,
    "systemone-iam": 200,
    "tokens-iam": 201,
    "tokens-bearer-forbidden": 403,
    "catalogs-1-put": (200, 201),  # 201 the first time, 200 when the same content exists
    "catalogs-2-get": 200,
    "catalogs-3-systemone-ref": 200,
    "catalogs-4-read-only-put": 403,
    "records-list": 200,
}


def test_every_event_file_has_an_expectation():
    assert sorted(p.stem for p in EVENTS.glob("*.json")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_event(local_stack, name):
    event = json.loads((EVENTS / f"{name}.json").read_text())
    context = event["requestContext"].get("authorizer") or {}
    if context.get("tenant_id"):  # the function checks the key is live: the events' key id must exist
        register_credentials(local_stack.store, context)
    status, headers, body = call(event, local_stack.function)
    expected = EXPECTED[name]
    assert status in (expected if isinstance(expected, tuple) else (expected,)), body
    assert headers["x-request-id"] == event["requestContext"]["requestId"]
    if name.startswith("systemone"):
        assert headers["x-typesafe-request-id"] == headers["x-request-id"]
    if name in ("systemone", "systemone-gzip"):
        assert set(body["answers"]) == {"is_refund", "queue", "anger"}
        assert body["model"] == "smollm2-135m-instruct-q4_1"
        assert isinstance(body["usage"]["input_tokens"], int)
    if name == "decisions":
        assert [a["name"] for a in body["answers"]] == ["is_refund", "queue", "anger"]
    if name == "catalogs-3-systemone-ref":
        assert body["answers"]["queue"]["x_catalog"].startswith("support-routing@") and body["x_decision_id"]
    if name == "tokens-iam":
        assert body["tenant_id"] == "acme" and body["scopes"] == ["decide"] and body["token"].startswith("dgt_")
    if name == "chat-stream":
        assert headers["content-type"] == "text/event-stream" and body.endswith("data: [DONE]\n\n")
    if status >= 400:
        assert "Traceback" not in json.dumps(body)
