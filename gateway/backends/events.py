"""Server-sent events from a backend's stream, put back together.

A streamed chat completion arrives in pieces that do not align with its events (SageMaker
forwards whatever the container flushed, in `PayloadPart`s). `events` yields each whole
event once its blank line has arrived, checked (one JSON object, bounded in size), up to
`data: [DONE]`; anything else means the stream is not a completion's, and it stops.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator

DONE = b"data: [DONE]\n\n"
# One event's bound: a chunk carries a token or a few, never this much; a backend that sends
# more without a blank line is broken, and the gateway must not buffer it without end.
MAX_EVENT_BYTES = 1 << 20


class BrokenStream(Exception):
    """The backend's stream was not the server-sent events of a chat completion."""


def error_event(message: str, code: str) -> bytes:
    """An OpenAI-shaped error in the stream: after the 200 has started, the only way to say it."""
    body = {"error": {"message": message, "type": "server_error", "param": None, "code": code}}
    return f"data: {json.dumps(body, separators=(',', ':'))}\n\n".encode()


def events(parts: Iterable[bytes]) -> Iterator[bytes]:
    """Whole events from a stream's pieces, each as `data: ...\n\n`, up to and including
    `data: [DONE]`. Raises BrokenStream on anything else: an event that is not one JSON
    object, one over MAX_EVENT_BYTES, or a stream that ends without `[DONE]`."""
    buffer = b""
    for part in parts:
        buffer = (buffer + part).replace(b"\r\n", b"\n")
        while (end := buffer.find(b"\n\n")) >= 0:
            raw, buffer = buffer[:end], buffer[end + 2:]
            data = b"\n".join(line[5:].lstrip(b" ") for line in raw.split(b"\n") if line.startswith(b"data:"))
            if not data:
                continue  # a comment or a keep-alive
            if data == b"[DONE]":
                yield DONE
                return
            try:
                if not isinstance(json.loads(data), dict):
                    raise ValueError
            except ValueError:
                raise BrokenStream("an event that is not a JSON object") from None
            yield b"data: " + data + b"\n\n"
        if len(buffer) > MAX_EVENT_BYTES:
            raise BrokenStream(f"an event over {MAX_EVENT_BYTES} bytes")
    raise BrokenStream("the stream ended without [DONE]")
