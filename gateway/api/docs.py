"""Response schemas for the OpenAPI document, declared only where the document is served.

Powertools builds a validator for every response model a route declares on that route's
first request (its `dependant`), after any snapshot was taken: work no caller needs where
nobody reads the document. Routes name the model by class either way
(tests/unit/gateway/wire/test_responses.py holds the rendered bodies to the same models)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from gateway.streaming.response import EVENT_STREAM
from gateway.wire.responses import documented


class ResponseDocs:
    def __init__(self, served: bool = False) -> None:
        self.served = served

    def __call__(self, model: type[BaseModel], description: str, status: int = 200) -> dict[int, Any] | None:
        """A route's `responses`: `model` as its JSON answer's schema, where the document is served."""
        return documented(model, description, status) if self.served else None

    def each(self, answers: dict[int, tuple[type[BaseModel], str]]) -> dict[int, Any] | None:
        """A route with more than one success status, each with its model."""
        if not self.served:
            return None
        return {status: documented(model, description, status)[status] for status, (model, description) in answers.items()}

    def text(self, media_type: str, description: str) -> dict[int, Any] | None:
        """A route whose answer is text of `media_type`, not JSON."""
        if not self.served:
            return None
        return {200: {"description": description, "content": {media_type: {"schema": {"type": "string"}}}}}

    def streamed(self, model: type[BaseModel], event: type[BaseModel], description: str) -> dict[int, Any] | None:
        """A route that answers `model` as JSON, or a stream of `event`s (server-sent events)."""
        if not self.served:
            return None
        answer = documented(model, description)
        answer[200]["content"][EVENT_STREAM] = {"model": event}
        return answer


UNSERVED = ResponseDocs(False)
