"""Calibration drift: how a catalog entry's answers fare against the outcomes tenants
attach, since its last calibration fit."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

BINS = 10


def expected_calibration_error(pairs: list[tuple[float, bool]]) -> float:
    """Mean |accuracy - top probability| over equal-width bins of the answers' top probability
    (the answer given's own probability: ECE's "confidence", not the contract's), weighted by bin size."""
    if not pairs:
        return 0.0
    total = 0.0
    for b in range(BINS):
        low, high = b / BINS, (b + 1) / BINS
        members = [(c, ok) for c, ok in pairs if low <= c < high or (b == BINS - 1 and c == 1.0)]
        if members:
            top = sum(c for c, _ in members) / len(members)
            accuracy = sum(ok for _, ok in members) / len(members)
            total += len(members) * abs(accuracy - top)
    return total / len(pairs)


def labelled_answers(records: Iterable[dict[str, Any]], catalog: str) -> list[tuple[float, bool]]:
    """(the answer's top probability, whether it matched the outcome) for each question of the entry that has one."""
    pairs = []
    for record in records:
        expected = ((record.get("outcome") or {}).get("answers")) or {}
        for question in record.get("questions", []):
            if question.get("catalog", "").split("@")[0] != catalog or question.get("name") not in expected:
                continue
            if question.get("refused"):
                continue
            probabilities = question.get("probabilities") or {}
            if question["kind"] == "noul":
                p = probabilities.get("true", 0.5)
                top = max(p, 1 - p)
            else:
                top = max(probabilities.values(), default=0.0)
            predicted = question.get("model_answer", question.get("answer"))
            pairs.append((top, _same(predicted, expected[question["name"]])))
    return pairs


def drift(records: list[dict[str, Any]], catalog: str, fit: dict[str, Any] | None) -> dict[str, Any]:
    pairs = labelled_answers(records, catalog)
    report: dict[str, Any] = {"samples": len(pairs), "since": None if fit is None else fit["fitted_at"]}
    if pairs:
        report["accuracy"] = sum(ok for _, ok in pairs) / len(pairs)
        report["ece"] = expected_calibration_error(pairs)
    if fit is not None:
        report.update(accuracy_at_fit=fit["accuracy"], ece_at_fit=fit["ece"])
        if pairs:
            report.update(accuracy_change=report["accuracy"] - fit["accuracy"], ece_change=report["ece"] - fit["ece"])
    return report


def _same(answer: Any, expected: Any) -> bool:
    # Outcomes arrive as JSON: a score level may come back as "2", a noul as "true".
    if isinstance(answer, bool) or isinstance(expected, bool):
        return str(answer).lower() == str(expected).lower()
    return str(answer) == str(expected)
