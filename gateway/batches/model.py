"""Files, uploads, batches and the per-line ledger, in OpenAI's shapes, and the store that keeps them.

What the API shows is each object's `as_openai()`; the stores keep the dataclasses. A batch
keeps the principal that created it (never a secret: its tenant, scopes, models and the id of
its credential), so each line runs as that caller, and the worker asks again, before each
line, whether that credential still stands.

The ledger is the batch's own state, one row per input line, and it is what makes a line
run exactly once:

    pending    not run yet, or run and refused for a while (busy, the tenant's share): it runs
               again at `not_before`
    running    a worker has taken it, with the decision id its record will have
    answered   its reply is kept, written before the decision's record (a decision line) or
               before its spend settles (a chat line)
    done       its reply is final

A worker that dies leaves a line `running` or `answered`. Taken again, a `running` line runs
again: its record was not written (the reply is kept first), so nothing was recorded.
An `answered` decision line is done if its record exists (it was recorded and charged once),
and runs again otherwise; an `answered` chat line is done.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal, Protocol

from gateway.auth.credentials import Principal


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A route a batch may name: the scope its creator needs, the service its model is routed
    by, and whether each line writes a decision record."""

    scope: str
    service: str
    records: bool


# The routes a batch may name (one endpoint per batch): the decision routes and chat.
ENDPOINTS = {"/v1/decisions": Endpoint("decide", "decisions", True),
             "/v1/systemone": Endpoint("decide", "decisions", True),
             "/v1/chat/completions": Endpoint("chat", "chat", False)}
COMPLETION_WINDOWS = {"24h": 86_400.0}  # the only window OpenAI offers, and the only one here
MAX_LINES = 50_000  # OpenAI's figure for one batch
MAX_FILE_BYTES = 200 * 1024 * 1024  # OpenAI's figure for a batch input file
MAX_CUSTOM_ID_CHARS = 512
MAX_UPLOAD_PARTS = 10_000
# The most one request carries of a file (`POST /v1/files`) or an upload's part: API Gateway
# hands Lambda the body base64-encoded inside a 6 MB event (gateway.settings.MAX_BODY_BYTES,
# 4,669,440 bytes of body), and a multipart form adds its own bytes; 4 MiB leaves room for them.
MAX_PART_BYTES = 4 * 1024 * 1024
FILE_TTL_S = 30 * 86_400.0  # input and output files are deleted 30 days after they are made
UPLOAD_TTL_S = 3_600.0  # an upload not completed within an hour expires, as OpenAI's do
MAX_METADATA_PAIRS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512
MAX_TENANT_FILES = 10_000  # files (and pending uploads) one tenant keeps at once
MAX_OPEN_BATCHES = 10  # batches one tenant has validating or running at once
INPUT_PURPOSE, OUTPUT_PURPOSE = "batch", "batch_output"

BatchStatus = Literal["validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling",
                      "cancelled"]
FINAL: frozenset[str] = frozenset({"failed", "completed", "expired", "cancelled"})
LineState = Literal["pending", "running", "answered", "done"]


def new_id(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(12)}"


class DigestMismatch(ValueError):
    """An upload's parts are not the bytes whose md5 its caller gave."""


class Digested:
    """Pieces of bytes passed on as they are read, their md5 taken on the way."""

    def __init__(self, pieces: Iterable[bytes]) -> None:
        self._pieces = iter(pieces)
        self._md5 = hashlib.md5(usedforsecurity=False)

    def __iter__(self) -> Iterator[bytes]:
        for piece in self._pieces:
            self._md5.update(piece)
            yield piece

    def matches(self, md5: str | None) -> bool:
        return md5 is None or self._md5.hexdigest() == md5.lower()


def tenant_hash(tenant_id: str) -> str:
    """What names a tenant where names show (object keys and folders, queue message groups): a
    hash of its id, never the id."""
    return hashlib.sha256(tenant_id.encode()).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class StoredFile:
    id: str
    tenant_id: str
    filename: str
    purpose: str
    bytes: int
    created_at: float
    expires_at: float | None = None
    # The scope a credential needs to see it (a batch's output: its endpoint's); None: any
    # credential that may use files (an input file).
    scope: str | None = None

    def as_openai(self) -> dict[str, Any]:
        return {"id": self.id, "object": "file", "bytes": self.bytes, "created_at": int(self.created_at),
                "expires_at": None if self.expires_at is None else int(self.expires_at), "filename": self.filename,
                "purpose": self.purpose, "status": "processed", "status_details": None}


@dataclass(frozen=True, slots=True)
class Upload:
    """OpenAI's Uploads API: a file sent in parts, then assembled (`complete`) into a file."""

    id: str
    tenant_id: str
    filename: str
    purpose: str
    bytes: int  # what the caller said the whole file will take; the parts must add up to it
    mime_type: str
    created_at: float
    expires_at: float
    status: Literal["pending", "completed", "cancelled", "expired"] = "pending"
    file_id: str | None = None
    file_ttl_s: float | None = None  # how long its file is kept (OpenAI's expires_after; else FILE_TTL_S)

    def as_openai(self, file: StoredFile | None = None) -> dict[str, Any]:
        return {"id": self.id, "object": "upload", "bytes": self.bytes, "created_at": int(self.created_at),
                "expires_at": int(self.expires_at), "filename": self.filename, "purpose": self.purpose,
                "status": self.status, "file": None if file is None else file.as_openai()}


@dataclass(frozen=True, slots=True)
class UploadPart:
    id: str
    upload_id: str
    bytes: int
    created_at: float

    def as_openai(self) -> dict[str, Any]:
        return {"id": self.id, "object": "upload.part", "created_at": int(self.created_at), "upload_id": self.upload_id}


def principal_document(principal: Principal) -> dict[str, Any]:
    """What a batch keeps of its creator: who it is, never a secret."""
    document = {f.name: getattr(principal, f.name) for f in fields(principal)}
    document["scopes"] = sorted(principal.scopes)
    document["models"] = None if principal.models is None else sorted(principal.models)
    return document


def principal_of(document: dict[str, Any]) -> Principal:
    models = document.get("models")
    return Principal(**{**document, "scopes": frozenset(document["scopes"]),
                        "models": None if models is None else frozenset(models)})


@dataclass(slots=True)
class Batch:
    id: str
    tenant_id: str
    endpoint: str
    input_file_id: str
    completion_window: str
    created_at: float
    expires_at: float
    principal: dict[str, Any]  # principal_document of its creator
    status: BatchStatus = "validating"
    metadata: dict[str, str] | None = None
    output_ttl_s: float | None = None  # how long its output files are kept (else FILE_TTL_S)
    model: str | None = None
    in_progress_at: float | None = None
    finalizing_at: float | None = None
    completed_at: float | None = None
    failed_at: float | None = None
    expired_at: float | None = None
    cancelling_at: float | None = None
    cancelled_at: float | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    errors: list[dict[str, Any]] | None = None  # OpenAI's BatchError items: why it failed validation
    total: int = 0
    completed: int = 0
    failed: int = 0
    usage: dict[str, int] = field(default_factory=lambda: {"input_tokens": 0, "output_tokens": 0, "cached_tokens": 0})
    cost_usd: float = 0.0  # what its lines were charged, at the batch price
    # Its asynchronous invocations waiting (their ids: until when either answer may come), kept
    # by the worker holding its lease (gateway.batches.worker.run_on_pool); none on a real-time pool
    invocations: dict[str, float] = field(default_factory=dict)

    def document(self) -> dict[str, Any]:
        """What a store keeps as the batch's document: its counts and usage are kept beside it,
        added to as each line finishes (BatchStore.finish_line), never written from here."""
        return {k: v for k, v in asdict(self).items() if k not in COUNTED}

    @classmethod
    def from_document(cls, document: dict[str, Any]) -> Batch:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in document.items() if k in known})

    def as_openai(self) -> dict[str, Any]:
        stamps = ("created_at", "expires_at", "in_progress_at", "finalizing_at", "completed_at", "failed_at",
                  "expired_at", "cancelling_at", "cancelled_at")
        usage = self.usage
        return {
            "id": self.id, "object": "batch", "endpoint": self.endpoint, "model": self.model,
            "errors": None if self.errors is None else {"object": "list", "data": self.errors},
            "input_file_id": self.input_file_id, "completion_window": self.completion_window, "status": self.status,
            "output_file_id": self.output_file_id, "error_file_id": self.error_file_id,
            **{name: None if getattr(self, name) is None else int(getattr(self, name)) for name in stamps},
            "request_counts": {"total": self.total, "completed": self.completed, "failed": self.failed},
            "metadata": self.metadata,
            "usage": {"input_tokens": usage["input_tokens"],
                      "input_tokens_details": {"cached_tokens": usage["cached_tokens"]},
                      "output_tokens": usage["output_tokens"], "output_tokens_details": {"reasoning_tokens": 0},
                      "total_tokens": usage["input_tokens"] + usage["output_tokens"]},
            "x_cost_usd": round(self.cost_usd, 9),
        }


COUNTED = ("completed", "failed", "usage", "cost_usd")  # Batch's figures a store adds to, line by line


@dataclass(slots=True)
class Line:
    """One input line and its place in the ledger."""

    batch_id: str
    number: int  # its line in the input file, from 0
    custom_id: str
    body: str  # the request body, JSON text as the file had it
    state: LineState = "pending"
    decision_id: str | None = None  # the record a decision line writes (set when it is first taken; none for chat)
    tries: int = 0
    not_before: float = 0.0
    reply: str | None = None  # JSON text: {"status_code", "body"} or {"error": {code, message}}
    failed: bool = False
    # The asynchronous invocation its request was sent to, while it waits for the answer (JSON
    # text: gateway.backends.async_pool.Submission); None on a real-time pool.
    submission: str | None = None

    @property
    def request_id(self) -> str:
        """The line's id in the output (`batch_req_...`) and its request id in records and logs."""
        return f"batch_req_{self.batch_id.removeprefix('batch_')}_{self.number}"


@dataclass(frozen=True, slots=True)
class LineUsage:
    """What a done line adds to its batch's figures."""

    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    cost_usd: float = 0.0


class BatchStore(Protocol):
    """Files (their bytes and what describes them), uploads, batches and their ledgers.

    Each write is whole or absent: a file's bytes are in place before its row names them, a
    ledger is in place before its batch's status says so (`add_lines`), and a batch's state
    changes only by the status it was read with (`update_batch`'s `expect`), so a cancel and a
    worker never overwrite each other."""

    def put_file(self, file: StoredFile, content: Iterable[bytes]) -> StoredFile:
        """Store the bytes, then the file; its size as written (`bytes`) comes back."""
        ...

    def get_file(self, tenant_id: str, file_id: str) -> StoredFile | None: ...

    def list_files(self, tenant_id: str, purpose: str | None, after: str | None, limit: int,
                   descending: bool, scopes: Iterable[str] | None = None) -> list[StoredFile]:
        """Oldest or newest first; with `scopes`, only files a credential holding them may see."""
        ...

    def read_file(self, tenant_id: str, file_id: str) -> Iterator[bytes] | None:
        """The file's bytes in pieces, or None when the tenant has no such file."""
        ...

    def delete_file(self, tenant_id: str, file_id: str) -> bool: ...

    def delete_expired(self, now: float) -> int:
        """Remove files and uploads past their expiry, ended batches' ledgers, and ended batches
        older than FILE_TTL_S; how many (a store whose platform expires items by itself, S3
        lifecycle rules and DynamoDB's TTL, may do less)."""
        ...

    def holdings(self, tenant_id: str) -> tuple[int, int]:
        """What the tenant's files take, and how many there are, pending uploads counted at the
        size they were created for (so that parallel uploads cannot pass a bound together)."""
        ...

    def put_upload(self, upload: Upload) -> None: ...

    def get_upload(self, tenant_id: str, upload_id: str) -> Upload | None: ...

    def set_upload(self, upload: Upload, expect: str) -> bool:
        """Replace the upload if its status is still `expect`."""
        ...

    def add_part(self, upload: Upload, part: UploadPart, data: bytes) -> None: ...

    def parts(self, upload_id: str) -> list[UploadPart]: ...

    def read_parts(self, upload: Upload, part_ids: list[str]) -> Iterator[bytes]:
        """The parts' bytes, in that order."""
        ...

    def complete_upload(self, upload: Upload, part_ids: list[str], file: StoredFile, md5: str | None = None) -> StoredFile:
        """The parts, in that order, as one new file; the upload completed, its parts dropped.
        With `md5`, the bytes' digest is checked as they are written (one read of the parts):
        DigestMismatch, and nothing written, when it differs."""
        ...

    def put_batch(self, batch: Batch) -> None: ...

    def get_batch(self, tenant_id: str, batch_id: str) -> Batch | None: ...

    def list_batches(self, tenant_id: str, after: str | None, limit: int,
                     scopes: Iterable[str] | None = None) -> list[Batch]:
        """Newest first; with `scopes`, only batches whose endpoint's scope is among them."""
        ...

    def update_batch(self, batch: Batch, expect: str) -> bool:
        """Write the batch if its stored status is still `expect` (False: another writer changed it)."""
        ...

    def open_batches(self) -> list[Batch]:
        """Every batch not yet final, oldest first (the local worker's queue)."""
        ...

    def stalled(self, now: float, quiet_s: float) -> list[Batch]:
        """Open batches that no worker held, and that were not created or announced, within
        `quiet_s` before `now` (a queue's sweep announces them again)."""
        ...

    def next_turn(self, batch_id: str, now: float) -> int | None:
        """A new turn of the open batch (its previous one stale from now on), or None when it is
        not open: the one turn a queue holds for it (gateway.functions.batch_queue)."""
        ...

    def turn_of(self, batch_id: str) -> int | None:
        """The batch's current turn (None: ended, or never announced)."""
        ...

    def lease(self, batch_id: str, owner: str, until: float, now: float) -> bool:
        """Take (or keep) the batch for `owner` until `until`, if no other owner holds it past
        `now` (`until` = `now` lets it go). True for a batch that does not exist: nothing holds it."""
        ...

    def add_lines(self, batch: Batch, lines: list[Line], expect: str) -> bool:
        """The ledger's lines, then the batch (counts, status), if its status is still `expect`:
        in one write (SQLite), or the lines first and taken back when the status moved (DynamoDB)."""
        ...

    def runnable_lines(self, batch_id: str, now: float, limit: int) -> list[Line]:
        """Lines not done whose `not_before` has come, in file order."""
        ...

    def put_line(self, line: Line, expect_tries: int | None = None) -> bool:
        """Write a line that is not done (taken, answered, waiting to run again); with
        `expect_tries`, only if its stored tries are still that (a worker taking a line: False
        when another took it first)."""
        ...

    def get_line(self, batch_id: str, number: int) -> Line | None:
        """One line of the ledger as it stands (read consistently), or None."""
        ...

    def finish_line(self, line: Line, usage: LineUsage) -> None:
        """Write the line done, and add it to its batch's counts and usage, in one write; a line
        done already is left as it is (so nothing is counted twice)."""
        ...

    def drop_lines(self, batch_id: str) -> None:
        """Forget an ended batch's ledger (its output files hold what it answered)."""
        ...

    def unfinished_lines(self, batch_id: str) -> Iterator[Line]: ...

    def finished_lines(self, batch_id: str) -> Iterator[Line]:
        """The done lines, in file order, read as the caller consumes them."""
        ...
