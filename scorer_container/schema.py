"""Wire models of the scorer: the System One decision request and the OpenAI chat request.

Validation errors come out in the System One 422 shape
(`{"detail": [{"loc": ["body", ...], "msg", "type"}]}`); unknown top-level fields are
ignored, and extensions of ours are `x_`-prefixed.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from scorer_container.errors import InvalidRequest

MAX_QUESTIONS = 400
MAX_CHOICES = 255
MAX_LEVELS = 10

# A description, instruction or level: any JSON value but a number or a boolean.
Text = str | dict[str, Any] | list[Any]


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class NoulCriteria(_Wire):
    true: Text | None = None
    false: Text | None = None


class NoulQuestion(_Wire):
    type: Literal["noul"]
    instructions: Text | None = None
    criteria: NoulCriteria | None = None

    @model_validator(mode="after")
    def _needs_something_to_ask(self) -> NoulQuestion:
        criteria = self.criteria
        if self.instructions is None and (criteria is None or (criteria.true is None and criteria.false is None)):
            raise ValueError("a noul question needs instructions or criteria")
        return self


class ChoiceQuestion(_Wire):
    type: Literal["choice"]
    instructions: Text | None = None
    criteria: dict[str, Text | None] = Field(min_length=2, max_length=MAX_CHOICES)

    @field_validator("criteria")
    @classmethod
    def _names_not_blank(cls, criteria: dict[str, Text | None]) -> dict[str, Text | None]:
        if any(not name.strip() for name in criteria):
            raise ValueError("option names must not be blank")
        return criteria


class ScoreQuestion(_Wire):
    type: Literal["score"]
    instructions: Text | None = None
    # Ordered levels, lowest first. A map such as {"0": ...} is refused: order must be explicit.
    criteria: list[Text] = Field(min_length=2, max_length=MAX_LEVELS)


Question = Annotated[NoulQuestion | ChoiceQuestion | ScoreQuestion, Field(discriminator="type")]
Readout = Literal["letters", "likelihood"]


class DecisionRequest(_Wire):
    model: str = Field(min_length=1)
    state: Text
    questions: dict[str, Question] = Field(min_length=1, max_length=MAX_QUESTIONS)
    # Extensions: override the model's readout and the debiasing per request.
    x_readout: Readout | None = None
    x_order_average: bool | None = None
    x_prior: bool | None = None

    @field_validator("questions")
    @classmethod
    def _ids_not_empty(cls, questions: dict[str, Any]) -> dict[str, Any]:
        if any(qid == "" for qid in questions):
            raise ValueError("question ids must be non-empty strings")
        return questions


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        parts = []
        for part in self.content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ValueError("only text content parts are supported")
            parts.append(part["text"])
        return "".join(parts)


class ChatRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    n: int = Field(default=1, ge=1, le=1)
    response_format: dict[str, Any] | None = None

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, stop: str | list[str] | None) -> str | list[str] | None:
        if isinstance(stop, list) and (len(stop) > 4 or any(not s for s in stop)):
            raise ValueError("stop takes at most 4 non-empty strings")
        return stop

    @field_validator("response_format")
    @classmethod
    def _text_only(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None and value.get("type") not in ("text", None):
            raise ValueError("this model server answers response_format type 'text' only")
        return value

    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


def parse(model: type[BaseModel], data: object) -> Any:
    """Validate `data`, raising InvalidRequest with every problem in the 422 shape."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise InvalidRequest(validation_details(exc)) from None


_UNION_MEMBERS = {"str", "dict[str,any]", "list[any]", "none", "NoulCriteria"}


def validation_details(exc: ValidationError) -> list[dict[str, Any]]:
    details: list[dict[str, Any]] = []
    seen: set[tuple] = set()
    for error in exc.errors(include_url=False, include_input=False):
        loc = list(error["loc"])
        # Discriminated unions add the tag to the path ("questions", "q1", "choice", ...);
        # callers know their question by id, so the tag is dropped.
        if len(loc) >= 3 and loc[0] == "questions" and loc[2] in ("noul", "choice", "score"):
            del loc[2]
        msg, kind = error["msg"], error["type"]
        # A JSON-value union fails once per member; say it once, in the caller's terms.
        if loc and isinstance(loc[-1], str) and loc[-1] in _UNION_MEMBERS:
            while loc and isinstance(loc[-1], str) and loc[-1] in _UNION_MEMBERS:
                loc.pop()
            msg, kind = "Input should be a string, an object or an array", "text_type"
        key = (tuple(loc), kind)
        if key in seen:
            continue
        seen.add(key)
        details.append({"loc": ["body", *loc], "msg": msg, "type": kind})
    return details
