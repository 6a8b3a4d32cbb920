"""OpenAI Chat Completions (`POST /v1/chat/completions`) and the stream framing.

The gateway validates the body, asks the backend for one complete (non-streamed)
completion, and, when the caller asked for `stream: true`, frames that completion as
server-sent events ending in `data: [DONE]`. A Lambda behind a REST API returns its
response in one piece, so the stream is buffered: the events arrive together, after
generation ends. Clients that parse SSE (the OpenAI SDK) work unchanged.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[dict[str, Any]] | None = None

    @field_validator("content")
    @classmethod
    def _text_parts_only(cls, content: Any) -> Any:
        if isinstance(content, list):
            for part in content:
                if part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise ValueError("only text content parts are supported")
        return content


class ChatRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str = Field(min_length=1)
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    n: int = Field(default=1, ge=1, le=1)
    response_format: dict[str, Any] | None = None

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, stop: str | list[str] | None) -> str | list[str] | None:
        if isinstance(stop, list) and (len(stop) > 4 or any(not s for s in stop)):
            raise ValueError("stop takes at most 4 non-empty strings")
        return stop

    @field_validator("response_format")
    @classmethod
    def _text_only(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None and value.get("type") not in ("text", None):
            raise ValueError("only response_format type 'text' is supported")
        return value

    def backend_body(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_unset=True)

    def include_usage(self) -> bool:
        return bool((self.stream_options or {}).get("include_usage"))


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
