"""Response schemas for the OpenAPI document, declared only where the document is served:
the response models are built on first use, which would cost every cold start tens of
milliseconds for a document nobody reads (tests/unit/gateway/test_responses.py holds the
rendered bodies to the same models either way)."""

from __future__ import annotations

from typing import Any


class Documentation:
    def __init__(self, enabled: bool = False) -> None:
        self.enabled = enabled

    def __call__(self, model: str, description: str, status: int = 200) -> dict[int, Any] | None:
        """A route's `responses`: the named model of gateway.wire.responses as its JSON answer's schema."""
        if not self.enabled:
            return None
        from gateway.wire import responses

        return responses.documented(getattr(responses, model), description, status)


UNDOCUMENTED = Documentation(False)
