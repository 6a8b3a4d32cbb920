"""Records against AWS's sizes: a record, its outcome included, fits one DynamoDB item (else
413 with the figures, nothing written), and a list of records comes a page at a time that
fits one Lambda response, a filtered one reading a bounded part of the history per page."""

from __future__ import annotations

import json
import time

import pytest

from devkit.fake_backend import UniformBackend
from devkit.gateway_stack import call_installed, event, install
from gateway.auth.authenticate import Authenticator
from gateway.auth.tokens import CachedKeyRing, new_key_document
from gateway.decisions.records import MAX_RECORD_ITEM_BYTES, DecisionRecorder, RecordTooLarge
from gateway.services import records as listing
from gateway.services.records import MAX_PAGE_BYTES, MAX_READ_BYTES, RecordsService
from systemone.limits import LAMBDA_INVOKE_PAYLOAD_BYTES
from tests.gateway_helpers import call, dynamodb_tenant_store, register_credentials, tenant_store

ACME = {"principalId": "acme", "tenant_id": "acme", "scopes": "decide", "models": "*", "credential_id": "k-acme"}


@pytest.fixture
def dynamodb(monkeypatch):
    with dynamodb_tenant_store(monkeypatch, "acme") as store:
        yield store


def gateway_on(store) -> None:
    document = new_key_document()
    install(UniformBackend(), stores=store, authenticator=Authenticator(store, CachedKeyRing(lambda: document)))
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
    assert dynamodb.records.get_record("acme", decision_id)["outcome"] is None
    # And an outcome that fits is attached as ever
    status, _, _ = call(event("POST", f"/v1/decisions/{decision_id}/outcome",
                                     {"answers": {names[0]: False}}, principal=ACME))
    assert status == 200 and dynamodb.records.get_record("acme", decision_id)["outcome"]["answers"] == {names[0]: False}


def test_dynamodbs_own_item_size_refusal_is_the_same_413(dynamodb):
    # Given a record written before the store kept its size (no item_bytes attribute)
    from gateway.stores.dynamodb.items import item

    body = json.dumps({"id": "legacy", "questions": [{"name": "q" * 700, "kind": "noul"} for _ in range(400)]})
    dynamodb.records.table.client.put_item(TableName="dg-records", Item=item({
        "tenant_id": "acme", "record_id": "legacy", "created_at": 1.0, "catalogs": None, "body": body,
        "ttl": int(time.time()) + 3600, "expires_at": time.time() + 3600}))
    # When an outcome takes it past the limit, DynamoDB refuses the update itself (ValidationException)
    with pytest.raises(RecordTooLarge) as refused:
        dynamodb.records.set_outcome("acme", "legacy", {"note": "n" * 150_000})
    # Then the adapter answers the same 413, with the figure
    assert refused.value.status == 413 and refused.value.size > MAX_RECORD_ITEM_BYTES
    assert dynamodb.records.get_record("acme", "legacy")["outcome"] is None


def test_a_put_dynamodb_refuses_for_its_size_is_a_413_not_a_500():
    import boto3
    from botocore.stub import Stubber

    from gateway.stores.dynamodb import DynamoDBTables, dynamodb_stores

    client = boto3.client("dynamodb", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    store = dynamodb_stores(client, DynamoDBTables("t", "k", records="dg-records"))
    with Stubber(client) as stub:
        stub.add_client_error("put_item", "ValidationException", "Item size has exceeded the maximum allowed size")
        with pytest.raises(RecordTooLarge) as refused:
            store.records.put_record("acme", "r1", 1.0, [], {"id": "r1"}, time.time() + 60)
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


# -- pages that fit one Lambda response ------------------------------------------------------

def big_record(i: int, *, catalog: str = "routing", kb: int = 215) -> tuple[str, dict]:
    """A record of about `kb` KB, shaped as a decision's (quote-heavy, as JSON records are)."""
    record_id = f"{1_000_000 + i:024x}"
    question = {"name": "", "kind": "choice", "catalog": f"{catalog}@1", "catalog_hash": "h" * 64,
                "probabilities": {f"o{k}": 0.01 for k in range(20)}, "answer": "o0", "model_answer": "o0",
                "action": "review", "top": 0.01, "margin": 0.0, "confidence": 0.01}
    size = len(json.dumps(question, separators=(",", ":")))  # as the API renders it
    questions = [{**question, "name": f"q{n}"} for n in range(kb * 1024 // (size + 5))]
    return record_id, {"id": record_id, "created_at": float(i), "questions": questions}


def put(store, *records: tuple[str, dict]) -> None:
    for record_id, body in records:
        catalogs = sorted({q["catalog"].split("@")[0] for q in body["questions"]})
        store.records.put_record("acme", record_id, body["created_at"], catalogs, body, time.time() + 3600)


def test_the_default_list_of_large_records_pages_within_one_lambda_response(tmp_path):
    # Given 25 records of a 215 KB decision (5.4 MB of JSON, over 6 MB once escaped in Lambda's result)
    store = tenant_store(tmp_path / "g.db", "acme")
    gateway_on(store)
    put(store, *(big_record(i) for i in range(25)))
    # When the tenant lists its records with the default limit, following the cursor
    seen, pages, cursor = [], 0, None
    while True:
        result = call_installed(event("GET", "/v1/records" + (f"?cursor={cursor}" if cursor else ""), principal=ACME), None)
        # Then every response fits Lambda's 6 MB, however it travels
        assert result["statusCode"] == 200 and len(json.dumps(result)) < LAMBDA_INVOKE_PAYLOAD_BYTES
        page = json.loads(result["body"])
        assert listing.travelling_bytes(page) <= MAX_PAGE_BYTES + 1024
        seen += [r["id"] for r in page["records"]]
        pages += 1
        cursor = page.get("next_cursor")
        if cursor is None:
            break
        assert page["records"] and cursor == page["records"][-1]["id"]
    # And every record comes once, newest first, over more than one page
    assert pages > 1 and seen == [big_record(i)[0] for i in reversed(range(25))]
    assert set(page["drift"]) == {"routing"}


@pytest.fixture(params=["sqlite", "dynamodb"])
def records_store(request, tmp_path):
    if request.param == "sqlite":
        yield tenant_store(tmp_path / "g.db", "acme")
    else:
        yield request.getfixturevalue("dynamodb")


def all_pages(service, *, catalog=None, limit=100):
    """Every page of the tenant's list, following next_cursor."""
    pages, cursor = [], None
    while True:
        page = service.list_with_drift(_principal(), catalog=catalog, limit=limit, cursor=cursor)
        pages.append(page)
        cursor = page.get("next_cursor")
        if cursor is None:
            return pages


def _principal():
    from gateway.auth.credentials import Principal

    return Principal("acme", frozenset({"decide"}), None, "k-acme")


def test_a_page_holds_at_most_limit_records_and_says_where_the_next_starts(records_store):
    put(records_store, *(big_record(i, kb=1) for i in range(5)))
    pages = all_pages(RecordsService(records_store.records, records_store.catalogs), limit=2)
    assert [[r["id"][-2:] for r in p["records"]] for p in pages] == [["44", "43"], ["42", "41"], ["40"]]
    assert "next_cursor" not in pages[-1]


class ReadCounting:
    """The store, counting what each listing reads (the sizes of the records it consumed)."""

    def __init__(self, store) -> None:
        self.store, self.reads = store, []

    def scan_records(self, *args, **kwargs):
        self.reads.append(0)
        for item in self.store.records.scan_records(*args, **kwargs):
            self.reads[-1] += item.size
            yield item


def test_a_catalog_filtered_list_caps_what_one_page_reads_and_returns(records_store, monkeypatch):
    # Given a long history in which one catalog entry is rare (its two records the oldest)
    monkeypatch.setattr(listing, "MAX_READ_BYTES", 256 * 1024)  # the rule at a scale a test can fill
    put(records_store, big_record(0, catalog="rare", kb=4), big_record(1, catalog="rare", kb=4))
    put(records_store, *(big_record(i, kb=40) for i in range(2, 32)))  # 1.2 MB that do not name it
    counting = ReadCounting(records_store)
    # When the tenant lists that entry's records
    pages = all_pages(RecordsService(counting, records_store.catalogs), catalog="rare", limit=1)
    # Then no page reads past the cap but for the record that crossed it and the one that
    # shows the list goes on; pages say where to go on; and the two come once each
    largest = max(r.size for r in records_store.records.scan_records("acme"))
    assert len(pages) > 3 and max(counting.reads) <= listing.MAX_READ_BYTES + 2 * largest
    assert [r["id"] for p in pages for r in p["records"]] == [big_record(1)[0], big_record(0)[0]]
    assert all("next_cursor" in p for p in pages[:-1]) and set(pages[-2]["drift"]) == {"rare"}
    assert MAX_READ_BYTES == 8 * 1024 * 1024  # the figure itself, unpatched


def test_a_page_counts_the_drift_report_of_each_catalog_entry_it_names(monkeypatch):
    from gateway.decisions.records import ListedRecord

    monkeypatch.setattr(listing, "MAX_PAGE_BYTES", 3 * listing.DRIFT_ENTRY_BYTES)
    many = {"id": "a", "questions": [{"catalog": f"c{i}@1"} for i in range(2)]}
    scanned = iter([ListedRecord("b", 10, many), ListedRecord("a", 10, {**many, "id": "x",
                                                                         "questions": [{"catalog": "c9@1"}]})])
    page, cursor = listing.page_of(scanned, limit=10)
    assert [r["id"] for r in page] == ["a"] and cursor == "b"  # the second's new entry would not fit
