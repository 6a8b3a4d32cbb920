"""OpenAI Chat Completions (`POST /v1/chat/completions`) and its server-sent events.

The gateway validates the body. Without `stream`, it asks the backend for one complete
completion. With `stream: true` on the streaming integration, the backend's events are
relayed as they come (`gateway.streaming.relay`); on the buffered integration,
`as_event_stream` frames a whole completion as the events a stream would have sent.
"""

import json
from typing import Any

from pydantic import Field

from systemone import chat as contract


class ChatRequest(contract.ChatRequest):
    """The contract's chat request, with `model` required (the gateway routes by it)."""

    model: str = Field(min_length=1)

    def backend_body(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_unset=True)


def as_event_stream(completion: dict[str, Any], include_usage: bool) -> str:
    """One complete completion as the chunks a streaming server would have sent."""
    base = {"id": completion.get("id", ""), "object": "chat.completion.chunk", "created": completion.get("created", 0),
            "model": completion.get("model", "")}
    events = []
    for choice in completion.get("choices", []):
        message = choice.get("message") or {}
        index = choice.get("index", 0)
        deltas = [({"role": "assistant", "content": ""}, None)]
        if message.get("content"):
            deltas.append(({"content": message["content"]}, None))
        deltas.append(({}, choice.get("finish_reason") or "stop"))
        for delta, finish in deltas:
            events.append({**base, "choices": [{"index": index, "delta": delta, "finish_reason": finish}]})
    if include_usage and isinstance(completion.get("usage"), dict):
        events.append({**base, "choices": [], "usage": completion["usage"]})
    lines = [f"data: {json.dumps(event, ensure_ascii=False, separators=(',', ':'))}\n\n" for event in events]
    return "".join(lines) + "data: [DONE]\n\n"

