"""Two store interfaces of the tenants: the tenant store (tenants, IAM principal rules, API
key records and token revocations) and the counter store (what a tenant's requests count,
shared by every function instance: rate windows, tallies of spend and endpoint time,
places in flight, usage by day). Each has two implementations that pass one contract
suite: `gateway.stores.sqlite` (the embedded local store) and `gateway.stores.dynamodb` (AWS).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class TenantLimits:
    """What one tenant may ask, per request and per second: settings of the tenant.

    The defaults keep every decision's record well under DynamoDB's 400 KB item limit
    (1024 options and 256 KiB of text at most) and a chat's reply under a minute of
    CPU decoding. Rate, burst and work in flight are enforced per tenant by the gateway
    on the store's shared counters (`gateway.services.throttle`); API Gateway's usage plan
    (the authorizer names the tenant's `usage_key`) is a coarser guard in front.
    """

    rate_per_s: float = 10.0
    burst: int = 20
    max_options: int = 1024  # options across every question of one decision (catalog entries included)
    max_text_bytes: int = 256 * 1024  # UTF-8 text the model reads for one request: state, questions, options, messages
    max_request_tokens: int | None = None  # estimated evaluation tokens per decision; None: the model's own limit
    max_chat_tokens: int = 1024  # the most a chat completion may generate
    # Decisions and chats of this tenant running at once (gateway.services.throttle); None: the
    # model's own figure, half of its scorers' line (EndpointPool's PoolPolicy.tenant_in_flight).
    max_in_flight: int | None = None
    monthly_budget_usd: float | None = None  # spend per calendar month (UTC), reserved before work (gateway.services.spending)
    endpoint_seconds_per_minute: float | None = None  # endpoint time per clock minute, reserved the same way
    # The tenant's share of a scorer against other tenants' (the scorer serves tenants in turn,
    # weighted: systemone.sidechannel); 2 is twice the turns of a tenant at 1 when both wait.
    share_weight: float = 1.0
    usage_key: str | None = None  # AWS: the API Gateway API key (of the tenant's usage plan) the authorizer returns

    def as_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in (f.name for f in fields(self)) if getattr(self, k) != getattr(DEFAULT_LIMITS, k)}

    @classmethod
    def from_json(cls, values: dict[str, Any] | None) -> TenantLimits:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in (values or {}).items() if k in known})


DEFAULT_LIMITS = TenantLimits()
# The least endpoint time a minute a tenant may be given: a request's deadline is capped at
# it, and one attempt needs the endpoint's 2 s to connect and a couple of seconds to read (a
# decision's time on a CPU scorer: docs/benchmarks.md). Below it every request would fail as if
# the model were down; it is refused instead (429 naming the figures).
MIN_ENDPOINT_SECONDS_PER_MINUTE = 5.0


@dataclass(frozen=True, slots=True)
class UsageRow:
    """What one tenant spent on one day (UTC, YYYY-MM-DD) under one entry: a catalog entry's
    name, `(inline)` for questions that named none, `(chat)` for chat completions."""

    day: str
    entry: str
    requests: int
    cost_nano_usd: int  # billionths of a dollar: integers, so concurrent additions never round
    endpoint_ms: int
    # What the tenant wrote to the stores: its decision records and catalog versions.
    stored_bytes: int = 0
    # What the model read for its decisions, and of that what the scorer restored from the
    # state it kept (not evaluated again: the endpoint time it saved is off the cost already).
    input_tokens: int = 0
    cached_tokens: int = 0


# A usage row's figures, each added up (every field past the day and the entry).
USAGE_FIGURES = ("requests", "cost_nano_usd", "endpoint_ms", "stored_bytes", "input_tokens", "cached_tokens")


@dataclass(frozen=True, slots=True)
class Tenant:
    tenant_id: str
    name: str
    created_at: float
    catalog_only: bool = False  # refuse inline questions: every question must name a catalog entry
    limits: TenantLimits = field(default_factory=TenantLimits)


@dataclass(frozen=True, slots=True)
class PrincipalRule:
    """An IAM principal (normalised ARN) that acts for a tenant, with what it may do."""

    principal_arn: str
    tenant_id: str
    scopes: tuple[str, ...]
    models: tuple[str, ...] | None
    created_at: float


@dataclass(frozen=True, slots=True)
class ApiKeyRecord:
    key_id: str
    tenant_id: str
    key_hash: str
    scopes: tuple[str, ...]
    models: tuple[str, ...] | None
    created_at: float
    expires_at: float | None = None
    revoked_at: float | None = None
    last_used_at: float | None = None
    name: str = ""


class TenantStore(Protocol):
    def put_tenant(self, tenant: Tenant) -> None: ...

    def get_tenant(self, tenant_id: str) -> Tenant | None: ...

    def put_principal_rule(self, rule: PrincipalRule) -> None: ...

    def get_principal_rule(self, principal_arn: str) -> PrincipalRule | None: ...

    def delete_principal_rule(self, principal_arn: str) -> bool: ...

    def put_api_key(self, record: ApiKeyRecord) -> None:
        """Insert a new key record; a key id that exists already raises ValueError."""
        ...

    def get_api_key(self, key_id: str) -> ApiKeyRecord | None: ...

    def list_api_keys(self, tenant_id: str) -> list[ApiKeyRecord]: ...

    def revoke_api_key(self, key_id: str, when: float) -> bool:
        """True when this call revoked it (False: unknown or already revoked)."""
        ...

    def touch_api_key(self, key_id: str, when: float) -> None: ...

    def revoke_token(self, token_id: str, tenant_id: str, expires_at: float) -> None: ...

    def token_revoked(self, tenant_id: str, token_id: str, now: float) -> bool:
        """One lookup by key, however many tokens are revoked (the check runs on every request)."""
        ...

    def set_not_before(self, subject: str, when: float) -> None:
        """Refuse tokens of `subject` minted at or before `when` (an earlier time never replaces a later one)."""
        ...

    def not_before(self, subject: str) -> float | None: ...


class CounterStore(Protocol):
    def count_within(self, name: str, limit: int, expires_at: float) -> bool:
        """Atomically count one more against `name` unless it reached `limit` (True: counted);
        the counter is dropped after `expires_at`."""
        ...

    def add_within(self, name: str, amount: int, limit: int | None, expires_at: float) -> bool:
        """Atomically add `amount` (negative to give some back) to the tally `name` while it is
        under `limit` (None: always); True when added. Expired after `expires_at`."""
        ...

    def tally(self, name: str) -> int:
        """The tally's current amount (0 when it has none or it expired)."""
        ...

    def add_usage(self, tenant_id: str, row: UsageRow, expires_at: float) -> None:
        """Add the row's figures to the tenant's day and entry (created at zero when new)."""
        ...

    def usage(self, tenant_id: str, first_day: str, last_day: str) -> list[UsageRow]:
        """The tenant's rows from `first_day` to `last_day` (inclusive), by day then entry."""
        ...

    def hold(self, name: str, holder: str, limit: int, expires_at: float, now: float) -> bool:
        """Atomically take one of `limit` places of `name` for `holder` until `expires_at`,
        unless they are all held (True: taken). A place whose holder never released it is
        free again once it expired, so a function that died holding one leaks nothing."""
        ...

    def release(self, name: str, holder: str) -> None:
        """Give `holder`'s place of `name` back (nothing when it holds none)."""
        ...
