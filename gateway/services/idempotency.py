"""Idempotent decisions: a request retried with the same `Idempotency-Key` gets the first answer.

The OpenAI SDKs retry a timeout, a 429 and a 5xx twice by default, and a caller's own
retry loop does the same: without this, each retry is a second decision, a second
record and (once spend is counted) a second charge. The key is the caller's (the
header OpenAI's and Stripe's APIs use), scoped to the tenant, the credential and the route
(a replay skips the checks that differ between credentials, such as the models a key may
use or an enforcing policy's, so another credential of the tenant never gets it):

- the first request with a key claims it (for the work's deadline and a margin), runs,
  and stores its 200 reply for `WINDOW_S` (24 hours);
- a retry with the same key and the same request gets that reply again, byte for byte,
  marked `idempotent-replayed: true`, with no backend call and no second record, once it
  passes the checks the request would meet now (the credential's models, the tenant's
  mode and limits, the catalog entries it names): what changed since is not replayed past;
- a retry while the first still runs gets 409 (the SDKs retry a 409 after a backoff,
  by when the first has usually ended); the same key with a different request is a 422;
- an error is not kept: the claim is dropped, so a retry runs afresh.

Entries live in the store the gateway already has (the keys table in AWS, the SQLite
file locally) under a hash of the key, never the key itself.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gateway.auth.credentials import Principal
from gateway.decisions.idempotency import Entry, IdempotencyStore
from gateway.errors import BackendUnavailable, Conflict, InvalidRequest, NotReplayable

log = logging.getLogger("gateway.idempotency")

HEADER = "Idempotency-Key"
REPLAYED_HEADER = "idempotent-replayed"
WINDOW_S = 24 * 3600
MAX_KEY_CHARS = 255
# A stored reply must fit one store item (DynamoDB's 400 KB) beside its key: compressed.
MAX_STORED_REPLY_BYTES = 350_000
# A claim outlives the work's own deadline by this much (a function that died holding it).
CLAIM_MARGIN_S = 30.0


@dataclass(frozen=True, slots=True)
class Reply:
    """A route's reply as it is stored and replayed."""

    status: int
    body: Any
    headers: dict[str, str]

    def encode(self) -> bytes:
        return gzip.compress(json.dumps({"status": self.status, "body": self.body, "headers": self.headers},
                                        ensure_ascii=False, separators=(",", ":")).encode(), mtime=0)

    @classmethod
    def decode(cls, data: bytes) -> Reply:
        value = json.loads(gzip.decompress(data))
        return cls(value["status"], value["body"], value["headers"])


# Kept in place of a reply too large to store: a replay says where to read the decision.
_TOO_LARGE = b"too-large:"


class Idempotency:
    def __init__(self, store: IdempotencyStore, *, hold_s: float, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.hold_s = hold_s + CLAIM_MARGIN_S
        self.clock = clock

    def respond(self, principal: Principal, key: str | None, route: str, request: Any,
                work: Callable[[], Reply], admit: Callable[[], object] = lambda: None) -> Reply:
        """`work()`'s reply, or the first reply to this key (see the module docstring), given
        only once `admit()` passes: the checks the request would meet now (a replay answers
        no caller a fresh request would refuse)."""
        if key is None:
            return work()
        tenant_id = principal.tenant_id
        stored_key = _stored_key(route, principal.credential_id, _checked(key))
        # In the request's own order: options are listed, and a state is read, in that order.
        fingerprint = hashlib.sha256(json.dumps(request, ensure_ascii=False).encode()).hexdigest()
        now = self.clock()
        try:
            existing = self.store.claim_request(tenant_id, stored_key, fingerprint, now + self.hold_s, now)
        except Exception:
            log.exception("an idempotency key could not be claimed", extra={"tenant_id": tenant_id})
            raise BackendUnavailable("idempotency keys cannot be checked right now; retry shortly", 2) from None
        if existing is not None:
            admit()
            return _replay(existing, fingerprint)
        try:
            reply = work()
        except BaseException:
            try:
                self.store.drop_request(tenant_id, stored_key, fingerprint)
            except Exception:  # the claim expires by itself; the caller gets the error that happened
                log.exception("a failed request's idempotency claim could not be dropped", extra={"tenant_id": tenant_id})
            raise
        encoded = reply.encode()
        if len(encoded) > MAX_STORED_REPLY_BYTES:
            encoded = _TOO_LARGE + reply.headers.get("x-decision-id", "").encode()
        try:
            self.store.finish_request(tenant_id, stored_key, fingerprint, encoded, self.clock() + WINDOW_S)
        except Exception:  # the answer stands (its record is stored); a retry within the claim gets 409
            log.exception("an idempotent reply could not be kept", extra={"tenant_id": tenant_id})
        return reply


def _checked(key: str) -> str:
    if not 1 <= len(key) <= MAX_KEY_CHARS or not all(" " <= c <= "~" for c in key):
        raise InvalidRequest([{"loc": ["header", HEADER.lower()], "msg": f"an {HEADER} is 1 to {MAX_KEY_CHARS} printable"
                               " ASCII characters", "type": "idempotency_key_invalid"}])
    return key


def _stored_key(route: str, credential_id: str, key: str) -> str:
    return hashlib.sha256(f"{route}\x1f{credential_id}\x1f{key}".encode()).hexdigest()


def _replay(entry: Entry, fingerprint: str) -> Reply:
    if entry.fingerprint != fingerprint:
        raise InvalidRequest([{"loc": ["header", HEADER.lower()], "msg": f"this {HEADER} was used for another request in the"
                               " last 24 hours: use a new key for a new request", "type": "idempotency_key_reused"}])
    if entry.reply is None:
        raise Conflict(f"a request with this {HEADER} is still running; retry when it has ended")
    if entry.reply.startswith(_TOO_LARGE):
        decision_id = entry.reply.removeprefix(_TOO_LARGE).decode()
        raise NotReplayable(f"the first answer to this {HEADER} is too large to replay: read it with GET"
                            f" /v1/records/{decision_id}")
    reply = Reply.decode(entry.reply)
    return Reply(reply.status, reply.body, {**reply.headers, REPLAYED_HEADER: "true"})
