"""What the wire codecs share: the base model, JSON text values, canonical rendering."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gateway.catalogs.model import MAX_VERSION, NAME_PATTERN
from gateway.decisions import scoring
from gateway.decisions.model import Answer, Option

# A description, instruction or state: any JSON value but a number or a boolean.
JsonText = str | dict[str, Any] | list[Any]


class Wire(BaseModel):
    """Strict types (no "1" for 1), unknown fields ignored, as both formats specify."""

    model_config = ConfigDict(extra="ignore", strict=True)


class CatalogQuestion(Wire):
    """A question declared in the tenant's catalog, named instead of written out."""

    catalog: str = Field(pattern=NAME_PATTERN, description="The catalog entry's name.")
    version: int | None = Field(default=None, ge=1, le=MAX_VERSION, description="A version; the latest when absent.")


def question_kind(value: Any) -> str | None:
    """A question's union tag: "catalog" for a reference to a catalog entry, else its `type`."""
    if isinstance(value, dict):
        return "catalog" if "catalog" in value else value.get("type")
    return "catalog" if isinstance(value, CatalogQuestion) else getattr(value, "type", None)


def render_json(value: Any) -> str:
    """A JSON value as text the model reads: canonical, so equal values give equal prompts."""
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def question_id(position: int) -> str:
    """Internal question ids are positional: the caller's ids and names never reach the model."""
    return f"q{position}"


def shown_choice(answer: Answer) -> Option:
    """The option a choice answers: the most likely one, or, when an enforcing policy
    abstains, the entry's declared abstain option."""
    question, verdict = answer.question, answer.verdict
    binding = question.binding
    if (verdict is not None and verdict.action == "abstain" and binding is not None and binding.abstain is not None
            and binding.policy is not None and binding.policy.mode == "enforcing"):
        return binding.abstain
    return question.options[scoring.argmax(answer.probabilities)]


def policy_fields(answer: Answer) -> dict[str, Any]:
    """x_catalog (name@version), and with a policy x_action and x_policy, on a catalog question's answer."""
    binding = answer.question.binding
    if binding is None:
        return {}
    fields: dict[str, Any] = {"x_catalog": binding.ref}
    if answer.verdict is not None:
        fields["x_action"] = answer.verdict.action
        fields["x_policy"] = {"catalog": binding.ref, "mode": binding.policy.mode, "temperature": binding.temperature}
    return fields
