"""What a store keeps for an idempotent request (`gateway.services.idempotency`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Entry:
    """What the store holds for one key: the request's fingerprint, and its reply once done."""

    fingerprint: str
    reply: bytes | None  # None: the first request still runs


class IdempotencyStore(Protocol):
    def claim_request(self, tenant_id: str, key: str, fingerprint: str, until: float, now: float) -> Entry | None:
        """Claim `key` for a first request until `until`, unless an unexpired entry holds it
        (returned as it is). Atomic: of two callers at once, one claims and one is returned."""
        ...

    def finish_request(self, tenant_id: str, key: str, fingerprint: str, reply: bytes, until: float) -> None:
        """Keep the reply until `until`, if the claim is still this request's (`fingerprint`,
        no reply yet): a claim that expired and was taken by another is left to it."""
        ...

    def drop_request(self, tenant_id: str, key: str, fingerprint: str) -> None:
        """Give up this request's claim (it failed); a finished entry, or another's, is kept."""
        ...
