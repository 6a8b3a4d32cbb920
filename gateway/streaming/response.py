"""The response a route returns when its body streams: status and headers now, the body as
it is produced. Powertools passes a body that is neither text nor JSON through untouched,
so the handler finds the events in the result's body and sends them after the prelude."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

from aws_lambda_powertools.event_handler import Response

EVENT_STREAM = "text/event-stream"


class StreamedBody(Protocol):
    """A body sent as it is produced; `close()` ends its work (the caller gone, or never read)."""

    def __iter__(self) -> Iterator[bytes]: ...

    def __next__(self) -> bytes: ...

    def close(self) -> None: ...


class EventStream(Response):
    """A 200 of server-sent events, sent as they are produced (the streaming integration only)."""

    def __init__(self, events: StreamedBody, headers: dict[str, str]) -> None:
        super().__init__(200, EVENT_STREAM, events, {"cache-control": "no-cache", **headers})


def streamed_body(result: dict[str, Any]) -> StreamedBody | None:
    """The events of a resolved EventStream, taken out of the proxy result (its body left
    empty for the prelude); None for a response answered whole."""
    body = result.get("body")
    if not (callable(getattr(body, "close", None)) and callable(getattr(body, "__next__", None))):
        return None
    result["body"] = ""
    return body
