"""The internal decision model. System One and OpenAI Decisions are two codecs over it,
and the backend (the scorer) receives it rendered as System One.

A question's options are ordered. Each option has a `key` (the name the backend sees
and answers by), a `value` (what the caller gets back: OpenAI choice values keep their
JSON type, so `true` and `"true"` are two options) and a `description` shown to the
model next to the key.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

from gateway.decisions.cost import Cost
from systemone import answers as formulas

# The contract's, re-exported for the decision model's users.
from systemone.json_text import canonical as render_json  # noqa: F401 (re-exported)
from systemone.limits import MAX_CHOICES as MAX_CHOICES
from systemone.limits import MAX_LEVELS as MAX_LEVELS
from systemone.limits import MAX_QUESTIONS as MAX_QUESTIONS
from systemone.models import InjectionSignal
from systemone.models import Text as Text

# Text shown to the model (`Text`): a string, or a JSON object or array rendered as
# canonical JSON (`render_json`), with the contract's limits: one copy, `systemone`.
Kind = Literal["noul", "choice", "score"]
Action = Literal["auto", "review", "abstain"]
# Why a verdict is not the one its rules gave on calibrated probabilities: the state looked
# like it carries instructions planted for the model (gateway.catalogs.policy.guard), or
# the entry's calibration was fitted on another model, prompt or readout than the one
# that answered, so it answered uncalibrated (gateway.catalogs.policy.fitted_here).
VerdictReason = Literal["injection_suspected", "injection_signal_missing", "calibration_mismatch"]


@dataclass(frozen=True, slots=True)
class Option:
    key: str
    value: str | bool | int
    description: Text | None = None
    label: Text | None = None  # score levels: the level as the caller wrote it


def score_level(index: int, label: str, description: Text | None) -> Option:
    """A score level as the model reads it: "label: description" (or the label alone)."""
    text = f"{label}: {description}" if isinstance(description, str) and description else label
    if description is not None and not isinstance(description, str):
        text = {"label": label, "description": description}
    return Option(str(index), index, text, label=label)


class Thresholds(Protocol):
    """What the decision model needs of a catalog entry's policy (gateway.catalogs.model.Policy):
    its mode, and the policy as JSON for the record; the catalogs package judges by it."""

    mode: str

    def model_dump(self, *, mode: str = "python") -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class FitKey:
    """What a catalog entry's calibration was fitted on: the model file (SHA-256), the
    scorer's prompt template and the readout. A temperature or a threshold measured on one
    says nothing about another; None: not recorded (a fit made before keys were)."""

    model_sha256: str | None
    prompt_version: str | None
    readout: str | None


@dataclass(frozen=True, slots=True)
class ReadFeatures:
    """What the backend read one answer from (its `x_features`): the listings'
    log-distributions over the declared options, the state sketch and the sketch's name."""

    orders: tuple[tuple[float, ...], ...]
    state: tuple[float, ...]
    sketch: str


@dataclass(frozen=True, slots=True)
class CatalogBinding:
    """The catalog entry a question came from, and what applies to its answer."""

    name: str
    version: int
    content_hash: str
    temperature: float = 1.0
    policy: Thresholds | None = None  # None: no thresholds
    abstain: Option | None = None  # the declared abstain / escalation option (choice)
    fitted_on: FitKey | None = None  # None: nothing was fitted (a temperature set by hand applies anywhere)
    # The entry's adapter (gateway.catalogs.model.Adapter), applied in place of its temperature.
    adapter: Any = None
    keep_features: bool = False  # its records keep the answer's features, for refits

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.version}"


@dataclass(frozen=True, slots=True)
class Question:
    id: str  # the backend's question id; never shown to the model
    kind: Kind
    instructions: Text | None
    options: tuple[Option, ...]  # noul: the described sides only; choice: options; score: levels, lowest first
    name: str | None = None  # the caller's name for it (OpenAI questions may be unnamed)
    binding: CatalogBinding | None = None


@dataclass(frozen=True, slots=True)
class CatalogReference:
    """A question the caller names by catalog entry instead of writing it out."""

    id: str
    name: str | None
    catalog: str
    version: int | None = None  # None: the latest
    loc: str | int = 0  # where the caller wrote it: its System One id or its OpenAI position


@dataclass(frozen=True, slots=True)
class Decision:
    model: str  # as the caller wrote it: a model name or an alias
    state: Text
    questions: tuple[Question | CatalogReference, ...]
    # Per-request engine settings passed through to the backend (x_readout, x_order_average, x_prior).
    engine_options: dict[str, Any] = field(default_factory=dict)
    calibrate: bool = True  # False: raw probabilities, no temperature and no thresholds (calibration runs)


@dataclass(frozen=True, slots=True)
class Verdict:
    """What a catalog policy says to do with an answer, and the measures it judged."""

    action: Action
    top: float
    margin: float
    confidence: float
    reason: VerdictReason | None = None  # None: the action is the one the rules gave


@dataclass(frozen=True, slots=True)
class Answer:
    question: Question
    # noul: (P(true),); choice and score: one probability per option, in option order.
    probabilities: tuple[float, ...] = ()
    refused: bool = False  # the backend gave no usable answer to this question
    verdict: Verdict | None = None  # when the question's catalog entry has a policy (gateway.catalogs.policy)
    # The confidence and (a score question's) expected level of these probabilities: the
    # scorer's while they are its own, computed once (`figures`) when the gateway changes them.
    confidence: float | None = None
    score: float | None = None
    features: ReadFeatures | None = None  # what the backend read it from, when asked (x_features)
    adapter: str | None = None  # the id of the catalog entry's adapter that produced these probabilities

    def recalibrated(self, probabilities: tuple[float, ...]) -> Answer:
        """This answer with other probabilities, and the figures that describe them."""
        if probabilities == self.probabilities:
            return self
        confidence, score = figures(self.question.kind, probabilities)
        return replace(self, probabilities=probabilities, confidence=confidence, score=score)


def cost_fields(cost: Cost) -> dict[str, float]:
    """A usage object's cost: seconds on the endpoints, and USD (0 where the pool has no price)."""
    return {"x_endpoint_s": round(cost.endpoint_seconds, 4), "x_cost_usd": cost.usd}


def figures(kind: str, probabilities: tuple[float, ...]) -> tuple[float, float | None]:
    """The contract's confidence of `probabilities` and, for a score question, its expected
    level (systemone.answers: the formulas the scorer computes its own with)."""
    if kind == "score":
        return formulas.score_confidence(probabilities), formulas.expected_score(probabilities)
    distribution = (probabilities[0], 1 - probabilities[0]) if kind == "noul" else probabilities
    return formulas.choice_confidence(distribution), None


def confidence_of(answer: Answer) -> float:
    """The answer's confidence: the one it carries, else (an answer made without) its figure."""
    return answer.confidence if answer.confidence is not None else figures(answer.question.kind, answer.probabilities)[0]


def score_of(answer: Answer) -> float:
    """A score answer's expected level: the one it carries, else its figure."""
    return answer.score if answer.score is not None else formulas.expected_score(answer.probabilities)


@dataclass(frozen=True, slots=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0


@dataclass(frozen=True, slots=True)
class DecisionResult:
    """What the model answered (never the ground truth a caller attaches later: that is a
    record's `outcome`)."""

    model: str  # the real model that answered, as the backend reports it
    answers: tuple[Answer, ...]
    usage: Usage
    endpoint: str = ""  # the endpoint that answered
    attempts: int = 1  # endpoints tried, that one included
    extensions: dict[str, Any] = field(default_factory=dict)  # x_ fields the backend returned (x_readout...)
    # The backend's x_injection, typed: policies judge by it. None from a scorer without the check.
    injection: InjectionSignal | None = None
    cost: Cost = field(default_factory=Cost)  # the endpoints' time at their price, and the gateway's share


def shown_choice(answer: Answer) -> Option:
    """The option a choice answers: the most likely one, or, when an enforcing policy
    abstains, the entry's declared abstain option."""
    question, verdict = answer.question, answer.verdict
    binding = question.binding
    if (verdict is not None and verdict.action == "abstain" and binding is not None and binding.abstain is not None
            and binding.policy is not None and binding.policy.mode == "enforcing"):
        return binding.abstain
    return question.options[formulas.argmax(answer.probabilities)]
