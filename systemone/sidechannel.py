"""What travels between the gateway and the scorer beside the System One body: one copy.

SageMaker's InvokeEndpoint carries a request to a container with one free-form header,
`X-Amzn-SageMaker-Custom-Attributes`, and carries a container's error back as a body
only (`OriginalMessage` of a ModelError: the container's headers are lost). So:

- the gateway writes `route`, `timeout_ms` and `request_id` into the custom attributes
  (`attributes`), and the scorer reads them back (`parse_attributes`, `route_of`,
  `timeout_of`, `request_id_of`);
- the gateway also says whose work it is and what kind: `tenant` (a keyed hash of the
  tenant, `tenant_tag`: never the tenant's id or a credential), `work` (`ordinary`,
  `long` or `bulk`) and `weight` (the tenant's share of a scorer against others', 1 by
  default), which the scorer's scheduler serves tenants in turn by (`tenant_of`,
  `work_of`, `weight_of`). Whoever may call InvokeEndpoint can claim any tag: the scorer
  trusts its caller, and calls without a tag share one lane of their own;
- the scorer repeats in its error body what a gateway in front must know to classify
  an error: `x_retry_after` (its Retry-After) and `x_state` (why it could not answer),
  written by `error_hints` and read by `hints_of`.

`x_state` says what retrying can do, which a status code alone cannot:

    not_ready           still loading or refused its model: another endpoint may answer (503)
    queue_timeout       the deadline passed while the job waited behind others: busy, retry later
    deadline_exceeded   the job ran out of time while it ran: the same work would run out
                        again, so it is never re-sent (the gateway answers 504, no retry)
    tenant_share        this tenant holds its share of the scorer's line already: a refusal
                        of that tenant alone (429 + Retry-After), never the endpoint's
                        saturation, so it never counts against the endpoint's circuit and
                        is never sent on to another endpoint
    long_share          long work's share of this instance is taken by other long work: a
                        refusal of this request alone (429 + Retry-After); another endpoint
                        may have room, but the endpoint's circuit never counts it
"""

from __future__ import annotations

import hashlib
import hmac
import math
from dataclasses import dataclass
from typing import Any, Literal

from systemone.json_text import object_or_none

CUSTOM_ATTRIBUTES = "X-Amzn-SageMaker-Custom-Attributes"
# SageMaker's limit on the header's value (InvokeEndpoint's CustomAttributes).
MAX_ATTRIBUTES_CHARS = 1024
Route = Literal["systemone", "chat"]
State = Literal["not_ready", "queue_timeout", "deadline_exceeded", "tenant_share", "long_share"]
STATES: tuple[State, ...] = ("not_ready", "queue_timeout", "deadline_exceeded", "tenant_share", "long_share")
# Refusals that concern one tenant or one request, never the endpoint: not saturation.
OWN_REFUSALS: frozenset[State] = frozenset({"tenant_share", "long_share"})
# The kinds of work a scorer's scheduler tells apart: ordinary (an interactive request within
# API Gateway's buffered deadline), long (a deadline past it: the streaming routes), bulk
# (batch lines: the lowest priority). Anyone may claim a lower priority; the scorer also
# counts as long whatever has a long deadline, whatever it claims.
Work = Literal["ordinary", "long", "bulk"]
WORKS: tuple[Work, ...] = ("ordinary", "long", "bulk")
# A tenant tag: lowercase hex of a keyed hash, short enough for the attributes' limit.
TENANT_TAG_CHARS = frozenset("0123456789abcdef")
TENANT_TAG_LENGTH = 24  # 96 bits: no two tenants of one deployment share a lane by chance
MIN_WEIGHT, MAX_WEIGHT = 0.1, 100.0

# A request id reaches headers and log lines on both sides: at most 64 of these.
REQUEST_ID_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.")
MAX_REQUEST_ID = 64
_MAX_TIMEOUT_DIGITS = 9
# What InvokeEndpoint makes of a container's error (ModelError, HTTP 424): the container's
# status and body survive, its headers do not; status 0: it did not answer in time.
ORIGINAL_STATUS = "OriginalStatusCode"
ORIGINAL_MESSAGE = "OriginalMessage"
_MAX_RETRY_AFTER_S = 3600


def safe_request_id(value: str) -> str:
    """A request id as it may travel in a header and a log line (`REQUEST_ID_CHARS`, at most 64)."""
    return "".join(c for c in value if c in REQUEST_ID_CHARS)[:MAX_REQUEST_ID]


def tenant_tag(tenant_id: str, key: bytes) -> str:
    """The tag a tenant's work carries to the scorer: HMAC-SHA256 of its id under a key of
    the deployment's, cut to `TENANT_TAG_LENGTH` hex digits. Stable for one key (so the
    scorer's lanes follow tenants), meaningless without it (a log line that shows a tag
    names nobody)."""
    return hmac.new(key, tenant_id.encode("utf-8"), hashlib.sha256).hexdigest()[:TENANT_TAG_LENGTH]


def attributes(route: Route, timeout_ms: int, request_id: str = "", *, tenant: str = "", work: Work = "ordinary",
               weight: float = 1.0) -> str:
    """The custom attributes the gateway sends with one attempt."""
    value = f"route={route};timeout_ms={max(1, int(timeout_ms))}"
    request_id = safe_request_id(request_id)
    if request_id:
        value += f";request_id={request_id}"
    if tenant:
        if not _is_tag(tenant):
            raise ValueError("a tenant tag is lowercase hex of at most 64 digits (tenant_tag)")
        value += f";tenant={tenant}"
    if work != "ordinary":
        if work not in WORKS:
            raise ValueError(f"work is one of {', '.join(WORKS)}")
        value += f";work={work}"
    if weight != 1.0:
        value += f";weight={_clamped_weight(weight):g}"
    return value


def _is_tag(value: str) -> bool:
    return 0 < len(value) <= 64 and all(c in TENANT_TAG_CHARS for c in value)


def _clamped_weight(weight: float) -> float:
    return min(MAX_WEIGHT, max(MIN_WEIGHT, float(weight))) if math.isfinite(weight) else 1.0


def parse_attributes(header: str) -> dict[str, str]:
    """`key=value` pairs (`;` or `,` separated, keys case-folded); the first of a key wins."""
    pairs: dict[str, str] = {}
    for item in header[:MAX_ATTRIBUTES_CHARS].replace(",", ";").split(";"):
        key, _, value = item.strip().partition("=")
        if key.strip():
            pairs.setdefault(key.strip().lower(), value.strip())
    return pairs


def route_of(pairs: dict[str, str]) -> Route | None:
    """`route=chat` or `route=systemone` (older spellings too) picks the handler; None: the body does."""
    value = pairs.get("route", "").lower()
    if value in ("chat", "chat/completions"):
        return "chat"
    if value in ("systemone", "decision", "decisions"):
        return "systemone"
    return None


def timeout_of(pairs: dict[str, str], ceiling: float) -> float:
    """The caller's own deadline in seconds (`timeout_ms`, what is left of it), never past `ceiling`."""
    raw = pairs.get("timeout_ms", "")
    if raw.isascii() and raw.isdigit() and 0 < len(raw) <= _MAX_TIMEOUT_DIGITS and int(raw) > 0:
        return min(ceiling, int(raw) / 1000)
    return ceiling


def request_id_of(pairs: dict[str, str]) -> str:
    return safe_request_id(pairs.get("request_id", ""))


def tenant_of(pairs: dict[str, str]) -> str:
    """The tenant tag (`tenant=`), or "" (untagged: the shared lane) when absent or malformed."""
    value = pairs.get("tenant", "").lower()
    return value if _is_tag(value) else ""


def work_of(pairs: dict[str, str]) -> Work:
    """The kind of work claimed (`work=`); anything else is ordinary."""
    value = pairs.get("work", "").lower()
    return value if value in WORKS else "ordinary"  # type: ignore[return-value]


def weight_of(pairs: dict[str, str]) -> float:
    """The tenant's weight (`weight=`), within [MIN_WEIGHT, MAX_WEIGHT]; 1 when absent or malformed."""
    raw = pairs.get("weight", "")
    if not raw or len(raw) > 12:
        return 1.0
    try:
        return _clamped_weight(float(raw))
    except ValueError:
        return 1.0


@dataclass(frozen=True, slots=True)
class ErrorHints:
    """What a scorer's error body says beside its message (see the module docstring)."""

    retry_after: int | None = None
    state: State | None = None


def error_hints(body: dict[str, Any], hints: ErrorHints) -> dict[str, Any]:
    """`body` with the hints added (the scorer's side)."""
    if hints.retry_after is not None:
        body["x_retry_after"] = int(hints.retry_after)
    if hints.state is not None:
        body["x_state"] = hints.state
    return body


def hints_of(original_message: str | bytes | None) -> ErrorHints:
    """The hints in a container's error body as SageMaker passed it on (the gateway's side);
    anything malformed is no hint at all."""
    body = object_or_none(original_message)
    if body is None:
        return ErrorHints()
    retry_after = body.get("x_retry_after")
    if not (isinstance(retry_after, int) and not isinstance(retry_after, bool) and 0 < retry_after <= _MAX_RETRY_AFTER_S):
        retry_after = None
    state = body.get("x_state")
    return ErrorHints(retry_after, state if state in STATES else None)


def original_error(response: dict[str, Any]) -> tuple[int, str | bytes]:
    """The container's status (-1 when unreadable) and error body in a ModelError as botocore
    raises it (the fields at the top of the response, or under `Error`)."""
    error = response.get("Error", {})
    try:
        status = int(response.get(ORIGINAL_STATUS, error.get(ORIGINAL_STATUS)))
    except (TypeError, ValueError):
        status = -1
    return status, response.get(ORIGINAL_MESSAGE, error.get(ORIGINAL_MESSAGE)) or ""
