"""The one place where errors become HTTP bodies.

System One routes answer `{"detail": [...]}` (422) or `{"detail": {"error_type", "message"}}`;
OpenAI routes answer `{"error": {"message", "type", "param", "code"}}`. 429 and 503
carry `Retry-After`. Nothing below the gateway's own messages reaches a caller.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

from gateway.errors import BackendUnavailable, GatewayError, InvalidRequest, RateLimited

Flavor = Literal["systemone", "openai"]

# JSON-value unions fail once per member; these are the member names pydantic puts in `loc`.
_UNION_MEMBERS = {"str", "dict[str,any]", "list[any]", "none", "NoulCriteria", "bool", "list[tagged-union[...]]"}
_QUESTION_TAGS = {"noul", "choice", "score", "predicate", "catalog"}


def validation_details(errors: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Pydantic errors as System One 422 items: `loc` from "body", one item per problem, no input echoed."""
    details: list[dict[str, Any]] = []
    seen: set[tuple] = set()
    for error in errors:
        loc = list(error.get("loc", ()))
        where = loc.pop(0) if loc and loc[0] in ("body", "path", "query", "header") else "body"
        # Discriminated unions put the tag in the path ("questions", "q1", "choice", ...): drop it.
        if len(loc) >= 3 and loc[0] == "questions" and loc[2] in _QUESTION_TAGS:
            del loc[2]
        msg, kind = str(error.get("msg", "invalid value")), str(error.get("type", "value_error"))
        if loc and isinstance(loc[-1], str) and loc[-1] in _UNION_MEMBERS:
            while loc and isinstance(loc[-1], str) and loc[-1] in _UNION_MEMBERS:
                loc.pop()
            msg, kind = "Input should be a string, an object or an array", "text_type"
        msg = msg.removeprefix("Value error, ")
        if kind == "json_invalid" and (error.get("ctx") or {}).get("error"):
            msg = f"{msg}: {error['ctx']['error']}"  # why it is not JSON: depth, a huge number, NaN
        key = (where, tuple(loc), kind)
        if key in seen:
            continue
        seen.add(key)
        details.append({"loc": [where, *loc], "msg": msg, "type": kind})
    return details


def error_body(exc: GatewayError, flavor: Flavor) -> tuple[int, dict[str, Any], dict[str, str]]:
    """(status, body, headers) for an error on a route of the given flavor."""
    headers: dict[str, str] = {}
    if isinstance(exc, RateLimited | BackendUnavailable):
        headers["Retry-After"] = str(exc.retry_after)
    if flavor == "systemone":
        if isinstance(exc, InvalidRequest):
            return exc.status, {"detail": exc.details}, headers
        return exc.status, {"detail": {"error_type": exc.error_type, "message": exc.message}}, headers
    message, param = exc.message, None
    if isinstance(exc, InvalidRequest) and exc.details:
        first = exc.details[0]
        where = first["loc"][0] if first["loc"] else "body"
        param = ".".join(str(p) for p in (first["loc"][1:] if where == "body" else first["loc"])) or None
        message = f"{param}: {first['msg']}" if param else first["msg"]
        if len(exc.details) > 1:
            message += f" (and {len(exc.details) - 1} more problems)"
    return exc.status, {"error": {"message": message, "type": exc.openai_type, "param": param, "code": exc.openai_code}}, headers
