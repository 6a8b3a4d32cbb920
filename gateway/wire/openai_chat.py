"""OpenAI Chat Completions (`POST /v1/chat/completions`) and the stream framing.

The gateway validates the body, asks the backend for one complete (non-streamed)
completion, and, when the caller asked for `stream: true`, frames that completion as
server-sent events ending in `data: [DONE]`. A Lambda behind a REST API returns its
response in one piece, so the stream is buffered: the events arrive together, after
generation ends. Clients that parse SSE (the OpenAI SDK) work unchanged.
"""

from __future__ import annotations

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
