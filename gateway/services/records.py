"""The records use case: attach the true outcome (or a person's override) to a decision,
read a record back, and list a tenant's records with calibration drift per catalog entry.

A decision id is accepted bare (System One's `x_decision_id`, the `x-decision-id`
header) or as an OpenAI Decisions answer's `id` carries it (`decision_<id>`): both name
the same record.

A list is paged, and a page ends at whichever comes first: `limit` records; the records
(and their drift report) that fit one Lambda response (`MAX_PAGE_BYTES`); or
`MAX_READ_BYTES` of records read, matching or not (what bounds a list filtered by
catalog entry). A page that ends before the list does says where the next one starts
(`next_cursor`, a record id to pass as `cursor`); a record is on exactly one page.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Callable, Iterator
from typing import Any

from gateway.auth.credentials import Principal
from gateway.catalogs.drift import drift
from gateway.catalogs.store import CatalogStore
from gateway.decisions.records import ListedRecord, OutcomeTrains, RecordStore, without_features
from gateway.errors import Forbidden, InvalidRequest, NotFound
from gateway.services.learning import TRAINING_SCOPE

ID_PATTERN = r"^(decision_)?[0-9a-f]{24}$"
CURSOR_PATTERN = r"^[0-9a-f]{24}$"
# Lambda answers with at most 6 MB (its invocation payload quota): the whole proxy result,
# in which the page's JSON travels escaped as a JSON string (non-ASCII as \uXXXX), or
# base64-encoded. A page's records and drift report are counted as they travel, the
# larger of the two ways (`travelling_bytes`), up to this figure; the other megabyte is
# the result's own fields and headers, with room to spare. One record always fits
# (records are capped at 400 KB: MAX_RECORD_ITEM_BYTES), so every page makes progress.
MAX_PAGE_BYTES = 5 * 1024 * 1024
# What one catalog entry's drift report takes as it travels, its name included, bounded
# (a full report of a 63-character name takes under 500 bytes).
DRIFT_ENTRY_BYTES = 1024
# A page reads at most this much of the tenant's stored records (about eight DynamoDB
# queries of 1 MB), so a catalog entry that is rare in a long history costs more pages,
# never one request that reads the whole history.
MAX_READ_BYTES = 8 * 1024 * 1024


def record_id(decision_id: str) -> str:
    return decision_id.removeprefix("decision_")


def check_outcome_answers(record: dict[str, Any], answers: dict[str, Any]) -> None:
    """An outcome names questions the decision asked, each with one of the options it declared
    (its record lists them): true or false for a yes/no question, a level for a score, an
    option's value for a choice."""
    asked = {q["name"]: q for q in record.get("questions", [])}
    unknown = sorted(set(answers) - set(asked))
    if unknown:
        raise InvalidRequest.at(["answers", unknown[0]], "this decision asked no such question", "unknown_question")
    for name, value in answers.items():
        question = asked[name]
        options = question.get("probabilities") or {}
        if question["kind"] == "noul":
            fits = isinstance(value, bool)
        elif question["kind"] == "score":
            fits = isinstance(value, int) and not isinstance(value, bool) and str(value) in options
        else:
            fits = not options or str(value) in options  # a refused question recorded no options
        if not fits:
            expected = "true or false" if question["kind"] == "noul" else "one of: " + ", ".join(list(options)[:10])
            raise InvalidRequest.at(["answers", name], f"not an answer this question allows ({expected})",
                                    "invalid_outcome")


class RecordsService:
    def __init__(self, store: RecordStore | None, catalogs: CatalogStore | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.catalogs = catalogs
        self.clock = clock

    def _records(self) -> RecordStore:
        if self.store is None:
            raise NotFound("decision records are not configured on this gateway")
        return self.store

    def get(self, principal: Principal, decision_id: str) -> dict[str, Any]:
        return without_features(self._stored(principal, decision_id))

    def _stored(self, principal: Principal, decision_id: str) -> dict[str, Any]:
        record = self._records().get_record(principal.tenant_id, record_id(decision_id))
        if record is None:
            raise NotFound(f"no decision {decision_id!r}")
        return record

    def attach_outcome(self, principal: Principal, decision_id: str, answers: dict[str, Any], *, override: bool,
                       note: str | None, source: str | None = None) -> dict[str, Any]:
        """The outcome as stored (replacing any earlier one). With a `source` (review, audit,
        downstream) it trains the entries' adapters (`trains`), which needs the outcomes:train
        scope as well: an outcome that trains is a write to an entry's behaviour."""
        may_train = TRAINING_SCOPE in principal.scopes
        if source is not None and not may_train:
            raise Forbidden(f"an outcome with a source trains catalog adapters: it needs the {TRAINING_SCOPE!r} scope"
                            " (leave source out to record an outcome for drift only)")
        replacing_training = Forbidden(f"this decision's outcome trains catalog adapters: replacing it needs the"
                                       f" {TRAINING_SCOPE!r} scope")
        record = self._stored(principal, decision_id)
        if (record.get("outcome") or {}).get("trains") and not may_train:
            raise replacing_training
        check_outcome_answers(record, answers)
        outcome = {"answers": answers, "override": override, "note": note, "recorded_at": self.clock(),
                   "recorded_by": principal.credential_id, **({"source": source} if source else {}),
                   "trains": source is not None}
        try:
            written = self._records().set_outcome(principal.tenant_id, record_id(decision_id), outcome,
                                                  keep_training=not may_train)
        except OutcomeTrains:  # attached by a trainer between the read above and this write
            raise replacing_training from None
        if not written:
            raise NotFound(f"no decision {decision_id!r}")  # expired between the read and the write
        return outcome

    def list_with_drift(self, principal: Principal, *, catalog: str | None, limit: int,
                        cursor: str | None = None) -> dict[str, Any]:
        """One page, newest first, and per catalog entry its records name: drift since that entry's
        last calibration fit; `next_cursor` when the list goes on."""
        scanned = self._records().scan_records(principal.tenant_id, catalog=catalog, before=cursor)
        with contextlib.closing(scanned):
            found, next_cursor = page_of(scanned, limit)
        found = [without_features(record) for record in found]
        report = {}
        for name in sorted({name for record in found for name in catalog_names(record)}):
            fit = self._calibration_fit(principal.tenant_id, name)
            since = [r for r in found if fit is None or r["created_at"] >= fit["fitted_at"]]
            report[name] = drift(since, name, fit)
        page: dict[str, Any] = {"records": found, "drift": report}
        if next_cursor is not None:
            page["next_cursor"] = next_cursor
        return page

    def _calibration_fit(self, tenant_id: str, name: str) -> dict[str, Any] | None:
        entry = self.catalogs.latest_catalog_version(tenant_id, name) if self.catalogs is not None else None
        fitted = entry.entry().calibration.fit if entry is not None else None
        return fitted.model_dump() if fitted is not None else None


def page_of(scanned: Iterator[ListedRecord], limit: int) -> tuple[list[dict[str, Any]], str | None]:
    """The page's records and, when the list goes on past them, the cursor of the next page:
    the id of the last record this page read (the next page starts just below it)."""
    page: list[dict[str, Any]] = []
    names: set[str] = set()
    used = read = 0
    last: str | None = None  # the last record read, and so counted on this page
    for item in scanned:
        # Reaching here, another record exists: if this page is full, the list goes on.
        if read >= MAX_READ_BYTES:
            return page, last
        if item.record is not None:
            new = catalog_names(item.record) - names
            cost = travelling_bytes(item.record) + DRIFT_ENTRY_BYTES * len(new)
            if len(page) == limit or (page and used + cost > MAX_PAGE_BYTES):
                return page, last
            page.append(item.record)
            names |= new
            used += cost
        read += item.size
        last = item.record_id
    return page, None


def catalog_names(record: dict[str, Any]) -> set[str]:
    """The catalog entries a record's questions came from (a drift report each)."""
    return {q["catalog"].split("@")[0] for q in record.get("questions", []) if q.get("catalog")}


def travelling_bytes(value: Any) -> int:
    """What `value` takes in the function's response: rendered as the API renders JSON, then
    escaped into the proxy result's body string or base64-encoded, whichever is larger."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return max(len(json.dumps(text)) - 2, 4 * math.ceil(len(text.encode("utf-8", "surrogatepass")) / 3))
