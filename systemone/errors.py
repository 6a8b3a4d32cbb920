"""The errors both sides raise and answer with, in one place.

`ServiceError` is the one base of every error the gateway and the scorer raise: each
carries the status it maps to and its names in both error shapes. The caller's mistakes
that both sides meet (`RequestError` and its leaves) are here; each side adds its own
leaves (gateway.errors, scorer_container.errors), and draws the whole tree at their top.

The two error-body shapes are written (`error_parts`, `system_one_body`, `openai_body`)
and read (`read_error_body`) here only: System One (`{"detail": [...]}` or
`{"detail": {"error_type", "message"}}`) and OpenAI (`{"error": {"message", "type",
"param", "code"}}`). Messages are written for callers; exception text from below never
reaches them. `retryable` False means retrying the same request by itself cannot help:
the caller is told so (`x-should-retry: false`, which the OpenAI SDKs obey). An error
with a `retry_after` sends it as Retry-After (a spent budget says when the month turns,
and is not retried by itself before).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from systemone.json_text import object_or_none
from systemone.limits import MAX_QUESTION_NAME_CHARS
from systemone.sidechannel import State

Flavor = Literal["systemone", "openai"]  # the API a route answers in

# JSON-value unions fail once per member; these are the member names pydantic puts in `loc`.
_UNION_MEMBERS = {"str", "dict[str,any]", "list[any]", "none", "NoulCriteria", "bool", "list[tagged-union[...]]"}
# The question types of this contract: a discriminated union puts the tag in `loc`. A side
# with more types of its own (the gateway's public API) passes them in.
QUESTION_TAGS = frozenset({"noul", "choice", "score"})
_WHERE = ("body", "path", "query", "header")


def validation_details(errors: Iterable[dict[str, Any]],
                       question_tags: frozenset[str] = QUESTION_TAGS) -> list[dict[str, Any]]:
    """Pydantic errors as 422 items: `loc` from "body", one item per problem, no input echoed."""
    details: list[dict[str, Any]] = []
    seen: set[tuple] = set()
    for error in errors:
        loc = list(error.get("loc", ()))
        where = loc.pop(0) if loc and loc[0] in _WHERE else "body"
        # Discriminated unions put the tag in the path ("questions", "q1", "choice", ...): drop it.
        if len(loc) >= 3 and loc[0] == "questions" and loc[2] in question_tags:
            del loc[2]
        msg, kind = str(error.get("msg", "invalid value")), str(error.get("type", "value_error"))
        if loc and isinstance(loc[-1], str) and loc[-1] in _UNION_MEMBERS:
            while loc and isinstance(loc[-1], str) and loc[-1] in _UNION_MEMBERS:
                loc.pop()
            msg, kind = "Input should be a string, an object or an array", "text_type"
        msg = msg.removeprefix("Value error, ")
        if kind == "json_invalid" and (error.get("ctx") or {}).get("error"):
            msg = f"{msg}: {error['ctx']['error']}"  # why it is not JSON: depth, a huge number, NaN
        # A key past the name bound is the input itself: it is named by its start, not echoed whole.
        loc = [f"{p[:MAX_QUESTION_NAME_CHARS]}…" if isinstance(p, str) and len(p) > MAX_QUESTION_NAME_CHARS else p
               for p in loc]
        key = (where, tuple(loc), kind)
        if key in seen:
            continue
        seen.add(key)
        details.append({"loc": [where, *loc], "msg": msg, "type": kind})
    return details


def detail(loc: list[str | int], msg: str, kind: str = "value_error") -> dict[str, Any]:
    """One 422 item about the body."""
    return {"loc": ["body", *loc], "msg": msg, "type": kind}


def system_one_body(error_type: str, message: str, details: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A 422 lists its problems; every other error says what kind it is and why."""
    if details is not None:
        return {"detail": details}
    return {"detail": {"error_type": error_type, "message": message}}


def openai_body(message: str, error_type: str, code: str | None,
                details: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """OpenAI's error object; a validation error names its first problem in `param` (dotted, after "body")."""
    param = None
    if details:
        first = details[0]
        where = first["loc"][0] if first["loc"] else "body"
        param = ".".join(str(p) for p in (first["loc"][1:] if where == "body" else first["loc"])) or None
        message = f"{param}: {first['msg']}" if param else first["msg"]
        if len(details) > 1:
            message += f" (and {len(details) - 1} more problems)"
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


@dataclass(frozen=True, slots=True)
class ErrorBody:
    """What an error body in either shape says: its message, and a 422's problems."""

    message: str | None = None
    details: list[dict[str, Any]] | None = None  # as `validation_details` writes them


def read_error_body(raw: str | bytes | None) -> ErrorBody:
    """The message (System One `detail.message` or OpenAI `error.message`) and a 422's problem
    list of an error body another side wrote; anything malformed says nothing."""
    body = object_or_none(raw)
    if body is None:
        return ErrorBody()
    detail = body.get("detail")
    if isinstance(detail, list) and detail and all(isinstance(d, dict) and "loc" in d for d in detail):
        return ErrorBody(None, detail)
    if isinstance(detail, dict) and isinstance(detail.get("message"), str):
        return ErrorBody(detail["message"])
    error = body.get("error")
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return ErrorBody(error["message"])
    return ErrorBody()


class ServiceError(Exception):
    status = 500
    error_type = "internal_error"  # System One `detail.error_type`
    openai_type = "server_error"  # OpenAI `error.type`
    openai_code = "internal_error"  # OpenAI `error.code`
    retryable: bool | None = None  # None: not known (the caller's own policy decides)
    retry_after: int | None = None  # seconds, sent as Retry-After: a retry can succeed then
    state: State | None = None  # the scorer's `x_state`: what a gateway in front may do about it

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class RequestError(ServiceError):
    """The caller's mistake: never a 5xx, and the same request gets the same answer."""

    status = 400
    error_type = "api_usage_error"
    openai_type = "invalid_request_error"
    openai_code = "invalid_request"
    retryable = False


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
    """A body, a prompt or a piece of work over a limit (413, with the figures)."""

    status = 413
    error_type = "max_tokens_exceeded"
    openai_code = "context_length_exceeded"


class UnsupportedMedia(RequestError):
    status = 415
    openai_code = "unsupported_encoding"


def error_parts(exc: ServiceError, flavor: Flavor) -> tuple[int, dict[str, Any], dict[str, str]]:
    """(status, body, headers) of an error on a route of the given flavor."""
    headers: dict[str, str] = {}
    if exc.retry_after is not None:
        headers["Retry-After"] = str(exc.retry_after)
    if exc.retryable is False:
        headers["x-should-retry"] = "false"
    details = exc.details if isinstance(exc, InvalidRequest) else None
    if flavor == "systemone":
        return exc.status, system_one_body(exc.error_type, exc.message, details), headers
    return exc.status, openai_body(exc.message, exc.openai_type, exc.openai_code, details), headers
