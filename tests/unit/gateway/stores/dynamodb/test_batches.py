"""The AWS batch store's own part: bytes in S3 (whole or absent, no tenant in a key, large
files in parts), lines too large for an item, expiry by the sweep and by TTL
(tests/unit/gateway/test_stores.py holds the contract both stores keep)."""

from dataclasses import replace

import pytest

from gateway.batches.model import FILE_TTL_S, Batch, Line, LineUsage, StoredFile, Upload, UploadPart
from gateway.stores.dynamodb import batches as module


@pytest.fixture
def store(monkeypatch):
    from tests.gateway_helpers import aws_batch_store

    with aws_batch_store(monkeypatch) as store:
        yield store


def keys(store) -> list[str]:
    return [o["Key"] for o in store.s3.list_objects_v2(Bucket=store.bucket).get("Contents", [])]


def file(file_id: str = "file-a", expires_at: float | None = None) -> StoredFile:
    return StoredFile(file_id, "acme", "in.jsonl", "batch", 0, 1.0, expires_at)


def test_a_large_file_goes_up_in_parts_and_comes_back_whole_under_a_key_naming_no_tenant(store, monkeypatch):
    monkeypatch.setattr(module, "PART_BYTES", 5 * 1024 * 1024)  # S3's smallest part
    pieces = [bytes([n]) * (1024 * 1024) for n in range(12)]
    stored = store.put_file(file(), iter(pieces))
    assert stored.bytes == 12 * 1024 * 1024 and b"".join(store.read_file("acme", "file-a")) == b"".join(pieces)
    assert [k for k in keys(store) if "acme" in k] == [] and len(keys(store)) == 1
    assert store.read_file("globex", "file-a") is None


def test_a_write_that_fails_part_way_leaves_no_file_and_no_upload_open(store, monkeypatch):
    monkeypatch.setattr(module, "PART_BYTES", 5 * 1024 * 1024)

    def failing():
        yield b"x" * (6 * 1024 * 1024)
        raise OSError("the client went away")

    with pytest.raises(OSError):
        store.put_file(file(), failing())
    assert store.get_file("acme", "file-a") is None and keys(store) == []
    assert store.s3.list_multipart_uploads(Bucket=store.bucket).get("Uploads", []) == []


def test_an_expired_file_is_refused_at_once_and_the_sweep_removes_its_bytes(store):
    store.put_file(file("file-old", expires_at=10.0), [b"x"])
    store.put_file(file("file-new"), [b"y"])
    assert store.get_file("acme", "file-old") is None and store.read_file("acme", "file-old") is None
    assert [f.id for f in store.list_files("acme", None, None, 10, True)] == ["file-new"]
    upload = Upload("upload_a", "acme", "x", "batch", 4, "text/plain", 1.0, 10.0)
    store.put_upload(upload)
    store.add_part(upload, UploadPart("part_a", "upload_a", 2, 1.0), b"ab")
    assert store.delete_expired(11.0) == 2
    assert store.get_upload("acme", "upload_a").status == "expired" and store.parts("upload_a") == []
    assert len(keys(store)) == 1 and store.holdings("acme") == (1, 1)


def test_a_line_too_large_for_an_item_is_kept_in_s3_and_dropped_with_its_ledger(store):
    batch = Batch("batch_a", "acme", "/v1/systemone", "file-a", "24h", 1.0, 100.0, {})
    store.put_batch(batch)
    batch.status = "in_progress"
    body = '{"state": "' + "s" * (module.SPILL_BYTES + 10) + '"}'
    assert store.add_lines(batch, [Line("batch_a", 0, "c0", body), Line("batch_a", 1, "c1", "{}")], "validating")
    [line, _] = store.runnable_lines("batch_a", 0.0, 5)
    assert line.body == body and len(keys(store)) == 1
    line.state, line.reply = "done", '{"status_code": 200, "body": {"answers": "' + "a" * module.SPILL_BYTES + '"}}'
    store.finish_line(line, LineUsage(1, 0, 0, 0.0))
    assert [ln.reply for ln in store.finished_lines("batch_a")] == [line.reply] and len(keys(store)) == 2
    store.drop_lines("batch_a")
    assert keys(store) == [] and list(store.finished_lines("batch_a")) == []


def test_an_ended_batch_leaves_the_open_index_and_is_removed_by_ttl_as_its_files_are(store):
    batch = Batch("batch_a", "acme", "/v1/chat/completions", "file-a", "24h", 5.0, 100.0, {})
    store.put_batch(batch)
    assert [b.id for b in store.open_batches()] == ["batch_a"]
    ended = replace(batch, status="cancelled")
    assert store.update_batch(ended, "validating") and store.open_batches() == []
    found = store.table.get({"pk": "B#batch_a", "sk": "batch"})
    assert found["ttl"] == int(5.0 + FILE_TTL_S) + 1 and "open" not in found
    assert store.get_batch("globex", "batch_a") is None  # another tenant never sees it by its id


def test_a_line_whose_body_and_reply_together_pass_an_items_room_is_written(store):
    batch = Batch("batch_a", "acme", "/v1/systemone", "file-a", "24h", 1.0, 100.0, {})
    store.put_batch(batch)
    batch.status = "in_progress"
    near = module.SPILL_BYTES - 1024  # each under the spill, both together past what one item may hold with room
    body = '{"state": "' + "s" * near + '"}'
    assert store.add_lines(batch, [Line("batch_a", 0, "c0", body)], "validating")
    [line] = store.runnable_lines("batch_a", 0.0, 1)
    line.state, line.reply = "done", '{"status_code": 200, "body": {"x": "' + "r" * near + '"}}'
    store.finish_line(line, LineUsage())
    assert [ln.reply for ln in store.finished_lines("batch_a")] == [line.reply] and keys(store) == []


def test_a_text_that_looks_like_a_key_is_only_text(store):
    batch = Batch("batch_a", "acme", "/v1/systemone", "file-a", "24h", 1.0, 100.0, {})
    store.put_batch(batch)
    store.put_file(StoredFile("file-x", "globex", "x", "batch", 0, 1.0), [b"secret"])
    batch.status = "in_progress"
    body = '{"s3": "files/whatever"}'
    assert store.add_lines(batch, [Line("batch_a", 0, "c0", body)], "validating")
    assert [ln.body for ln in store.unfinished_lines("batch_a")] == [body]
    store.drop_lines("batch_a")
    assert len(keys(store)) == 1  # globex's file untouched


def test_an_object_s3_will_not_show_reads_as_gone(store, monkeypatch):
    from botocore.exceptions import ClientError

    store.put_file(file(), [b"x"])

    def denied(**kwargs):  # what S3 answers a missing key when the caller may not list the bucket
        raise ClientError({"Error": {"Code": "AccessDenied", "Message": "Access Denied"}}, "GetObject")

    monkeypatch.setattr(store.s3, "get_object", denied)
    assert store.read_file("acme", "file-a") is None
