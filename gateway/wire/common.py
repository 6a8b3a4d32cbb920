"""What the wire codecs share: the base model, JSON text values, canonical rendering."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict

# A description, instruction or state: any JSON value but a number or a boolean.
JsonText = str | dict[str, Any] | list[Any]


class Wire(BaseModel):
    """Strict types (no "1" for 1), unknown fields ignored, as both formats specify."""

    model_config = ConfigDict(extra="ignore", strict=True)


def render_json(value: Any) -> str:
    """A JSON value as text the model reads: canonical, so equal values give equal prompts."""
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def question_id(position: int) -> str:
    """Internal question ids are positional: the caller's ids and names never reach the model."""
    return f"q{position}"
