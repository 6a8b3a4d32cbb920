"""Calibration and thresholds: what turns probabilities into an action.

Calibration divides the log-probabilities by the entry's temperature and renormalises
(for a noul, the logit of P(true)); it runs before the thresholds and before score and
confidence are computed, so everything the caller gets is calibrated. The policy then
judges the calibrated answer: `auto` when the auto rule holds, else `review` when the
review rule holds, else `abstain`. Last, the scorer's injection suspicion may make the
verdict stricter (never softer): the state is text anyone can write, and a state that
addresses the model reading it can steer the probabilities themselves, so no rule on
them is evidence enough to act automatically on it.

An entry with an adapter (gateway.catalogs.adapters) is answered by it instead of by its
temperature. A calibration or an adapter belongs to what it was fitted on (`FitKey`: the
model file, the prompt template, the readout; an adapter also needs the answer's
features). An answer from anything else is left uncalibrated, and its verdict says so
(`calibration_mismatch`); an enforcing policy sends it to review, since its thresholds
were set on another model's probabilities.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from gateway.catalogs.adapters import adapted
from gateway.catalogs.model import InjectionRule, Policy, Rule
from gateway.decisions.model import Action, DecisionResult, FitKey, Verdict, VerdictReason, figures

_EPSILON = 1e-12
_STRICTNESS: dict[Action, int] = {"auto": 0, "review": 1, "abstain": 2}


def with_temperature(kind: str, probabilities: Sequence[float], temperature: float) -> tuple[float, ...]:
    if temperature == 1.0:
        return tuple(probabilities)
    if kind == "noul":
        p = min(1 - _EPSILON, max(_EPSILON, probabilities[0]))
        logit = math.log(p / (1 - p)) / temperature
        return (1 / (1 + math.exp(-logit)),)
    logs = [math.log(max(_EPSILON, p)) / temperature for p in probabilities]
    top = max(logs)
    weights = [math.exp(v - top) for v in logs]
    total = sum(weights)
    return tuple(w / total for w in weights)


def measures(kind: str, probabilities: Sequence[float], confidence: float | None = None) -> tuple[float, float, float]:
    """(top probability, margin over the runner-up, confidence) of an answer; its confidence
    is computed only when the answer carries none."""
    distribution = (probabilities[0], 1 - probabilities[0]) if kind == "noul" else tuple(probabilities)
    ordered = sorted(distribution, reverse=True)
    top, margin = ordered[0], ordered[0] - ordered[1]
    return top, margin, figures(kind, tuple(probabilities))[0] if confidence is None else confidence


def judge(kind: str, probabilities: Sequence[float], policy: Policy, suspicion: float | None = None,
          confidence: float | None = None) -> Verdict:
    """`suspicion`: the scorer's injection suspicion for the state (None: the scorer did not say);
    `confidence`: the answer's own, when it carries one."""
    top, margin, confidence = measures(kind, probabilities, confidence)

    def holds(rule: Rule) -> bool:
        return ((rule.min_top is None or top >= rule.min_top)
                and (rule.min_margin is None or margin >= rule.min_margin)
                and (rule.min_confidence is None or confidence >= rule.min_confidence))

    action: Action = "auto" if holds(policy.auto) else "review" if holds(policy.review) else "abstain"
    return guard(Verdict(action, top, margin, confidence), policy, suspicion)


def guard(verdict: Verdict, policy: Policy, suspicion: float | None) -> Verdict:
    """The verdict made stricter when the suspicion reaches the entry's threshold, or when
    there is none and the entry requires one."""
    action = policy.injection_action()
    rule = policy.injection or InjectionRule()
    if suspicion is None:
        if not rule.require_signal:
            return verdict
        reason: VerdictReason = "injection_signal_missing"
    elif suspicion < rule.threshold:
        return verdict
    else:
        reason = "injection_suspected"
    if action == "ignore" or _STRICTNESS[action] <= _STRICTNESS[verdict.action]:
        return verdict
    return replace(verdict, action=action, reason=reason)


def answered_by(extensions: dict[str, Any], kind: str) -> FitKey:
    """What answered a question of `kind`: the scorer's model file, prompt template and
    readout (a question type may be read another way than the request's, x_debias.by_type)."""
    debias = extensions.get("x_debias")
    by_type = debias.get("by_type") if isinstance(debias, dict) else None
    own = by_type.get(kind) if isinstance(by_type, dict) else None
    readout = own.get("readout") if isinstance(own, dict) and own.get("readout") else extensions.get("x_readout")
    return FitKey(extensions.get("x_model_sha256"), extensions.get("x_prompt_version"), readout)


def listing_of(extensions: dict[str, Any], kind: str) -> str | None:
    """How a question of `kind` was listed and debiased ("canonical/reversal/raw"): an
    adapter reads the per-listing distributions, so it applies only to answers listed as
    the ones it learned from. None when the scorer did not say, or cut its debiasing to fit
    the budget (x_debias.reduced_for_budget)."""
    debias = extensions.get("x_debias")
    if not isinstance(debias, dict) or debias.get("reduced_for_budget"):
        return None
    by_type = debias.get("by_type")
    own = by_type.get(kind) if isinstance(by_type, dict) else None
    settings = own if isinstance(own, dict) else debias
    try:
        averaging = settings["averaging"] if settings["order_average"] else "single"
        return f"{settings['ordering']}/{averaging}/{'prior' if settings['prior'] else 'raw'}"
    except (KeyError, TypeError):
        return None


def fitted_here(fitted_on: FitKey | None, answered: FitKey) -> bool:
    """Whether a calibration applies to an answer: nothing fitted (a temperature set by hand),
    or fitted on this model file, and on this prompt and readout where the fit records them.
    A fit that records no model matches none: it cannot say which it was."""
    if fitted_on is None:
        return True
    if fitted_on.model_sha256 is None or fitted_on.model_sha256 != answered.model_sha256:
        return False
    return all(mine is None or mine == theirs for mine, theirs in ((fitted_on.prompt_version, answered.prompt_version),
                                                                   (fitted_on.readout, answered.readout)))


def apply_catalogs(result: DecisionResult) -> DecisionResult:
    """Each catalog question's temperature, then its policy's verdict, on the calibrated
    probabilities; uncalibrated, and at least `review` when enforcing, where the calibration
    was fitted on something other than what answered."""
    suspicion = result.injection.suspicion if result.injection is not None else None
    answers = []
    for answer in result.answers:
        binding = answer.question.binding
        if binding is None or answer.refused:
            answers.append(answer)
            continue
        kind = answer.question.kind
        answered = answered_by(result.extensions, kind)
        own = None
        if binding.adapter is not None:
            own = adapted(binding.adapter, answer.features, answered, listing_of(result.extensions, kind))
        if own is not None:
            matches, calibrated = True, (own[:1] if kind == "noul" else own)
        else:  # no adapter, or one that does not apply to this answer: the entry's temperature, if it does
            matches = fitted_here(binding.fitted_on, answered)
            calibrated = with_temperature(kind, answer.probabilities, binding.temperature) if matches else answer.probabilities
        figured = answer.recalibrated(calibrated)  # its figures computed once, or the scorer's kept
        verdict = (judge(kind, calibrated, binding.policy, suspicion, figured.confidence)
                   if binding.policy is not None else None)
        if not matches:  # what the answer and its record say was applied: no temperature, no adapter
            answer = replace(answer, question=replace(answer.question, binding=replace(binding, temperature=1.0)))
            if verdict is not None:
                verdict = unfitted(verdict, binding.policy)
        elif own is not None:
            answer = replace(answer, adapter=binding.adapter.id,
                             question=replace(answer.question, binding=replace(binding, temperature=1.0)))
        answers.append(replace(answer, probabilities=figured.probabilities, confidence=figured.confidence,
                               score=figured.score, verdict=verdict))
    return replace(result, answers=tuple(answers))


def unfitted(verdict: Verdict, policy: Policy) -> Verdict:
    """The verdict on uncalibrated probabilities: an enforcing policy's `auto` becomes
    `review` (its thresholds were set for another model's probabilities); either way the
    reason says so, unless a stricter reason already stands."""
    if verdict.reason is not None:
        return verdict
    action: Action = "review" if policy.mode == "enforcing" and verdict.action == "auto" else verdict.action
    return replace(verdict, action=action, reason="calibration_mismatch")
