"""The records use case: attach the true outcome (or a person's override) to a decision,
read a record back, and list a tenant's records with calibration drift per catalog entry.

A decision id is accepted bare (System One's `x_decision_id`, the `x-decision-id`
header) or as an OpenAI Decisions answer's `id` carries it (`decision_<id>`): both name
the same record.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from gateway.auth.credentials import Principal
from gateway.catalogs.drift import drift
from gateway.catalogs.store import CatalogStore
from gateway.decisions.records import RecordStore
from gateway.errors import InvalidRequest, NotFound

ID_PATTERN = r"^(decision_)?[0-9a-f]{24}$"


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
        record = self._records().get_record(principal.tenant_id, record_id(decision_id))
        if record is None:
            raise NotFound(f"no decision {decision_id!r}")
        return record

    def attach_outcome(self, principal: Principal, decision_id: str, answers: dict[str, Any], *, override: bool,
                       note: str | None) -> dict[str, Any]:
        """The outcome as stored (replacing any earlier one)."""
        check_outcome_answers(self.get(principal, decision_id), answers)
        outcome = {"answers": answers, "override": override, "note": note, "recorded_at": self.clock(),
                   "recorded_by": principal.credential_id}
        if not self._records().set_outcome(principal.tenant_id, record_id(decision_id), outcome):
            raise NotFound(f"no decision {decision_id!r}")  # expired between the read and the write
        return outcome

    def list_with_drift(self, principal: Principal, *, catalog: str | None, limit: int) -> dict[str, Any]:
        """Newest first, and per catalog entry they name: drift since that entry's last calibration fit."""
        found = self._records().list_records(principal.tenant_id, catalog=catalog, limit=limit)
        names = sorted({q["catalog"].split("@")[0] for r in found for q in r.get("questions", []) if q.get("catalog")})
        report = {}
        for name in names:
            fit = self._calibration_fit(principal.tenant_id, name)
            since = [r for r in found if fit is None or r["created_at"] >= fit["fitted_at"]]
            report[name] = drift(since, name, fit)
        return {"records": found, "drift": report}

    def _calibration_fit(self, tenant_id: str, name: str) -> dict[str, Any] | None:
        entry = self.catalogs.latest_catalog_version(tenant_id, name) if self.catalogs is not None else None
        fitted = entry.entry().calibration.fit if entry is not None else None
        return fitted.model_dump() if fitted is not None else None
