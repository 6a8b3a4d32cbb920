"""A suspected prompt injection through the real handler, replaying the catalog events
(events/catalogs-*.json, as API Gateway sends them): the enforcing `support-routing`
entry, with no injection rule written, sends a confident answer to review when the
scorer suspects the state, and leaves it automatic when it does not. The scorer is the
fake that answers set probabilities (no model needed), the store a real SQLite file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from devkit.gateway_stack import install
from gateway.auth.authenticate import Authenticator
from gateway.auth.tokens import CachedKeyRing, new_key_document
from tests.fakes import FixedBackend
from tests.gateway_helpers import call, register_credentials, tenant_store

EVENTS = Path(__file__).resolve().parents[2] / "events"


def replay(name: str):
    ev = json.loads((EVENTS / f"{name}.json").read_text())
    return call(ev)


@pytest.mark.parametrize(("suspicion", "action"), [(0.9, "review"), (0.1, "auto")])
def test_an_enforcing_entry_routes_a_suspected_injection_to_review(tmp_path, suspicion, action):
    store = tenant_store(tmp_path / "g.db", "acme")
    backend = FixedBackend(choice={"billing": 0.95}, framing="spotlight",
                           injection={"suspicion": suspicion, "probe": suspicion, "patterns": [], "neutralised": []})
    document = new_key_document()
    install(backend, stores=store, authenticator=Authenticator(store, CachedKeyRing(lambda: document)))
    put = json.loads((EVENTS / "catalogs-1-put.json").read_text())
    register_credentials(store, put["requestContext"]["authorizer"])
    status, _, entry = replay("catalogs-1-put")
    assert status == 201 and entry["policy"]["mode"] == "enforcing" and "injection" not in entry["policy"]

    status, headers, body = replay("catalogs-3-systemone-ref")
    assert status == 200, body
    answer = body["answers"]["queue"]
    assert answer["x_action"] == action and answer["choice"] == "billing"  # review keeps the answer; a person checks it
    assert answer.get("x_action_reason") == ("injection_suspected" if action == "review" else None)
    assert body["x_injection"]["suspicion"] == suspicion and body["x_framing"] == "spotlight"
    record = store.records.get_record("acme", headers["x-decision-id"])
    assert record["injection"]["suspicion"] == suspicion and record["questions"][0]["action"] == action
