"""The REQUEST authorizer: its policy, its context, and its cache."""

from __future__ import annotations

from gateway.auth.credentials import Principal
from gateway.auth.store import DEFAULT_LIMITS
from gateway.errors import Unauthenticated
from gateway.functions import authorizer

METHOD_ARN = "arn:aws:execute-api:us-east-1:123456789012:abc123/prod/POST/v1/systemone"


class Counting:
    def __init__(self, principal: Principal | None) -> None:
        self.principal, self.calls = principal, 0

    def authenticate(self, header):
        self.calls += 1
        if self.principal is None:
            raise Unauthenticated("invalid credentials")
        return self.principal

    def still_valid(self, principal):
        return principal

    def limits(self, tenant_id):
        return DEFAULT_LIMITS


def event(credential: str) -> dict:
    return {"type": "REQUEST", "methodArn": METHOD_ARN, "headers": {"Authorization": f"Bearer {credential}"}}


def test_a_good_credential_gets_a_stage_wide_allow_and_its_principal():
    authorize = authorizer.Authorizer(Counting(Principal("acme", frozenset({"decide"}), frozenset({"m"}), "k1", 2e9)))
    policy = authorize(event("dgk_x"), None)
    statement = policy["policyDocument"]["Statement"][0]
    assert statement["Effect"] == "Allow" and statement["Resource"] == "arn:aws:execute-api:us-east-1:123456789012:abc123/prod/*"
    assert policy["context"] == {"tenant_id": "acme", "scopes": "decide", "models": '["m"]', "credential_id": "k1",
                                 "expires_at": "2000000000.0", "kind": "api_key"}
    assert all(isinstance(v, str) for v in policy["context"].values())  # API Gateway context values are scalars


def test_a_bad_credential_is_passed_on_as_a_reason_for_a_shaped_401():
    policy = authorizer.Authorizer(Counting(None))(event("dgk_bad"), None)
    assert policy["principalId"] == "anonymous" and policy["context"] == {"tenant_id": "", "reason": "invalid credentials"}


def test_the_cache_is_keyed_by_a_hash_and_never_outlives_the_credential(monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(authorizer.time, "time", lambda: clock[0])
    soon = Counting(Principal("acme", frozenset(), None, "t1", expires_at=1010.0))
    authorize = authorizer.Authorizer(soon)
    for _ in range(3):
        authorize(event("dgt_abc"), None)
    assert soon.calls == 1
    assert all("dgt_abc" not in key for key in authorize._cache)
    clock[0] = 1010.0  # the token's own expiry, before the 60 s cache would end
    authorize(event("dgt_abc"), None)
    assert soon.calls == 2
    clock[0] = 1000.0 + authorizer.CACHE_S + 1
    lasting = Counting(Principal("acme", frozenset(), None, "k1"))
    authorize = authorizer.Authorizer(lasting)
    authorize(event("dgk_long"), None)
    clock[0] += authorizer.CACHE_S
    authorize(event("dgk_long"), None)
    assert lasting.calls == 2


def _load_authorizer(tmp_path, **env) -> tuple[dict, str]:
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[4]
    script = ("import json, gateway.functions.authorizer as a\n"
              "print(json.dumps({'built': a._authorizer is not None,"
              " 'cached': len(a._authorizer._cache) if a._authorizer else None}))")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "GATEWAY_"))}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=root,
                          env={**clean, "AWS_DEFAULT_REGION": "us-east-1", **env})
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def test_in_lambda_the_authorizer_is_built_in_the_init_phase_that_a_snapshot_carries(tmp_path):
    # Given Lambda's environment and a store, loading the module builds the authorizer (its
    # cache empty: nothing is authorized at init); outside Lambda nothing is built at import;
    # settings that cannot be built still load, and the first invocation tries again.
    store = {"GATEWAY_SQLITE_PATH": str(tmp_path / "g.db"), "GATEWAY_SIGNING_KEYS_FILE": str(tmp_path / "keys.json")}
    loaded, _ = _load_authorizer(tmp_path, AWS_LAMBDA_FUNCTION_NAME="authorizer", **store)
    assert loaded == {"built": True, "cached": 0}
    assert _load_authorizer(tmp_path, **store)[0] == {"built": False, "cached": None}
    broken, log = _load_authorizer(tmp_path, AWS_LAMBDA_FUNCTION_NAME="authorizer")
    assert broken["built"] is False and "could not be built in the init phase" in log
