"""Exceptions of the scorer, and the HTTP status each one maps to.

    ScorerError
     ├── RequestError                  the caller's fault: never a 5xx
     │    ├── InvalidRequest           422, System One validation shape
     │    ├── PayloadTooLarge          413, body over the payload limit
     │    ├── ContextOverflow          413, prompt longer than the model's context
     │    ├── OverBudget               413, more work than one request may ask for
     │    └── UnsupportedMedia         415, unknown Content-Encoding or type
     ├── Overloaded                    503 + Retry-After: the line is full (busy for everyone)
     │    ├── TenantOverShare          429 + Retry-After: this tenant holds its share of the line
     │    └── LongOverShare            429 + Retry-After: long work's share of this instance is taken
     ├── ModelNotReady                 503: still loading, or refused its manifest
     ├── DeadlineExceeded              504: the job ran out of time while it ran; the same work would again
     │    ├── QueueTimeout             503 + Retry-After: the deadline passed while it waited in line
     │    └── CallerGone               the caller hung up; the job was abandoned (nobody reads the answer)
     ├── ModelFileError                the model file or its manifest is wrong (start-up)
     └── EngineFailure                 500: llama.cpp failed on a valid request

The server maps these to bodies in one place (`server.py`); messages are written for
callers and never carry exception text from below. `state` is the error's `x_state`
(systemone.sidechannel): what a gateway in front may do about it.
"""

from __future__ import annotations

from typing import Any

from systemone.errors import detail
from systemone.sidechannel import State


class ScorerError(Exception):
    status = 500
    error_type = "internal_error"
    state: State | None = None
    retry_after: int | None = None

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class RequestError(ScorerError):
    status = 400
    error_type = "api_usage_error"


class InvalidRequest(RequestError):
    """Validation failed; `details` follows the FastAPI/System One 422 item shape."""

    status = 422

    def __init__(self, details: list[dict[str, Any]]) -> None:
        super().__init__("request validation failed")
        self.details = details

    @classmethod
    def at(cls, loc: list[str | int], msg: str, type_: str = "value_error") -> InvalidRequest:
        return cls([detail(loc, msg, type_)])


class PayloadTooLarge(RequestError):
    status = 413
    error_type = "max_tokens_exceeded"


class ContextOverflow(RequestError):
    status = 413
    error_type = "max_tokens_exceeded"


class OverBudget(RequestError):
    status = 413
    error_type = "max_tokens_exceeded"


class UnsupportedMedia(RequestError):
    status = 415


class Overloaded(ScorerError):
    status = 503
    error_type = "overloaded"

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class TenantOverShare(Overloaded):
    """A refusal of one tenant, not the endpoint's saturation: a gateway answers that tenant 429 and
    neither counts it against the endpoint nor sends it elsewhere (scheduler.Scheduler.admit)."""

    status = 429
    error_type = "rate_limit_error"
    state = "tenant_share"


class LongOverShare(Overloaded):
    """A refusal of one long request: long work's share of this instance is taken by other long work."""

    status = 429
    error_type = "rate_limit_error"
    state = "long_share"


class ModelNotReady(ScorerError):
    status = 503
    error_type = "overloaded"
    state = "not_ready"  # unavailable, not saturated: a gateway answers 503, not 429
    retry_after = 5


class DeadlineExceeded(ScorerError):
    """Cut while it ran: the work did not fit the time it was given, and would not on a retry."""

    status = 504
    error_type = "timeout"
    state = "deadline_exceeded"


class QueueTimeout(DeadlineExceeded):
    """Out of time in line, before it ran: the model was busy; a later retry can succeed."""

    status = 503
    error_type = "overloaded"
    state = "queue_timeout"

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class CallerGone(DeadlineExceeded):
    pass


class ModelFileError(ScorerError):
    """The model or its manifest cannot be trusted; the server stays unhealthy."""


class EngineFailure(ScorerError):
    status = 500
