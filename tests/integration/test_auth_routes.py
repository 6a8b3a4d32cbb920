"""Every route, every kind of bad credential, through the local runner, the real
authorizer and the real store (the backend is the uniform fake: what is tested is who
gets in). A canary credential is used throughout; tests/conftest.py fails any test whose
captured output contains it."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from devkit.fake_backend import UniformBackend
from devkit.gateway_stack import settings_for
from devkit.local import InProcessFunction, LocalApiGateway, make_server
from gateway.auth.authenticate import Authenticator
from gateway.auth.store import PrincipalRule
from gateway.auth.tenants import create_tenant, issue_api_key
from gateway.auth.tokens import CachedKeyRing, mint, new_key_document
from gateway.functions.authorizer import Authorizer
from gateway.functions.composition import build_services
from gateway.functions.handler import GatewayFunction
from gateway.stores.sqlite import open_sqlite
from tests.conftest import CANARY_KEY
from tests.gateway_helpers import unthrottled

ROLE = "arn:aws:iam::123456789012:role/Ops"
OTHER_ROLE = "arn:aws:iam::123456789012:role/GlobexOps"
BODIES = {
    "/v1/systemone": {"model": "jev-latest", "state": "s", "questions": {"q": {"type": "noul", "instructions": "?"}}},
    "/v1/decisions": {"model": "decision-default", "input": "s", "questions": [{"type": "predicate", "instructions": "?"}]},
    "/v1/chat/completions": {"model": "chat-default", "messages": [{"role": "user", "content": "hi"}]},
}
ROUTES = [("GET", "/v1/models", None), ("POST", "/v1/systemone", "decide"), ("POST", "/v1/decisions", "decide"),
          ("POST", "/v1/chat/completions", "chat")]


class Stack:
    def __init__(self, tmp_path) -> None:
        store = open_sqlite(tmp_path / "g.db")
        for tenant in ("acme", "globex"):
            create_tenant(store.tenants, tenant)
        unthrottled(store, "acme", "globex")  # who gets in is tested here, not how often
        store.tenants.put_principal_rule(PrincipalRule(ROLE, "acme", ("chat", "decide"), None, 1.0))
        store.tenants.put_principal_rule(PrincipalRule(OTHER_ROLE, "globex", ("chat", "decide", "admin"), None, 1.0))
        document = new_key_document()
        ring = CachedKeyRing(lambda: document)
        self.auth = Authenticator(store, ring)
        self.store, self.ring = store, ring
        self.good = issue_api_key(store.tenants, "acme", ["chat", "decide"], key=CANARY_KEY).secret
        self.chat_only = issue_api_key(store.tenants, "acme", ["chat"]).secret
        self.decide_only = issue_api_key(store.tenants, "acme", ["decide"]).secret
        self.limited_models = issue_api_key(store.tenants, "acme", ["chat", "decide"], models=["chat-default"]).secret
        expired = issue_api_key(store.tenants, "acme", ["chat", "decide"], ttl_s=1)
        self.expired = expired.secret
        revoked = issue_api_key(store.tenants, "acme", ["chat", "decide"])
        store.tenants.revoke_api_key(revoked.key_id, time.time())
        self.revoked = revoked.secret
        self.tampered = self.good[:-1] + ("A" if self.good[-1] != "A" else "B")
        self.token, _ = mint(ring, "acme", ("chat", "decide"), None, 600, time.time())
        self.expired_token, _ = mint(ring, "acme", ("chat", "decide"), None, 3600, time.time() - 7200)
        self.revoked_token, claims = mint(ring, "acme", ("chat", "decide"), None, 600, time.time())
        store.tenants.revoke_token(claims.token_id, "acme", claims.expires_at)
        self.services = build_services(settings_for(), UniformBackend(), stores=store, authenticator=self.auth)
        self.authorizer = Authorizer(self.auth)
        gateway = LocalApiGateway(InProcessFunction(GatewayFunction(self.services)),
                                  authorizer=lambda event, context: self.authorizer(event, context))
        self.server = make_server("127.0.0.1", 0, gateway)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        time.sleep(1.05)  # let the 1-second key expire

    def call(self, method: str, path: str, credential: str | None = None, *, iam: str | None = None, body=None):
        headers = {}
        if credential is not None:
            headers["Authorization"] = f"Bearer {credential}"
        if iam is not None:
            headers["X-Local-Iam-Principal"] = iam
        return httpx.request(method, f"{self.url}{path}", json=body if body is not None else BODIES.get(path),
                             headers=headers, timeout=30)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    stack = Stack(tmp_path_factory.mktemp("auth"))
    yield stack
    stack.server.shutdown()
    stack.server.server_close()


@pytest.fixture(autouse=True)
def fresh_authorizer(stack):
    stack.authorizer = Authorizer(stack.auth)  # each test starts with an empty authorizer cache


def error_kind(reply: httpx.Response) -> str:
    body = reply.json()
    if "error" in body:
        return body["error"]["type"]
    return body["detail"]["error_type"]


@pytest.mark.parametrize(("method", "path", "scope"), ROUTES, ids=[p for _, p, _ in ROUTES])
@pytest.mark.parametrize("which", [None, "expired", "revoked", "tampered", "expired_token", "revoked_token", "garbage"])
def test_every_route_refuses_a_bad_credential_with_401(stack, method, path, scope, which):
    credential = {None: None, "garbage": "not-a-credential"}.get(which, getattr(stack, which or "good", None))
    reply = stack.call(method, path, credential)
    assert reply.status_code == 401, reply.text
    assert error_kind(reply) == "authentication_error"


@pytest.mark.parametrize(("method", "path", "scope"), ROUTES, ids=[p for _, p, _ in ROUTES])
def test_every_route_accepts_good_credentials_and_checks_its_scope(stack, method, path, scope):
    for credential in (stack.good, stack.token):
        assert stack.call(method, path, credential).status_code == 200
    assert stack.call(method, path, iam="arn:aws:sts::123456789012:assumed-role/Ops/alice").status_code == 200
    wrong = {"decide": stack.chat_only, "chat": stack.decide_only}.get(scope)
    if wrong is not None:
        reply = stack.call(method, path, wrong)
        assert reply.status_code == 403 and error_kind(reply) in ("permission_denied", "permission_error")


def test_a_model_outside_the_credentials_list_does_not_exist_for_it(stack):
    assert stack.call("POST", "/v1/systemone", stack.limited_models).status_code == 404
    models = stack.call("GET", "/v1/models", stack.limited_models).json()
    assert [m["id"] for m in models["data"]] == ["chat-default"]


def test_tokens_are_minted_by_sigv4_callers_only_and_narrowed(stack):
    assert stack.call("POST", "/v1/tokens", body={}).status_code == 401
    bearer = stack.call("POST", "/v1/tokens", stack.good, body={})
    assert bearer.status_code == 403 and "IAM" in bearer.json()["error"]["message"]
    unmapped = stack.call("POST", "/v1/tokens", iam="arn:aws:iam::123456789012:role/Nobody", body={})
    assert unmapped.status_code == 403
    minted = stack.call("POST", "/v1/tokens", iam=ROLE, body={"scopes": ["chat"], "ttl_s": 120})
    assert minted.status_code == 201 and minted.headers["cache-control"] == "no-store"
    document = minted.json()
    assert document["tenant_id"] == "acme" and document["scopes"] == ["chat"] and document["expires_in"] == 120
    assert stack.call("POST", "/v1/chat/completions", document["token"]).status_code == 200
    assert stack.call("POST", "/v1/systemone", document["token"]).status_code == 403
    assert stack.call("POST", "/v1/tokens", iam=ROLE, body={"scopes": ["admin"]}).status_code == 403
    assert stack.call("POST", "/v1/tokens", iam=ROLE, body={"ttl_s": 13 * 3600}).status_code == 422


def test_a_token_can_be_revoked_by_its_tenant_only(stack):
    token = stack.call("POST", "/v1/tokens", iam=ROLE, body={"ttl_s": 600}).json()["token"]
    assert stack.call("GET", "/v1/models", token).status_code == 200
    foreign = stack.call("POST", "/v1/tokens/revoke", iam=OTHER_ROLE, body={"token": token})
    assert foreign.status_code == 403
    assert stack.call("POST", "/v1/tokens/revoke", token, body={"token": token}).status_code == 403  # a bearer without admin
    assert stack.call("POST", "/v1/tokens/revoke", iam=ROLE, body={"token": token}).status_code == 200
    stack.authorizer = Authorizer(stack.auth)  # a new authorizer instance (its cache is per instance)
    assert stack.call("GET", "/v1/models", token).status_code == 401


def test_credentials_in_the_query_string_are_refused(stack):
    reply = httpx.get(f"{stack.url}/v1/models?api_key={stack.good}", headers={"Authorization": f"Bearer {stack.good}"})
    assert reply.status_code == 400 and stack.good not in reply.text
    reply = httpx.get(f"{stack.url}/v1/models?x={stack.token}", headers={"Authorization": f"Bearer {stack.good}"})
    assert reply.status_code == 400


def test_errors_never_echo_the_credential(stack):
    for credential in (stack.tampered, stack.expired, stack.good + "x"):
        reply = stack.call("POST", "/v1/systemone", credential)
        assert credential not in reply.text and credential[:20] not in reply.text
