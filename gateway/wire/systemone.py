"""System One (`POST /v1/systemone`): request model, conversion to a Decision, and the answer.

Question ids are returned byte for byte; they are never shown to the model (the
backend sees positional ids), so renaming a question cannot change its answer.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, field_validator, model_validator

from gateway.decisions import scoring
from gateway.decisions.model import (
    MAX_CHOICES,
    MAX_LEVELS,
    MAX_QUESTIONS,
    CatalogReference,
    Decision,
    Option,
    Outcome,
    Question,
    shown_choice,
)
from gateway.errors import BackendFailed
from gateway.wire.common import (
    CatalogQuestion,
    JsonText,
    Wire,
    policy_fields,
    question_id,
    question_kind,
)


class NoulCriteria(Wire):
    true: JsonText | None = Field(default=None, description="What counts as yes / true.")
    false: JsonText | None = Field(default=None, description="What counts as no / false.")


class NoulQuestion(Wire):
    """A yes/no question; the answer is P(true)."""

    type: Literal["noul"]
    instructions: JsonText | None = None
    criteria: NoulCriteria | None = None

    @model_validator(mode="after")
    def _needs_something_to_ask(self) -> NoulQuestion:
        criteria = self.criteria
        if self.instructions is None and (criteria is None or (criteria.true is None and criteria.false is None)):
            raise ValueError("a noul question needs instructions or criteria")
        return self


class ChoiceQuestion(Wire):
    """One of 2 to 255 named options; a description may be null (the name explains it)."""

    type: Literal["choice"]
    instructions: JsonText | None = None
    criteria: dict[str, JsonText | None] = Field(min_length=2, max_length=MAX_CHOICES)

    @field_validator("criteria")
    @classmethod
    def _names_not_blank(cls, criteria: dict[str, Any]) -> dict[str, Any]:
        if any(not name.strip() for name in criteria):
            raise ValueError("option names must not be blank")
        return criteria


class ScoreQuestion(Wire):
    """Ordered levels, lowest first (an array: a map such as {"0": ...} is refused)."""

    type: Literal["score"]
    instructions: JsonText | None = None
    criteria: list[JsonText] = Field(min_length=2, max_length=MAX_LEVELS)


SystemOneQuestion = Annotated[
    Annotated[NoulQuestion, Tag("noul")] | Annotated[ChoiceQuestion, Tag("choice")] | Annotated[ScoreQuestion, Tag("score")]
    | Annotated[CatalogQuestion, Tag("catalog")],
    Discriminator(question_kind),
]


class SystemOneRequest(Wire):
    model: str = Field(min_length=1, description="A model name or alias from GET /v1/models (jev-latest works).")
    state: JsonText = Field(description="The text, or a JSON object or array, the questions are about.")
    questions: dict[Annotated[str, Field(min_length=1)], SystemOneQuestion] = Field(min_length=1, max_length=MAX_QUESTIONS)
    x_readout: Literal["letters", "likelihood"] | None = None
    x_order_average: bool | None = None
    x_prior: bool | None = None
    x_calibrate: bool | None = Field(default=None, description="false: raw probabilities, no calibration or thresholds.")

    def to_decision(self) -> Decision:
        questions = tuple(_question(question_id(i), qid, q) for i, (qid, q) in enumerate(self.questions.items()))
        engine = {k: v for k, v in (("x_readout", self.x_readout), ("x_order_average", self.x_order_average),
                                    ("x_prior", self.x_prior)) if v is not None}
        return Decision(model=self.model, state=self.state, questions=questions, engine_options=engine,
                        calibrate=self.x_calibrate is not False)


def _question(internal_id: str, name: str, q: Any) -> Question | CatalogReference:
    if isinstance(q, CatalogQuestion):
        return CatalogReference(internal_id, name, q.catalog, q.version, loc=name)
    if isinstance(q, NoulQuestion):
        sides = q.criteria.model_dump() if q.criteria else {}
        options = tuple(Option(side, side == "true", text) for side, text in sides.items() if text is not None)
    elif isinstance(q, ChoiceQuestion):
        options = tuple(Option(key, key, text) for key, text in q.criteria.items())
    else:
        options = tuple(Option(str(i), i, text, label=text) for i, text in enumerate(q.criteria))
    return Question(id=internal_id, kind=q.type, instructions=q.instructions, options=options, name=name)


def render(outcome: Outcome, decision_id: str | None = None) -> dict[str, Any]:
    """The 200 body. System One has no refusal: an unusable answer fails the request."""
    answers: dict[str, Any] = {}
    for answer in outcome.answers:
        question = answer.question
        if answer.refused:
            raise BackendFailed("the model endpoint gave no usable answer to a question")
        p = answer.probabilities
        if question.kind == "noul":
            body: dict[str, Any] = {"type": "noul", "noul": p[0]}
        elif question.kind == "choice":
            keys = [o.key for o in question.options]
            body = {
                "type": "choice",
                "choice": shown_choice(answer).key,
                "probabilities": dict(zip(keys, p, strict=True)),
                "confidence": scoring.choice_confidence(p),
            }
        else:
            body = {
                "type": "score",
                "score": scoring.expected_score(p),
                "legend": {str(i): o.label for i, o in enumerate(question.options)},
                "probabilities": {str(i): v for i, v in enumerate(p)},
                "confidence": scoring.score_confidence(p),
            }
        answers[question.name] = {**body, **policy_fields(answer)}
    document = {
        "model": outcome.model,
        "answers": answers,
        "usage": {"input_tokens": outcome.usage.input_tokens, "output_tokens": outcome.usage.output_tokens},
        **outcome.extensions,
    }
    if decision_id:
        document["x_decision_id"] = decision_id
    return document
