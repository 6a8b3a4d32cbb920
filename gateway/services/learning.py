"""Refitting a catalog entry's adapter from its records' outcomes (`POST /v1/catalogs/{name}/refit`).

A record can train the entry when its question named the entry, it kept the answer's
features (the entry's `learning.keep_features`), and its outcome was attached by a
credential holding `outcomes:train` with a `source` (review, audit, downstream): an
outcome is a write to the entry's behaviour, so whoever may only decide cannot steer it.
Only the records of one model, prompt template, readout, listing and sketch are used (an
adapter belongs to them, and the reply names them: `fitted_on`): those with the most
training outcomes among the records read, the newest on a tie. Not simply the newest
record's: a caller who may only decide can choose a readout or listing on an advisory
entry, and one such decision must not decide what the entry learns. After a model change
the refit follows once the new model's outcomes outnumber the old one's. Folds are
grouped by the state's sketch, so answers about one text never straddle train and test.

A fitted adapter is kept only where it beats the calibrated zero-shot answer out of fold
(gateway.catalogs.fitting); then it is written as a new version of the entry, unless the
entry enforces its policy and the caller did not say `apply: true`: a refit that moves an
enforcing entry is an explicit act, its figures shown first.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import re
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from gateway.catalogs.model import MAX_ADAPTER_OPTIONS, Adapter, AdapterFit, adapter_bytes_bound
from gateway.catalogs.policy import answered_by, listing_of
from gateway.catalogs.service import MAX_CONTENT_BYTES, CatalogService
from gateway.catalogs.vectors import adapter_id, encode_vector
from gateway.decisions.records import RecordStore
from gateway.errors import InvalidRequest, NotFound, PayloadTooLarge
from gateway.services.throttle import TenantThrottle
from systemone.features import decode_state

TRAINING_SCOPE = "outcomes:train"
# The newest records a refit reads: about 10 MB of records with features; older outcomes
# add little to a head of a few thousand numbers.
MAX_REFIT_RECORDS = 5000
# The keys (model, template, readout, listing, sketch) a refit's read counts outcomes for:
# their samples are held until one is chosen, so their number is bounded.
MAX_KEYS = 4
# The training outcomes a refit asked over the API fits on (the newest): few enough that a
# 256 MB function (a sixth of a core) answers within API Gateway's 29 s (the fit's time:
# docs/concepts/adapters.md). The scheduled refit (gateway.functions.refits, a function of its own) fits on up to
# MAX_REFIT_RECORDS.
MAX_REQUEST_SAMPLES = 500
# ...for an entry of up to this many options; an entry with more gets proportionally fewer
# (a fit's work grows with outcomes x options), never fewer than MIN_SAMPLES_CAP.
REFERENCE_OPTIONS = 5
MIN_SAMPLES_CAP = 60
# The records a refit reads to find them, matching or not (a tenant's history may be long
# and the entry rare in it): an API refit reads what a page of records does; the scheduled
# one 32 times that.
MAX_REQUEST_READ_BYTES = 8 * 1024 * 1024
MAX_SCHEDULED_READ_BYTES = 32 * MAX_REQUEST_READ_BYTES


class LearningService:
    def __init__(self, catalogs: CatalogService | None, records: RecordStore | None,
                 clock: Callable[[], float] = time.time, throttle: TenantThrottle | None = None) -> None:
        self.catalogs = catalogs
        self.records = records
        self.clock = clock
        self.throttle = throttle  # one refit at a time per tenant, where refits share the decisions' function

    def refit(self, tenant_id: str, name: str, apply: bool | None, max_samples: int = MAX_REQUEST_SAMPLES,
              max_read_bytes: int = MAX_REQUEST_READ_BYTES,
              out_of_time: Callable[[], bool] = lambda: False) -> dict[str, Any]:
        """Fit the entry's adapter on its newest `max_samples` training outcomes; write it as a
        new version where it is kept and may move the entry (see the module's docstring).
        The read of the records stops at `max_read_bytes` or once `out_of_time()`."""
        if self.catalogs is None or self.records is None:
            raise NotFound("catalogs and decision records are not both configured on this gateway")
        with self.throttle.one_refit(tenant_id) if self.throttle is not None else contextlib.nullcontext():
            return self._refit(tenant_id, name, apply, max_samples, max_read_bytes, out_of_time)

    def _refit(self, tenant_id: str, name: str, apply: bool | None, max_samples: int, max_read_bytes: int,
               out_of_time: Callable[[], bool]) -> dict[str, Any]:
        assert self.catalogs is not None and self.records is not None
        latest = self.catalogs.get(tenant_id, name)
        entry = latest.entry()
        keys = entry.option_keys()
        if len(keys) > MAX_ADAPTER_OPTIONS:
            raise InvalidRequest.at([], f"this entry has {len(keys)} options; an adapter answers over at most"
                                    f" {MAX_ADAPTER_OPTIONS}", "adapter_too_large")
        if entry.learning is None or not entry.learning.keep_features:
            raise InvalidRequest.at([], "this entry keeps no features for refits: set learning.keep_features true,"
                                    " decide, attach outcomes (scope outcomes:train, with a source), then refit",
                                    "nothing_to_learn")
        # An entry near its size limit cannot take an adapter: refused before any work.
        held = len(json.dumps(entry.adapter.model_dump())) if entry.adapter is not None else 0
        room = MAX_CONTENT_BYTES - len(latest.content.encode("utf-8")) + held
        if adapter_bytes_bound(len(keys)) > room:
            raise PayloadTooLarge(f"an adapter of {len(keys)} options takes up to {adapter_bytes_bound(len(keys))} bytes"
                                  f" and this entry has room for {room} (an entry holds at most {MAX_CONTENT_BYTES}):"
                                  " shorten its descriptions to let it learn")
        # The fit's work grows with outcomes x options: the cap is on their product.
        limit = max(MIN_SAMPLES_CAP, max_samples * REFERENCE_OPTIONS // max(len(keys), REFERENCE_OPTIONS))
        samples, key, found = self._samples(tenant_id, name, keys, limit, max_read_bytes, out_of_time)
        report: dict[str, Any] = {"catalog": latest.ref, "outcomes": found, "samples": len(samples), "fitted_on": key}
        digest = outcomes_digest(samples)
        if entry.adapter is not None and entry.adapter.fit.outcomes == digest:
            return {**report, "applied": False, "adapter": entry.adapter.id,
                    "reason": "no training outcome changed since its adapter was fitted"}
        # BLAS threads are the environment's (OPENBLAS_NUM_THREADS=1 in the template and `make up`).
        from gateway.catalogs import fitting  # numpy: loaded by a refit only, never on a decision's path

        fitted = fitting.fit([s for s, _, _ in samples], len(keys))
        report["reason"] = fitted.reason
        if fitted.adapted is not None and fitted.zero_shot is not None:
            report.update(adapter_out_of_fold=fitted.adapted.as_dict(), zero_shot_out_of_fold=fitted.zero_shot.as_dict(),
                          folds=fitted.folds, l2=fitted.l2)
        if fitted.head is None:
            return {**report, "applied": False}
        assert key is not None and fitted.adapted is not None and fitted.zero_shot is not None and fitted.l2 is not None
        adapter = _adapter(fitted, key, keys, Counter(source for _, source, _ in samples), digest, self.clock())
        report["adapter"] = adapter.id
        if apply is False or (entry.enforces and apply is not True):
            why = ("apply: false" if apply is False
                   else "the entry enforces its policy: it moves only when the refit says apply: true")
            return {**report, "applied": False, "reason": f"{fitted.reason}; not written ({why})"}
        content = entry.model_copy(update={"adapter": adapter})
        version, _ = self.catalogs.put(tenant_id, name, type(entry).model_validate(content.model_dump()),
                                       based_on=latest.version)
        return {**report, "applied": True, "version": version.version, "catalog": version.ref}

    def _samples(self, tenant_id: str, name: str, keys: list[str], limit: int, max_read_bytes: int,
                 out_of_time: Callable[[], bool]) -> tuple[list[tuple[Any, str, str]], dict | None, dict[str, int]]:
        """((sample, its outcome's source, record id) of the key with the most training
        outcomes, that key, counts of what was read and why records were left out)."""
        from gateway.catalogs.fitting import Sample

        found: Counter[str] = Counter()
        by_key: dict[str, list[tuple[tuple, str, str]]] = {}  # newest first, each at most `limit`
        counts: Counter[str] = Counter()
        scanned = self.records.scan_records(tenant_id, catalog=name)  # type: ignore[union-attr]
        read_bytes = 0
        with contextlib.closing(scanned):
            for item in scanned:
                read_bytes += item.size
                if read_bytes > max_read_bytes or found["read"] >= MAX_REFIT_RECORDS:
                    found["read_limit_reached"] = 1  # older records are left out
                    break
                if out_of_time():
                    found["time_limit_reached"] = 1  # this entry's share of the scheduled run
                    break
                if item.record is None:
                    continue
                found["read"] += 1
                for question in item.record.get("questions", ()):
                    if not str(question.get("catalog", "")).startswith(f"{name}@"):
                        continue
                    read = _training_sample(item.record, question, keys)
                    if isinstance(read, str):
                        found[read] += 1
                        continue
                    sample_key, sample, source = read
                    tag = json_key(sample_key)
                    if tag not in by_key and len(by_key) >= MAX_KEYS:
                        found["another_model"] += 1  # bounded memory: the first MAX_KEYS keys met compete
                        continue
                    counts[tag] += 1
                    kept = by_key.setdefault(tag, [])
                    if len(kept) < limit:
                        kept.append((sample, source, item.record["id"]))
        if not by_key:
            found["used"] = 0
            return [], None, dict(found)
        # Most outcomes wins; on a tie, the key met first (the newest record's).
        chosen = max(by_key, key=lambda tag: (counts[tag], -list(by_key).index(tag)))
        others = sum(n for tag, n in counts.items() if tag != chosen)
        if others:
            found["another_model"] += others
        if counts[chosen] > len(by_key[chosen]):
            found["beyond_limit"] = counts[chosen] - len(by_key[chosen])
        samples = [(Sample(orders, decode_state(state), label, group), source, record_id)
                   for (orders, state, label, group), source, record_id in by_key[chosen]]
        found["used"] = len(samples)
        return samples, json.loads(chosen), dict(found)


def json_key(key: dict[str, Any]) -> str:
    return json.dumps(key, sort_keys=True)


def _training_sample(record: dict[str, Any], question: dict[str, Any], keys: list[str]) -> tuple | str:
    """(the key it was answered under, the sample's parts, the outcome's source), or why it cannot train."""
    outcome = record.get("outcome") or {}
    if not outcome.get("trains"):
        return "no_training_outcome"
    value = (outcome.get("answers") or {}).get(question.get("name"))
    label = _label(value, question["kind"], keys)
    if label is None:
        return "no_outcome_for_question"
    features = question.get("features")
    if not features:
        return "no_features"
    try:
        decode_state(features["state"])  # checked here; decoded again for the key chosen only
    except (KeyError, ValueError, TypeError):
        return "no_features"
    orders = features.get("orders") or []
    # The same options in the same order: a version that reordered them lists other features.
    declared = keys if question["kind"] == "noul" else list(question.get("probabilities") or {})
    if not orders or declared != keys or any(len(o) != len(keys) for o in orders):
        return "options_changed"
    extensions = {"x_model_sha256": record.get("model_sha256"), "x_prompt_version": record.get("prompt_version"),
                  "x_readout": record.get("readout"), "x_debias": record.get("debias")}
    answered = answered_by(extensions, question["kind"])
    key = {"model_sha256": answered.model_sha256, "prompt_version": answered.prompt_version,
           "readout": answered.readout, "sketch": features.get("sketch"),
           "listing": listing_of(extensions, question["kind"])}
    if not _valid_key(key):
        return "no_model_recorded"
    # Grouped by what the model read: answers about one text share a sketch, whatever key
    # hashed their state (so the folds never split a text, even across a key rotation).
    group = hashlib.sha256(features["state"].encode()).hexdigest()
    return key, (orders, features["state"], label, group), outcome.get("source") or "downstream"


def _valid_key(key: dict[str, Any]) -> bool:
    """A key an adapter can carry (gateway.catalogs.model.Adapter): anything else a scorer
    wrote into a record trains nothing."""
    return (isinstance(key["model_sha256"], str) and re.fullmatch(r"[0-9a-f]{64}", key["model_sha256"]) is not None
            and key["readout"] in ("letters", "likelihood")
            and all(isinstance(key[k], str) and 0 < len(key[k]) <= 64 for k in ("prompt_version", "sketch", "listing")))


def outcomes_digest(samples: list[tuple[Any, str, str]]) -> str:
    """What a fit learned from, in 16 hex digits: its records and their labels, in any order."""
    rows = sorted(f"{record_id}:{sample.label}" for sample, _, record_id in samples)
    return hashlib.sha256("\n".join(rows).encode()).hexdigest()[:16]


def _label(value: Any, kind: str, keys: list[str]) -> int | None:
    if kind == "noul":
        return {True: 0, False: 1}.get(value) if isinstance(value, bool) else None
    text = str(value) if not isinstance(value, bool) else None
    return keys.index(text) if text in keys else None


def _adapter(fitted: Any, key: dict[str, Any], keys: list[str], sources: Counter[str], digest: str,
             now: float) -> Adapter:
    head = fitted.head
    fields: dict[str, Any] = {
        **key, "options": keys, "scale": round(float(head.scale), 6), "bias": [round(float(b), 6) for b in head.bias],
        "center": encode_vector([float(v) for v in head.center]), "spread": encode_vector([float(v) for v in head.spread]),
        "weights": encode_vector([float(v) for v in head.weights.reshape(-1)]),
        # Rounded outwards: the held term never cuts a training sample's own.
        "reach": [[math.floor(float(low) * 1e6) / 1e6, math.ceil(float(high) * 1e6) / 1e6] for low, high in head.reach],
        "fit": AdapterFit(fitted_at=now, samples=sum(sources.values()), folds=fitted.folds, l2=fitted.l2,
                          accuracy=fitted.adapted.accuracy, nll=fitted.adapted.nll, brier=fitted.adapted.brier,
                          zero_shot_accuracy=fitted.zero_shot.accuracy, zero_shot_nll=fitted.zero_shot.nll,
                          zero_shot_brier=fitted.zero_shot.brier, sources=dict(sources),
                          outcomes=digest).model_dump(mode="json")}
    return Adapter.model_validate({**fields, "id": adapter_id(fields)})

