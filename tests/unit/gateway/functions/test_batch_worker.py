"""The batch worker on a function's services: its creator asked again, and open batches served tenant by tenant."""

import time

import pytest

from devkit.fake_backend import UniformBackend
from devkit.gateway_stack import _installed_function, install
from gateway.auth.credentials import Principal
from gateway.auth.store import PrincipalRule
from gateway.batches.model import Batch
from gateway.errors import Forbidden
from gateway.functions.batch_worker import build_worker, by_tenant_in_turn
from tests.gateway_helpers import tenant_store

ROLE = "arn:aws:iam::123456789012:role/Batches"


def test_an_iam_creator_mapped_to_another_tenant_since_no_longer_runs_its_batch(tmp_path):
    store = tenant_store(tmp_path / "gateway.db", "acme", "globex")
    store.tenants.put_principal_rule(PrincipalRule(ROLE, "acme", ("decide",), None, time.time()))
    install(UniformBackend(), stores=store)
    worker = build_worker(_installed_function(), "w")
    creator = Principal("acme", frozenset({"decide"}), None, ROLE, iam=True, kind="iam")
    assert worker.check_principal(creator).tenant_id == "acme"
    store.tenants.put_principal_rule(PrincipalRule(ROLE, "globex", ("decide",), None, time.time()))
    with pytest.raises(Forbidden):
        worker.check_principal(creator)


def test_open_batches_are_served_tenant_by_tenant():
    def batch(batch_id: str, tenant: str) -> Batch:
        return Batch(batch_id, tenant, "/v1/systemone", "file-a", "24h", 0.0, 1.0, {})

    oldest_first = [batch("a1", "a"), batch("a2", "a"), batch("a3", "a"), batch("b1", "b"), batch("c1", "c")]
    assert [b.id for b in by_tenant_in_turn(oldest_first)] == ["a1", "b1", "c1", "a2", "a3"]
