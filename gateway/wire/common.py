"""What the wire codecs share: the base model, JSON text values, canonical rendering."""

from typing import Any

from pydantic import Field

from gateway.catalogs.model import MAX_VERSION, NAME_PATTERN
from gateway.decisions.model import Answer
from systemone.models import Wire as Wire  # the contract's strict base model, for both formats


class CatalogQuestion(Wire):
    """A question declared in the tenant's catalog, named instead of written out."""

    catalog: str = Field(pattern=NAME_PATTERN, description="The catalog entry's name.")
    version: int | None = Field(default=None, ge=1, le=MAX_VERSION, description="A version; the latest when absent.")


X_CACHE = ("false: the scorer reads the state afresh, keeps nothing of it, and forgets what the instance answering"
           " kept of it for this tenant (others forget at their TTL, 10 minutes). Absent or true: it may keep the"
           " state it read, for this tenant, in memory for minutes, and start from it the next time (the usage's cached"
           " tokens say how much it did).")


def cache_option(x_cache: bool | None) -> dict[str, Any]:
    """The backend's option for a request's `x_cache`: passed on only as false (true is the default,
    and a catalog entry's false must win over it: catalogs.resolve)."""
    return {"x_cache": False} if x_cache is False else {}


def question_kind(value: Any) -> str | None:
    """A question's union tag: "catalog" for a reference to a catalog entry, else its `type`."""
    if isinstance(value, dict):
        return "catalog" if "catalog" in value else value.get("type")
    return "catalog" if isinstance(value, CatalogQuestion) else getattr(value, "type", None)


def question_id(position: int) -> str:
    """Internal question ids are positional: the caller's ids and names never reach the model."""
    return f"q{position}"


def policy_fields(answer: Answer) -> dict[str, Any]:
    """x_catalog (name@version), and with a policy x_action and x_policy, on a catalog question's answer;
    x_action_reason when the action is not the one the policy's rules gave (a suspected injection);
    x_adapter when the entry's adapter produced the probabilities."""
    binding = answer.question.binding
    if binding is None:
        return {}
    fields: dict[str, Any] = {"x_catalog": binding.ref}
    if answer.adapter is not None:
        fields["x_adapter"] = answer.adapter
    if answer.verdict is not None:
        fields["x_action"] = answer.verdict.action
        if answer.verdict.reason is not None:
            fields["x_action_reason"] = answer.verdict.reason
        fields["x_policy"] = {"catalog": binding.ref, "mode": binding.policy.mode, "temperature": binding.temperature}
    return fields
