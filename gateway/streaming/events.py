"""Server-sent events from a backend's stream, put back together.

A streamed chat completion arrives in pieces that do not align with its events (SageMaker
forwards whatever the container flushed, in `PayloadPart`s). `events` yields each whole
event once its blank line has arrived, checked (one JSON object, bounded in size), up to
`data: [DONE]`; anything else means the stream is not a completion's, and it stops.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator

from gateway.backends.base import StreamBroken
from gateway.backends.scorer import json_object
from gateway.errors import BackendFailed

DONE = b"data: [DONE]\n\n"
# One event's bound: a chunk carries a token or a few, never this much; a backend that sends
# more without a blank line is broken, and the gateway must not buffer it without end.
MAX_EVENT_BYTES = 1 << 20


def error_event(message: str, code: str) -> bytes:
    """An OpenAI-shaped error in the stream: after the 200 has started, the only way to say it."""
    body = {"error": {"message": message, "type": "server_error", "param": None, "code": code}}
    return f"data: {json.dumps(body, separators=(',', ':'))}\n\n".encode()


def events(parts: Iterable[bytes], endpoint: str) -> Iterator[bytes]:
    """Whole events from `endpoint`'s stream's pieces, each as `data: ...\n\n` on one line, up to
    and including `data: [DONE]`. Raises StreamBroken on anything else: an event that is not one
    JSON object, one over MAX_EVENT_BYTES, or a stream that ends without `[DONE]`. Each byte
    is scanned once, whatever the pieces' sizes."""
    buffer = bytearray()
    scanned = 0  # where the search for the next blank line resumes
    for part in parts:
        start = max(0, len(buffer) - 1)  # a CR at the old end may pair with an LF here
        buffer += part
        buffer[start:] = buffer[start:].replace(b"\r\n", b"\n")
        while (end := buffer.find(b"\n\n", max(0, scanned - 2))) >= 0:  # a CRLF joined above moved one back
            raw = bytes(buffer[:end])
            del buffer[:end + 2]
            scanned = 0
            event = _event(raw, endpoint)
            if event is not None:
                yield event
                if event == DONE:
                    return
        scanned = len(buffer)
        if len(buffer) > MAX_EVENT_BYTES:
            raise StreamBroken(endpoint, "event_too_large")
    raise StreamBroken(endpoint, "no_done")


def _event(raw: bytes, endpoint: str) -> bytes | None:
    """One event's bytes to pass on; None for a comment or a keep-alive."""
    lines = [line[5:].lstrip(b" ") for line in raw.split(b"\n") if line.startswith(b"data:")]
    if not lines:
        return None
    data = b"\n".join(lines)
    if data == b"[DONE]":
        return DONE
    try:
        payload = json_object(data)  # the check every answer of an endpoint gets
    except BackendFailed:
        raise StreamBroken(endpoint, "event_not_json") from None
    if len(lines) > 1:  # one line for the caller, whatever the backend's framing
        data = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()
    return b"data: " + data + b"\n\n"
