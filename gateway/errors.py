"""The gateway's errors: the shared base and request errors of both deployables
(systemone.errors), and the gateway's own leaves. Each carries the HTTP status it maps
to; `systemone.errors.error_parts` turns them into System One or OpenAI bodies.

    ServiceError                       500 internal_error (systemone.errors)
     ├── RequestError                  the caller's fault: never a 5xx (systemone.errors)
     │    ├── InvalidRequest           422, System One validation items (systemone.errors)
     │    │    └── InvalidParameters   400, the same on OpenAI's Files, Uploads and Batch APIs
     │    ├── PayloadTooLarge          413, body (or prompt) over a limit (systemone.errors)
     │    │    └── RecordTooLarge      413, a record with its outcome over one stored item (decisions.records)
     │    ├── UnsupportedMedia         415, unknown Content-Encoding (systemone.errors)
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
"""

from __future__ import annotations

from systemone.errors import InvalidRequest, PayloadTooLarge, RequestError, ServiceError, UnsupportedMedia

__all__ = ["BackendFailed", "BackendUnavailable", "BudgetExhausted", "Conflict", "Forbidden", "InvalidParameters",
           "InvalidRequest",
           "NoAnswerInTime", "NotFound", "NotReplayable", "PayloadTooLarge", "RateLimited", "RecordNotStored",
           "RequestError", "ServiceError", "Unauthenticated", "UnknownRoute", "UnsupportedMedia", "WorkTimedOut"]


class InvalidParameters(InvalidRequest):
    """A request to OpenAI's Files, Uploads or Batch API that cannot be read: OpenAI answers those
    400 (the SDK's BadRequestError), where this API's decision routes answer 422."""

    status = 400


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


class RateLimited(ServiceError):
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


class BackendUnavailable(ServiceError):
    status = 503
    error_type = "overloaded"
    openai_code = "overloaded"

    def __init__(self, message: str, retry_after: int = 5) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class AnsweredLater(BackendUnavailable):
    """A batch line's request taken down to be sent to an asynchronous pool
    (gateway.backends.deferred): only the batch worker sees it, and the line waits for the pool's
    answer. Nothing failed, and nothing is known of any endpoint (the pool asks no other)."""


class NoAnswerInTime(BackendUnavailable):
    """An endpoint said nothing before the deadline (a hung or crashed container, far more often
    than oversized work: a scorer cuts its own work first, and says so). The work is not sent
    again in this request (it may still run there); a later retry can find a healthy endpoint."""

    error_type = "timeout"
    openai_code = "timeout"


class RecordNotStored(BackendUnavailable):
    """A decision is answered only once its record is stored: an answer nobody can audit is not given."""


class WorkTimedOut(ServiceError):
    """The model ran out of time on this work (cut by its deadline, or no answer in time). It is
    never re-sent to another endpoint, and the caller is told not to retry: the same work
    would run out of time again, and each try holds a model that others wait for."""

    status = 504
    error_type = "timeout"
    openai_code = "timeout"
    retryable = False


class BackendFailed(ServiceError):
    status = 502
    openai_code = "bad_gateway"
