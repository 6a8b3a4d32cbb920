"""Exceptions of the gateway. Each carries the HTTP status it maps to; `gateway.wire.errors`
turns them into System One or OpenAI bodies in one place.

    GatewayError                       500 internal_error
     ├── RequestError                  the caller's fault: never a 5xx
     │    ├── InvalidRequest           422, System One validation items
     │    ├── PayloadTooLarge          413, body (or prompt) over a limit
     │    │    └── RecordTooLarge      413, a record with its outcome over one stored item (decisions.records)
     │    ├── UnsupportedMedia         415, unknown Content-Encoding
     │    ├── NotFound                 404, unknown model (UnknownRoute: unknown path)
     │    ├── Unauthenticated          401, missing, bad or expired credential
     │    ├── Forbidden                403, credential without the needed scope or model
     │    └── Conflict                 409, concurrent writers: re-read and retry
     │         └── NotReplayable       409, an idempotent request's first reply cannot be given again
     ├── RateLimited                   429 + Retry-After, the pool saturated, or a tenant's cap reached
     │    └── BudgetExhausted          429 insufficient_quota, the tenant's monthly spend used up
     ├── BackendUnavailable            503 + Retry-After, no endpoint could answer
     │    ├── NoAnswerInTime           503 + Retry-After, an endpoint said nothing before the deadline
     │    └── RecordNotStored          503, the decision's audit record could not be written
     ├── WorkTimedOut                  504, the work ran out of time on the model: never retried
     └── BackendFailed                 502, an endpoint answered something unusable

Messages are written for callers; exception text from below never reaches them.
`retryable` False means retrying the same request cannot help: the caller is told so
(`x-should-retry: false`, which the OpenAI SDKs obey), and no Retry-After is sent.
"""

from __future__ import annotations

from typing import Any

from systemone.errors import detail


class GatewayError(Exception):
    status = 500
    error_type = "internal_error"  # System One `detail.error_type`
    openai_type = "server_error"  # OpenAI `error.type`
    openai_code = "internal_error"  # OpenAI `error.code`
    retryable: bool | None = None  # None: not known (the caller's own policy decides)

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class RequestError(GatewayError):
    status = 400
    error_type = "api_usage_error"
    openai_type = "invalid_request_error"
    openai_code = "invalid_request"
    retryable = False  # the same request gets the same answer


class InvalidRequest(RequestError):
    """Validation failed; `details` are System One / FastAPI 422 items (`loc` starts with "body")."""

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
    openai_code = "context_length_exceeded"


class UnsupportedMedia(RequestError):
    status = 415
    openai_code = "unsupported_encoding"


class NotFound(RequestError):
    status = 404
    error_type = "not_found"
    openai_code = "model_not_found"


class UnknownRoute(NotFound):
    openai_code = "unknown_url"


class Unauthenticated(RequestError):
    status = 401
    error_type = "authentication_error"
    openai_type = "authentication_error"
    openai_code = "invalid_api_key"


class Forbidden(RequestError):
    status = 403
    error_type = "permission_denied"
    openai_type = "permission_error"
    openai_code = "insufficient_permissions"


class Conflict(RequestError):
    status = 409
    error_type = "conflict"
    openai_code = "conflict"
    retryable = None  # re-read and retry can succeed


class NotReplayable(Conflict):
    retryable = False  # the first reply stays too large to keep however often it is asked


class RateLimited(GatewayError):
    status = 429
    error_type = "rate_limit_error"
    openai_type = "rate_limit_error"
    openai_code = "rate_limit_exceeded"

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class BudgetExhausted(RateLimited):
    """The tenant's monthly spend is used up: 429, as OpenAI answers a spent quota. Retry-After
    says when the next month starts; no client should retry by itself before."""

    retryable = False
    error_type = "budget_exhausted"
    openai_type = "insufficient_quota"
    openai_code = "insufficient_quota"


class BackendUnavailable(GatewayError):
    status = 503
    error_type = "overloaded"
    openai_code = "overloaded"

    def __init__(self, message: str, retry_after: int = 5) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class NoAnswerInTime(BackendUnavailable):
    """An endpoint said nothing before the deadline (a hung or crashed container, far more often
    than oversized work: a scorer cuts its own work first, and says so). The work is not sent
    again in this request (it may still run there); a later retry can find a healthy endpoint."""

    error_type = "timeout"
    openai_code = "timeout"


class RecordNotStored(BackendUnavailable):
    """A decision is answered only once its record is stored: an answer nobody can audit is not given."""


class WorkTimedOut(GatewayError):
    """The model ran out of time on this work (cut by its deadline, or no answer in time). It is
    never re-sent to another endpoint, and the caller is told not to retry: the same work
    would run out of time again, and each try holds a model that others wait for."""

    status = 504
    error_type = "timeout"
    openai_code = "timeout"
    retryable = False


class BackendFailed(GatewayError):
    status = 502
    openai_code = "bad_gateway"
