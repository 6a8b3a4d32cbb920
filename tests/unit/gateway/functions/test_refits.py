"""The scheduled refit over a real SQLite store: which entries it refits, what it writes."""

from __future__ import annotations

import json

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
    assert summary == {"tenants": 1, "entries": 2, "written": 1, "unchanged": 1, "failed": 0, "left_for_next_run": 0}
    versions = {v.name: v for v in catalogs.list("acme")}
    assert versions["daily"].version == 2 and versions["daily"].entry().adapter is not None
    assert versions["enforced"].version == 1 and versions["on-demand"].version == 1
    # The next day, with no new outcome: nothing is written.
    again = refit_all(store.catalogs, catalogs, learning)
    assert again["written"] == 0 and catalogs.get("acme", "daily").version == 2
    # Out of time: the rest waits for the next run.
    late = refit_all(store.catalogs, catalogs, learning, deadline=lambda: 10.0)
    assert late["left_for_next_run"] == 2 and late["entries"] == 0

    monkeypatch.setenv("GATEWAY_SQLITE_PATH", str(store.catalogs.db.path))
    for name in ("GATEWAY_TENANTS_TABLE", "GATEWAY_KEYS_TABLE"):
        monkeypatch.delenv(name, raising=False)
    assert lambda_handler({"source": "aws.events"}, None)["entries"] == 2


def test_an_entry_written_before_learning_existed_keeps_its_hash():
    old = {"type": "noul", "instructions": "Is it fruit?"}
    entry = parse_content(json.dumps(old))
    assert "learning" not in entry.canonical() and "adapter" not in entry.canonical()
