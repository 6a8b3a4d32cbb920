"""The SQLite batch store's own part: its folder (private bytes, no tenant in a path) and its
sweep (tests/unit/gateway/test_stores.py holds the contract both stores keep)."""

import stat

import pytest

from gateway.batches.model import Batch, Line, StoredFile, Upload, UploadPart
from gateway.stores.sqlite.batches import SQLiteBatches
from gateway.stores.sqlite.database import Database


@pytest.fixture
def store(tmp_path):
    return SQLiteBatches(Database(tmp_path / "gateway.db"))


def file(file_id: str, tenant: str = "acme", created_at: float = 1.0, purpose: str = "batch") -> StoredFile:
    return StoredFile(file_id, tenant, "in.jsonl", purpose, 0, created_at)


def test_a_files_bytes_are_private_to_this_user_and_named_by_no_tenant(store):
    stored = store.put_file(file("file-a"), [b"one\n", b"two\n"])
    assert stored.bytes == 8 and b"".join(store.read_file("acme", "file-a")) == b"one\ntwo\n"
    [path] = [p for p in store.folder.rglob("*") if p.is_file()]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and "acme" not in str(path)
    assert store.read_file("globex", "file-a") is None and store.get_file("globex", "file-a") is None


def test_a_write_that_fails_leaves_no_file(store):
    def failing():
        yield b"part"
        raise OSError("disk full")

    with pytest.raises(OSError):
        store.put_file(file("file-a"), failing())
    assert store.get_file("acme", "file-a") is None and not [p for p in store.folder.rglob("*") if p.is_file()]


def test_expired_files_and_uploads_are_removed(store):
    store.put_file(StoredFile("file-old", "acme", "x", "batch", 0, 1.0, 10.0), [b"x"])
    upload = Upload("upload_a", "acme", "x", "batch", 4, "text/plain", 1.0, 10.0)
    store.put_upload(upload)
    store.add_part(upload, UploadPart("part_a", "upload_a", 2, 1.0), b"ab")
    assert store.delete_expired(11.0) == 2
    assert store.get_file("acme", "file-old") is None and store.get_upload("acme", "upload_a").status == "expired"
    assert store.holdings("acme") == (0, 0) and not [p for p in store.folder.rglob("*") if p.is_file()]


def batch(batch_id: str = "batch_a") -> Batch:
    return Batch(batch_id, "acme", "/v1/systemone", "file-a", "24h", 1.0, 100.0, {})


def test_an_ended_batchs_ledger_is_forgotten(store):
    ended = batch()
    store.put_batch(ended)
    ended.status = "in_progress"
    store.add_lines(ended, [Line("batch_a", 0, "c", "{}")], "validating")
    ended.status = "completed"
    store.update_batch(ended, "in_progress")
    store.delete_expired(2.0)
    assert list(store.unfinished_lines("batch_a")) == [] and store.get_batch("acme", "batch_a") is not None
    store.delete_expired(1.0 + 31 * 86400)
    assert store.get_batch("acme", "batch_a") is None


