"""Wire models of the scorer: the System One decision request (the contract's own,
`systemone.models`) and the OpenAI chat request.

Validation errors come out in the System One 422 shape
(`{"detail": [{"loc": ["body", ...], "msg", "type"}]}`); unknown top-level fields are
ignored, and extensions of ours are `x_`-prefixed.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from scorer_container.errors import InvalidRequest
from systemone.errors import validation_details
from systemone.limits import MAX_CHOICES, MAX_LEVELS, MAX_QUESTIONS
from systemone.models import (
    ChoiceQuestion,
    DecisionRequest,
    NoulCriteria,
    NoulQuestion,
    Question,
    Readout,
    ScoreQuestion,
    Text,
)

# The decision request is the System One contract's, unchanged (one copy: `systemone`).
__all__ = ["MAX_CHOICES", "MAX_LEVELS", "MAX_QUESTIONS", "ChatMessage", "ChatRequest", "ChoiceQuestion",
           "DecisionRequest", "NoulCriteria", "NoulQuestion", "Question", "Readout", "ScoreQuestion", "Text", "parse"]


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
        raise InvalidRequest(validation_details(exc.errors(include_url=False, include_input=False))) from None
