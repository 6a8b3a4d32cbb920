"""Decision records: one per decision, for audit and replay, and for measuring drift.

A record says which model file (sha256), image, prompt template, catalog entry
(name@version and hash) and policy produced which probabilities and which action (and
why, when a suspected injection made it stricter: the scorer's injection check is kept),
for which tenant and request, and how long it took. The state itself is never kept: only a
keyed hash of it (HMAC-SHA256 with the deployment's signing key, whose id is recorded),
which proves later that a given state was the one decided on without revealing it.

The hash key is the records' own (`GATEWAY_RECORD_KEY_SECRET_ID` or
`GATEWAY_RECORD_KEYS_FILE`), never the token signing key: signing keys rotate monthly
and are dropped a day later, records live for their retention. Its document has the
same shape as the signing keys' (`current` + `key:<kid>`); it is rotated by hand
(`admin new-record-key`), which keeps every earlier key for at least the retention,
so a record made on its first day still verifies on its last. Each tenant's hash key
is derived from it (HMAC of the tenant id), so one tenant's hashes say nothing about
another's and a state is bound to the tenant it was decided for.

Every record is written as a structured log line (durable in CloudWatch) and to the
records store. A decision is answered only once its record is stored: the write is
tried `WRITE_ATTEMPTS` times, and if every try fails the request fails with 503
(`RecordNotStored`, Retry-After), so no caller acts on a decision nobody can audit.
The log line (marked `stored: false`) still holds what was decided.

A record is one DynamoDB item, whose size AWS caps (`MAX_RECORD_ITEM_BYTES`). Both stores
hold a record, its outcome included, to that cap before they write, and refuse what
would pass it with `RecordTooLarge` (413, with the figures): a decision whose record
would not fit is not answered (retrying cannot help, so it is not retried), an outcome
that would not fit is not attached, and the record stays as it was.
"""

import hashlib
import hmac
import logging
import secrets
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple, Protocol

from pydantic import BaseModel, ConfigDict

from gateway.auth.credentials import Principal
from gateway.auth.tokens import KeyRing
from gateway.decisions.cost import Meter
from gateway.decisions.model import (
    Action,
    Answer,
    Decision,
    DecisionResult,
    Text,
    VerdictReason,
    render_json,
    shown_choice,
)
from gateway.errors import PayloadTooLarge, RecordNotStored
from systemone import answers as formulas
from systemone.features import encode_state

log = logging.getLogger("gateway.records")
DEFAULT_RETENTION_DAYS = 90
WRITE_ATTEMPTS = 3
WRITE_BACKOFF_S = 0.05
# DynamoDB's largest item is 400 KB of 1,024 bytes (409,600), attribute names and values
# together ("Constraints in Amazon DynamoDB", "DynamoDB item sizes and formats"). A record
# is held to 400,000 by the figure below, so that no difference in counting (UpdateItem's
# own overhead; moto counts numbers by their digits and stops at 405,000) can fail a write
# the check let through. The decision-time estimate (`decisions/work_limits.py`,
# MAX_RECORD_BYTES = 300,000) leaves about 100 KB of it for the outcome.
MAX_RECORD_ITEM_BYTES = 400_000
# The rest of a record's item, bounded: its attribute names (70 bytes), four numbers (at
# most 21 bytes each), the catalog list's 3, and what an UpdateItem counts on top (3, and
# 19 for its SET).
RECORD_ITEM_FIXED_BYTES = 256


class OutcomeTrains(Exception):
    """The record's outcome trains catalog adapters, and the write was to leave such an outcome as it is."""


class RecordTooLarge(PayloadTooLarge):
    """A record, with its outcome, larger than one stored item may be (413, with the figures)."""

    error_type = "api_usage_error"
    openai_code = "request_too_large"

    def __init__(self, size: int | None, *, outcome: bool) -> None:
        figure = f"{size} bytes" if size is not None else f"more than {MAX_RECORD_ITEM_BYTES} bytes"
        if outcome:
            message = (f"with this outcome the decision's record would take {figure}; a record holds at most"
                       f" {MAX_RECORD_ITEM_BYTES} bytes, its outcome included: send fewer or shorter answers, or a"
                       " shorter note")
        else:
            message = (f"this decision's audit record would take {figure}; a record holds at most"
                       f" {MAX_RECORD_ITEM_BYTES} bytes: use shorter question names or option keys, or fewer questions")
        super().__init__(message)
        self.size = size


def record_item_bytes(tenant_id: str, record_id: str, catalogs: Iterable[str], body: str,
                      outcome: str | None = None) -> int:
    """What a stored record takes, its outcome included, by DynamoDB's rules (strings by their
    UTF-8 bytes, a list's elements one byte more each): `body` and `outcome` as the store
    writes them (JSON text). Both stores hold a record to MAX_RECORD_ITEM_BYTES by this figure."""
    names = list(catalogs)
    texts = [tenant_id, record_id, body, outcome or "", *names]
    return RECORD_ITEM_FIXED_BYTES + len(names) + sum(len(t.encode("utf-8", "surrogatepass")) for t in texts)


def check_record_item(size: int, *, outcome: bool) -> None:
    """RecordTooLarge when a record of `size` (record_item_bytes) would not fit one item."""
    if size > MAX_RECORD_ITEM_BYTES:
        raise RecordTooLarge(size, outcome=outcome)


class ListedRecord(NamedTuple):
    """One record as a listing reads it."""

    record_id: str
    size: int  # the stored JSON texts' bytes, body and outcome: what reading it cost
    record: dict[str, Any] | None  # None: read, but not a match (another catalog, older than `since`, expired)


class RecordStore(Protocol):
    def put_record(self, tenant_id: str, record_id: str, created_at: float, catalogs: list[str], body: dict[str, Any],
                   expires_at: float) -> int:
        """Store a new record; its size as stored (record_item_bytes). RecordTooLarge (nothing
        written) past MAX_RECORD_ITEM_BYTES."""
        ...

    def get_record(self, tenant_id: str, record_id: str) -> dict[str, Any] | None:
        """The record body with its `outcome` (or None), only if it belongs to the tenant."""
        ...

    def set_outcome(self, tenant_id: str, record_id: str, outcome: dict[str, Any], *, keep_training: bool = False) -> bool:
        """Attach (or replace) the outcome; False when the tenant has no such record;
        RecordTooLarge (the record unchanged) when the record with it would pass MAX_RECORD_ITEM_BYTES.
        With `keep_training`, an outcome that trains (`trains`) is left as it is (OutcomeTrains),
        checked in the same write: a check before it could be raced by the write it guards."""
        ...

    def scan_records(self, tenant_id: str, *, catalog: str | None = None, since: float | None = None,
                     before: str | None = None) -> Iterator[ListedRecord]:
        """The tenant's records newest first (by id: ids are time-ordered), from just below the id
        `before`, read as the caller consumes them, so that a page stops reading where it ends.
        A record that does not name `catalog`, or was made before `since`, comes with no body,
        so that a filtered page can cap what it reads as well as what it returns."""
        ...


class QuestionRecord(BaseModel):
    """One question of a decision as recorded: what was asked, what the model said, what the policy did."""

    model_config = ConfigDict(extra="forbid", defer_build=True)
    name: str | None
    kind: str
    catalog: str | None = None  # name@version of the entry that declared it
    catalog_hash: str | None = None
    temperature: float | None = None
    policy: dict[str, Any] | None = None
    refused: bool | None = None
    probabilities: dict[str, float] | None = None
    answer: str | bool | int | None = None  # what the caller got (an enforced abstain included)
    model_answer: str | bool | int | None = None  # the most likely option: drift is measured on it
    action: Action | None = None
    action_reason: VerdictReason | None = None  # set only when the action is not the one the rules gave
    top: float | None = None
    margin: float | None = None
    confidence: float | None = None
    adapter: str | None = None  # the id of the entry's adapter that produced the probabilities
    # What the scorer read the answer from, kept only where the entry opts in
    # (learning.keep_features): a representation of the state, which lives and dies with the
    # record (its retention, its tenant) and never reaches a log line.
    features: dict[str, Any] | None = None


class RecordInjection(BaseModel):
    """The scorer's check of the state for planted instructions (systemone.models.InjectionSignal)."""

    model_config = ConfigDict(extra="forbid", defer_build=True)
    suspicion: float
    probe: float | None = None
    patterns: list[str] = []
    neutralised: list[str] = []


class RecordUsage(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)
    input_tokens: int
    output_tokens: int
    cached_tokens: int = 0  # of the input, what the scorer restored from the state it kept (0 in records made before)
    endpoint_s: float = 0.0  # the model endpoints' time, every attempt included (0 in records made before)
    cost_usd: float = 0.0  # that time at the pools' prices, and the gateway's share


class DecisionRecord(BaseModel):
    """A decision as audited: one model for the stored item, the log line and `GET /v1/records/{id}`.

    `outcome` is the ground truth (or a person's override) a caller attaches later, never the
    model's answer (that is `questions`)."""

    model_config = ConfigDict(extra="forbid", defer_build=True)
    id: str
    request_id: str
    tenant_id: str
    credential_id: str
    created_at: float
    route: str
    model_requested: str
    model: str
    endpoint: str
    attempts: int
    model_sha256: str | None = None
    image_digest: str | None = None
    prompt_version: str | None = None  # the prompt template that produced the probabilities
    readout: str | None = None
    # How the options were listed and averaged, and the model's temperature: an answer
    # depends on them as much as on the prompt template.
    debias: dict[str, Any] | None = None
    # How the state was shown to the model and what the injection check found: an action
    # made stricter by a suspected injection is explained by them (records made by a scorer
    # without the check have neither).
    framing: str | None = None
    quarantine: bool | None = None
    injection: RecordInjection | None = None
    calibrated: bool
    state_hash: str | None = None  # keyed HMAC of the state (never the state itself)
    state_hash_key: str | None = None
    latency_ms: float
    usage: RecordUsage
    questions: list[QuestionRecord]
    outcome: dict[str, Any] | None = None

    def stored(self) -> dict[str, Any]:
        """The body stores keep: every top-level field; a question's fields only where they apply."""
        body = self.model_dump(exclude={"outcome", "questions"})
        body["questions"] = [q.model_dump(exclude_unset=True) for q in self.questions]
        return body


def tenant_key(master: bytes, tenant_id: str) -> bytes:
    return hmac.new(master, b"decision-state-key/v1\x00" + tenant_id.encode(), hashlib.sha256).digest()


def state_digest(master: bytes, tenant_id: str, state: Text) -> str:
    text = state if isinstance(state, str) else render_json(state)
    return hmac.new(tenant_key(master, tenant_id), b"decision-state\x00" + text.encode(), hashlib.sha256).hexdigest()


def state_matches(keys: KeyRing, record: dict[str, Any], state: Text) -> bool:
    """Was `state` the one this record was decided on? (Its key must still be in the ring.)"""
    master = keys.keys().get(str(record.get("state_hash_key") or ""))
    if master is None or not record.get("state_hash"):
        return False
    return hmac.compare_digest(state_digest(master, record["tenant_id"], state), record["state_hash"])


class DecisionRecorder:
    def __init__(self, store: RecordStore | None, hash_keys: KeyRing | None = None,
                 retention_days: float = DEFAULT_RETENTION_DAYS, clock: Callable[[], float] = time.time,
                 on_failure: Callable[[], None] | None = None, sleep: Callable[[float], None] = time.sleep) -> None:
        self.store = store
        self.hash_keys = hash_keys
        self.retention_s = retention_days * 86400
        self.clock = clock
        self.on_failure = on_failure or (lambda: None)
        self.sleep = sleep

    def new_id(self) -> str:
        """Time-ordered (hex milliseconds first), so a tenant's records list newest first by id."""
        return f"{int(self.clock() * 1000):012x}{secrets.token_hex(6)}"

    def state_hash(self, tenant_id: str, state: Text) -> tuple[str | None, str | None]:
        if self.hash_keys is None:
            return None, None
        key_id, master = self.hash_keys.current()
        return state_digest(master, tenant_id, state), key_id

    def record(self, record_id: str, *, principal: Principal, route: str, request_id: str, decision: Decision,
               result: DecisionResult, latency_ms: float, meter: Meter | None = None) -> dict[str, Any]:
        """Store the decision's record (RecordNotStored, or RecordTooLarge, when it cannot be) and
        add the bytes it took to `meter` (the tenant's usage counts them when it settles)."""
        now = self.clock()
        try:
            digest, key_id = self.state_hash(principal.tenant_id, decision.state)
        except Exception:
            log.exception("the record's state-hash key cannot be read", extra={"record_id": record_id})
            self.on_failure()
            raise RecordNotStored("the decision could not be recorded, so it is not answered; retry", retry_after=2) from None
        extensions = result.extensions
        record = DecisionRecord(
            id=record_id, request_id=request_id, tenant_id=principal.tenant_id,
            credential_id=principal.credential_id, created_at=now, route=route, model_requested=decision.model,
            model=result.model, endpoint=result.endpoint, attempts=result.attempts,
            model_sha256=extensions.get("x_model_sha256"), image_digest=extensions.get("x_image_digest"),
            prompt_version=extensions.get("x_prompt_version"), readout=extensions.get("x_readout"),
            debias=extensions.get("x_debias"), framing=extensions.get("x_framing"),
            quarantine=extensions.get("x_quarantine"),
            injection=None if result.injection is None else RecordInjection(**result.injection.model_dump()),
            calibrated=decision.calibrate, state_hash=digest,
            state_hash_key=key_id, latency_ms=round(latency_ms, 2),
            usage=RecordUsage(input_tokens=result.usage.input_tokens, output_tokens=result.usage.output_tokens,
                              cached_tokens=result.usage.cached_tokens,
                              endpoint_s=round(result.cost.endpoint_seconds, 4), cost_usd=result.cost.usd),
            questions=[_question_record(answer) for answer in result.answers])
        body = record.stored()
        catalogs = sorted({a.question.binding.name for a in result.answers if a.question.binding is not None})
        try:
            size = 0 if self.store is None else self._store(principal.tenant_id, record_id, now, catalogs, body)
            stored = size is not None
        except RecordTooLarge:
            log.info("decision record", extra={"record": without_features(body), "stored": False})
            raise
        log.info("decision record", extra={"record": without_features(body), "stored": stored})
        if not stored:
            self.on_failure()
            raise RecordNotStored("the decision could not be recorded, so it is not answered; retry", retry_after=2)
        if meter is not None:
            meter.stored_bytes += size or 0
        return body

    def _store(self, tenant_id: str, record_id: str, now: float, catalogs: list[str], body: dict[str, Any]) -> int | None:
        """The record's size as stored, or None when every attempt failed."""
        for attempt in range(WRITE_ATTEMPTS):
            try:
                return self.store.put_record(tenant_id, record_id, now, catalogs, body, now + self.retention_s)
            except RecordTooLarge:
                raise  # the same record never fits: the caller's request has to change
            except Exception:
                log.warning("decision record write failed", exc_info=True,
                            extra={"record_id": record_id, "attempt": attempt + 1})
                if attempt + 1 < WRITE_ATTEMPTS:
                    self.sleep(WRITE_BACKOFF_S * (2 ** attempt))
        return None


def _question_record(answer: Answer) -> QuestionRecord:
    question = answer.question
    binding = question.binding
    entry: dict[str, Any] = {"name": question.name, "kind": question.kind}
    if binding is not None:
        entry.update(catalog=binding.ref, catalog_hash=binding.content_hash, temperature=binding.temperature,
                     policy=None if binding.policy is None else binding.policy.model_dump(mode="json"))
    if answer.refused:
        return QuestionRecord(**entry, refused=True)
    p = list(answer.probabilities)
    if question.kind == "noul":
        entry.update(probabilities={"true": p[0]}, answer=p[0] >= 0.5)
    else:
        # `answer` is what the caller got (an enforced abstain route included); `model_answer`
        # the most likely option, which calibration drift is measured on.
        entry.update(probabilities={str(o.value): v for o, v in zip(question.options, p, strict=True)},
                     answer=shown_choice(answer).value, model_answer=question.options[formulas.argmax(p)].value)
    if answer.verdict is not None:
        entry.update(action=answer.verdict.action, top=answer.verdict.top, margin=answer.verdict.margin,
                     confidence=answer.verdict.confidence)
        if answer.verdict.reason is not None:
            entry.update(action_reason=answer.verdict.reason)
    if answer.adapter is not None:
        entry.update(adapter=answer.adapter)
    if binding is not None and binding.keep_features and answer.features is not None:
        features = answer.features
        entry.update(features={"orders": [list(o) for o in features.orders], "state": encode_state(features.state),
                               "sketch": features.sketch})
    return QuestionRecord(**entry)


def without_features(body: dict[str, Any]) -> dict[str, Any]:
    """The record as a log line may carry it: the kept features left out."""
    if not any("features" in q for q in body.get("questions", ())):
        return body
    return {**body, "questions": [{k: v for k, v in q.items() if k != "features"} for q in body["questions"]]}
