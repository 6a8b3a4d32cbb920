"""API keys, the authenticator and the SQLite tenant store."""

from __future__ import annotations

import pytest

from gateway.auth.authenticate import Authenticator
from gateway.auth.credentials import api_key_id, bearer_credential, new_api_key
from gateway.auth.tenants import ProvisioningError, create_tenant, issue_api_key
from gateway.errors import Unauthenticated
from tests.fakes import ManualClock
from tests.gateway_helpers import tenant_store

Clock = ManualClock


@pytest.fixture
def store(tmp_path):
    return tenant_store(tmp_path / "gateway.db", "acme")


def test_keys_are_recognisable_and_never_printed():
    key = new_api_key()
    assert key.secret.startswith("dgk_") and api_key_id(key.secret) == key.key_id
    assert key.secret not in repr(key)
    assert api_key_id("dgk_short_x") is None and api_key_id(key.secret + "x") is None


@pytest.mark.parametrize("header", [None, "", "Bearer", "Bearer   ", "Basic abc", "bearer"])
def test_malformed_authorization_headers_carry_no_credential(header):
    assert bearer_credential(header) is None


def test_only_the_hash_is_stored_and_a_good_key_gives_its_principal(store, tmp_path):
    key = issue_api_key(store.tenants, "acme", ["decide", "chat"], models=["decision-default"])
    assert key.secret.encode() not in (tmp_path / "gateway.db").read_bytes()
    principal = Authenticator(store).authenticate(f"Bearer {key.secret}")
    assert principal.tenant_id == "acme" and principal.scopes == {"decide", "chat"}
    assert principal.may_use("decision-default") and not principal.may_use("chat-default")


def test_tampered_unknown_revoked_and_expired_keys_are_refused_alike(store):
    clock = Clock(1_000.0)
    auth = Authenticator(store, clock=clock)
    good = issue_api_key(store.tenants, "acme", ["decide"])
    tampered = good.secret[:-1] + ("A" if good.secret[-1] != "A" else "B")
    unknown = new_api_key().secret
    for candidate in (tampered, unknown, "dgk_garbage"):
        with pytest.raises(Unauthenticated, match=r"^invalid credentials$"):
            auth.authenticate(f"Bearer {candidate}")
    short = issue_api_key(store.tenants, "acme", ["decide"], ttl_s=60)
    expires_at = store.tenants.get_api_key(short.key_id).expires_at
    assert Authenticator(store, clock=Clock(expires_at - 1)).authenticate(f"Bearer {short.secret}").tenant_id == "acme"
    with pytest.raises(Unauthenticated):
        Authenticator(store, clock=Clock(expires_at)).authenticate(f"Bearer {short.secret}")
    assert store.tenants.revoke_api_key(good.key_id, 5.0) and not store.tenants.revoke_api_key(good.key_id, 6.0)
    with pytest.raises(Unauthenticated):
        auth.authenticate(f"Bearer {good.secret}")


def test_last_used_is_recorded_without_a_write_per_call(store):
    key = issue_api_key(store.tenants, "acme", ["decide"])
    clock = Clock(10_000.0)
    auth = Authenticator(store, clock=clock)
    auth.authenticate(f"Bearer {key.secret}")
    assert store.tenants.get_api_key(key.key_id).last_used_at == 10_000.0
    clock.now += 30
    auth.authenticate(f"Bearer {key.secret}")
    assert store.tenants.get_api_key(key.key_id).last_used_at == 10_000.0
    clock.now += 60
    auth.authenticate(f"Bearer {key.secret}")
    assert store.tenants.get_api_key(key.key_id).last_used_at == 10_090.0


def test_provisioning_refuses_what_it_cannot_keep(store):
    with pytest.raises(ProvisioningError, match="tenant id"):
        create_tenant(store.tenants, "Not Valid")
    with pytest.raises(ProvisioningError, match="unknown scopes"):
        issue_api_key(store.tenants, "acme", ["root"])
    with pytest.raises(ProvisioningError, match="no tenant"):
        issue_api_key(store.tenants, "ghost", ["decide"])
    with pytest.raises(ProvisioningError, match="reads dgk_"):
        issue_api_key(store.tenants, "acme", ["decide"], key="hunter2")
    given = new_api_key().secret
    assert issue_api_key(store.tenants, "acme", ["decide"], key=given).secret == given
    assert issue_api_key(store.tenants, "acme", ["decide"], key=given).secret == given  # importing twice is a no-op
