"""The scheduled refit over a real SQLite store: which entries it refits, what it writes."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from devkit.gateway_stack import event
from gateway.catalogs.model import parse_content
from gateway.catalogs.service import CatalogService
from gateway.functions.refits import lambda_handler, refit_all
from gateway.services.learning import LearningService
from tests.gateway_helpers import call, tenant_store
from tests.unit.gateway.test_catalogs import (
    ACME,
    FRUIT,
    FRUITY,
    OTHER,
    TRAINER,
    learning_stack,
    put,
)


@pytest.fixture
def store(tmp_path):
    return tenant_store(tmp_path / "g.db", "acme", "globex")


def _train(name: str) -> None:
    for text, truth in [(t, True) for t in FRUITY] + [(t, False) for t in OTHER]:
        for variant in (text, text + " today"):
            decision_id = call(event("POST", "/v1/systemone", {"model": "jev-latest", "state": variant,
                                                               "questions": {"fruit": {"catalog": name}}},
                                     principal=ACME))[2]["x_decision_id"]
            call(event("POST", f"/v1/decisions/{decision_id}/outcome", {"answers": {"fruit": truth}, "source": "audit"},
                       principal=TRAINER))


def test_the_schedule_refits_entries_that_ask_moves_advisory_ones_only_and_writes_nothing_unchanged(store, monkeypatch):
    learning_stack(store)
    put({**FRUIT, "learning": {"keep_features": True, "refit": "daily"}}, name="daily")
    put({**FRUIT, "learning": {"keep_features": True, "refit": "daily"}, "policy": {"mode": "enforcing"}},
        name="enforced")
    put(FRUIT, name="on-demand")  # keeps features, refitted only when asked
    for name in ("daily", "enforced", "on-demand"):
        _train(name)
    catalogs = CatalogService(store.catalogs)
    learning = LearningService(catalogs, store.records)
    summary = refit_all(store.catalogs, catalogs, learning)
    assert summary == {"tenants": 1, "entries": 2, "written": 1, "unchanged": 1, "failed": 0, "listing_failed": 0,
                       "tenants_left_for_next_run": 0}
    versions = {v.name: v for v in catalogs.list("acme")[0]}
    assert versions["daily"].version == 2 and versions["daily"].entry().adapter is not None
    assert versions["enforced"].version == 1 and versions["on-demand"].version == 1
    # The next day, with no new outcome: nothing is written.
    again = refit_all(store.catalogs, catalogs, learning)
    assert again["written"] == 0 and catalogs.get("acme", "daily").version == 2
    # Out of time: the rest waits for the next run.
    late = refit_all(store.catalogs, catalogs, learning, deadline=lambda: 10.0)
    assert late["tenants_left_for_next_run"] == 1 and late["entries"] == 0

    monkeypatch.setenv("GATEWAY_SQLITE_PATH", str(store.catalogs.db.path))
    for name in ("GATEWAY_TENANTS_TABLE", "GATEWAY_KEYS_TABLE"):
        monkeypatch.delenv(name, raising=False)
    assert lambda_handler({"source": "aws.events"}, None)["entries"] == 2


def test_an_entry_written_before_learning_existed_keeps_its_hash():
    old = {"type": "noul", "instructions": "Is it fruit?"}
    entry = parse_content(json.dumps(old))
    assert "learning" not in entry.canonical() and "adapter" not in entry.canonical()


def test_one_large_tenant_never_holds_back_the_others_refits(monkeypatch):
    """On DynamoDB (moto), scaled a hundredfold: one tenant with many versions of many due
    entries and a long record history (every entry's refit reads it), two small tenants
    with one due entry each, and a run that has time for a few entries' reads. The small
    tenants' entries are refitted in the same run; listing the tenants and their due
    entries reads no version of any entry."""
    from gateway.decisions.records import ListedRecord
    from tests.gateway_helpers import dynamodb_tenant_store

    daily = {"type": "noul", "instructions": "Is it fruit?", "learning": {"keep_features": True, "refit": "daily"}}
    with dynamodb_tenant_store(monkeypatch, "big", "small-a", "small-b") as stores:
        catalogs = CatalogService(stores.catalogs)
        for entry in range(10):  # 100 versions (10,000 in the full-size case), 10 due entries
            for n in range(10):
                catalogs.put("big", f"entry-{entry}", parse_content(json.dumps({**daily, "instructions": f"{n}?"})))
        for tenant in ("small-a", "small-b"):
            catalogs.put(tenant, "fruit", parse_content(json.dumps(daily)))
        pad = "x" * 10_000
        far = 4_000_000_000.0
        for i in range(256):  # 2.56 MB of records (256 MB in the full-size case)
            stores.records.put_record("big", f"{i:024x}", 1.0, ["entry-0"], {"id": f"{i:024x}", "pad": pad}, far)

        clock = [0.0]  # seconds of the run used: reading the big history whole takes 300 s of a 900 s run
        scan = stores.records.scan_records

        def timed_scan(tenant_id, **kw) -> Iterator[ListedRecord]:
            for listed in scan(tenant_id, **kw):
                clock[0] += listed.size * 300 / 2_560_000
                yield listed

        monkeypatch.setattr(stores.records, "scan_records", timed_scan)
        calls: list[tuple[str, dict]] = []
        client = stores.catalogs.table.client
        for operation in ("scan", "query"):
            real = getattr(client, operation)

            def spy(real=real, operation=operation, **request):
                calls.append((operation, request))
                return real(**request)

            monkeypatch.setattr(client, operation, spy)
        refitted: list[tuple[str, str]] = []
        learning = LearningService(catalogs, stores.records)
        real_refit = learning.refit

        def tracked(tenant_id, name, *args, **kw):
            refitted.append((tenant_id, name))
            return real_refit(tenant_id, name, *args, **kw)

        monkeypatch.setattr(learning, "refit", tracked)
        summary = refit_all(stores.catalogs, catalogs, learning, deadline=lambda: 900 - clock[0])

    assert ("small-a", "fruit") in refitted and ("small-b", "fruit") in refitted
    assert summary["tenants"] == 3 and summary["tenants_left_for_next_run"] == 1 and summary["entries"] < 12
    assert clock[0] < 900 - 55  # no read ran past its share (by more than its last record) into the last minute
    listing = [request for operation, request in calls if operation == "scan"
               or request.get("IndexName") == "by_tenant"]
    assert listing and all(request.get("IndexName") == "by_tenant" for request in listing)


def test_a_tenants_due_entries_start_at_a_new_place_each_run_and_each_comes_once(store, monkeypatch):
    from gateway.functions import refits

    monkeypatch.setattr(refits, "NAMES_PAGE", 2)  # pages end inside each pass
    catalogs = CatalogService(store.catalogs)
    for name in ("a", "b", "c", "cc", "d", "e"):
        catalogs.put("acme", name, parse_content(json.dumps({"type": "noul", "instructions": "?",
                                                             "learning": {"refit": "daily"}})))
    names = refits._DueNames(store.catalogs, "acme", "c")
    assert list(iter(names.next, None)) == ["cc", "d", "e", "a", "b", "c"]
    names = refits._DueNames(store.catalogs, "acme", "z")
    assert list(iter(names.next, None)) == ["a", "b", "c", "cc", "d", "e"]
