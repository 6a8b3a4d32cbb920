"""What a tenant's catalog keeps, on both stores: the versions an entry keeps, when a
replaced one expires, the entries a tenant may have."""

from __future__ import annotations

import time

import pytest

from gateway.catalogs import service as catalog_service
from gateway.catalogs.model import content_hash, parse_content
from gateway.catalogs.service import DAY_S, CatalogService
from gateway.errors import Conflict


@pytest.fixture(params=["sqlite", "dynamodb"])
def store(request, tmp_path, monkeypatch):
    if request.param == "sqlite":
        from gateway.stores.sqlite import open_sqlite

        yield open_sqlite(tmp_path / "g.db").catalogs
        return
    from tests.gateway_helpers import dynamodb_tenant_store

    with dynamodb_tenant_store(monkeypatch) as stores:
        yield stores.catalogs


def entry(n: int, mode: str | None = None, daily: bool = False):
    content = {"type": "noul", "instructions": f"Is it {n}?"}
    if mode:
        content["policy"] = {"mode": mode}
    if daily:
        content["learning"] = {"keep_features": True, "refit": "daily"}
    return parse_content(__import__("json").dumps(content))


def test_an_entry_keeps_its_newest_versions_and_the_one_that_made_it_enforcing(store, monkeypatch):
    monkeypatch.setattr(catalog_service, "MAX_KEPT_VERSIONS", 4)
    catalogs = CatalogService(store)
    for n in range(1, 4):
        catalogs.put("acme", "routing", entry(n))
    catalogs.put("acme", "routing", entry(4, "enforcing"))  # version 4 makes it enforcing
    for n in range(5, 12):
        catalogs.put("acme", "routing", entry(n, "enforcing"))
    kept = [v.version for v in store.list_catalog_versions("acme", "routing")]
    assert kept == [4, 8, 9, 10, 11]  # 200 writes or 11: never more than the count, and the enforcing one
    assert catalogs.get("acme", "routing").enforcing_since == 4
    assert catalogs.get("acme", "routing", 4).expires_at is None  # kept while the entry enforces
    catalogs.put("acme", "routing", entry(12))  # advisory again: version 4 is one more old version
    assert [v.version for v in store.list_catalog_versions("acme", "routing")] == [9, 10, 11, 12]
    # Within the count, the version that made an entry enforcing expires once it no longer does.
    catalogs.put("acme", "spam", entry(1, "enforcing"))
    catalogs.put("acme", "spam", entry(2, "enforcing"))
    assert [v.expires_at is None for v in store.list_catalog_versions("acme", "spam")] == [True, True]
    catalogs.put("acme", "spam", entry(3))
    assert [v.expires_at is None for v in store.list_catalog_versions("acme", "spam")] == [False, False, True]


def test_a_replaced_version_expires_after_the_record_retention_unless_a_decision_names_it(store):
    now = time.time()
    clock = [now - 40 * DAY_S]
    catalogs = CatalogService(store, clock=lambda: clock[0], keep_days=30)
    catalogs.put("acme", "routing", entry(1))
    catalogs.put("acme", "routing", entry(2))  # 40 days ago: version 1 expired 10 days ago
    clock[0] = now - 20 * DAY_S
    catalogs.put("acme", "routing", entry(3))  # 20 days ago: version 2 expires in 10 days
    with pytest.raises(Exception, match="does not exist"):
        catalogs.get("acme", "routing", 1)
    assert catalogs.get("acme", "routing", 2).expires_at == pytest.approx(now + 10 * DAY_S)
    clock[0] = now
    # A decision names version 2 today: it lives as long as that decision's record.
    assert catalogs.named("acme", "routing", 2).version == 2
    assert catalogs.get("acme", "routing", 2).expires_at == pytest.approx(now + 30 * DAY_S)
    assert catalogs.named("acme", "routing", None).expires_at is None  # the latest never expires
    assert [v.version for v in store.list_catalog_versions("acme", "routing")] == [2, 3]


def test_a_tenant_has_at_most_so_many_entries_and_the_refusal_names_the_figures(store, monkeypatch):
    monkeypatch.setattr(catalog_service, "MAX_ENTRIES", 3)
    catalogs = CatalogService(store)
    for name in ("a", "b", "c"):
        catalogs.put("acme", name, entry(1))
    with pytest.raises(Conflict, match="has 3 catalog entries, the most it may have is 3"):
        catalogs.put("acme", "d", entry(1))
    assert [v.name for v in catalogs.list("acme")[0]] == ["a", "b", "c"]
    catalogs.put("acme", "a", entry(2))  # a new version of an entry is not a new entry
    catalogs.put("globex", "d", entry(1))  # nor is another tenant's


def test_a_head_behind_its_versions_is_moved_on_by_the_next_write(monkeypatch):
    """A version written without its head (an earlier release still serving during a deploy)
    never blocks the entry: the next write moves the head on."""
    from gateway.stores.dynamodb.items import item
    from tests.gateway_helpers import dynamodb_tenant_store

    with dynamodb_tenant_store(monkeypatch) as stores:
        store = stores.catalogs
        catalogs = CatalogService(store)
        catalogs.put("acme", "routing", entry(1, daily=True))
        content = entry(2).canonical()
        store.table.client.put_item(TableName=store.table.name, Item=item(
            {"pk": "acme#routing", "version": 2, "tenant": "acme", "name": "routing",
             "content_hash": content_hash(content), "content": content, "created_at": 2.0}))
        version, created = catalogs.put("acme", "routing", entry(3))
        assert created and version.version == 3 and store.due_refits("acme", "", 10) == []
        assert [v.version for v in catalogs.list("acme")[0]] == [3]


def test_the_heads_say_which_entries_refit_daily_and_follow_their_latest(store):
    catalogs = CatalogService(store)
    catalogs.put("acme", "a", entry(1, daily=True))
    catalogs.put("acme", "b", entry(1, daily=True))
    catalogs.put("acme", "b", entry(2))
    assert store.due_refits("acme", "", 10) == ["a"]
    assert list(store.list_catalog_tenants()) == ["acme"]


def test_an_entry_written_before_heads_is_listed_and_gets_a_head_at_its_next_write(monkeypatch):
    from gateway.stores.dynamodb.items import item
    from tests.gateway_helpers import dynamodb_tenant_store

    with dynamodb_tenant_store(monkeypatch) as stores:
        store = stores.catalogs
        for n in (1, 2):  # as the store wrote versions before: each with the index's keys, no head
            content = entry(n, daily=True).canonical()
            store.table.client.put_item(TableName=store.table.name, Item=item(
                {"pk": "acme#old", "version": n, "tenant_id": "acme", "name": "old", "name_version": f"old#{n:09d}",
                 "content_hash": content_hash(content), "content": content, "created_at": float(n)}))
        catalogs = CatalogService(store)
        assert [(v.name, v.version) for v in catalogs.list("acme")[0]] == [("old", 2)]
        assert catalogs.get("acme", "old").version == 2 and store.due_refits("acme", "", 10) == []
        catalogs.put("acme", "old", entry(3, daily=True))
        assert [(v.name, v.version) for v in catalogs.list("acme")[0]] == [("old", 3)]
        assert store.due_refits("acme", "", 10) == ["old"]
        assert catalogs.get("acme", "old", 2).expires_at is not None


def test_entries_written_before_heads_are_adopted_once_after_the_upgrade(monkeypatch):
    from gateway.stores.dynamodb.items import item, plain
    from tests.gateway_helpers import dynamodb_tenant_store

    with dynamodb_tenant_store(monkeypatch) as stores:
        store = stores.catalogs
        for name, contents in (("daily", [entry(1, daily=True), entry(2, daily=True)]),
                               ("strict", [entry(1), entry(2, "enforcing")])):
            for n, content in enumerate((c.canonical() for c in contents), start=1):
                store.table.client.put_item(TableName=store.table.name, Item=item(
                    {"pk": f"acme#{name}", "version": n, "tenant_id": "acme", "name": name,
                     "name_version": f"{name}#{n:09d}", "content_hash": content_hash(content), "content": content,
                     "created_at": float(n)}))
        assert store.due_refits("acme", "", 10) == [] and store.count_catalogs("acme") == 0
        # One written again between the deploy and the adoption: its head says which version made it enforcing.
        catalogs = CatalogService(store)
        catalogs.put("acme", "strict", entry(3, "enforcing"))
        assert catalogs.get("acme", "strict").enforcing_since == 2
        assert store.adopt_entries_without_heads(30 * DAY_S) == 1
        assert store.due_refits("acme", "", 10) == ["daily"] and store.count_catalogs("acme") == 2
        index = [plain(i) for i in store.table.client.scan(TableName=store.table.name, IndexName="by_tenant")["Items"]]
        assert sorted((i["name"], int(i["version"])) for i in index) == [("daily", 0), ("strict", 0)]  # heads only
        assert catalogs.get("acme", "daily", 1).expires_at == pytest.approx(time.time() + 30 * DAY_S, abs=60)
        assert catalogs.get("acme", "daily").expires_at is None and catalogs.get("acme", "strict").enforcing_since == 2
        assert catalogs.get("acme", "strict", 2).expires_at is None  # kept: it made the entry enforcing
        assert [(v.name, v.version) for v in catalogs.list("acme")[0]] == [("daily", 2), ("strict", 3)]
        assert store.adopt_entries_without_heads(30 * DAY_S) == 0  # again: nothing left to adopt
        catalogs.put("acme", "daily", entry(3, daily=True))
        assert catalogs.get("acme", "daily").version == 3 and store.due_refits("acme", "", 10) == ["daily"]


def test_the_admin_adopts_heads_on_dynamodb_only(tmp_path, capsys):
    from devkit import admin

    assert admin.main(["--sqlite", str(tmp_path / "g.db"), "adopt-catalog-heads"]) == 2
    assert "for DynamoDB" in capsys.readouterr().err


def test_the_entries_come_a_page_at_a_time_by_name_and_by_size(store, monkeypatch):
    catalogs = CatalogService(store)
    for name in ("a", "b", "c", "d"):
        catalogs.put("acme", name, entry(1))
    page, after = catalogs.list("acme", limit=3)
    assert [v.name for v in page] == ["a", "b", "c"] and after == "c"
    page, after = catalogs.list("acme", after, limit=3)
    assert [v.name for v in page] == ["d"] and after is None
    if hasattr(store, "table"):  # DynamoDB reads each latest version: a page reads one past its end, no more
        read = []
        real = store.get_catalog_version
        monkeypatch.setattr(store, "get_catalog_version", lambda *a: read.append(a) or real(*a))
        catalogs.list("acme", limit=2)
        assert len(read) == 3
    monkeypatch.setattr(catalog_service, "MAX_VERSIONS_PAGE_BYTES", 1)  # each page ends after its first entry
    assert catalogs.list("acme") == ([catalogs.get("acme", "a")], "a")
