"""The batch store's contract, on both storages: SQLite with a folder (the local stack) and
DynamoDB with S3 (AWS; moto). What only one of them does is tested beside it."""

from dataclasses import replace

import pytest

from gateway.batches.model import Batch, Line, LineUsage, StoredFile, Upload, UploadPart


@pytest.fixture(params=["sqlite", "dynamodb"])
def store(request, tmp_path, monkeypatch):
    if request.param == "sqlite":
        from gateway.stores.sqlite.batches import SQLiteBatches
        from gateway.stores.sqlite.database import Database

        yield SQLiteBatches(Database(tmp_path / "gateway.db"))
        return
    from tests.gateway_helpers import aws_batch_store

    with aws_batch_store(monkeypatch) as store:
        yield store


def file(file_id: str, tenant: str = "acme", created_at: float = 1.0, purpose: str = "batch") -> StoredFile:
    return StoredFile(file_id, tenant, "in.jsonl", purpose, 0, created_at)


def test_files_list_newest_first_a_page_at_a_time_and_by_purpose(store):
    for i in range(5):
        store.put_file(file(f"file-{i}", created_at=float(i), purpose="batch" if i % 2 else "batch_output"), [b"x"])
    assert [f.id for f in store.list_files("acme", None, None, 2, True)] == ["file-4", "file-3"]
    assert [f.id for f in store.list_files("acme", None, "file-3", 2, True)] == ["file-2", "file-1"]
    assert [f.id for f in store.list_files("acme", "batch", None, 10, False)] == ["file-1", "file-3"]
    store.put_file(replace(file("file-out", created_at=9.0), scope="decide"), [b"x"])
    assert "file-out" not in [f.id for f in store.list_files("acme", None, None, 10, True, scopes={"chat"})]
    assert "file-out" in [f.id for f in store.list_files("acme", None, None, 10, True, scopes={"decide"})]
    assert store.holdings("acme") == (6, 6) and store.holdings("globex") == (0, 0)


def test_a_pending_upload_counts_at_the_size_it_was_created_for_and_a_cancelled_one_at_nothing(store):
    upload = Upload("upload_a", "acme", "x", "batch", 1000, "text/plain", 1.0, 10.0)
    store.put_upload(upload)
    store.add_part(upload, UploadPart("part_a", "upload_a", 2, 1.0), b"ab")
    assert store.holdings("acme") == (1000, 1)
    assert store.set_upload(replace(upload, status="cancelled"), "pending")
    assert store.holdings("acme") == (0, 0) and store.parts("upload_a") == []


def test_an_ended_batchs_ledger_is_dropped_and_its_batch_kept(store):
    ended = batch()
    store.put_batch(ended)
    ended.status = "in_progress"
    store.add_lines(ended, [Line("batch_a", 0, "c", "{}")], "validating")
    ended.status = "completed"
    assert store.update_batch(ended, "in_progress") and store.open_batches() == []
    store.drop_lines("batch_a")
    assert list(store.unfinished_lines("batch_a")) == [] and store.get_batch("acme", "batch_a").status == "completed"


def batch(batch_id: str = "batch_a") -> Batch:
    return Batch(batch_id, "acme", "/v1/systemone", "file-a", "24h", 1.0, 100.0, {})


def test_a_lease_is_one_owners_until_it_lapses(store):
    store.put_batch(batch())
    assert store.lease("batch_a", "one", 10.0, 0.0) and store.lease("batch_a", "one", 20.0, 5.0)
    assert not store.lease("batch_a", "two", 30.0, 19.0)
    assert store.lease("batch_a", "two", 30.0, 20.0)


def test_a_batch_changes_only_from_the_status_it_was_read_with(store):
    store.put_batch(batch())
    changed = batch()
    changed.status = "cancelling"
    assert store.update_batch(changed, "validating") and not store.update_batch(changed, "validating")
    assert not store.add_lines(changed, [Line("batch_a", 0, "c", "{}")], "validating")
    assert list(store.unfinished_lines("batch_a")) == []


def test_a_line_is_counted_once_however_often_it_is_finished(store):
    started = batch()
    store.put_batch(started)
    started.status = "in_progress"
    assert store.add_lines(started, [Line("batch_a", n, f"c{n}", "{}") for n in range(3)], "validating")
    line = store.runnable_lines("batch_a", 0.0, 1)[0]
    line.state, line.reply = "done", '{"status_code": 200, "body": {}}'
    for _ in range(2):
        store.finish_line(line, LineUsage(10, 2, 4, 0.5))
    again = store.get_batch("acme", "batch_a")
    assert (again.completed, again.failed, again.usage["input_tokens"], again.cost_usd) == (1, 0, 10, 0.5)
    assert [ln.number for ln in store.unfinished_lines("batch_a")] == [1, 2]
    assert [ln.number for ln in store.finished_lines("batch_a")] == [0]
    waiting = store.runnable_lines("batch_a", 0.0, 1)[0]
    waiting.not_before = 50.0
    store.put_line(waiting)
    assert [ln.number for ln in store.runnable_lines("batch_a", 10.0, 5)] == [2]



def test_a_batch_has_one_current_turn_while_open_and_is_stalled_only_when_nothing_touched_it(store):
    started = batch()
    store.put_batch(started)
    assert store.turn_of("batch_a") is None and [b.id for b in store.stalled(1.0 + 600, 600)] == ["batch_a"]
    assert store.next_turn("batch_a", 700.0) == 1 and store.next_turn("batch_a", 701.0) == 2
    assert store.turn_of("batch_a") == 2 and store.stalled(1000.0, 600) == []  # announced at 701
    assert store.lease("batch_a", "w", 2000.0, 1000.0) and store.stalled(2500.0, 600) == []  # held until 2000
    assert [b.id for b in store.stalled(2601.0, 600)] == ["batch_a"]
    started.status = "cancelled"
    assert store.update_batch(started, "validating")
    assert store.next_turn("batch_a", 3000.0) is None and store.turn_of("batch_a") is None


def test_an_upload_whose_parts_are_not_the_md5_given_completes_nothing(store):
    import hashlib

    from gateway.batches.model import DigestMismatch

    upload = Upload("upload_a", "acme", "x", "batch", 4, "text/plain", 1.0, 10.0 ** 10)
    store.put_upload(upload)
    store.add_part(upload, UploadPart("part_a", "upload_a", 4, 1.0), b"abcd")
    with pytest.raises(DigestMismatch):
        store.complete_upload(upload, ["part_a"], file("file-a"), md5="0" * 32)
    assert store.get_file("acme", "file-a") is None and store.get_upload("acme", "upload_a").status == "pending"
    done = store.complete_upload(upload, ["part_a"], file("file-a"), md5=hashlib.md5(b"abcd").hexdigest())
    assert done.bytes == 4 and b"".join(store.read_file("acme", "file-a")) == b"abcd"
