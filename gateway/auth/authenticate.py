"""Turn a credential into a principal (tenant + scopes + models), or refuse it.

Three ways in, one result:
- an API key (`dgk_...`), checked against its stored hash;
- a minted token (`dgt_...`), checked by signature and expiry, with no store read but a
  revocation list refreshed every few seconds;
- an IAM principal that API Gateway authenticated with SigV4, mapped to a tenant by a
  stored rule (assumed-role sessions are normalised to their role).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from typing import Protocol

from gateway.auth.credentials import API_KEY_PREFIX, SCOPES, Principal, api_key_id, bearer_credential, same_hash
from gateway.auth.revocation import RevocationCheck
from gateway.auth.store import CounterStore, TenantLimits, TenantStore
from gateway.auth.tenant_cache import TenantCache
from gateway.auth.tokens import DEFAULT_TTL_S, MAX_TTL_S, TOKEN_PREFIX, KeyRing, TokenClaims, TokenError, mint, verify
from gateway.errors import Forbidden, InvalidRequest, RateLimited, Unauthenticated

# Touching last-used on every call would make each request a write; once a minute is enough.
LAST_USED_RESOLUTION_S = 60.0
# A tenant's revocations and mints are capped, so that nobody can grow the revocation
# data (or the work of checking it) without bound: revocations live as long as the
# tokens they refuse (12 h at most), mints are counted per minute.
MAX_REVOCATIONS_PER_WINDOW = 10_000
MAX_MINTS_PER_MINUTE = 600
_ASSUMED_ROLE = re.compile(r"^arn:(aws[a-z-]*):sts::(\d{12}):assumed-role/([^/]+)/[^/]+$")
_IAM = re.compile(r"^arn:aws[a-z-]*:iam::\d{12}:(root|user/.+|role/.+)$")


def normalise_principal(arn: str) -> str | None:
    """arn:aws:sts::123:assumed-role/Role/session -> arn:aws:iam::123:role/Role; IAM ARNs as they are."""
    match = _ASSUMED_ROLE.match(arn)
    if match:
        partition, account, role = match.groups()
        return f"arn:{partition}:iam::{account}:role/{role}"
    return arn if _IAM.match(arn) else None


class AuthStores(Protocol):
    """The stores a credential is checked against (a deployment's `gateway.stores.Stores`)."""

    @property
    def tenants(self) -> TenantStore: ...

    @property
    def counters(self) -> CounterStore: ...


class Authenticator:
    def __init__(self, stores: AuthStores, keys: KeyRing | None = None, clock: Callable[[], float] = time.time,
                 revocations: RevocationCheck | None = None) -> None:
        self.tenant_store = stores.tenants
        self.counters = stores.counters
        self.keys = keys
        self.clock = clock
        self.revocations = revocations or RevocationCheck(stores.tenants, clock=clock)
        self.tenants = TenantCache(stores.tenants)

    def limits(self, tenant_id: str) -> TenantLimits:
        return self.tenants.limits(tenant_id)

    def still_valid(self, principal: Principal) -> Principal:
        """The principal, if its credential was not revoked since it was verified (any cache
        that holds a principal asks this on every request); else Unauthenticated."""
        if principal.expires_at is not None and principal.expires_at <= self.clock():
            raise Unauthenticated("invalid credentials")
        if self.revocations.refused(principal):
            raise Unauthenticated("invalid credentials")
        return principal

    def authenticate(self, authorization: str | None) -> Principal:
        credential = bearer_credential(authorization)
        if credential is None:
            raise Unauthenticated("missing credentials: send Authorization: Bearer <API key or token>")
        if credential.startswith(TOKEN_PREFIX):
            return self._token(credential)
        if credential.startswith(API_KEY_PREFIX):
            return self._api_key(credential)
        raise Unauthenticated("invalid credentials")

    def _api_key(self, credential: str) -> Principal:
        key_id = api_key_id(credential)
        record = self.tenant_store.get_api_key(key_id) if key_id else None
        now = self.clock()
        # One message for every failure, so a caller learns nothing about which keys exist.
        if record is None or not same_hash(credential, record.key_hash):
            raise Unauthenticated("invalid credentials")
        if record.revoked_at is not None or (record.expires_at is not None and record.expires_at <= now):
            raise Unauthenticated("invalid credentials")
        if record.last_used_at is None or now - record.last_used_at > LAST_USED_RESOLUTION_S:
            self.tenant_store.touch_api_key(record.key_id, now)
        models = frozenset(record.models) if record.models is not None else None
        return Principal(record.tenant_id, frozenset(record.scopes), models, record.key_id, record.expires_at)

    def _token(self, credential: str) -> Principal:
        return self.still_valid(token_principal(self.verify_token(credential)))

    def verify_token(self, credential: str) -> TokenClaims:
        """Signature and expiry only (revocation is `still_valid`'s)."""
        if self.keys is None:
            raise Unauthenticated("invalid credentials")
        try:
            return verify(self.keys, credential, self.clock())
        except TokenError:
            raise Unauthenticated("invalid credentials") from None

    def authenticate_iam(self, user_arn: str) -> Principal:
        """A SigV4 caller, already authenticated by API Gateway: which tenant it acts for."""
        normalised = normalise_principal(user_arn)
        rule = self.tenant_store.get_principal_rule(normalised) if normalised else None
        if rule is None:
            raise Forbidden("this IAM principal is not mapped to a tenant")
        models = frozenset(rule.models) if rule.models is not None else None
        return Principal(rule.tenant_id, frozenset(rule.scopes), models, normalised or "", None, iam=True, kind="iam")

    def mint_token(self, caller: Principal, scopes: Iterable[str] | None, models: Iterable[str] | None,
                   ttl_s: int | None) -> tuple[str, TokenClaims]:
        """A token for the caller's tenant, narrowed to what it asks and never wider than what it has."""
        if not caller.iam:
            raise Forbidden("tokens are minted with IAM credentials (SigV4), not with a bearer credential")
        if self.keys is None:
            raise Forbidden("token minting is not configured on this gateway")
        wanted_scopes = set(caller.scopes if scopes is None else scopes)
        unknown = wanted_scopes - set(SCOPES)
        if unknown:
            raise InvalidRequest.at(["scopes"], f"unknown scopes: {', '.join(sorted(unknown))}")
        if not wanted_scopes <= caller.scopes:
            raise Forbidden(f"this principal cannot grant: {', '.join(sorted(wanted_scopes - caller.scopes))}")
        wanted_models = None if models is None else set(models)
        if caller.models is not None:
            if wanted_models is None:
                wanted_models = set(caller.models)
            elif not wanted_models <= caller.models:
                raise Forbidden("this principal cannot grant those models")
        if self.revocations.key_dropped(self.keys.current()[0]):
            self.keys.keys(reload=True)  # an emergency rotation: sign with the new key, not the dropped one
        now = self.clock()
        minute = int(now // 60)
        if not self.counters.count_within(f"mints:{caller.tenant_id}:{minute}", MAX_MINTS_PER_MINUTE, (minute + 2) * 60):
            raise RateLimited(f"this tenant minted {MAX_MINTS_PER_MINUTE} tokens this minute; reuse a token until it"
                              " nears its expiry", retry_after=max(1, int((minute + 1) * 60 - now) + 1))
        return mint(self.keys, caller.tenant_id, tuple(wanted_scopes),
                    None if wanted_models is None else tuple(wanted_models), ttl_s or DEFAULT_TTL_S, now, caller.credential_id)

    def revoke_token(self, caller: Principal, *, token: str | None = None, token_id: str | None = None) -> str:
        """Revoke one of the caller's tenant's tokens, given the token or only its id: the token id."""
        now = self.clock()
        if token is not None:
            try:
                claims = self.verify_token(token)
            except Unauthenticated:
                raise InvalidRequest.at(["token"], "this is not a live token of this gateway (malformed, forged or"
                                        " expired); an expired token needs no revocation", "invalid_token") from None
            if claims.tenant_id != caller.tenant_id:
                raise Forbidden("that token belongs to another tenant")
            token_id, expires_at = claims.token_id, float(claims.expires_at)
        elif token_id is not None:
            expires_at = now + MAX_TTL_S  # without the token, its expiry is unknown: the longest a token lives
        else:
            raise InvalidRequest.at([], "name the token to revoke: token or token_id")
        window = int(now // MAX_TTL_S)
        if not self.counters.count_within(f"revocations:{caller.tenant_id}:{window}", MAX_REVOCATIONS_PER_WINDOW,
                                       (window + 2) * MAX_TTL_S):
            raise RateLimited(f"this tenant revoked {MAX_REVOCATIONS_PER_WINDOW} tokens in 12 hours; revoke them all at"
                              " once instead (all_tokens: true)", retry_after=max(1, int((window + 1) * MAX_TTL_S - now)))
        self.tenant_store.revoke_token(token_id, caller.tenant_id, expires_at)
        self.revocations.forget(f"token:{caller.tenant_id}:{token_id}")
        return token_id

    def revoke_all_tokens(self, subject: str) -> float:
        """Refuse every token minted until now for `subject` ("tenant:<id>", "principal:<arn>",
        "key:<kid>" or "all"): the "not before" time set."""
        now = self.clock()
        self.tenant_store.set_not_before(subject, now)
        self.revocations.forget(f"nb:{subject}")
        return now


def token_principal(claims: TokenClaims) -> Principal:
    models = frozenset(claims.models) if claims.models is not None else None
    return Principal(claims.tenant_id, frozenset(claims.scopes), models, claims.token_id, float(claims.expires_at),
                     kind="token", issued_at=float(claims.issued_at), subject=claims.subject, key_id=claims.key_id)
