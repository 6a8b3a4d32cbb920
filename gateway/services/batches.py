"""The files, uploads and batches use cases (OpenAI's Files, Uploads and Batch APIs).

Everything here is the caller's tenant's own: another tenant's file, upload or batch id is a
404, as an id that never existed is. Files take the `decide` or `chat` scope (a batch runs
one of them); a batch takes its endpoint's (`decide` for the decision routes, `chat` for
chat), checked when it is created and, through its route, for every line it runs.

Limits, each refused at once with the figures: a file sent whole (`POST /v1/files`) or an
upload's part is at most what one request carries (`GatewaySettings.max_body_bytes`, about
4.7 MB, since API Gateway hands Lambda the body base64-encoded in a 6 MB event); a file is at
most MAX_FILE_BYTES; a tenant's files together at most `BatchSettings.max_tenant_bytes`; a
batch whose work, estimated from its file's size, could not finish within its window on the
model's pool (`BatchSettings.tokens_per_second` an instance) is refused (413).
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable, Iterator
from typing import Any

from gateway.auth.credentials import Principal
from gateway.backends.routing import ModelRegistry
from gateway.batches.jsonl import first_model
from gateway.batches.model import (
    COMPLETION_WINDOWS,
    ENDPOINTS,
    FILE_TTL_S,
    INPUT_PURPOSE,
    MAX_FILE_BYTES,
    MAX_METADATA_KEY,
    MAX_METADATA_PAIRS,
    MAX_METADATA_VALUE,
    MAX_UPLOAD_PARTS,
    OUTPUT_PURPOSE,
    UPLOAD_TTL_S,
    Batch,
    BatchStore,
    StoredFile,
    Upload,
    UploadPart,
    new_id,
    principal_document,
)
from gateway.errors import Conflict, Forbidden, NotFound, PayloadTooLarge, RequestError
from gateway.settings import BatchSettings

FILE_SCOPES = ("decide", "chat")
ENDPOINT_SCOPES = {"/v1/decisions": "decide", "/v1/systemone": "decide", "/v1/chat/completions": "chat"}
BYTES_PER_TOKEN = 4  # a batch's work is estimated from its file's size: about four bytes of JSON a token
FILE_LIST_LIMIT, BATCH_LIST_LIMIT = 10_000, 100


class NoSuchObject(NotFound):
    openai_code = "not_found"


class BadRequest(RequestError):
    """400 with OpenAI's invalid_request_error, naming the parameter."""


def require_files_scope(principal: Principal) -> None:
    if not any(scope in principal.scopes for scope in FILE_SCOPES):
        raise Forbidden("batch files need a credential with the decide or chat scope")


class FileService:
    def __init__(self, store: BatchStore, settings: BatchSettings, max_part_bytes: int,
                 count_stored: Callable[[str, int, str], None] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.settings = settings
        self.max_part_bytes = max_part_bytes
        self.count_stored = count_stored or (lambda tenant_id, size, entry: None)
        self.clock = clock

    def create(self, principal: Principal, filename: str, purpose: str, data: bytes) -> StoredFile:
        require_files_scope(principal)
        _check_purpose(purpose)
        self._check_room(principal.tenant_id, len(data))
        now = self.clock()
        file = StoredFile(new_id("file-"), principal.tenant_id, _filename(filename), purpose, len(data), now,
                          now + FILE_TTL_S)
        stored = self.store.put_file(file, [data])
        self.count_stored(principal.tenant_id, stored.bytes, "(files)")
        return stored

    def _check_room(self, tenant_id: str, size: int) -> None:
        if size > MAX_FILE_BYTES:
            raise PayloadTooLarge(f"a batch file holds at most {MAX_FILE_BYTES} bytes; this one would take {size}")
        held = self.store.stored_bytes(tenant_id)
        if held + size > self.settings.max_tenant_bytes:
            raise PayloadTooLarge(f"this tenant's files take {held} bytes of the {self.settings.max_tenant_bytes} it may"
                                  f" keep, and this one needs {size} more: delete files it no longer needs"
                                  " (DELETE /v1/files/{id})")

    def get(self, principal: Principal, file_id: str) -> StoredFile:
        require_files_scope(principal)
        file = self.store.get_file(principal.tenant_id, file_id)
        if file is None:
            raise NoSuchObject(f"No such File object: {file_id}")
        return file

    def content(self, principal: Principal, file_id: str) -> tuple[StoredFile, Iterator[bytes]]:
        file = self.get(principal, file_id)
        chunks = self.store.read_file(principal.tenant_id, file_id)
        if chunks is None:
            raise NoSuchObject(f"No such File object: {file_id}")
        return file, chunks

    def list(self, principal: Principal, purpose: str | None, after: str | None, limit: int,
             order: str) -> dict[str, Any]:
        require_files_scope(principal)
        files = self.store.list_files(principal.tenant_id, purpose, after, limit + 1, order != "asc")
        return page([f.as_openai() for f in files], limit)

    def delete(self, principal: Principal, file_id: str) -> dict[str, Any]:
        self.get(principal, file_id)
        self.store.delete_file(principal.tenant_id, file_id)
        return {"id": file_id, "object": "file", "deleted": True}

    # -- uploads ----------------------------------------------------------------------

    def create_upload(self, principal: Principal, filename: str, purpose: str, size: int, mime_type: str) -> Upload:
        require_files_scope(principal)
        _check_purpose(purpose)
        self._check_room(principal.tenant_id, size)
        now = self.clock()
        upload = Upload(new_id("upload_"), principal.tenant_id, _filename(filename), purpose, size, mime_type, now,
                        now + UPLOAD_TTL_S)
        self.store.put_upload(upload)
        return upload

    def upload(self, principal: Principal, upload_id: str) -> Upload:
        require_files_scope(principal)
        upload = self.store.get_upload(principal.tenant_id, upload_id)
        if upload is None:
            raise NoSuchObject(f"No such Upload object: {upload_id}")
        if upload.status == "pending" and upload.expires_at <= self.clock():
            raise BadRequest(f"upload {upload_id} expired (an upload is completed within an hour of its creation)")
        return upload

    def add_part(self, principal: Principal, upload_id: str, data: bytes) -> UploadPart:
        upload = self._pending(principal, upload_id)
        if len(data) > self.max_part_bytes:
            raise PayloadTooLarge(f"a part holds at most {self.max_part_bytes} bytes here (what one request carries"
                                  f" through API Gateway and Lambda); this one has {len(data)}: send smaller parts"
                                  f" (the OpenAI SDK's upload_file_chunked(part_size={self.max_part_bytes}))")
        parts = self.store.parts(upload_id)
        received = sum(p.bytes for p in parts)
        if len(parts) >= MAX_UPLOAD_PARTS or received + len(data) > upload.bytes:
            raise BadRequest(f"the parts would hold {received + len(data)} bytes, more than the {upload.bytes} this"
                             f" upload was created for (or more than {MAX_UPLOAD_PARTS} parts)")
        part = UploadPart(new_id("part_"), upload.id, len(data), self.clock())
        self.store.add_part(upload, part, data)
        return part

    def complete(self, principal: Principal, upload_id: str, part_ids: list[str], md5: str | None) -> tuple[Upload, StoredFile]:
        upload = self._pending(principal, upload_id)
        parts = {p.id: p for p in self.store.parts(upload_id)}
        unknown = [p for p in part_ids if p not in parts]
        if unknown or len(set(part_ids)) != len(part_ids):
            raise BadRequest(f"part_ids must name this upload's parts, each once; {unknown[:1] or 'one'} does not")
        size = sum(parts[p].bytes for p in part_ids)
        if size != upload.bytes:
            raise BadRequest(f"the parts hold {size} bytes and the upload was created for {upload.bytes}")
        now = self.clock()
        file = StoredFile(new_id("file-"), upload.tenant_id, upload.filename, upload.purpose, size, now, now + FILE_TTL_S)
        if md5 is not None and _md5(self.store, upload, part_ids) != md5.lower():
            raise BadRequest("the parts' md5 is not the one given: a part was lost or changed on the way")
        try:
            stored = self.store.complete_upload(upload, part_ids, file)
        except ValueError:
            raise Conflict("the upload was completed or cancelled by another request") from None
        self.count_stored(principal.tenant_id, stored.bytes, "(files)")
        return self.store.get_upload(upload.tenant_id, upload.id) or upload, stored

    def cancel_upload(self, principal: Principal, upload_id: str) -> Upload:
        upload = self._pending(principal, upload_id)
        cancelled = Upload(**{**{n: getattr(upload, n) for n in upload.__slots__}, "status": "cancelled"})
        if not self.store.set_upload(cancelled, "pending"):
            raise Conflict("the upload was completed or cancelled by another request")
        return cancelled

    def _pending(self, principal: Principal, upload_id: str) -> Upload:
        upload = self.upload(principal, upload_id)
        if upload.status != "pending":
            raise BadRequest(f"upload {upload_id} is {upload.status}; only a pending upload takes parts or ends")
        return upload


class BatchService:
    def __init__(self, store: BatchStore, registry: ModelRegistry, settings: BatchSettings,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.registry = registry
        self.settings = settings
        self.clock = clock

    def create(self, principal: Principal, input_file_id: str, endpoint: str, completion_window: str,
               metadata: dict[str, str] | None, output_ttl_s: float | None = None) -> Batch:
        """A batch, validating: its worker reads the file next. `output_ttl_s`: how long its output
        and error files are kept (OpenAI's output_expires_after; else FILE_TTL_S)."""
        if endpoint not in ENDPOINTS:
            raise BadRequest(f"endpoint must be one of {', '.join(ENDPOINTS)}")
        scope = ENDPOINT_SCOPES[endpoint]
        if scope not in principal.scopes:
            raise Forbidden(f"a batch for {endpoint} needs a credential with the {scope!r} scope")
        if completion_window not in COMPLETION_WINDOWS:
            raise BadRequest(f"completion_window must be one of {', '.join(COMPLETION_WINDOWS)}")
        _check_metadata(metadata)
        file = self.store.get_file(principal.tenant_id, input_file_id)
        if file is None:
            raise NoSuchObject(f"No such File object: {input_file_id}")
        if file.purpose != INPUT_PURPOSE:
            raise BadRequest(f"the input file's purpose is {file.purpose!r}; a batch reads a file uploaded with purpose"
                             f" {INPUT_PURPOSE!r}")
        window = COMPLETION_WINDOWS[completion_window]
        self._check_capacity(principal, file, endpoint, window)
        now = self.clock()
        batch = Batch(new_id("batch_"), principal.tenant_id, endpoint, input_file_id, completion_window, now,
                      now + window, principal_document(principal), metadata=metadata, output_ttl_s=output_ttl_s)
        self.store.put_batch(batch)
        return batch

    def _check_capacity(self, principal: Principal, file: StoredFile, endpoint: str, window_s: float) -> None:
        """Refuse at once a batch whose work could never finish within its window: its tokens
        (estimated from its size) at the pool's rate, on every instance of the pool's first tier."""
        model = first_model(self.store.read_file(principal.tenant_id, file.id) or iter(()))
        service = "chat" if endpoint == "/v1/chat/completions" else "decisions"
        try:
            pool = self.registry.route_for(model, service).pool if model is not None else None
        except NotFound:
            pool = None  # the batch fails validation, naming the model
        instances = 1
        if pool is not None:
            first_tier = min(member.tier for member in pool.members)
            instances = sum(1 for m in pool.members if m.tier == first_tier) * max(1, pool.policy.min_instances)
        tokens = file.bytes / BYTES_PER_TOKEN
        needs_s = tokens / self.settings.tokens_per_second
        can_s = window_s * instances
        if needs_s > can_s:
            raise PayloadTooLarge(
                f"this batch's work cannot finish within its window: about {math.ceil(tokens)} tokens ({file.bytes}"
                f" bytes at about {BYTES_PER_TOKEN} a token) at {self.settings.tokens_per_second:g} tokens a second"
                f" take about {math.ceil(needs_s)} s of model time, and {instances} instance(s) give"
                f" {math.floor(can_s)} s in {window_s / 3600:g} h: split the file into batches of fewer lines")

    def get(self, principal: Principal, batch_id: str) -> Batch:
        require_files_scope(principal)
        batch = self.store.get_batch(principal.tenant_id, batch_id)
        if batch is None:
            raise NoSuchObject(f"No such Batch object: {batch_id}")
        return batch

    def list(self, principal: Principal, after: str | None, limit: int) -> dict[str, Any]:
        require_files_scope(principal)
        batches = self.store.list_batches(principal.tenant_id, after, limit + 1)
        return page([b.as_openai() for b in batches], limit)

    def cancel(self, principal: Principal, batch_id: str) -> Batch:
        """A batch validating or in progress is cancelling at once; its worker stops within a line
        and keeps what finished. Cancelling a cancelling batch again changes nothing."""
        for _ in range(3):  # a worker's own write may come between the read and this one
            batch = self.get(principal, batch_id)
            if batch.status in ("cancelling", "cancelled"):
                return batch
            if batch.status not in ("validating", "in_progress"):
                raise Conflict(f"cannot cancel a batch with status {batch.status}")
            was = batch.status
            batch.status, batch.cancelling_at = "cancelling", self.clock()
            if self.store.update_batch(batch, was):
                return batch
        raise Conflict("the batch changed while it was cancelled; retry")


def page(items: list[dict[str, Any]], limit: int) -> dict[str, Any]:
    """OpenAI's cursor page: `after` the last id of one page gives the next."""
    shown = items[:limit]
    return {"object": "list", "data": shown, "first_id": shown[0]["id"] if shown else None,
            "last_id": shown[-1]["id"] if shown else None, "has_more": len(items) > limit}


def _check_purpose(purpose: str) -> None:
    if purpose != INPUT_PURPOSE:
        raise BadRequest(f"purpose must be {INPUT_PURPOSE!r}: this API keeps batch input files"
                         f" ({OUTPUT_PURPOSE!r} files are the batches' own output)")


def _check_metadata(metadata: dict[str, str] | None) -> None:
    if metadata is None:
        return
    if len(metadata) > MAX_METADATA_PAIRS or any(
            not isinstance(k, str) or not isinstance(v, str) or len(k) > MAX_METADATA_KEY or len(v) > MAX_METADATA_VALUE
            for k, v in metadata.items()):
        raise BadRequest(f"metadata holds at most {MAX_METADATA_PAIRS} pairs of strings, keys of at most"
                         f" {MAX_METADATA_KEY} characters and values of at most {MAX_METADATA_VALUE}")


def _filename(name: str) -> str:
    """A file's name as given, without a path, at most 255 characters (it names a download)."""
    name = name.replace("\\", "/").rsplit("/", 1)[-1].strip()
    return "".join(c for c in name if c.isprintable())[:255] or "upload.jsonl"


def _md5(store: BatchStore, upload: Upload, part_ids: list[str]) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    for chunk in store.read_parts(upload, part_ids):
        digest.update(chunk)
    return digest.hexdigest()
