"""A decision's answer, from its plan and the distributions the engine read.

Each question's distribution over its declared options becomes a System One answer
(`answer`); the whole body also says how it was read (`x_readout`, `x_debias`), how the
state was shown (`x_framing`, `x_quarantine`) and what the injection checks found
(`x_injection`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from scorer_container import untrusted
from scorer_container.decision_settings import DecisionSettings
from scorer_container.planning import Plan
from scorer_container.questions import PreparedQuestion
from systemone import answers as formulas
from systemone.features import SKETCH, encode_state
from systemone.models import AnswerFeatures, ChoiceAnswer, DecisionResponse, NoulAnswer, ScoreAnswer, Usage


@dataclass(frozen=True)
class Features:
    """What one question's answer was read from (the engine's, for `x_features`)."""

    orders: list[np.ndarray]  # the distribution in each listing, declared order
    prior: np.ndarray | None  # content-free log-scores, declared order
    state: np.ndarray  # the sketch of the answer position (prefix_tree.Sketch)

    def wire(self) -> dict[str, Any]:
        def logs(values: np.ndarray) -> list[float]:
            return [round(float(v), 6) for v in np.log(np.clip(values, 1e-300, None))]

        return AnswerFeatures(orders=[logs(o) for o in self.orders],
                              prior=None if self.prior is None else [round(float(v), 6) for v in self.prior],
                              state=encode_state(self.state.tolist()), sketch=SKETCH).model_dump(mode="json")


def response(plan: Plan, distributions: Sequence[np.ndarray], evaluated: int, model_name: str,
             features: Sequence[Features] | None = None, cached: int = 0) -> dict[str, Any]:
    """The System One response body for a plan the engine ran (with each answer's
    `x_features` when the engine read them). Its input tokens are those the model read:
    `evaluated` decoded, `cached` restored from the state cache (x_cached_tokens)."""
    questions = [asked.question for asked in plan.asked]
    probe = None
    if plan.settings.injection_probe:  # the injection probe is asked last
        questions, probe = questions[:-1], float(distributions[-1][0])
    settings = plan.settings
    answered = {q.qid: answer(q, p) for q, p in zip(questions, distributions[: len(questions)], strict=True)}
    for q, read in zip(questions, features or (), strict=False):
        answered[q.qid]["x_features"] = read.wire()
    # Built as the contract's model, so no answer leaves the scorer that the gateway would refuse.
    return DecisionResponse(
        model=model_name,
        answers=answered,
        usage=Usage(input_tokens=int(evaluated + cached), output_tokens=0, x_cached_tokens=int(cached)),
        x_readout=settings.readout,
        x_debias=debias(settings, {q.kind for q in questions}),
        x_framing=settings.framing,
        x_quarantine=settings.quarantine,
        x_injection=injection_signal(untrusted.readable(plan.request.state), plan.state, probe, plan.wordings),
    ).model_dump(mode="json", exclude_unset=True)


def answer(question: PreparedQuestion, probabilities: np.ndarray) -> dict[str, Any]:
    """The System One answer for one question from its distribution over options."""
    p = probabilities / probabilities.sum()
    values = [float(x) for x in p]
    if question.kind == "noul":
        typed: NoulAnswer | ChoiceAnswer | ScoreAnswer = NoulAnswer(type="noul", noul=values[0])
    elif question.kind == "choice":
        names = list(question.question.criteria)  # type: ignore[union-attr]
        typed = ChoiceAnswer(type="choice", choice=names[formulas.argmax(values)],
                             probabilities=dict(zip(names, values, strict=True)),
                             confidence=formulas.choice_confidence(values))
    else:
        levels = question.question.criteria  # type: ignore[union-attr]
        typed = ScoreAnswer(type="score", score=formulas.expected_score(values),
                            legend={str(i): level for i, level in enumerate(levels)},
                            probabilities={str(i): v for i, v in enumerate(values)},
                            confidence=formulas.score_confidence(values))
    return typed.model_dump(mode="json", exclude_unset=True)


def debias(settings: DecisionSettings, kinds: set[str]) -> dict[str, Any]:
    """What was applied, for the answer's `x_debias`: the types that differ are listed under `by_type`."""
    out = settings.describe()
    differ = {k: {"readout": v.readout, **v.describe()} for k, v in sorted(settings.kinds.items()) if k in kinds}
    if differ:
        out["by_type"] = differ
    if settings.reduced:
        out["reduced_for_budget"] = True
    return out


def injection_signal(original: str, shown: untrusted.Shown, probe: float | None,
                     answers: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The answer's `x_injection`: the pattern checks on the caller's text (given the request's
    option wordings), the probe's P(yes) when it ran; `suspicion` is the larger of the two
    (what a policy's threshold reads)."""
    score, matched = untrusted.patterns(original, answers)
    return {"suspicion": max(score, probe or 0.0), "probe": probe, "patterns": list(matched),
            "neutralised": list(shown.neutralised)}
