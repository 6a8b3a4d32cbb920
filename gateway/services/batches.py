"""The files, uploads and batches use cases (OpenAI's Files, Uploads and Batch APIs).

Everything here is the caller's tenant's own: another tenant's file, upload or batch id is a
404, as an id that never existed is. Files take the `decide` or `chat` scope (a batch runs
one of them); a batch takes its endpoint's (`decide` for the decision routes, `chat` for
chat), checked when it is created and, through its route, for every line it runs.

Limits, each refused at once with the figures: a file sent whole (`POST /v1/files`) or an
upload's part is at most MAX_PART_BYTES (4 MiB: what one request carries, since API Gateway
hands Lambda the body base64-encoded in a 6 MB event); a file is at most MAX_FILE_BYTES; a
tenant's files together at most `BatchSettings.max_tenant_bytes`; a batch whose work,
estimated from its file's size, could not finish within its window on the model's pool
(`BatchSettings.tokens_per_second` an instance), beside the open batches' work, is refused (413).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

from gateway.auth.credentials import Principal
from gateway.backends.routing import ModelRegistry
from gateway.batches.jsonl import first_model
from gateway.batches.model import (
    COMPLETION_WINDOWS,
    ENDPOINTS,
    FILE_TTL_S,
    FINAL,
    INPUT_PURPOSE,
    MAX_FILE_BYTES,
    MAX_METADATA_KEY,
    MAX_METADATA_PAIRS,
    MAX_METADATA_VALUE,
    MAX_OPEN_BATCHES,
    MAX_PART_BYTES,
    MAX_TENANT_FILES,
    MAX_UPLOAD_PARTS,
    OUTPUT_PURPOSE,
    UPLOAD_TTL_S,
    Batch,
    BatchStore,
    DigestMismatch,
    StoredFile,
    Upload,
    UploadPart,
    new_id,
    principal_document,
)
from gateway.errors import Conflict, Forbidden, NotFound, PayloadTooLarge, RateLimited, RequestError
from gateway.settings import BatchSettings

log = logging.getLogger("gateway.services.batches")

FILE_SCOPES = tuple(dict.fromkeys(endpoint.scope for endpoint in ENDPOINTS.values()))  # what a batch may run
BYTES_PER_TOKEN = 4  # a batch's work is estimated from its file's size: about four bytes of JSON a token
FILE_LIST_LIMIT, BATCH_LIST_LIMIT = 10_000, 100


class NoSuchObject(NotFound):
    openai_code = "not_found"


class BadRequest(RequestError):
    """400 with OpenAI's invalid_request_error."""


class FileTooLarge(PayloadTooLarge):
    openai_code = "file_too_large"


class CannotFinish(PayloadTooLarge):
    """A batch whose work could never finish within its window (413, with the figures)."""

    openai_code = "batch_too_large"


def require_files_scope(principal: Principal) -> None:
    if not any(scope in principal.scopes for scope in FILE_SCOPES):
        raise Forbidden("batch files need a credential with the decide or chat scope")


class FileService:
    def __init__(self, store: BatchStore, settings: BatchSettings,
                 count_stored: Callable[[str, int, str], None] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.settings = settings
        self.count_stored = count_stored or (lambda tenant_id, size, entry: None)
        self.clock = clock

    def create(self, principal: Principal, filename: str, purpose: str, data: bytes,
               ttl_s: float | None = None) -> StoredFile:
        """A file sent whole, kept FILE_TTL_S (or `ttl_s`: OpenAI's expires_after)."""
        require_files_scope(principal)
        _check_purpose(purpose)
        if len(data) > MAX_PART_BYTES:
            raise FileTooLarge(f"a file sent whole holds at most {MAX_PART_BYTES} bytes (what one request carries"
                               f" through API Gateway and Lambda); this one has {len(data)}: send it through the"
                               " Uploads API (POST /v1/uploads), in parts")
        self._check_room(principal.tenant_id, len(data))
        now = self.clock()
        file = StoredFile(new_id("file-"), principal.tenant_id, _filename(filename), purpose, len(data), now,
                          now + (ttl_s or FILE_TTL_S))
        stored = self.store.put_file(file, [data])
        self.count_stored(principal.tenant_id, stored.bytes, "(files)")
        return stored

    def _check_room(self, tenant_id: str, size: int) -> None:
        if size == 0:
            raise BadRequest("the file is empty: a batch file holds one request a line")
        if size > MAX_FILE_BYTES:
            raise FileTooLarge(f"a batch file holds at most {MAX_FILE_BYTES} bytes; this one would take {size}")
        held, files = self.store.holdings(tenant_id)
        if files >= MAX_TENANT_FILES:
            raise FileTooLarge(f"this tenant keeps {files} files, the most it may: delete files it no longer needs"
                               " (DELETE /v1/files/{id})")
        if held + size > self.settings.max_tenant_bytes:
            raise FileTooLarge(f"this tenant's files take {held} bytes of the {self.settings.max_tenant_bytes} it may"
                                  f" keep, and this one needs {size} more: delete files it no longer needs"
                                  " (DELETE /v1/files/{id})")

    def get(self, principal: Principal, file_id: str) -> StoredFile:
        """The file, if the credential may see it: a batch's output needs its endpoint's scope (a
        file the credential may not see does not exist for it: 404, as another tenant's)."""
        require_files_scope(principal)
        file = self.store.get_file(principal.tenant_id, file_id)
        if file is None or not visible(file.scope, principal):
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
        files = self.store.list_files(principal.tenant_id, purpose, after, limit + 1, order != "asc",
                                      scopes=principal.scopes)
        return page([f.as_openai() for f in files], limit)

    def delete(self, principal: Principal, file_id: str) -> dict[str, Any]:
        self.get(principal, file_id)
        self.store.delete_file(principal.tenant_id, file_id)
        return {"id": file_id, "object": "file", "deleted": True}

    # -- uploads ----------------------------------------------------------------------

    def create_upload(self, principal: Principal, filename: str, purpose: str, size: int, mime_type: str,
                      ttl_s: float | None = None) -> Upload:
        """An upload, pending for UPLOAD_TTL_S; its file is kept FILE_TTL_S (or `ttl_s`)."""
        require_files_scope(principal)
        _check_purpose(purpose)
        self._check_room(principal.tenant_id, size)
        now = self.clock()
        upload = Upload(new_id("upload_"), principal.tenant_id, _filename(filename), purpose, size, mime_type, now,
                        now + UPLOAD_TTL_S, file_ttl_s=ttl_s)
        self.store.put_upload(upload)
        return upload

    def get_upload(self, principal: Principal, upload_id: str) -> Upload:
        require_files_scope(principal)
        upload = self.store.get_upload(principal.tenant_id, upload_id)
        if upload is None:
            raise NoSuchObject(f"No such Upload object: {upload_id}")
        if upload.status == "pending" and upload.expires_at <= self.clock():
            raise BadRequest(f"upload {upload_id} expired (an upload is completed within an hour of its creation)")
        return upload

    def add_part(self, principal: Principal, upload_id: str, data: bytes) -> UploadPart:
        upload = self._pending(principal, upload_id)
        if len(data) > MAX_PART_BYTES:
            raise FileTooLarge(f"a part holds at most {MAX_PART_BYTES} bytes here (what one request carries through"
                               f" API Gateway and Lambda); this one has {len(data)}: send smaller parts (the OpenAI"
                               f" SDK's upload_file_chunked(part_size={MAX_PART_BYTES}))")
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
        file = StoredFile(new_id("file-"), upload.tenant_id, upload.filename, upload.purpose, size, now,
                          now + (upload.file_ttl_s or FILE_TTL_S))
        try:  # the md5 taken as the file is written: the parts are read once
            stored = self.store.complete_upload(upload, part_ids, file, md5)
        except DigestMismatch:
            raise BadRequest("the parts' md5 is not the one given: a part was lost or changed on the way") from None
        except ValueError:
            raise Conflict("the upload was completed or cancelled by another request") from None
        self.count_stored(principal.tenant_id, stored.bytes, "(files)")
        return self.store.get_upload(upload.tenant_id, upload.id) or upload, stored

    def cancel_upload(self, principal: Principal, upload_id: str) -> Upload:
        upload = self._pending(principal, upload_id)
        cancelled = replace(upload, status="cancelled")
        if not self.store.set_upload(cancelled, "pending"):
            raise Conflict("the upload was completed or cancelled by another request")
        return cancelled

    def _pending(self, principal: Principal, upload_id: str) -> Upload:
        upload = self.get_upload(principal, upload_id)
        if upload.status != "pending":
            raise BadRequest(f"upload {upload_id} is {upload.status}; only a pending upload takes parts or ends")
        return upload


class BatchService:
    def __init__(self, store: BatchStore, registry: ModelRegistry, settings: BatchSettings,
                 clock: Callable[[], float] = time.time, announce: Callable[[str, str], None] | None = None) -> None:
        self.store = store
        self.registry = registry
        self.settings = settings
        self.clock = clock
        # (batch id, tenant id): tells the worker a batch waits (AWS: its queue). Locally the
        # worker polls the store; in AWS a batch whose announcement failed is found by the sweep.
        self.announce = announce

    def create(self, principal: Principal, input_file_id: str, endpoint: str, completion_window: str,
               metadata: dict[str, str] | None, output_ttl_s: float | None = None) -> Batch:
        """A batch, validating: its worker reads the file next. `output_ttl_s`: how long its output
        and error files are kept (OpenAI's output_expires_after; else FILE_TTL_S)."""
        if endpoint not in ENDPOINTS:
            raise BadRequest(f"endpoint must be one of {', '.join(ENDPOINTS)}")
        scope = ENDPOINTS[endpoint].scope
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
        open_batches = self.store.open_batches()
        if sum(1 for b in open_batches if b.tenant_id == principal.tenant_id) >= MAX_OPEN_BATCHES:
            raise RateLimited(f"this tenant has {MAX_OPEN_BATCHES} batches validating or running, the most it may at"
                              " once; create this one when one of them has ended", 60)
        self._check_capacity(principal, file, endpoint, window, open_batches)
        now = self.clock()
        batch = Batch(new_id("batch_"), principal.tenant_id, endpoint, input_file_id, completion_window, now,
                      now + window, principal_document(principal), metadata=metadata, output_ttl_s=output_ttl_s)
        self.store.put_batch(batch)
        if self.announce is not None:
            try:
                self.announce(batch.id, batch.tenant_id)
            except Exception:  # created all the same: the sweep announces a batch no worker took
                log.exception("a new batch could not be announced to its worker", extra={"batch_id": batch.id})
        return batch

    def _check_capacity(self, principal: Principal, file: StoredFile, endpoint: str, window_s: float,
                        open_batches: list[Batch]) -> None:
        """Refuse at once a batch whose work could never finish within its window: its tokens
        (estimated from its size) and those of the batches still open before it, at the pool's
        rate, on its first tier's least instances."""
        model = first_model(self.store.read_file(principal.tenant_id, file.id) or iter(()))
        try:
            pool = self.registry.route_for(model, ENDPOINTS[endpoint].service).pool if model is not None else None
        except NotFound:
            pool = None  # the batch fails validation, naming the model
        instances = max(1, pool.policy.min_instances) if pool is not None else 1
        ahead = sum(f.bytes for b in open_batches
                    if (f := self.store.get_file(b.tenant_id, b.input_file_id)) is not None)
        tokens = (file.bytes + ahead) / BYTES_PER_TOKEN
        needs_s = tokens / self.settings.tokens_per_second
        can_s = window_s * instances
        if needs_s > can_s:
            raise CannotFinish(
                f"this batch's work cannot finish within its window: about {math.ceil(tokens)} tokens ({file.bytes}"
                f" bytes, and {ahead} of the batches open before it, at about {BYTES_PER_TOKEN} bytes a token) at"
                f" {self.settings.tokens_per_second:g} tokens a second take about {math.ceil(needs_s)} s of model"
                f" time, and {instances} instance(s) give {math.floor(can_s)} s in {window_s / 3600:g} h: split the"
                " file into batches of fewer lines, or send it when the open batches are done")

    def get(self, principal: Principal, batch_id: str) -> Batch:
        """The batch, if the credential holds its endpoint's scope (else, as another tenant's, 404)."""
        require_files_scope(principal)
        batch = self.store.get_batch(principal.tenant_id, batch_id)
        if batch is None or not visible(ENDPOINTS[batch.endpoint].scope, principal):
            raise NoSuchObject(f"No such Batch object: {batch_id}")
        return batch

    def list(self, principal: Principal, after: str | None, limit: int) -> dict[str, Any]:
        require_files_scope(principal)
        batches = self.store.list_batches(principal.tenant_id, after, limit + 1, scopes=principal.scopes)
        return page([b.as_openai() for b in batches], limit)

    def cancel(self, principal: Principal, batch_id: str) -> Batch:
        """A batch validating or in progress is cancelling at once; its worker stops within a line
        and keeps what finished. Cancelling a cancelling batch again changes nothing."""
        for _ in range(3):  # a worker's own write may come between the read and this one
            batch = self.get(principal, batch_id)
            if batch.status in ("cancelling", "cancelled"):
                return batch
            if batch.status in FINAL or batch.status == "finalizing":
                raise Conflict(f"cannot cancel a batch with status {batch.status}")
            was = batch.status
            batch.status, batch.cancelling_at = "cancelling", self.clock()
            if self.store.update_batch(batch, was):
                return batch
        raise Conflict("the batch changed while it was cancelled; retry")


def page(items: list[dict[str, Any]], limit: int) -> dict[str, Any]:
    """OpenAI's cursor page of up to `limit` of `items` (`limit + 1` read, to know whether more
    follow): `after` the last id of one page gives the next."""
    shown = items[:limit]
    return {"object": "list", "data": shown, "first_id": shown[0]["id"] if shown else None,
            "last_id": shown[-1]["id"] if shown else None, "has_more": len(items) > limit}


def visible(scope: str | None, principal: Principal) -> bool:
    return scope is None or scope in principal.scopes


def _check_purpose(purpose: str) -> None:
    if purpose != INPUT_PURPOSE:
        raise BadRequest(f"purpose must be {INPUT_PURPOSE!r}: this API keeps batch input files"
                         f" ({OUTPUT_PURPOSE!r} files are the batches' own output)")


def _check_metadata(metadata: dict[str, str] | None) -> None:
    if metadata is None:
        return
    if len(metadata) > MAX_METADATA_PAIRS or any(
            len(k) > MAX_METADATA_KEY or len(v) > MAX_METADATA_VALUE for k, v in metadata.items()):
        raise BadRequest(f"metadata holds at most {MAX_METADATA_PAIRS} pairs of strings, keys of at most"
                         f" {MAX_METADATA_KEY} characters and values of at most {MAX_METADATA_VALUE}")


def _filename(name: str) -> str:
    """A file's name as given, without a path, at most 255 characters (it names a download)."""
    name = name.replace("\\", "/").rsplit("/", 1)[-1].strip()
    return "".join(c for c in name if c.isprintable())[:255] or "upload.jsonl"


