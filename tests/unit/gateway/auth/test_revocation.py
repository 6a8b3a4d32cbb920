"""A revocation takes effect within its stated bound, whichever cache holds the credential.

Three caches can hold a verified credential: API Gateway's authorizer cache (here: the
same authorizer context replayed to the function), the authorizer's own cache, and
the revocation check's memory. A clock is stepped past `check_s` instead of waiting.
"""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from devkit.fake_backend import UniformBackend
from devkit.gateway_stack import event, install
from gateway.auth.authenticate import Authenticator
from gateway.auth.revocation import RevocationCheck
from gateway.auth.store import PrincipalRule
from gateway.auth.tenants import create_tenant, issue_api_key
from gateway.auth.tokens import CachedKeyRing, new_key_document
from gateway.errors import RateLimited, Unauthenticated
from gateway.functions import authorizer
from gateway.stores.sqlite import open_sqlite
from gateway.stores.sqlite.tenants import SQLiteTenants
from tests.fakes import ManualClock
from tests.gateway_helpers import call

ROLE = "arn:aws:iam::123456789012:role/Ops"
OTHER_ROLE = "arn:aws:iam::123456789012:role/Batch"
CHECK_S = 10.0
DECISION = {"model": "jev-latest", "state": "s", "questions": {"q": {"type": "noul", "instructions": "?"}}}


def Clock() -> ManualClock:
    return ManualClock(time.time())


class CountingTenants(SQLiteTenants):
    """Counts the revocation lookups and what each returned (one row at most)."""

    def __init__(self, db) -> None:
        super().__init__(db)
        self.lookups = 0

    def token_revoked(self, tenant_id, token_id, now):
        self.lookups += 1
        return super().token_revoked(tenant_id, token_id, now)


@pytest.fixture
def stack(tmp_path, monkeypatch):
    store = open_sqlite(tmp_path / "g.db")
    store = replace(store, tenants=CountingTenants(store.tenants.db))
    create_tenant(store.tenants, "acme")
    create_tenant(store.tenants, "globex")
    store.tenants.put_principal_rule(PrincipalRule(ROLE, "acme", ("chat", "decide", "admin"), None, 1.0))
    store.tenants.put_principal_rule(PrincipalRule(OTHER_ROLE, "acme", ("decide",), None, 1.0))
    clock = Clock()
    document = new_key_document()
    ring = CachedKeyRing(lambda: document)
    auth = Authenticator(store, ring, clock=clock, revocations=RevocationCheck(store.tenants, check_s=CHECK_S, clock=clock))
    install(UniformBackend(), stores=store, authenticator=auth)
    monkeypatch.setattr(authorizer, "_authorizer", authorizer.Authorizer(auth))  # what lambda_handler runs
    monkeypatch.setattr(authorizer.time, "time", clock)  # the authorizer's own cache runs on the same clock
    return auth, store, clock


def authorize(credential: str) -> dict:
    policy = authorizer.lambda_handler({"type": "REQUEST", "methodArn": "arn:aws:execute-api:r:1:a/s/POST/v1/systemone",
                                        "headers": {"Authorization": f"Bearer {credential}"}}, None)
    return {"principalId": policy["principalId"], **policy["context"]}


def decide_with(context: dict) -> int:
    """The function, given an authorizer context (API Gateway may replay a cached one for 60 s)."""
    return call(event("POST", "/v1/systemone", DECISION, principal=context))[0]


def mint(auth, role=ROLE) -> str:
    token, _ = auth.mint_token(auth.authenticate_iam(role), None, None, 3600)
    return token


def test_a_revoked_token_is_refused_by_every_cache_within_the_check_bound(stack):
    auth, store, clock = stack
    token = mint(auth)
    context = authorize(token)  # now in the authorizer's cache, and (as API Gateway would) replayed below
    assert context["tenant_id"] == "acme" and decide_with(context) == 200
    auth_elsewhere = Authenticator(store, auth.keys, clock=clock)  # another instance revokes it
    auth_elsewhere.revoke_token(auth.authenticate_iam(ROLE), token=token)
    clock.now += CHECK_S  # the bound: no answer older than check_s is reused
    assert authorize(token)["tenant_id"] == ""  # the authorizer's cache hit asks the check
    assert decide_with(context) == 401  # so does the function, for API Gateway's cached context


def test_a_revocation_made_here_applies_here_at_once(stack):
    auth, _, _ = stack
    token = mint(auth)
    context = authorize(token)
    assert decide_with(context) == 200
    auth.revoke_token(auth.authenticate_iam(ROLE), token=token)
    assert authorize(token)["tenant_id"] == "" and decide_with(context) == 401


def test_a_token_is_revoked_by_its_id_without_holding_it(stack):
    auth, _, clock = stack
    token, claims = auth.mint_token(auth.authenticate_iam(ROLE), None, None, 3600)
    context = authorize(token)
    status, _, body = call(event("POST", "/v1/tokens/revoke", {"token_id": claims.token_id},
                                 principal={**authorize(mint(auth)), "scopes": "admin"}))
    assert status == 200 and body == {"token_id": claims.token_id, "revoked": True}
    clock.now += CHECK_S
    assert decide_with(context) == 401


def test_not_before_refuses_every_token_minted_until_then_per_tenant_and_per_principal(stack):
    auth, _, clock = stack
    ops, batch = mint(auth, ROLE), mint(auth, OTHER_ROLE)
    ops_context, batch_context = authorize(ops), authorize(batch)
    auth.revoke_all_tokens(f"principal:{ROLE}")  # as unmapping the principal does
    clock.now += CHECK_S
    assert decide_with(ops_context) == 401 and decide_with(batch_context) == 200
    clock.now += 1
    fresh = mint(auth, ROLE)  # minted after the not-before time: good
    assert decide_with(authorize(fresh)) == 200
    status, _, _ = call(event("POST", "/v1/tokens/revoke", {"all_tokens": True},
                              principal={**authorize(fresh), "scopes": "admin"}))
    assert status == 200
    clock.now += CHECK_S
    assert decide_with(batch_context) == 401 and authorize(fresh)["tenant_id"] == ""


def test_a_dropped_signing_key_refuses_even_a_forged_token(stack):
    # Given a token signed with a key that leaked, when the key is dropped (its "not
    # before" is set to the end of time), then no token it signs passes, whatever it claims.
    auth, _, clock = stack
    token = mint(auth)
    key_id = auth.keys.current()[0]
    auth.tenant_store.set_not_before(f"key:{key_id}", 1e18)
    clock.now += CHECK_S
    with pytest.raises(Unauthenticated):
        auth.authenticate(f"Bearer {token}")


def test_unmapping_a_principal_revokes_its_tokens(stack, tmp_path, capsys):
    from devkit import admin

    auth, store, clock = stack
    token = mint(auth)
    assert admin.main(["--sqlite", store.tenants.db.path, "unmap-principal", ROLE]) == 0
    assert '"tokens_not_before"' in capsys.readouterr().out
    clock.now += CHECK_S
    with pytest.raises(Unauthenticated):
        auth.authenticate(f"Bearer {token}")


def test_a_revoked_api_key_is_refused_by_the_function_for_a_cached_authorization(stack):
    _, store, clock = stack
    key = issue_api_key(store.tenants, "acme", ["decide"])
    context = authorize(key.secret)
    assert decide_with(context) == 200
    store.tenants.revoke_api_key(key.key_id, clock.now)
    clock.now += CHECK_S
    assert decide_with(context) == 401 and authorize(key.secret)["tenant_id"] == ""


def test_the_check_costs_one_lookup_by_key_with_100k_revocations(stack):
    # Given 100,000 live revocations, when a token is checked, the store is asked one
    # key lookup (never a list), and within check_s not at all.
    auth, store, clock = stack
    with store.tenants.db.connect() as db:
        db.executemany("INSERT INTO token_revocations (tenant_id, token_id, expires_at) VALUES (?, ?, ?)",
                       (("acme", f"{i:032x}", clock.now + 3600) for i in range(100_000)))
    token = mint(auth)
    before = store.tenants.lookups
    auth.authenticate(f"Bearer {token}")
    assert store.tenants.lookups == before + 1
    auth.authenticate(f"Bearer {token}")
    assert store.tenants.lookups == before + 1  # remembered for check_s
    plan = store.tenants.db.connect().execute("EXPLAIN QUERY PLAN SELECT 1 FROM token_revocations WHERE tenant_id = ? AND token_id = ?"
                                    " AND expires_at > ?", ("acme", "x", 0)).fetchall()
    assert any("USING PRIMARY KEY" in row[-1] or "USING INDEX" in row[-1] for row in plan)


def test_revocations_and_mints_are_capped_per_tenant(stack, monkeypatch):
    from gateway.auth import authenticate

    auth, _, _ = stack
    monkeypatch.setattr(authenticate, "MAX_MINTS_PER_MINUTE", 3)
    monkeypatch.setattr(authenticate, "MAX_REVOCATIONS_PER_WINDOW", 2)
    caller = auth.authenticate_iam(ROLE)
    for _ in range(3):
        auth.mint_token(caller, None, None, 600)
    with pytest.raises(RateLimited) as refused:
        auth.mint_token(caller, None, None, 600)
    assert refused.value.retry_after >= 1
    auth.revoke_token(caller, token_id="a" * 32)
    auth.revoke_token(caller, token_id="b" * 32)
    with pytest.raises(RateLimited, match="all_tokens"):
        auth.revoke_token(caller, token_id="c" * 32)


def test_the_authorizer_turns_a_store_failure_into_an_unverified_refusal_the_function_retries(stack, monkeypatch):
    _, store, _ = stack
    key = issue_api_key(store.tenants, "acme", ["decide"])
    real_get = store.tenants.get_api_key
    monkeypatch.setattr(store.tenants, "get_api_key", lambda key_id: (_ for _ in ()).throw(OSError("the table is unavailable")))
    context = authorize(key.secret)
    assert context["tenant_id"] == "" and context["unverified"] == "1"
    with_header = {"Authorization": f"Bearer {key.secret}"}
    status, headers, _ = call(event("POST", "/v1/systemone", DECISION, principal=context, headers=with_header))
    assert status == 503 and headers["retry-after"]  # the store is still down: retry later, not "your key is bad"
    monkeypatch.setattr(store.tenants, "get_api_key", real_get)
    status, _, body = call(event("POST", "/v1/systemone", DECISION, principal=context, headers=with_header))
    assert status == 200, body  # back up: the function checked the credential itself
