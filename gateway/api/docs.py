"""Response schemas for the OpenAPI document, declared only where the document is served.

Powertools builds a validator for every response model a route declares on that route's
first request (its `dependant`), after any snapshot was taken: work no caller needs where
nobody reads the document. Routes name the model by class either way
(tests/unit/gateway/wire/test_responses.py holds the rendered bodies to the same models)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from gateway.wire.responses import documented


class ResponseDocs:
    def __init__(self, served: bool = False) -> None:
        self.served = served

    def __call__(self, model: type[BaseModel], description: str, status: int = 200) -> dict[int, Any] | None:
        """A route's `responses`: `model` as its JSON answer's schema, where the document is served."""
        return documented(model, description, status) if self.served else None


UNSERVED = ResponseDocs(False)
