"""One contract per store interface, two storages: the embedded SQLite file and DynamoDB
(through moto; batches with S3). Each test takes the store of the interface it checks; what
only one storage does is tested beside it (tests/unit/gateway/stores/)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gateway.auth.store import ApiKeyRecord, PrincipalRule, Tenant
from gateway.batches.model import Batch, Line, LineUsage, StoredFile, Upload, UploadPart
from gateway.catalogs.model import CatalogVersion, content_hash
from gateway.catalogs.store import TooManyEntries, VersionTaken


@pytest.fixture(params=["sqlite", "dynamodb"])
def stores(request, tmp_path, monkeypatch):
    if request.param == "sqlite":
        from gateway.stores.sqlite import open_sqlite

        yield open_sqlite(tmp_path / "gateway.db")
        return
    from tests.gateway_helpers import dynamodb_tenant_store

    with dynamodb_tenant_store(monkeypatch) as stores:
        yield stores


def key(key_id: str, tenant: str = "acme", created_at: float = 1.0, **kw) -> ApiKeyRecord:
    return ApiKeyRecord(key_id=key_id, tenant_id=tenant, key_hash="h" * 64, scopes=("decide",), models=None,
                        created_at=created_at, **kw)


@pytest.fixture
def tenants(stores):
    stores.tenants.put_tenant(Tenant("acme", "Acme", 1.0))
    stores.tenants.put_tenant(Tenant("globex", "Globex", 2.0))
    return stores.tenants


@pytest.fixture
def counters(stores):
    return stores.counters


@pytest.fixture
def idempotency(stores):
    return stores.idempotency


@pytest.fixture
def catalogs(stores):
    return stores.catalogs


@pytest.fixture
def records(stores):
    return stores.records


def test_tenants_round_trip(tenants):
    assert tenants.get_tenant("acme") == Tenant("acme", "Acme", 1.0)
    assert tenants.get_tenant("nobody") is None


def test_principal_rules_round_trip_replace_and_delete(tenants):
    arn = "arn:aws:iam::123456789012:role/Ops"
    tenants.put_principal_rule(PrincipalRule(arn, "acme", ("decide",), ("decision-default",), 5.0))
    assert tenants.get_principal_rule(arn) == PrincipalRule(arn, "acme", ("decide",), ("decision-default",), 5.0)
    tenants.put_principal_rule(PrincipalRule(arn, "acme", ("decide", "admin"), None, 5.0))
    assert tenants.get_principal_rule(arn).scopes == ("decide", "admin") and tenants.get_principal_rule(arn).models is None
    assert tenants.delete_principal_rule(arn) and not tenants.delete_principal_rule(arn)
    assert tenants.get_principal_rule(arn) is None


def test_api_keys_are_never_overwritten(tenants):
    tenants.put_api_key(key("k1", expires_at=100.0))
    with pytest.raises(ValueError, match="exists"):
        tenants.put_api_key(key("k1", tenant="globex"))
    assert tenants.get_api_key("k1") == key("k1", expires_at=100.0)
    assert tenants.get_api_key("k2") is None


def test_keys_are_listed_per_tenant_only(tenants):
    tenants.put_api_key(key("a1", created_at=1.0))
    tenants.put_api_key(key("a2", created_at=2.0))
    tenants.put_api_key(key("g1", tenant="globex"))
    assert [k.key_id for k in tenants.list_api_keys("acme")] == ["a1", "a2"]
    assert [k.key_id for k in tenants.list_api_keys("globex")] == ["g1"]


def test_revocation_happens_once_and_touch_records_use(tenants):
    tenants.put_api_key(key("k1"))
    assert tenants.revoke_api_key("k1", 7.0) and not tenants.revoke_api_key("k1", 8.0)
    assert tenants.get_api_key("k1").revoked_at == 7.0
    assert not tenants.revoke_api_key("missing", 7.0)
    tenants.touch_api_key("k1", 9.5)
    assert tenants.get_api_key("k1").last_used_at == 9.5
    tenants.touch_api_key("missing", 9.5)  # no error, and no record appears
    assert tenants.get_api_key("missing") is None


def test_a_revoked_token_is_found_by_its_tenant_and_id_until_it_expires(tenants):
    tenants.revoke_token("t1", "acme", expires_at=100.0)
    tenants.revoke_token("t2", "globex", expires_at=200.0)
    tenants.revoke_token("t1", "acme", expires_at=100.0)  # twice is once
    assert tenants.token_revoked("acme", "t1", now=50.0) and tenants.token_revoked("globex", "t2", now=50.0)
    assert not tenants.token_revoked("globex", "t1", now=50.0)  # another tenant cannot revoke acme's token by its id
    assert not tenants.token_revoked("acme", "t1", now=150.0) and tenants.token_revoked("globex", "t2", now=150.0)


def test_not_before_keeps_the_latest_time(tenants):
    assert tenants.not_before("tenant:acme") is None
    tenants.set_not_before("tenant:acme", 100.0)
    tenants.set_not_before("tenant:acme", 50.0)  # an earlier time never replaces a later one
    assert tenants.not_before("tenant:acme") == 100.0 and tenants.not_before("tenant:globex") is None
    tenants.set_not_before("tenant:acme", 150.0)
    assert tenants.not_before("tenant:acme") == 150.0


def test_a_counter_counts_up_to_its_limit_and_no_further(counters):
    assert [counters.count_within("mints:acme:1", 3, 4e9) for _ in range(5)] == [True, True, True, False, False]
    assert counters.count_within("mints:globex:1", 3, 4e9)  # its own counter


def test_places_are_held_up_to_their_limit_and_given_back(counters):
    # Given a limit of 2 places, a third holder is refused until one gives its place back;
    # another name has places of its own; giving back a place one does not hold is harmless.
    assert counters.hold("inflight:acme", "a", 2, 2000.0, 1000.0)
    assert counters.hold("inflight:acme", "b", 2, 2000.0, 1000.0)
    assert not counters.hold("inflight:acme", "c", 2, 2000.0, 1000.0)
    assert counters.hold("inflight:globex", "c", 2, 2000.0, 1000.0)
    counters.release("inflight:acme", "a")
    counters.release("inflight:acme", "nobody")
    assert counters.hold("inflight:acme", "c", 2, 2000.0, 1000.0)
    assert not counters.hold("inflight:acme", "d", 2, 2000.0, 1000.0)


def test_a_place_whose_holder_died_is_free_once_it_expired(counters):
    # A function that died holding a place never gives it back: it must not leak the limit.
    assert counters.hold("inflight:acme", "dead", 1, 1030.0, 1000.0)
    assert not counters.hold("inflight:acme", "next", 1, 1060.0, 1029.0)
    assert counters.hold("inflight:acme", "next", 1, 1060.0, 1031.0)


def test_an_idempotent_request_is_claimed_once_then_replayed_within_its_window(idempotency):
    from gateway.decisions.idempotency import Entry

    # Given a first claim, a second caller sees it running; once finished, its reply.
    assert idempotency.claim_request("acme", "k1", "fp", 1060.0, 1000.0) is None
    assert idempotency.claim_request("acme", "k1", "fp", 1060.0, 1001.0) == Entry("fp", None)
    assert idempotency.claim_request("globex", "k1", "fp", 1060.0, 1001.0) is None  # another tenant's key
    idempotency.finish_request("acme", "k1", "fp", b"\x1f\x8breply", 90_000.0)
    assert idempotency.claim_request("acme", "k1", "other", 1060.0, 1002.0) == Entry("fp", b"\x1f\x8breply")
    # A dropped claim (its request failed) frees the key; a finished one is never dropped.
    idempotency.drop_request("globex", "k1", "fp")
    assert idempotency.claim_request("globex", "k1", "fp2", 1060.0, 1003.0) is None
    idempotency.drop_request("acme", "k1", "fp")
    assert idempotency.claim_request("acme", "k1", "fp", 1060.0, 1004.0) == Entry("fp", b"\x1f\x8breply")


def test_an_expired_idempotency_entry_is_claimed_afresh(idempotency):
    # A claim whose function died, or a reply past its window, does not hold the key.
    assert idempotency.claim_request("acme", "k2", "fp", 1030.0, 1000.0) is None
    assert idempotency.claim_request("acme", "k2", "fp3", 1090.0, 1031.0) is None
    # The first request, whose claim expired, ends late: it neither finishes nor drops the new claim.
    idempotency.finish_request("acme", "k2", "fp", b"late", 90_000.0)
    idempotency.drop_request("acme", "k2", "fp")
    from gateway.decisions.idempotency import Entry

    assert idempotency.claim_request("acme", "k2", "fp3", 1090.0, 1032.0) == Entry("fp3", None)
    idempotency.finish_request("acme", "k2", "fp3", b"r", 1100.0)
    assert idempotency.claim_request("acme", "k2", "fp4", 1200.0, 1101.0) is None


def test_a_last_use_recorded_for_a_key_that_does_not_exist_makes_no_key(tenants):
    # The functions may only touch a key's last use; where no key exists, that write must not
    # leave something that reads as a key (or breaks the read of one).
    tenants.touch_api_key("0123456789abcdef", 1.7e9)
    assert tenants.get_api_key("0123456789abcdef") is None


def test_a_tenants_limits_are_stored_with_it(tenants):
    from dataclasses import replace

    from gateway.auth.store import DEFAULT_LIMITS

    assert tenants.get_tenant("acme").limits == DEFAULT_LIMITS
    limits = replace(DEFAULT_LIMITS, rate_per_s=2.5, burst=5, max_options=64, max_in_flight=3,
                     usage_key="usage-key-acme-0000000000")
    tenants.put_tenant(Tenant("acme", "Acme", 1.0, limits=limits))
    assert tenants.get_tenant("acme").limits == limits


def version(tenant: str, name: str, n: int, content: str = '{"type":"noul","instructions":"x"}',
            enforcing_since: int | None = None) -> CatalogVersion:
    return CatalogVersion(tenant, name, n, content_hash(content), content, float(n), enforcing_since=enforcing_since)


def insert(catalogs, v: CatalogVersion, expire: dict[int, float] | None = None, max_entries: int = 10) -> None:
    catalogs.insert_catalog_version(v, replaces=v.version - 1, expire=expire or {}, max_entries=max_entries)


DAILY = '{"type":"noul","instructions":"x","learning":{"refit":"daily"}}'


def test_catalog_versions_are_immutable_and_scoped_by_tenant(catalogs):
    insert(catalogs, version("acme", "routing", 1))
    insert(catalogs, version("acme", "routing", 2, '{"type":"noul","instructions":"y"}'))
    insert(catalogs, version("acme", "spam", 1))
    insert(catalogs, version("globex", "routing", 1))
    with pytest.raises(VersionTaken):
        insert(catalogs, version("acme", "routing", 2, '{"type":"noul","instructions":"z"}'))
    with pytest.raises(VersionTaken):  # the latest is 2: a writer that read 1 lost the race
        catalogs.insert_catalog_version(version("acme", "routing", 3), replaces=1, expire={}, max_entries=10)
    assert catalogs.get_catalog_version("acme", "routing", 2).content == '{"type":"noul","instructions":"y"}'
    assert catalogs.latest_catalog_version("acme", "routing").version == 2
    assert catalogs.get_catalog_version("globex", "routing", 2) is None
    assert catalogs.get_catalog_version("acme", "routing", 0) is None
    assert [v.version for v in catalogs.list_catalog_versions("acme", "routing")] == [1, 2]
    assert [v.version for v in catalogs.list_catalog_versions("acme", "routing", after=1)] == [2]
    assert [v.version for v in catalogs.list_catalog_versions("acme", "routing", limit=1)] == [1]
    assert catalogs.list_catalog_versions("acme", "routing", after=2) == []
    assert [(v.name, v.version) for v in catalogs.list_catalogs("acme")] == [("routing", 2), ("spam", 1)]
    assert next(iter(catalogs.list_catalogs("acme"))).content == '{"type":"noul","instructions":"y"}'  # the latest, whole
    assert [(v.name, v.version) for v in catalogs.list_catalogs("globex")] == [("routing", 1)]
    assert catalogs.latest_catalog_version("acme", "nothing") is None
    assert sorted(catalogs.list_catalog_tenants()) == ["acme", "globex"]  # each once, however many entries and versions
    assert catalogs.count_catalogs("acme") == 2 and catalogs.count_catalogs("initech") == 0


def test_a_replaced_version_expires_and_the_count_deletes_the_oldest_but_those_kept(catalogs):
    import time as clock

    past, future = clock.time() - 1, clock.time() + 3600
    insert(catalogs, version("acme", "routing", 1))
    insert(catalogs, version("acme", "routing", 2, '{"type":"noul","instructions":"y"}'), expire={1: past})
    insert(catalogs, version("acme", "routing", 3, '{"type":"noul","instructions":"z"}'), expire={2: future})
    assert catalogs.get_catalog_version("acme", "routing", 1) is None  # expired, whatever the TTL's lag
    assert [v.version for v in catalogs.list_catalog_versions("acme", "routing")] == [2, 3]
    assert catalogs.get_catalog_version("acme", "routing", 2).expires_at == future
    assert catalogs.latest_catalog_version("acme", "routing").expires_at is None
    # A decision that names version 2 keeps it as long as its record; never shortened.
    catalogs.extend_catalog_version("acme", "routing", 2, future + 60)
    catalogs.extend_catalog_version("acme", "routing", 2, future - 60)
    catalogs.extend_catalog_version("acme", "routing", 3, future)  # the latest does not expire
    assert catalogs.get_catalog_version("acme", "routing", 2).expires_at == future + 60
    assert catalogs.latest_catalog_version("acme", "routing").expires_at is None
    for n in range(4, 8):
        insert(catalogs, version("acme", "routing", n, f'{{"type":"noul","instructions":"{n}"}}'))
    catalogs.delete_catalog_versions("acme", "routing", below=6, keep={3})
    assert [v.version for v in catalogs.list_catalog_versions("acme", "routing")] == [3, 6, 7]
    assert catalogs.latest_catalog_version("acme", "routing").version == 7


def test_an_entry_past_the_tenants_count_is_refused_and_nothing_is_written(catalogs):
    insert(catalogs, version("acme", "a", 1), max_entries=2)
    insert(catalogs, version("acme", "b", 1), max_entries=2)
    with pytest.raises(TooManyEntries) as refused:
        insert(catalogs, version("acme", "c", 1), max_entries=2)
    assert refused.value.count == 2
    assert catalogs.latest_catalog_version("acme", "c") is None and catalogs.count_catalogs("acme") == 2
    insert(catalogs, version("acme", "a", 2, '{"type":"noul","instructions":"y"}'), max_entries=2)  # a version: no new entry
    insert(catalogs, version("globex", "c", 1), max_entries=2)  # another tenant's count


def test_the_entries_due_for_a_refit_come_from_their_latest_versions_a_page_at_a_time(catalogs):
    for name in ("a", "b", "c", "d"):
        insert(catalogs, version("acme", name, 1, DAILY))
    insert(catalogs, version("acme", "b", 2))  # no longer daily
    insert(catalogs, version("acme", "e", 1))  # never
    insert(catalogs, version("globex", "a", 1, DAILY))
    assert catalogs.due_refits("acme", "", 2) == ["a", "c"]
    assert catalogs.due_refits("acme", "c", 2) == ["d"]
    assert catalogs.due_refits("acme", "d", 2) == []
    assert catalogs.due_refits("globex", "", 10) == ["a"]


def listed(records, tenant: str, **kw) -> list[tuple[str, str | None]]:
    """(record id, the body's id or None when read but not a match) for each record the store
    reads, but an expired one (DynamoDB reads one, as no match, until its TTL removes it)."""
    return [(r.record_id, r.record and r.record["id"]) for r in records.scan_records(tenant, **kw)
            if r.record is not None or r.record_id != "old"]


def test_records_are_per_tenant_newest_first_filterable_and_take_an_outcome(records):
    import time as clock

    far = clock.time() + 3600
    from gateway.decisions.records import record_item_bytes

    size = records.put_record("acme", "r1", 1.0, ["routing"], {"id": "r1"}, far)
    assert size == record_item_bytes("acme", "r1", ["routing"], '{"id": "r1"}')  # what the tenant's usage counts
    records.put_record("acme", "r2", 2.0, ["routing", "spam"], {"id": "r2"}, far)
    records.put_record("acme", "r3", 3.0, [], {"id": "r3"}, far)
    records.put_record("acme", "old", 0.5, ["routing"], {"id": "old"}, clock.time() - 1)
    records.put_record("globex", "g1", 1.0, ["routing"], {"id": "g1"}, far)
    assert listed(records, "acme") == [("r3", "r3"), ("r2", "r2"), ("r1", "r1")]
    # A filtered list still reads every record, the ones it skips without their bodies.
    assert listed(records, "acme", catalog="routing") == [("r3", None), ("r2", "r2"), ("r1", "r1")]
    assert listed(records, "acme", since=2.0) == [("r3", "r3"), ("r2", "r2"), ("r1", None)]
    assert listed(records, "acme", before="r3") == [("r2", "r2"), ("r1", "r1")]
    assert records.get_record("acme", "g1") is None and records.get_record("acme", "old") is None
    assert records.get_record("acme", "r1") == {"id": "r1", "outcome": None}
    assert records.set_outcome("acme", "r1", {"expected": {"q": "billing"}})
    assert not records.set_outcome("globex", "r1", {"expected": {}}) and not records.set_outcome("acme", "nope", {})
    assert records.get_record("acme", "r1")["outcome"] == {"expected": {"q": "billing"}}
    # What reading a record costs: its stored texts, the outcome's included.
    sizes = {r.record_id: r.size for r in records.scan_records("acme") if r.record_id != "old"}
    assert sizes == {"r3": len('{"id": "r3"}'), "r2": len('{"id": "r2"}'),
                     "r1": len('{"id": "r1"}') + len('{"expected": {"q": "billing"}}')}
    # An outcome that trains is left as it is by a write told to keep it, in that write itself.
    from gateway.decisions.records import OutcomeTrains

    assert records.set_outcome("acme", "r2", {"answers": {"q": True}, "trains": False}, keep_training=True)
    assert records.set_outcome("acme", "r2", {"answers": {"q": True}, "trains": True}, keep_training=True)
    with pytest.raises(OutcomeTrains):
        records.set_outcome("acme", "r2", {"answers": {"q": False}, "trains": False}, keep_training=True)
    assert records.get_record("acme", "r2")["outcome"] == {"answers": {"q": True}, "trains": True}
    assert not records.set_outcome("acme", "nope", {}, keep_training=True)
    assert records.set_outcome("acme", "r2", {"answers": {"q": False}, "trains": True})  # a trainer's write


def _outcome_of(size: int, body: dict, catalogs: list[str], record_id: str = "big") -> dict:
    """An outcome that makes the record take exactly `size` bytes (record_item_bytes)."""
    import json

    from gateway.decisions.records import record_item_bytes

    base = record_item_bytes("acme", record_id, catalogs, json.dumps(body), json.dumps({"note": ""}))
    return {"note": "n" * (size - base)}


def test_a_record_with_its_outcome_is_held_to_one_dynamodb_item(records):
    import time as clock

    from gateway.decisions.records import MAX_RECORD_ITEM_BYTES, RecordTooLarge

    # Given a record of 300 KB, the most a decision's estimate lets through, with an outcome attached
    far = clock.time() + 3600
    body = {"id": "big", "questions": [{"name": "q" * 700, "kind": "noul"} for _ in range(400)]}
    records.put_record("acme", "big", 1.0, ["routing"], body, far)
    assert records.set_outcome("acme", "big", {"answers": {"first": True}})
    # When an outcome would take the record one byte past the item limit, it is refused with
    # the figures, and the record keeps the outcome it had
    with pytest.raises(RecordTooLarge) as refused:
        records.set_outcome("acme", "big", _outcome_of(MAX_RECORD_ITEM_BYTES + 1, body, ["routing"]))
    assert refused.value.status == 413 and refused.value.size == MAX_RECORD_ITEM_BYTES + 1
    assert f"{MAX_RECORD_ITEM_BYTES + 1} bytes" in refused.value.message and str(MAX_RECORD_ITEM_BYTES) in refused.value.message
    assert records.get_record("acme", "big")["outcome"] == {"answers": {"first": True}}
    # Then one that fits exactly is attached
    assert records.set_outcome("acme", "big", _outcome_of(MAX_RECORD_ITEM_BYTES, body, ["routing"]))
    assert len(records.get_record("acme", "big")["outcome"]["note"]) > 90_000
    # And a missing record is still just missing, however large the outcome
    assert not records.set_outcome("acme", "nope", _outcome_of(MAX_RECORD_ITEM_BYTES + 1, body, ["routing"]))


def test_a_record_too_large_for_one_item_is_refused_and_not_written(records):
    import time as clock

    from gateway.decisions.records import RecordTooLarge

    body = {"id": "huge", "questions": [{"name": "q" * 1100, "kind": "noul"} for _ in range(400)]}
    with pytest.raises(RecordTooLarge) as refused:
        records.put_record("acme", "huge", 1.0, [], body, clock.time() + 3600)
    assert refused.value.status == 413 and refused.value.size > 400 * 1024
    assert records.get_record("acme", "huge") is None and listed(records, "acme") == []


def test_a_tally_adds_while_under_its_limit_and_settles_either_way(counters):
    # Given a limit of 100, additions are admitted while the tally is under it (so the last
    # one admitted may pass it), then refused; a settlement (no limit) always applies.
    assert [counters.add_within("spend:acme:2026-12", 40, 100, 4e9) for _ in range(4)] == [True, True, True, False]
    assert counters.tally("spend:acme:2026-12") == 120
    assert counters.add_within("spend:acme:2026-12", -70, None, 4e9)
    assert counters.tally("spend:acme:2026-12") == 50
    assert counters.add_within("spend:acme:2026-12", 40, 100, 4e9)
    assert counters.tally("spend:globex:2026-12") == 0  # its own tally


def test_usage_rows_add_up_by_day_and_entry_and_stay_with_their_tenant(counters):
    from gateway.auth.store import UsageRow

    counters.add_usage("acme", UsageRow("2026-12-01", "routing", 1, 500, 1200, input_tokens=900, cached_tokens=0), 4e9)
    counters.add_usage("acme", UsageRow("2026-12-01", "routing", 1, 300, 800, input_tokens=950, cached_tokens=880), 4e9)
    counters.add_usage("acme", UsageRow("2026-12-01", "routing", 0, 0, 0, 4096), 4e9)  # a version written
    counters.add_usage("acme", UsageRow("2026-12-01", "(inline)", 1, 7, 9), 4e9)
    counters.add_usage("acme", UsageRow("2026-12-03", "routing", 2, 1, 2), 4e9)
    counters.add_usage("globex", UsageRow("2026-12-01", "routing", 1, 99, 99), 4e9)
    assert counters.usage("acme", "2026-12-01", "2026-12-02") == [
        UsageRow("2026-12-01", "(inline)", 1, 7, 9), UsageRow("2026-12-01", "routing", 2, 800, 2000, 4096, 1850, 880)]
    assert [r.day for r in counters.usage("acme", "2026-11-30", "2026-12-03")] == ["2026-12-01"] * 2 + ["2026-12-03"]
    assert counters.usage("acme", "2026-12-02", "2026-12-02") == []


@pytest.mark.parametrize("value", [float("nan"), float("inf"), {True}, {1, "a"}, set(), {1: "x"}, object()])
def test_the_dynamodb_codec_refuses_what_dynamodb_cannot_store(value):
    from gateway.stores.dynamodb.items import typed

    with pytest.raises(TypeError):
        typed(value)


def test_a_page_of_catalog_versions_reads_no_more_versions_than_it_returns():
    # Given a history whose pages DynamoDB cuts at what was asked (a 1 MB page can hold fewer)
    from gateway.stores.dynamodb import DynamoDBTables, dynamodb_stores

    class Pages:
        def __init__(self) -> None:
            self.limits = []

        def query(self, **request):
            self.limits.append(request.get("Limit"))
            start = int(request.get("ExclusiveStartKey", {}).get("version", {}).get("N", 0))
            taken = range(start + 1, start + 1 + min(request["Limit"], 15))  # at most 15 per page
            items = [{"pk": {"S": "acme#routing"}, "version": {"N": str(n)}, "tenant_id": {"S": "acme"},
                      "name": {"S": "routing"}, "content_hash": {"S": "h"}, "content": {"S": "{}"},
                      "created_at": {"N": "1"}} for n in taken]
            return {"Items": items, "LastEvaluatedKey": {"version": {"N": str(taken[-1])}}}

    client = Pages()
    catalogs = dynamodb_stores(client, DynamoDBTables("t", "k", catalogs="c")).catalogs
    # When a caller pages 21 of them, then the pages ask for 21, then the 6 still wanted
    assert [v.version for v in catalogs.list_catalog_versions("acme", "routing", limit=21)] == list(range(1, 22))
    assert client.limits == [21, 6]


def test_a_sqlite_file_written_before_versions_expired_gains_the_columns_and_its_daily_entries(tmp_path):
    import sqlite3

    from gateway.stores.sqlite import open_sqlite

    path = tmp_path / "old.db"
    with sqlite3.connect(path) as db:  # the table as it was
        db.execute("CREATE TABLE catalog_versions (tenant_id TEXT NOT NULL, name TEXT NOT NULL, version INTEGER NOT NULL,"
                   " content_hash TEXT NOT NULL, content TEXT NOT NULL, created_at REAL NOT NULL,"
                   " PRIMARY KEY (tenant_id, name, version))")
        db.execute("INSERT INTO catalog_versions VALUES ('acme', 'a', 1, 'h', ?, 1.0)", (DAILY,))
        db.execute("INSERT INTO catalog_versions VALUES ('acme', 'a', 2, 'h2', ?, 2.0)", (DAILY,))
    catalogs = open_sqlite(path).catalogs
    assert catalogs.due_refits("acme", "", 10) == ["a"]
    assert catalogs.latest_catalog_version("acme", "a").expires_at is None
    assert catalogs.get_catalog_version("acme", "a", 1).expires_at is not None  # replaced before: it expires too


def test_a_sqlite_file_from_before_the_token_figures_reads_and_adds_them(tmp_path):
    # A gateway.db written before usage counted stored bytes and tokens: its rows read with 0
    # for them, and new additions count them.
    import sqlite3

    from gateway.auth.store import UsageRow
    from gateway.stores.sqlite import open_sqlite

    path = tmp_path / "old.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE usage (tenant_id TEXT NOT NULL, day TEXT NOT NULL, entry TEXT NOT NULL,"
                   " requests INTEGER NOT NULL, cost_nano_usd INTEGER NOT NULL, endpoint_ms INTEGER NOT NULL,"
                   " expires_at REAL NOT NULL, PRIMARY KEY (tenant_id, day, entry))")
        db.execute("INSERT INTO usage VALUES ('acme', '2026-12-01', 'routing', 3, 30, 300, 4e9)")
    counters = open_sqlite(path).counters
    counters.add_usage("acme", UsageRow("2026-12-01", "routing", 1, 5, 50, 7, 1200, 1000), 4e9)
    assert counters.usage("acme", "2026-12-01", "2026-12-01") == [UsageRow("2026-12-01", "routing", 4, 35, 350, 7,
                                                                            1200, 1000)]


# -- batches: files, uploads, batches and their ledgers (SQLite with a folder; DynamoDB with S3) --


@pytest.fixture
def batches(stores):
    return stores.batches


def file(file_id: str, tenant: str = "acme", created_at: float = 1.0, purpose: str = "batch") -> StoredFile:
    return StoredFile(file_id, tenant, "in.jsonl", purpose, 0, created_at)


def test_files_list_newest_first_a_page_at_a_time_and_by_purpose(batches):
    for i in range(5):
        batches.put_file(file(f"file-{i}", created_at=float(i), purpose="batch" if i % 2 else "batch_output"), [b"x"])
    assert [f.id for f in batches.list_files("acme", None, None, 2, True)] == ["file-4", "file-3"]
    assert [f.id for f in batches.list_files("acme", None, "file-3", 2, True)] == ["file-2", "file-1"]
    assert [f.id for f in batches.list_files("acme", "batch", None, 10, False)] == ["file-1", "file-3"]
    batches.put_file(replace(file("file-out", created_at=9.0), scope="decide"), [b"x"])
    assert "file-out" not in [f.id for f in batches.list_files("acme", None, None, 10, True, scopes={"chat"})]
    assert "file-out" in [f.id for f in batches.list_files("acme", None, None, 10, True, scopes={"decide"})]
    assert batches.holdings("acme") == (6, 6) and batches.holdings("globex") == (0, 0)


def test_a_pending_upload_counts_at_the_size_it_was_created_for_and_a_cancelled_one_at_nothing(batches):
    upload = Upload("upload_a", "acme", "x", "batch", 1000, "text/plain", 1.0, 10.0)
    batches.put_upload(upload)
    batches.add_part(upload, UploadPart("part_a", "upload_a", 2, 1.0), b"ab")
    assert batches.holdings("acme") == (1000, 1)
    assert batches.set_upload(replace(upload, status="cancelled"), "pending")
    assert batches.holdings("acme") == (0, 0) and batches.parts("upload_a") == []


def test_an_ended_batchs_ledger_is_dropped_and_its_batch_kept(batches):
    ended = batch()
    batches.put_batch(ended)
    ended.status = "in_progress"
    batches.add_lines(ended, [Line("batch_a", 0, "c", "{}")], "validating")
    ended.status = "completed"
    assert batches.update_batch(ended, "in_progress") and batches.open_batches() == []
    batches.drop_lines("batch_a")
    assert list(batches.unfinished_lines("batch_a")) == [] and batches.get_batch("acme", "batch_a").status == "completed"


def batch(batch_id: str = "batch_a") -> Batch:
    return Batch(batch_id, "acme", "/v1/systemone", "file-a", "24h", 1.0, 100.0, {})


def test_a_lease_is_one_owners_until_it_lapses(batches):
    batches.put_batch(batch())
    assert batches.lease("batch_a", "one", 10.0, 0.0) and batches.lease("batch_a", "one", 20.0, 5.0)
    assert not batches.lease("batch_a", "two", 30.0, 19.0)
    assert batches.lease("batch_a", "two", 30.0, 20.0)


def test_a_batch_changes_only_from_the_status_it_was_read_with(batches):
    batches.put_batch(batch())
    changed = batch()
    changed.status = "cancelling"
    assert batches.update_batch(changed, "validating") and not batches.update_batch(changed, "validating")
    assert not batches.add_lines(changed, [Line("batch_a", 0, "c", "{}")], "validating")
    assert list(batches.unfinished_lines("batch_a")) == []


def test_a_line_is_counted_once_however_often_it_is_finished(batches):
    started = batch()
    batches.put_batch(started)
    started.status = "in_progress"
    assert batches.add_lines(started, [Line("batch_a", n, f"c{n}", "{}") for n in range(3)], "validating")
    line = batches.runnable_lines("batch_a", 0.0, 1)[0]
    line.state, line.reply = "done", '{"status_code": 200, "body": {}}'
    for _ in range(2):
        batches.finish_line(line, LineUsage(10, 2, 4, 0.5))
    again = batches.get_batch("acme", "batch_a")
    assert (again.completed, again.failed, again.usage["input_tokens"], again.cost_usd) == (1, 0, 10, 0.5)
    assert [ln.number for ln in batches.unfinished_lines("batch_a")] == [1, 2]
    assert [ln.number for ln in batches.finished_lines("batch_a")] == [0]
    waiting = batches.runnable_lines("batch_a", 0.0, 1)[0]
    waiting.not_before = 50.0
    batches.put_line(waiting)
    assert [ln.number for ln in batches.runnable_lines("batch_a", 10.0, 5)] == [2]



def test_a_line_keeps_the_asynchronous_invocation_it_waits_for_and_reads_by_its_number(batches):
    started = batch()
    batches.put_batch(started)
    started.status = "in_progress"
    assert batches.add_lines(started, [Line("batch_a", n, f"c{n}", "{}") for n in range(2)], "validating")
    line = batches.get_line("batch_a", 1)
    assert line is not None and line.submission is None and batches.get_line("batch_a", 2) is None
    line.state, line.not_before, line.submission = "pending", 500.0, '{"id": "s1"}'
    assert batches.put_line(line, expect_tries=0)
    again = batches.get_line("batch_a", 1)
    assert (again.submission, again.not_before) == ('{"id": "s1"}', 500.0)
    again.submission = None
    assert batches.put_line(again) and batches.get_line("batch_a", 1).submission is None


def test_a_batch_has_one_current_turn_while_open_and_is_stalled_only_when_nothing_touched_it(batches):
    started = batch()
    batches.put_batch(started)
    assert batches.turn_of("batch_a") is None and [b.id for b in batches.stalled(1.0 + 600, 600)] == ["batch_a"]
    assert batches.next_turn("batch_a", 700.0) == 1 and batches.next_turn("batch_a", 701.0) == 2
    assert batches.turn_of("batch_a") == 2 and batches.stalled(1000.0, 600) == []  # announced at 701
    assert batches.lease("batch_a", "w", 2000.0, 1000.0) and batches.stalled(2500.0, 600) == []  # held until 2000
    assert [b.id for b in batches.stalled(2601.0, 600)] == ["batch_a"]
    started.status = "cancelled"
    assert batches.update_batch(started, "validating")
    assert batches.next_turn("batch_a", 3000.0) is None and batches.turn_of("batch_a") is None


def test_an_upload_whose_parts_are_not_the_md5_given_completes_nothing(batches):
    import hashlib

    from gateway.batches.model import DigestMismatch

    upload = Upload("upload_a", "acme", "x", "batch", 4, "text/plain", 1.0, 10.0 ** 10)
    batches.put_upload(upload)
    batches.add_part(upload, UploadPart("part_a", "upload_a", 4, 1.0), b"abcd")
    with pytest.raises(DigestMismatch):
        batches.complete_upload(upload, ["part_a"], file("file-a"), md5="0" * 32)
    assert batches.get_file("acme", "file-a") is None and batches.get_upload("acme", "upload_a").status == "pending"
    done = batches.complete_upload(upload, ["part_a"], file("file-a"), md5=hashlib.md5(b"abcd").hexdigest())
    assert done.bytes == 4 and b"".join(batches.read_file("acme", "file-a")) == b"abcd"
