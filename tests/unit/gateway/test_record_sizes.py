"""Records against AWS's sizes: a record, its outcome included, fits one DynamoDB item (else
413 with the figures, nothing written)."""

from __future__ import annotations

import json
import time

import pytest

from gateway.auth.authenticate import Authenticator
from gateway.auth.tenants import create_tenant
from gateway.auth.tokens import CachedKeyRing, new_key_document
from gateway.decisions.records import MAX_RECORD_ITEM_BYTES, DecisionRecorder, RecordTooLarge
from tests.fakes import UniformBackend
from tests.gateway_helpers import call, event, install, register_credentials, tenant_store

ACME = {"principalId": "acme", "tenant_id": "acme", "scopes": "decide", "models": "*", "credential_id": "k-acme"}


@pytest.fixture
def dynamodb(monkeypatch):
    from moto import mock_aws

    for name, value in (("AWS_ACCESS_KEY_ID", "x"), ("AWS_SECRET_ACCESS_KEY", "x"), ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(name, value)
    with mock_aws():
        from gateway.stores.dynamodb import DynamoDBStore

        store = DynamoDBStore("dg-tenants", "dg-keys", catalogs_table="dg-catalogs", records_table="dg-records")
        store.create_tables()
        create_tenant(store, "acme")
        yield store


def gateway_on(store) -> None:
    document = new_key_document()
    install(UniformBackend(), authenticator=Authenticator(store, CachedKeyRing(lambda: document)))
    register_credentials(store, ACME)


# -- a record with its outcome: one DynamoDB item --------------------------------------------

def test_an_outcome_that_would_pass_dynamodbs_item_limit_is_a_413_with_the_figures(dynamodb):
    # Given a decision of 400 yes/no questions with long names (its record just under the
    # decision-time estimate's 300,000 bytes), stored in DynamoDB
    gateway_on(dynamodb)
    names = [f"{i:03d}-" + "n" * 500 for i in range(400)]
    questions = {name: {"type": "noul", "instructions": "Late?"} for name in names}
    status, _, decided = call(event("POST", "/v1/systemone", {"model": "jev-latest", "state": "s", "questions": questions},
                                    principal=ACME))
    assert status == 200, decided
    decision_id = decided["x_decision_id"]
    # When the outcome names every question (a record of about 500 KB with it)
    outcome = {"answers": {name: True for name in names}}
    status, _, refused = call(event("POST", f"/v1/decisions/{decision_id}/outcome", outcome, principal=ACME))
    # Then it is refused as too large, with the figures, and nothing is half-written
    assert status == 413, refused
    message = refused["detail"]["message"]
    assert str(MAX_RECORD_ITEM_BYTES) in message and "would take" in message
    assert int(message.split("would take ")[1].split(" bytes")[0]) > MAX_RECORD_ITEM_BYTES
    assert dynamodb.get_record("acme", decision_id)["outcome"] is None
    # And an outcome that fits is attached as ever
    status, _, attached = call(event("POST", f"/v1/decisions/{decision_id}/outcome",
                                     {"answers": {names[0]: False}}, principal=ACME))
    assert status == 200 and dynamodb.get_record("acme", decision_id)["outcome"]["answers"] == {names[0]: False}


def test_dynamodbs_own_item_size_refusal_is_the_same_413(dynamodb):
    # Given a record written before the store kept its size (no item_bytes attribute)
    from gateway.stores.dynamodb import _item

    body = json.dumps({"id": "legacy", "questions": [{"name": "q" * 700, "kind": "noul"} for _ in range(400)]})
    dynamodb.client.put_item(TableName="dg-records", Item=_item({
        "tenant_id": "acme", "record_id": "legacy", "created_at": 1.0, "catalogs": None, "body": body,
        "ttl": int(time.time()) + 3600, "expires_at": time.time() + 3600}))
    # When an outcome takes it past the limit, DynamoDB refuses the update itself (ValidationException)
    with pytest.raises(RecordTooLarge) as refused:
        dynamodb.set_outcome("acme", "legacy", {"note": "n" * 150_000})
    # Then the adapter answers the same 413, with the figure
    assert refused.value.status == 413 and refused.value.size > MAX_RECORD_ITEM_BYTES
    assert dynamodb.get_record("acme", "legacy")["outcome"] is None


def test_a_put_dynamodb_refuses_for_its_size_is_a_413_not_a_500():
    import boto3
    from botocore.stub import Stubber

    from gateway.stores.dynamodb import DynamoDBStore

    client = boto3.client("dynamodb", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    store = DynamoDBStore("t", "k", client, records_table="dg-records")
    with Stubber(client) as stub:
        stub.add_client_error("put_item", "ValidationException", "Item size has exceeded the maximum allowed size")
        with pytest.raises(RecordTooLarge) as refused:
            store.put_record("acme", "r1", 1.0, [], {"id": "r1"}, time.time() + 60)
    assert refused.value.status == 413 and f"more than {MAX_RECORD_ITEM_BYTES} bytes" in refused.value.message


def test_a_decision_whose_record_cannot_fit_is_refused_once_not_retried(tmp_path):
    from tests.unit.gateway.test_services import ACME as PRINCIPAL
    from tests.unit.gateway.test_services import DECISION, decide_service

    store = tenant_store(tmp_path / "g.db", "acme")

    class TooLarge:
        attempts = 0

        def put_record(self, *args):
            TooLarge.attempts += 1
            raise RecordTooLarge(MAX_RECORD_ITEM_BYTES + 10, outcome=False)

    service = decide_service(store, UniformBackend())
    service.recorder = DecisionRecorder(TooLarge(), None, sleep=lambda s: pytest.fail("retried"))
    with pytest.raises(RecordTooLarge) as refused:
        service.decide(PRINCIPAL, DECISION, route="systemone")
    assert refused.value.status == 413 and TooLarge.attempts == 1
