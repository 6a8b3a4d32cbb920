"""The use cases, called directly: the decide sequence (who may ask, tenant policy,
budget, the pool, the record) and the records one (outcomes, reads, tenant isolation).
A real SQLite store, the fake backend, an injected clock."""

from __future__ import annotations

from dataclasses import replace

import pytest

from devkit.gateway_stack import settings_for
from gateway.auth.credentials import Principal
from gateway.auth.tenant_cache import TenantCache
from gateway.auth.tenants import create_tenant, set_limits
from gateway.auth.tokens import CachedKeyRing, new_key_document
from gateway.catalogs.service import CatalogService
from gateway.decisions.model import Decision, Option, Question
from gateway.decisions.records import DecisionRecorder
from gateway.errors import Forbidden, InvalidRequest, NotFound, PayloadTooLarge, RateLimited, RecordNotStored
from gateway.functions.composition import build_registry, build_services
from gateway.services.decide import DecideService
from gateway.services.records import RecordsService
from gateway.services.tenant_tags import TenantTags
from systemone.sidechannel import TENANT_TAG_LENGTH, tenant_tag
from tests.fakes import FixedBackend, ManualClock
from tests.gateway_helpers import tenant_store

ACME = Principal("acme", frozenset({"decide"}), None, "k-acme")
GLOBEX = Principal("globex", frozenset({"decide"}), None, "k-globex")
QUEUE = Question(id="q0", kind="choice", instructions="Which queue?", name="queue",
                 options=(Option("billing", "billing", "payments"), Option("delivery", "delivery", None)))
DECISION = Decision("jev-latest", "I was charged twice.", (QUEUE,))


@pytest.fixture
def store(tmp_path):
    return tenant_store(tmp_path / "g.db", "acme", "globex")


def decide_service(store, backend, clock=None, records=True) -> DecideService:
    recorder = DecisionRecorder(store.records if records else None, None)
    return DecideService(build_registry(settings_for()), backend, recorder, catalogs=CatalogService(store.catalogs),
                         tenants=TenantCache(store.tenants), clock=clock or ManualClock(0.0))


def test_a_decision_is_asked_recorded_and_timed(store):
    backend, clock = FixedBackend(choice={"billing": 0.8}), ManualClock(0.0)
    service = decide_service(store, backend, clock)
    original = backend.invoke

    def slow(*args, **kwargs):  # the pool's call takes 0.25 s on the service's clock
        clock.advance(0.25)
        return original(*args, **kwargs)

    backend.invoke = slow
    result, decision_id = service.decide(ACME, DECISION, route="systemone", request_id="r-1")
    assert result.answers[0].probabilities == pytest.approx((0.8, 0.2))
    record = store.records.get_record("acme", decision_id)
    assert record["request_id"] == "r-1" and record["latency_ms"] == 250.0 and record["model_requested"] == "jev-latest"
    assert backend.calls[0][1]["model"] == "decision-default"  # the route's own name, never the alias


def test_a_model_outside_the_credential_is_unknown_before_anything_is_asked(store):
    backend = FixedBackend()
    limited = Principal("acme", frozenset({"decide"}), frozenset({"chat-default"}), "k")
    with pytest.raises(NotFound):
        decide_service(store, backend).decide(limited, DECISION, route="systemone")
    assert backend.calls == []


def test_tenant_policy_and_budget_refuse_before_the_backend(store):
    backend = FixedBackend()
    create_tenant(store.tenants, "acme", catalog_only=True)
    with pytest.raises(Forbidden):
        decide_service(store, backend).decide(ACME, DECISION, route="systemone")
    set_limits(store.tenants, "globex", max_request_tokens=256)
    many = Decision("jev-latest", "x" * 4000, (QUEUE,))
    with pytest.raises(PayloadTooLarge):
        decide_service(store, backend).decide(GLOBEX, many, route="systemone")
    assert backend.calls == []


def test_no_answer_without_its_record(store):
    class Unwritable:
        def put_record(self, *args):
            raise OSError("the table is unavailable")

    backend = FixedBackend()
    service = decide_service(store, backend)
    service.recorder.store, service.recorder.sleep = Unwritable(), lambda s: None
    with pytest.raises(RecordNotStored):
        service.decide(ACME, DECISION, route="systemone")
    assert len(backend.calls) == 1  # asked once, then refused to answer unrecorded


def test_outcomes_name_what_was_asked_by_either_id_and_stay_within_the_tenant(store):
    _, decision_id = decide_service(store, FixedBackend()).decide(ACME, DECISION, route="decisions")
    records = RecordsService(store.records, store.catalogs, clock=lambda: 2_000.0)
    with pytest.raises(InvalidRequest) as unknown:
        records.attach_outcome(ACME, decision_id, {"mood": True}, override=False, note=None)
    with pytest.raises(InvalidRequest) as undeclared:
        records.attach_outcome(ACME, decision_id, {"queue": "refunds"}, override=False, note=None)
    assert [d["type"] for d in unknown.value.details + undeclared.value.details] == ["unknown_question", "invalid_outcome"]
    with pytest.raises(NotFound):
        records.attach_outcome(GLOBEX, decision_id, {"queue": "billing"}, override=False, note=None)
    stored = records.attach_outcome(ACME, f"decision_{decision_id}", {"queue": "billing"}, override=True, note="ok")
    assert stored == {"answers": {"queue": "billing"}, "override": True, "note": "ok", "recorded_at": 2_000.0,
                      "recorded_by": "k-acme", "trains": False}  # no source: for drift only, never for an adapter
    assert records.get(ACME, decision_id)["outcome"] == stored
    assert [r["id"] for r in records.list_with_drift(ACME, catalog=None, limit=10)["records"]] == [decision_id]
    assert records.list_with_drift(GLOBEX, catalog=None, limit=10)["records"] == []


def test_records_not_configured_are_not_found_not_a_failure():
    with pytest.raises(NotFound, match="not configured"):
        RecordsService(None).get(ACME, "0" * 24)


def tagged_service(store, backend, document: str) -> DecideService:
    """A function instance's decide service, its tenant tags keyed by the records' key document."""
    service = decide_service(store, backend)
    service.tags = TenantTags(CachedKeyRing(lambda: document))
    return service


def test_each_call_says_whose_work_it_is_with_one_tag_per_tenant_on_every_function_instance(store):
    # Given two function instances over one records' key document, and acme weighted 3
    document, backend = new_key_document(), FixedBackend()
    set_limits(store.tenants, "acme", share_weight=3.0)
    first, second = tagged_service(store, backend, document), tagged_service(store, backend, document)
    # When acme asks on each instance, once for a long deadline, and globex asks once
    first.decide(ACME, DECISION, route="systemone", request_id="r-1")
    second.decide(ACME, DECISION, route="systemone", request_id="r-2", streaming=True, wait_s=40)
    first.decide(GLOBEX, DECISION, route="systemone")
    # Then acme's calls carry one tag on both instances, keyed (never its id, nor an unkeyed
    # hash of it), unlike globex's; its weight; and long work only past the ordinary deadline
    acme, acme_long, globex = backend.callers
    assert acme.tenant_tag == acme_long.tenant_tag != globex.tenant_tag
    assert len(acme.tenant_tag) == TENANT_TAG_LENGTH and "acme" not in acme.tenant_tag
    assert acme.tenant_tag != tenant_tag("acme", b"")
    assert (acme.request_id, acme.work, acme.weight) == ("r-1", "ordinary", 3.0)
    assert (acme_long.request_id, acme_long.work) == ("r-2", "long")
    assert (globex.work, globex.weight) == ("ordinary", 1.0)
    # And another deployment's key gives acme another tag
    tagged_service(store, backend, new_key_document()).decide(ACME, DECISION, route="systemone")
    assert backend.callers[-1].tenant_tag != acme.tenant_tag


def test_without_a_key_no_tag_is_sent_and_the_key_is_read_on_first_use_not_at_build(store, caplog):
    # Given a deployment with no records' key (tests, local fakes): its calls share the
    # scorer's untagged lane rather than carry a hash anyone could compute
    backend = FixedBackend()
    decide_service(store, backend).decide(ACME, DECISION, route="systemone")
    assert backend.callers[-1].tenant_tag == ""
    # Given a key ring that counts its reads, when the function is built (its init phase),
    # then the key is not read; a chat's first call reads it
    reads: list[int] = []
    document = new_key_document()
    ring = CachedKeyRing(lambda: reads.append(1) or document)
    services = build_services(settings_for(), backend, record_keys=ring)
    assert reads == []
    services.decide.chat(ACME, {"model": "chat-default", "messages": [{"role": "user", "content": "hi"}]})
    assert reads == [1] and backend.callers[-1].tenant_tag
    # And a key that cannot be read sends the call to the shared lane, its log naming no tenant
    broken = tagged_service(store, backend, "not a key document")
    broken.decide(ACME, DECISION, route="systemone")
    assert backend.callers[-1].tenant_tag == ""
    [logged] = [r for r in caplog.records if r.name == "gateway.tenant_tags"]
    assert "shared lane" in logged.getMessage() and "acme" not in str(vars(logged))


def test_a_minute_of_endpoint_time_too_short_for_an_attempt_is_429_naming_it_never_an_outage(store):
    # Given a tenant whose endpoint time a minute (0.3 s, written to the store before the
    # operator's minimum existed) caps every deadline below what an attempt needs
    tenant = store.tenants.get_tenant("acme")
    store.tenants.put_tenant(replace(tenant, limits=replace(tenant.limits, endpoint_seconds_per_minute=0.3)))
    backend = FixedBackend()
    service = decide_service(store, backend)
    # When it asks a decision or a chat, then each is 429 naming both figures (not a 503 that
    # looks like an outage), before any backend call
    chat = {"model": "chat-default", "messages": [{"role": "user", "content": "hi"}]}
    for ask in (lambda: service.decide(ACME, DECISION, route="systemone"), lambda: service.chat(ACME, chat)):
        with pytest.raises(RateLimited) as raised:
            ask()
        assert raised.value.status == 429 and "0.3 s of model endpoint time a minute" in raised.value.message
        assert "at least 5 s" in raised.value.message
    assert backend.calls == []
    # And at the minimum, the deadline is the minute's figure and the decision is answered
    set_limits(store.tenants, "acme", endpoint_seconds_per_minute=5.0)
    service = decide_service(store, backend)  # a tenant cache that has not read the old figure
    assert service.deadline("acme", service.registry.route_for("jev-latest", "decisions").pool, False, None) == 5.0
    service.decide(ACME, DECISION, route="systemone")


def test_a_tag_key_is_derived_once_per_ring_key_and_a_rotation_gives_new_tags():
    # Given a ring whose current key rotates
    class Ring:
        key = b"k1" * 16

        def current(self):
            return "kid", self.key

    ring = Ring()
    tags = TenantTags(ring)
    first = tags.tag("acme")
    # Then the same key gives the same tag (from the derived key kept), and another tenant another
    assert tags.tag("acme") == first != tags.tag("globex")
    # And a rotation gives every tenant a new tag, never the old derived key's
    ring.key = b"k2" * 16
    assert tags.tag("acme") not in (first, "") and tags.tag("acme") == TenantTags(ring).tag("acme")
