"""An invocation of many requests: what SageMaker's Asynchronous Inference hands the container.

An asynchronous invocation's input is one S3 object (up to 1 GB) that SageMaker POSTs to
/invocations whole, and its answer is the response's body, written back to S3; the invocation
may run for an hour. With `Content-Type: application/jsonlines` the scorer reads the body as
lines, one request each, and answers them one after another, in order, each as its own request
with its own deadline (server.py's `_lines`), in the format systemone.lines holds.

A line the scorer cannot read is answered 400 (and one too long 413); a line the invocation's
time no longer leaves room for is answered 503 (`queue_timeout`, busy), so whoever sent it sends
it again. Lines are read as they come and answers go out as they are made: the invocation holds
one line at a time, whatever its size.
"""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import IO, Any

from systemone.body import read_json
from systemone.errors import PayloadTooLarge
from systemone.lines import CONTENT_TYPES, MAX_ID_CHARS, MAX_LINES

IN_MEMORY_BYTES = 8 << 20  # a body past this is kept in a temporary file while its lines are answered


@dataclass(frozen=True, slots=True)
class InLine:
    """One line as read: its request, or why it cannot be one (`refused`: a status and a message)."""

    number: int
    id: str | None = None
    route: str = "systemone"
    body: Any = None
    attributes: str = ""
    refused: tuple[int, str] | None = None


async def spooled(stream: AsyncIterator[bytes], limit: int) -> IO[bytes]:
    """The whole body, in memory up to IN_MEMORY_BYTES and in a temporary file past that, at its
    start; PayloadTooLarge past `limit`."""
    body = tempfile.SpooledTemporaryFile(max_size=IN_MEMORY_BYTES)
    size = 0
    async for chunk in stream:
        size += len(chunk)
        if size > limit:
            body.close()
            raise PayloadTooLarge(f"an invocation's body is larger than {limit} bytes")
        body.write(chunk)
    body.seek(0)
    return body


async def pieces(body: IO[bytes], size: int = 1 << 20) -> AsyncIterator[bytes]:
    while chunk := body.read(size):
        yield chunk


def is_lines(content_type: str) -> bool:
    return content_type.split(";", 1)[0].strip().lower() in CONTENT_TYPES


async def read_lines(stream: AsyncIterator[bytes], max_line_bytes: int) -> AsyncIterator[InLine]:
    """The body's lines as requests, as they arrive: at most `max_line_bytes` a line (one
    longer is answered 413 and skipped to its end), at most MAX_LINES (the rest 413), blank
    lines skipped."""
    buffer, skipping, number = bytearray(), False, 0
    async for chunk in stream:
        buffer += chunk
        while (end := buffer.find(b"\n")) >= 0:
            raw = bytes(buffer[:end])
            del buffer[:end + 1]
            if skipping:
                skipping = False
                continue
            if raw.strip():
                number += 1
                yield parse_line(raw, number) if len(raw) <= max_line_bytes else _too_long(number, max_line_bytes)
        if len(buffer) > max_line_bytes and not skipping:  # no end in sight: refused now, its rest skipped
            number += 1
            yield _too_long(number, max_line_bytes)
            skipping = True
        if skipping:
            buffer.clear()
    if buffer.strip() and not skipping:
        number += 1
        yield parse_line(bytes(buffer), number)


def _too_long(number: int, max_line_bytes: int) -> InLine:
    return InLine(number, refused=(413, f"a line is larger than {max_line_bytes} bytes"))


def parse_line(raw: bytes, number: int) -> InLine:
    if number > MAX_LINES:
        return InLine(number, refused=(413, f"an invocation holds at most {MAX_LINES} lines"))
    try:
        line = read_json(raw, "", len(raw))
    except Exception:  # the contract's reader says why in its own error; a line only needs "not JSON"
        return InLine(number, refused=(400, "the line is not JSON"))
    if not isinstance(line, dict):
        return InLine(number, refused=(400, "a line is a JSON object"))
    line_id, route, attributes = line.get("id"), line.get("route", "systemone"), line.get("attributes", "")
    if not isinstance(line_id, str) or not 0 < len(line_id) <= MAX_ID_CHARS:
        return InLine(number, refused=(400, f"a line's id is a string of 1 to {MAX_ID_CHARS} characters"))
    if route not in ("systemone", "chat") or not isinstance(attributes, str):
        return InLine(number, line_id, refused=(400, 'route is "systemone" or "chat", attributes a string'))
    if "body" not in line:
        return InLine(number, line_id, refused=(400, "a line has a body: the request"))
    return InLine(number, line_id, route, line["body"], attributes)
