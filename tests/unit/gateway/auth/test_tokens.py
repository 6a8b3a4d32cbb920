"""Minted tokens: signature, expiry, key rotation, revocation, and the IAM mapping."""

from __future__ import annotations

import base64
import json

import pytest

from gateway.auth.authenticate import Authenticator, normalise_principal
from gateway.auth.credentials import Principal
from gateway.auth.revocation import RevocationCheck
from gateway.auth.store import PrincipalRule
from gateway.auth.tokens import MAX_TTL_S, CachedKeyRing, TokenError, mint, new_key_document, verify
from gateway.errors import Forbidden, InvalidRequest, Unauthenticated
from tests.fakes import ManualClock
from tests.gateway_helpers import tenant_store

Clock = ManualClock


class Documents:
    """A key document that rotates, as a secret in Secrets Manager would."""

    def __init__(self) -> None:
        self.text = new_key_document()
        self.loads = 0

    def rotate(self) -> None:
        self.text = new_key_document(self.text)

    def __call__(self) -> str:
        self.loads += 1
        return self.text


ROLE = "arn:aws:iam::123456789012:role/Ops"


@pytest.fixture
def setup(tmp_path):
    store = tenant_store(tmp_path / "g.db", "acme", "globex")
    store.tenants.put_principal_rule(PrincipalRule(ROLE, "acme", ("chat", "decide"), ("decision-default", "chat-default"), 1.0))
    documents, clock = Documents(), Clock()
    ring = CachedKeyRing(documents, ttl_s=300, min_reload_s=0, clock=clock)
    auth = Authenticator(store, ring, clock=clock, revocations=RevocationCheck(store.tenants, check_s=0, clock=clock))
    return auth, documents, clock, store


@pytest.mark.parametrize(
    ("arn", "normalised"),
    [
        ("arn:aws:sts::123456789012:assumed-role/Ops/alice@example.com", ROLE),
        ("arn:aws:iam::123456789012:role/Ops", ROLE),
        ("arn:aws:iam::123456789012:user/team/bob", "arn:aws:iam::123456789012:user/team/bob"),
        ("arn:aws-us-gov:sts::123456789012:assumed-role/Ops/x", "arn:aws-us-gov:iam::123456789012:role/Ops"),
        ("arn:aws:sts::123456789012:federated-user/bob", None),
        ("not an arn", None),
    ],
)
def test_principals_are_normalised_to_what_rules_name(arn, normalised):
    assert normalise_principal(arn) == normalised


def test_an_assumed_role_session_acts_for_its_roles_tenant(setup):
    auth, *_ = setup
    principal = auth.authenticate_iam("arn:aws:sts::123456789012:assumed-role/Ops/alice")
    assert principal.tenant_id == "acme" and principal.iam and principal.scopes == {"chat", "decide"}
    with pytest.raises(Forbidden, match="not mapped"):
        auth.authenticate_iam("arn:aws:iam::123456789012:role/Stranger")


def test_a_minted_token_is_narrowed_and_verifies_without_a_store_read(setup):
    auth, _, clock, _store = setup
    caller = auth.authenticate_iam(ROLE)
    token, claims = auth.mint_token(caller, ["decide"], ["decision-default"], 600)
    assert token.startswith("dgt_") and claims.expires_at == int(clock.now) + 600
    principal = auth.authenticate(f"Bearer {token}")
    assert (principal.tenant_id, principal.scopes, principal.models) == ("acme", {"decide"}, {"decision-default"})
    assert principal.expires_at == claims.expires_at and principal.credential_id == claims.token_id


def test_minting_never_widens_and_only_iam_callers_mint(setup):
    auth, *_ = setup
    caller = auth.authenticate_iam(ROLE)
    with pytest.raises(Forbidden, match="cannot grant: admin"):
        auth.mint_token(caller, ["admin"], None, 600)
    with pytest.raises(Forbidden, match="models"):
        auth.mint_token(caller, None, ["other-model"], 600)
    with pytest.raises(InvalidRequest):
        auth.mint_token(caller, ["root"], None, 600)
    with pytest.raises(ValueError):
        auth.mint_token(caller, None, None, MAX_TTL_S + 1)
    _, claims = auth.mint_token(caller, None, None, None)
    assert claims.expires_at - claims.issued_at == 3600 and claims.models == ("chat-default", "decision-default")
    bearer = Principal("acme", frozenset({"chat", "decide"}), None, "k1")
    with pytest.raises(Forbidden, match="IAM"):
        auth.mint_token(bearer, None, None, 600)


def test_expired_tampered_and_foreign_tokens_are_refused_alike(setup):
    auth, _documents, clock, _ = setup
    token, _ = auth.mint_token(auth.authenticate_iam(ROLE), None, None, 600)
    payload, signature = token[4:].split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=="))
    forged_payload = base64.urlsafe_b64encode(json.dumps({**claims, "ten": "globex"}).encode()).rstrip(b"=").decode()
    other_ring = CachedKeyRing(Documents(), clock=clock)
    foreign, _ = mint(other_ring, "acme", ("decide",), None, 600, clock.now)
    # Another last character whose unused bits alone differ decodes to the same signature:
    # it is another text, and refused as tampered (one token, one text).
    twin = next(token[:-1] + c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
                if c != token[-1] and base64.urlsafe_b64decode(signature[:-1] + c + "=")
                == base64.urlsafe_b64decode(signature + "="))
    changed = token[:-2] + ("B" if token[-2] == "A" else "A") + token[-1]
    for bad in (f"dgt_{forged_payload}.{signature}", changed, twin, foreign, "dgt_x.y", "dgt_", token + ".x"):
        with pytest.raises(Unauthenticated, match=r"^invalid credentials$"):
            auth.authenticate(f"Bearer {bad}")
    clock.now += 600
    with pytest.raises(Unauthenticated):
        auth.authenticate(f"Bearer {token}")


def test_a_token_minted_with_one_key_still_verifies_after_rotation(setup):
    auth, documents, clock, _ = setup
    old, _ = auth.mint_token(auth.authenticate_iam(ROLE), None, None, 3600)
    documents.rotate()
    clock.now += 400  # past the key ring's cache: the new key is current
    new, claims = auth.mint_token(auth.authenticate_iam(ROLE), None, None, 3600)
    assert claims.key_id == json.loads(documents.text)["current"]
    assert auth.authenticate(f"Bearer {old}").tenant_id == auth.authenticate(f"Bearer {new}").tenant_id == "acme"


def test_a_token_signed_by_an_unknown_key_reloads_the_ring_once(setup):
    auth, documents, clock, _ = setup
    auth.mint_token(auth.authenticate_iam(ROLE), None, None, 600)
    loads = documents.loads
    documents.rotate()
    minted_elsewhere, _ = mint(CachedKeyRing(lambda: documents.text, clock=clock), "acme", ("decide",), None, 600, clock.now)
    assert auth.authenticate(f"Bearer {minted_elsewhere}").tenant_id == "acme"
    assert documents.loads == loads + 1


def test_revocation_applies_and_only_to_the_callers_tenant(setup):
    auth, _, _, store = setup
    caller = auth.authenticate_iam(ROLE)
    token, claims = auth.mint_token(caller, None, None, 600)
    other = Principal("globex", frozenset({"admin"}), None, "iam", iam=True)
    with pytest.raises(Forbidden, match="another tenant"):
        auth.revoke_token(other, token=token)
    auth.revoke_token(caller, token=token)
    assert store.tenants.token_revoked("acme", claims.token_id, 0) and not store.tenants.token_revoked("globex", claims.token_id, 0)
    with pytest.raises(Unauthenticated):
        auth.authenticate(f"Bearer {token}")


def test_verify_refuses_garbage_without_raising_anything_else():
    ring = CachedKeyRing(Documents())
    for garbage in ("", "dgt_", "dgt_....", "dgt_!!.??", "dgt_" + "A" * 5000, "dgt_e30.AAAA"):
        with pytest.raises(TokenError):
            verify(ring, garbage, 0)


def test_the_signature_is_checked_before_the_payload_is_decoded(monkeypatch):
    # Given a token whose payload is a JSON bomb (deep nesting) under a wrong signature,
    # when verified, it is refused, and the payload was never given to the JSON parser.
    ring = CachedKeyRing(Documents())
    decoded = []
    import gateway.auth.tokens as tokens

    monkeypatch.setattr(tokens.json, "loads", lambda text: decoded.append(text) or {})
    bomb = base64.urlsafe_b64encode(b"[" * 3000 + b"]" * 3000).rstrip(b"=").decode()
    with pytest.raises(TokenError):
        verify(ring, f"dgt_{bomb}.{'A' * 43}", 0)
    assert decoded == []


def test_a_signed_payload_that_is_not_claims_is_refused_as_a_token_error():
    ring = CachedKeyRing(Documents())
    key_id, key = ring.current()
    from gateway.auth.tokens import _b64, _sign

    for document in (b"[" * 3000 + b"]" * 3000, b'{"v": 1}', b"null", b'{"v":1,"kid":"' + key_id.encode() + b'","jti":[]}'):
        payload = _b64(document)
        with pytest.raises(TokenError):
            verify(ring, f"dgt_{payload}.{_b64(_sign(key, payload))}", 0)
