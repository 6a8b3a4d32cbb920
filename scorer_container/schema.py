"""Wire models of the scorer: the System One decision request and the OpenAI chat request,
both the contract's own (`systemone.models`, `systemone.chat`).

Validation errors come out in the System One 422 shape
(`{"detail": [{"loc": ["body", ...], "msg", "type"}]}`); unknown top-level fields are
ignored, and extensions of ours are `x_`-prefixed.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from scorer_container.errors import InvalidRequest
from systemone.chat import ChatMessage, ChatRequest
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


def parse(model: type[BaseModel], data: object) -> Any:
    """Validate `data`, raising InvalidRequest with every problem in the 422 shape."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise InvalidRequest(validation_details(exc.errors(include_url=False, include_input=False))) from None
