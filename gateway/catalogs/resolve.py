"""Catalog references in a decision become questions, with what their entries declare."""

from __future__ import annotations

from typing import Any

from gateway.catalogs.model import CatalogVersion, ChoiceEntry, NoulEntry, ScoreEntry
from gateway.catalogs.service import CatalogService
from gateway.decisions.model import (
    CatalogBinding,
    CatalogReference,
    Decision,
    FitKey,
    Option,
    Question,
    score_level,
)
from gateway.errors import Forbidden, InvalidRequest, NotFound

_READOUT_FIELDS = {"readout": "x_readout", "order_average": "x_order_average", "prior": "x_prior"}


# Whoever may rewrite a catalog entry's policy may also read past it (calibration runs
# do): everyone else gets an enforcing entry's verdict, computed the entry's way.
POLICY_OVERRIDE_SCOPE = "catalogs:write"
Entry = NoulEntry | ChoiceEntry | ScoreEntry


def expand_references(decision: Decision, tenant_id: str, catalogs: CatalogService | None, catalog_only: bool,
                      may_override_policy: bool = True) -> Decision:
    """The decision with every catalog reference replaced by the question its entry holds."""
    questions: list[Question] = []
    declared: dict[str, dict[Any, str]] = {}  # option -> {value: the entry declaring it}
    enforcing: list[tuple[str, Entry]] = []
    uncached = False
    for question in decision.questions:
        if not isinstance(question, CatalogReference):
            if catalog_only:
                raise Forbidden("this tenant accepts catalog questions only: name an entry, e.g. {\"catalog\": \"...\"}")
            questions.append(question)
            continue
        version = _version(catalogs, tenant_id, question)
        entry = version.entry()
        keep = _keeps_features(catalogs, tenant_id, version, entry) if question.version is not None else None
        questions.append(from_entry(question.id, question.name, version, entry, keep_features=keep))
        uncached = uncached or entry.cache is False
        if not may_override_policy and _held_to_policy(catalogs, tenant_id, decision, version, entry):
            enforcing.append((version.name, entry))
        for field, option in _READOUT_FIELDS.items():
            value = getattr(entry.readout, field)
            if value is not None:
                declared.setdefault(option, {}).setdefault(value, version.name)
    engine = dict(decision.engine_options)
    for option, values in declared.items():
        if option in engine:
            continue  # the request's own setting wins
        if len(values) > 1:
            raise InvalidRequest.at(["questions"], f"these catalog entries declare different {option[2:]} settings; "
                                    "ask them in separate requests or set it on the request", "catalog_conflict")
        engine[option] = next(iter(values))
    # Checked on the settings the scorer will be asked with, every entry's merged in: another
    # entry in the same request must not change an enforcing entry's readout either.
    for name, entry in enforcing:
        _hold_to_readout(name, entry, engine, decision.engine_options, declared)
    if enforcing:
        engine["x_reduce"] = False  # the scorer may not cut the debiasing to fit: 413 instead
    if uncached:
        engine["x_cache"] = False  # the entry's word: its states are kept nowhere, whatever the request says
    if any(q.binding is not None and (q.binding.adapter is not None or q.binding.keep_features) for q in questions):
        engine["x_features"] = True  # what an adapter is applied to, and a refit learns from
    return Decision(decision.model, decision.state, tuple(questions), engine, decision.calibrate)


def _version(catalogs: CatalogService | None, tenant_id: str, question: CatalogReference) -> CatalogVersion:
    if catalogs is None:
        raise NotFound("catalogs are not configured on this gateway")
    try:
        return catalogs.named(tenant_id, question.catalog, question.version)
    except NotFound as exc:
        raise InvalidRequest.at(["questions", question.loc, "catalog"], exc.message, "catalog_not_found") from None


def _keeps_features(catalogs: CatalogService | None, tenant_id: str, version: CatalogVersion, entry: Entry) -> bool:
    """Whether a pinned version's records keep features: only while the entry's latest version
    still says so. Features are a representation of the state, kept at the tenant's choice;
    a caller naming an earlier version must not keep what the tenant has since switched off."""
    if catalogs is None or entry.learning is None or not entry.learning.keep_features:
        return False
    latest = catalogs.get(tenant_id, version.name)
    learning = latest.entry().learning
    return latest.version == version.version or (learning is not None and learning.keep_features)


def _held_to_policy(catalogs: CatalogService, tenant_id: str, decision: Decision, version: CatalogVersion,
                    entry: Entry) -> bool:
    """For a caller who may not read past policies: whether the entry enforces (its latest
    version does), refusing a request that would escape its verdict (an earlier version, or
    raw probabilities)."""
    latest = version if entry.enforces else catalogs.get(tenant_id, version.name)
    if not latest.entry().enforces:
        return False
    if latest.version != version.version:
        raise Forbidden(f"the catalog entry {version.name!r} enforces its policy from version {latest.version}: an"
                        f" earlier version needs the {POLICY_OVERRIDE_SCOPE!r} scope")
    if not decision.calibrate:
        raise Forbidden(f"the catalog entry {version.name!r} enforces its policy: x_calibrate false (raw probabilities,"
                        f" no verdict) needs the {POLICY_OVERRIDE_SCOPE!r} scope")
    return True


def _hold_to_readout(name: str, entry: Entry, engine: dict[str, Any], asked: dict[str, Any],
                     declared: dict[str, dict[Any, str]]) -> None:
    """The readout an enforcing entry's thresholds were set for: its own settings, the model's
    defaults for those it leaves out (absent from `engine`). Neither the caller (403) nor
    another entry of the request (422) may choose another."""
    for field, option in _READOUT_FIELDS.items():
        own = getattr(entry.readout, field)
        if engine.get(option) == own:
            continue
        if option in asked:
            raise Forbidden(f"an enforcing catalog entry fixes {option[2:]} (its thresholds were set for its own"
                            f" readout): setting it needs the {POLICY_OVERRIDE_SCOPE!r} scope")
        others = sorted(n for n in declared.get(option, {}).values() if n != name)
        raise InvalidRequest.at(["questions"], f"the catalog entry {name!r} enforces its policy with its own"
                                f" {option[2:]} setting, and {', '.join(map(repr, others))} declares another: ask them"
                                " in separate requests", "catalog_conflict")


def from_entry(question_id: str, name: str | None, version: CatalogVersion,
               entry: NoulEntry | ChoiceEntry | ScoreEntry, keep_features: bool | None = None) -> Question:
    """The entry's question, bound to it; `keep_features` overrides the entry's own setting."""
    abstain = None
    if isinstance(entry, ChoiceEntry):
        options = tuple(Option(o.name, o.name, o.description) for o in entry.options)
        if entry.abstain is not None:
            abstain = Option(entry.abstain.name, entry.abstain.name, entry.abstain.description)
    elif isinstance(entry, ScoreEntry):
        options = tuple(score_level(i, level.label, level.description) for i, level in enumerate(entry.levels))
    else:
        options = tuple(Option(side, side == "true", text) for side, text in (entry.criteria or {}).items() if text is not None)
    fit = entry.calibration.fit
    fitted_on = FitKey(fit.model_sha256, fit.prompt_version, fit.readout) if fit is not None else None
    keep = entry.learning is not None and entry.learning.keep_features if keep_features is None else keep_features
    binding = CatalogBinding(version.name, version.version, version.content_hash, entry.calibration.temperature, entry.policy,
                             abstain, fitted_on, entry.adapter, keep)
    return Question(question_id, entry.type, entry.instructions, options, name=name or version.name, binding=binding)
