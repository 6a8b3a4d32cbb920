"""System One (`POST /v1/systemone`): request model, conversion to a Decision, and the answer.

Question ids are returned byte for byte; they are never shown to the model (the
backend sees positional ids), so renaming a question cannot change its answer.
"""

from typing import Annotated, Any

from pydantic import Discriminator, Field, Tag
from pydantic.json_schema import SkipJsonSchema

from gateway.decisions.model import (
    MAX_QUESTIONS,
    CatalogReference,
    Decision,
    DecisionResult,
    Option,
    Question,
    confidence_of,
    cost_fields,
    score_of,
    shown_choice,
)
from gateway.errors import BackendFailed
from gateway.wire.common import X_CACHE, CatalogQuestion, cache_option, policy_fields, question_id, question_kind
from systemone.models import ChoiceQuestion, DecisionRequest, NoulQuestion, QuestionId, ScoreQuestion

SystemOneQuestion = Annotated[
    Annotated[NoulQuestion, Tag("noul")] | Annotated[ChoiceQuestion, Tag("choice")] | Annotated[ScoreQuestion, Tag("score")]
    | Annotated[CatalogQuestion, Tag("catalog")],
    Discriminator(question_kind),
]


class SystemOneRequest(DecisionRequest):
    """The contract's decision request, extended: a question may name a catalog entry, and
    `x_calibrate` turns the entries' calibration and thresholds off."""

    model: str = Field(min_length=1, description="A model name or alias from GET /v1/models (jev-latest works).")
    questions: dict[QuestionId, SystemOneQuestion] = Field(min_length=1, max_length=MAX_QUESTIONS)
    x_calibrate: bool | None = Field(default=None, description="false: raw probabilities, no calibration or thresholds.")
    x_cache: bool | None = Field(default=None, description=X_CACHE)
    # How the scorer shows the state to the model (framing, quarantine of flagged passages,
    # the injection probe) is the deployment's, from the model's manifest: whoever can write
    # a state must not find a request that lowers it. Accepted and ignored, like unknown fields.
    x_framing: SkipJsonSchema[Any] = Field(default=None, exclude=True)
    x_quarantine: SkipJsonSchema[Any] = Field(default=None, exclude=True)
    x_injection_probe: SkipJsonSchema[Any] = Field(default=None, exclude=True)
    x_reduce: SkipJsonSchema[Any] = Field(default=None, exclude=True)  # the gateway's to set (catalogs.resolve)
    x_features: SkipJsonSchema[Any] = Field(default=None, exclude=True)  # likewise: for catalog entries' adapters

    def to_decision(self) -> Decision:
        questions = tuple(_question(question_id(i), qid, q) for i, (qid, q) in enumerate(self.questions.items()))
        engine = {k: v for k, v in (("x_readout", self.x_readout), ("x_order_average", self.x_order_average),
                                    ("x_prior", self.x_prior)) if v is not None} | cache_option(self.x_cache)
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


def render(result: DecisionResult, decision_id: str | None = None) -> dict[str, Any]:
    """The 200 body. System One has no refusal: an unusable answer fails the request."""
    answers: dict[str, Any] = {}
    for answer in result.answers:
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
                "confidence": confidence_of(answer),
            }
        else:
            body = {
                "type": "score",
                "score": score_of(answer),
                "legend": {str(i): o.label for i, o in enumerate(question.options)},
                "probabilities": {str(i): v for i, v in enumerate(p)},
                "confidence": confidence_of(answer),
            }
        answers[question.name] = {**body, **policy_fields(answer)}
    document = {
        "model": result.model,
        "answers": answers,
        "usage": {"input_tokens": result.usage.input_tokens, "output_tokens": result.usage.output_tokens,
                  "x_cached_tokens": result.usage.cached_tokens, **cost_fields(result.cost)},
        **result.extensions,
    }
    if decision_id:
        document["x_decision_id"] = decision_id
    return document
