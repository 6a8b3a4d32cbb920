"""The scorer's errors: the shared base and request errors of both deployables
(systemone.errors), and the scorer's own leaves, with the HTTP status each maps to.

    ServiceError                       500 (systemone.errors)
     ├── RequestError                  the caller's fault: never a 5xx (systemone.errors)
     │    ├── InvalidRequest           422, System One validation shape (systemone.errors)
     │    ├── PayloadTooLarge          413, body over the payload limit (systemone.errors)
     │    │    ├── ContextOverflow     413, prompt longer than the model's context
     │    │    └── OverBudget          413, more work than one request may ask for
     │    └── UnsupportedMedia         415, unknown Content-Encoding or type (systemone.errors)
     ├── Overloaded                    503 + Retry-After: the line is full (busy for everyone)
     │    ├── TenantOverShare          429 + Retry-After: this tenant holds its share of the line
     │    └── LongOverShare            429 + Retry-After: long work's share of this instance is taken
     ├── ModelNotReady                 503: still loading, or refused its manifest
     ├── DeadlineExceeded              504: the job ran out of time while it ran; the same work would again
     │    ├── QueueTimeout             503 + Retry-After: the deadline passed while it waited in line
     │    └── CallerGone               the caller hung up; the job was abandoned (nobody reads the answer)
     ├── ModelFileError                the model file or its manifest is wrong (start-up)
     └── EngineFailure                 500: llama.cpp failed on a valid request

The server maps these to bodies in one place (`server.py`); `state` is the error's
`x_state` (systemone.sidechannel): what a gateway in front may do about it.
"""

from __future__ import annotations

from systemone.errors import InvalidRequest, PayloadTooLarge, RequestError, ServiceError, UnsupportedMedia

__all__ = ["CallerGone", "ContextOverflow", "DeadlineExceeded", "EngineFailure", "InvalidRequest", "LongOverShare",
           "ModelFileError", "ModelNotReady", "OverBudget", "Overloaded", "PayloadTooLarge", "QueueTimeout",
           "RequestError", "ServiceError", "TenantOverShare", "UnsupportedMedia"]


class ContextOverflow(PayloadTooLarge):
    """The prompt is longer than the model's context."""


class OverBudget(PayloadTooLarge):
    """More work than one request may ask for."""


class Overloaded(ServiceError):
    status = 503
    error_type = "overloaded"
    openai_code = "overloaded"

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class TenantOverShare(Overloaded):
    """A refusal of one tenant, not the endpoint's saturation: a gateway answers that tenant 429 and
    neither counts it against the endpoint nor sends it elsewhere (scheduler.Scheduler.admit)."""

    status = 429
    error_type = "rate_limit_error"
    openai_type = "rate_limit_error"
    openai_code = "rate_limit_exceeded"
    state = "tenant_share"


class LongOverShare(Overloaded):
    """A refusal of one long request: long work's share of this instance is taken by other long work."""

    status = 429
    error_type = "rate_limit_error"
    openai_type = "rate_limit_error"
    openai_code = "rate_limit_exceeded"
    state = "long_share"


class ModelNotReady(ServiceError):
    status = 503
    error_type = "overloaded"
    openai_code = "overloaded"
    state = "not_ready"  # unavailable, not saturated: a gateway answers 503, not 429
    retry_after = 5


class DeadlineExceeded(ServiceError):
    """Cut while it ran: the work did not fit the time it was given, and would not on a retry."""

    status = 504
    error_type = "timeout"
    openai_code = "timeout"
    state = "deadline_exceeded"


class QueueTimeout(DeadlineExceeded):
    """Out of time in line, before it ran: the model was busy; a later retry can succeed."""

    status = 503
    error_type = "overloaded"
    openai_code = "overloaded"
    state = "queue_timeout"

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class CallerGone(DeadlineExceeded):
    pass


class ModelFileError(ServiceError):
    """The model or its manifest cannot be trusted; the server stays unhealthy."""


class EngineFailure(ServiceError):
    status = 500
