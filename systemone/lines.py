"""An invocation of many requests, as the gateway writes it and the scorer answers it: one copy.

SageMaker's Asynchronous Inference hands the container one S3 object (up to 1 GB) as one
request, and writes its answer back to S3; an invocation runs for an hour at most. The gateway
sends a batch's lines that way (gateway.backends.deferred and async_pool) as a body of JSON
lines, one request each, and the scorer answers each line as its own request, in order
(scorer_container.lines):

    in   {"id": "...", "route": "systemone" | "chat", "attributes": "tenant=...;timeout_ms=...", "body": {...}}
    out  {"id": "...", "line": 1, "status": 200, "body": {...}, "x_busy_ms": 412}

`attributes` are what the custom attributes header says for a single request (sidechannel);
`line` is the line's place in the body, from 1; `x_busy_ms` the time the scorer spent on it,
which is what its sender charges it (a chat's answer says no time of its own).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

JSONLINES = "application/jsonlines"  # what the gateway sends and the scorer answers with
CONTENT_TYPES = (JSONLINES, "application/jsonl", "application/x-ndjson")  # what the scorer reads as lines
MAX_INVOCATION_S = 3600.0  # SageMaker's longest asynchronous invocation
MAX_INVOCATION_BYTES = 1 << 30  # SageMaker's most for an asynchronous invocation's input
MAX_LINES = 50_000  # an invocation is at most one batch (OpenAI's most lines in one)
MAX_ID_CHARS = 512
_MAX_BUSY_MS = int(MAX_INVOCATION_S * 1000)


def in_line(line_id: str, route: str, attributes: str, body: bytes) -> bytes:
    """One request of an invocation; `body` is the request's JSON text, sent as it is."""
    head = json.dumps({"id": line_id, "route": route, "attributes": attributes}, separators=(",", ":"),
                      ensure_ascii=False)
    return head[:-1].encode() + b',"body":' + body + b"}\n"


def out_line(line_id: str | None, number: int, status: int, body: Any, busy_ms: int) -> bytes:
    """One answer of an invocation."""
    return (json.dumps({"id": line_id, "line": number, "status": status, "body": body, "x_busy_ms": busy_ms},
                       ensure_ascii=False, separators=(",", ":")) + "\n").encode()


@dataclass(frozen=True, slots=True)
class OutLine:
    id: str
    status: int
    body: bytes  # the answer's JSON text
    busy_s: float | None  # the scorer's time on it, when the line says


def read_out_line(raw: bytes) -> OutLine | None:
    """An answer as the scorer wrote it, or None for a line that is not one."""
    try:
        line = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(line, dict):
        return None
    line_id, status = line.get("id"), line.get("status")
    if not isinstance(line_id, str) or not isinstance(status, int) or isinstance(status, bool):
        return None
    return OutLine(line_id, status, json.dumps(line.get("body"), separators=(",", ":")).encode(),
                   busy_seconds(line.get("x_busy_ms")))


def busy_seconds(value: Any) -> float | None:
    """An `x_busy_ms` figure in seconds, if it is one (a count within an invocation's hour)."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _MAX_BUSY_MS:
        return value / 1000
    return None
