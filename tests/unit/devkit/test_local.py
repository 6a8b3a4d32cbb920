"""The limits in front of the function: body size arithmetic, per-tenant throttling
(usage plans in AWS, the local runner's buckets), and the local-only IAM emulation."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from devkit import local
from devkit.fake_backend import UniformBackend
from devkit.gateway_stack import PRINCIPAL, call_installed, event, install, settings_for, stream_installed
from devkit.local import LocalApiGateway, LocalUsagePlans, TokenBucket, proxy_event, read_whole
from gateway.auth.store import DEFAULT_LIMITS, Tenant
from gateway.functions import authorizer
from gateway.settings import LAMBDA_INVOKE_PAYLOAD_BYTES, MAX_BODY_BYTES, GatewaySettings
from systemone import limits
from tests.fakes import ManualClock
from tests.gateway_helpers import call, tenant_store


def test_the_largest_accepted_body_fits_a_lambda_invocation_once_base64_encoded():
    # Given a body of exactly the limit with 10 KiB of headers (API Gateway's most) and a
    # full authorizer context, the proxy event Lambda receives is under its 6 MB payload.
    headers = [("Content-Type", "application/json"), ("Authorization", "Bearer " + "x" * 400)]
    headers += [(f"X-Filler-{i}", "v" * 90) for i in range(100)]
    assert sum(len(k) + len(v) for k, v in headers) >= 10 * 1024
    ev = proxy_event("POST", "/v1/systemone", headers, b"a" * MAX_BODY_BYTES, "203.0.113.7")
    ev["requestContext"]["authorizer"] = {**PRINCIPAL, "models": json.dumps([f"model-{i}" for i in range(50)]),
                                          "issued_at": "1.0", "expires_at": "2.0", "subject": "arn:aws:iam::1:role/" + "r" * 64}
    assert len(json.dumps(ev).encode()) <= LAMBDA_INVOKE_PAYLOAD_BYTES
    assert MAX_BODY_BYTES == 4_669_440 and GatewaySettings.model_fields["max_body_bytes"].default == MAX_BODY_BYTES


def test_a_body_over_the_limit_is_the_gateways_own_413():
    install(UniformBackend())
    status, _, body = call(event("POST", "/v1/systemone", raw=b" " * (MAX_BODY_BYTES + 1)))
    assert status == 413 and str(MAX_BODY_BYTES) in body["detail"]["message"]


def test_no_setting_can_raise_the_body_limit_past_what_fits():
    with pytest.raises(ValueError):
        settings_for(max_body_bytes=MAX_BODY_BYTES + 1)


def test_the_gateways_limit_is_below_what_api_gateway_and_lambda_can_carry():
    # AWS's figures, stated once (systemone.limits): the local runner uses them, the settings agree.
    assert limits.LAMBDA_INVOKE_PAYLOAD_BYTES == LAMBDA_INVOKE_PAYLOAD_BYTES == 6_291_456
    assert limits.MAX_CARRIED_BODY_BYTES == 4_718_592 and MAX_BODY_BYTES < limits.MAX_CARRIED_BODY_BYTES
    assert local.MAX_REQUEST_BYTES == limits.API_GATEWAY_MAX_REQUEST_BYTES == 10 * 1024 * 1024


class _Invoked:
    """The installed function behind the local runner, remembering whether it was reached."""

    def __init__(self) -> None:
        self.events = 0

    def invoke(self, ev, timeout_s):
        self.events += 1
        return call_installed(ev, None)

    def invoke_stream(self, ev, timeout_s):
        self.events += 1
        return stream_installed(ev, None)


def _runner() -> tuple[LocalApiGateway, _Invoked]:
    install(UniformBackend())
    function = _Invoked()
    accept = lambda ev, context: {"principalId": "acme", "context": dict(PRINCIPAL)}  # noqa: E731
    return LocalApiGateway(function, authorizer=accept), function


# API Gateway's most headers (10 KiB of them), so the largest accepted body is tried in the fullest event.
FULL_HEADERS = [("Content-Type", "application/json"), ("Authorization", "Bearer " + "x" * 400)]
FULL_HEADERS += [(f"X-Filler-{i}", "v" * 90) for i in range(100)]
DECISION = b'{"model": "jev-latest", "state": "Where is my parcel?", "questions": {"late": {"type": "noul", "instructions": "Is it late?"}}}'


def test_the_largest_accepted_body_reaches_the_function_through_the_local_runner():
    # Given a valid request padded with trailing whitespace to exactly the gateway's limit
    runner, function = _runner()
    body = DECISION + b" " * (MAX_BODY_BYTES - len(DECISION))
    # When it goes through API Gateway's steps with the most headers API Gateway takes
    status, _, reply = read_whole(runner.handle("POST", "/v1/systemone", FULL_HEADERS, body, "127.0.0.1"))
    # Then the function decides it
    assert (status, function.events) == (200, 1), reply
    assert set(json.loads(reply)["answers"]) == {"late"}


def test_one_byte_over_the_gateways_limit_is_the_gateways_own_413_through_the_local_runner():
    runner, function = _runner()
    body = DECISION + b" " * (MAX_BODY_BYTES + 1 - len(DECISION))
    status, _, reply = read_whole(runner.handle("POST", "/v1/systemone", FULL_HEADERS, body, "127.0.0.1"))
    assert (status, function.events) == (413, 1)
    assert str(MAX_BODY_BYTES) in json.loads(reply)["detail"]["message"]


@pytest.mark.parametrize("size", [limits.MAX_CARRIED_BODY_BYTES + 1, limits.API_GATEWAY_MAX_REQUEST_BYTES + 1])
def test_a_body_api_gateway_cannot_carry_gets_its_own_refusal_from_the_local_runner(size):
    # Given a body whose event Lambda would refuse (over 6 MB once base64-encoded), or one
    # over API Gateway's 10 MB: API Gateway answers itself, with its default (uncustomisable) body
    runner, function = _runner()
    status, headers, reply = read_whole(runner.handle("POST", "/v1/systemone", FULL_HEADERS[:2], b" " * size, "127.0.0.1"))
    assert status == 413 and function.events == 0
    assert reply == b'{"message": "Request Too Long"}'
    assert dict(headers) == {"Content-Type": "application/json", "x-amzn-ErrorType": "BadRequestException"}


def Clock() -> ManualClock:
    return ManualClock(100.0)


def test_a_bucket_admits_the_burst_then_the_rate():
    bucket = TokenBucket(rate_per_s=2.0, burst=3, now=0.0)
    assert [bucket.take(0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.take(0.0) == pytest.approx(0.5)
    assert bucket.take(0.5) == 0.0 and bucket.take(0.5) > 0


def test_a_tenant_with_its_own_key_is_throttled_alone_at_its_own_numbers():
    limits = {"flood": replace(DEFAULT_LIMITS, rate_per_s=1.0, burst=2, usage_key="local-flood"),
              "quiet": replace(DEFAULT_LIMITS, usage_key="local-quiet")}
    clock = Clock()
    plans = LocalUsagePlans(limits.__getitem__, clock)
    assert [plans.admit("flood") for _ in range(2)] == [0.0, 0.0]
    assert plans.admit("flood") == pytest.approx(1.0)
    assert all(plans.admit("quiet") == 0.0 for _ in range(DEFAULT_LIMITS.burst))  # the flood did not touch it
    assert all(plans.admit("") == 0.0 for _ in range(local.REFUSED_BURST)) and plans.admit("") > 0
    clock.now += 1.0
    assert plans.admit("flood") == 0.0


def test_tenants_without_a_key_share_one_bucket_at_the_default_numbers_as_in_aws():
    # Their own rate is not applied: in AWS they share the stack's key and its plan.
    limits = {"a": replace(DEFAULT_LIMITS, rate_per_s=1.0, burst=1), "b": DEFAULT_LIMITS}
    plans = LocalUsagePlans(limits.__getitem__, Clock())
    assert all(plans.admit("a") == 0.0 for _ in range(DEFAULT_LIMITS.burst))
    assert plans.admit("b") > 0


class _Authorizing:
    """An authorizer that maps `Bearer <tenant>` to that tenant (what is tested is the throttle)."""

    def authenticate(self, header):
        from gateway.auth.credentials import Principal
        from gateway.errors import Unauthenticated

        if not header:
            raise Unauthenticated("missing credentials")
        if header == "Bearer store-down":
            raise OSError("the store is unavailable")
        return Principal(header.split()[-1], frozenset({"decide"}), None, "k")

    def still_valid(self, principal):
        return principal

    def limits(self, tenant_id):
        if tenant_id == "flood":
            return replace(DEFAULT_LIMITS, rate_per_s=1.0, burst=2, usage_key="local-flood")
        return replace(DEFAULT_LIMITS, usage_key="local-quiet")


def test_the_local_runner_answers_429_with_retry_after_in_both_shapes_before_the_function():
    authorize = authorizer.Authorizer(_Authorizing())
    invoked = []

    class Function:
        def invoke(self, event, timeout_s):
            invoked.append(event["requestContext"]["authorizer"]["tenant_id"])
            return {"statusCode": 200, "headers": {}, "body": "{}"}

    gateway = LocalApiGateway(Function(), authorizer=authorize, usage_plans=LocalUsagePlans(authorize.limits))
    replies = [gateway.handle("GET", "/v1/models", [("Authorization", "Bearer flood")], b"", "127.0.0.1") for _ in range(3)]
    _, headers, body = replies[-1]
    assert [r[0] for r in replies] == [200, 200, 429]
    assert dict(headers)["Retry-After"] == "1"
    parsed = json.loads(body)
    assert parsed["error"]["code"] == "rate_limit_exceeded" and parsed["detail"]["error_type"] == "rate_limit_error"
    assert gateway.handle("GET", "/v1/models", [("Authorization", "Bearer quiet")], b"", "127.0.0.1")[0] == 200
    assert invoked == ["flood", "flood", "quiet"]


def test_the_authorizer_names_the_tenants_usage_key_and_refused_callers_get_theirs(monkeypatch):
    class WithKey(_Authorizing):
        def limits(self, tenant_id):
            return replace(DEFAULT_LIMITS, usage_key="acme-usage-key-000000000000" if tenant_id == "acme" else None)

    monkeypatch.setenv("GATEWAY_DEFAULT_USAGE_KEY", "shared-default-key-0000000000")
    monkeypatch.setenv("GATEWAY_REFUSED_USAGE_KEY", "shared-refused-key-0000000000")
    authorize = authorizer.Authorizer(WithKey())

    def policy(header):
        return authorize({"methodArn": "arn:aws:execute-api:r:1:a/s/GET/v1/models",
                          "headers": {"Authorization": header} if header else {}}, None)

    assert policy("Bearer acme")["usageIdentifierKey"] == "acme-usage-key-000000000000"
    assert policy("Bearer globex")["usageIdentifierKey"] == "shared-default-key-0000000000"
    assert policy(None)["usageIdentifierKey"] == "shared-refused-key-0000000000"
    # A store hiccup is not the caller's fault: not the bucket anyone can empty with garbage.
    assert policy("Bearer store-down")["usageIdentifierKey"] == "shared-default-key-0000000000"


@pytest.mark.parametrize(("source", "host", "status"), [
    ("127.0.0.1", "127.0.0.1:3000", 200), ("127.0.0.1", "localhost:3000", 200), ("::1", "[::1]:3000", 200),
    ("10.0.0.5", "127.0.0.1:3000", 403),  # another machine
    ("127.0.0.1", "gateway.example.com", 403),  # a loopback proxy forwarding an outside request
])
def test_the_iam_header_is_honoured_only_from_this_machine(source, host, status):
    class Function:
        def invoke(self, event, timeout_s):
            return {"statusCode": 200, "headers": {}, "body": json.dumps(event["requestContext"]["identity"]["userArn"])}

    headers = [("Host", host), ("X-Local-Iam-Principal", "arn:aws:iam::000000000000:role/LocalDeveloper")]
    got, _, body = LocalApiGateway(Function()).handle("GET", "/v1/models", headers, b"", source)
    assert got == status
    if status == 403:
        assert "only from this machine" in json.loads(body)["detail"]["message"]


def test_the_iam_header_can_be_switched_off():
    headers = [("Host", "127.0.0.1"), ("X-Local-Iam-Principal", "arn:aws:iam::000000000000:role/LocalDeveloper")]
    assert LocalApiGateway(iam_emulation=False).handle("GET", "/v1/models", headers, b"", "127.0.0.1")[0] == 403


def test_the_runner_refuses_to_listen_beyond_loopback_with_the_iam_header_on(monkeypatch, capsys):
    monkeypatch.setenv("GATEWAY_MODELS", json.dumps({"models": [{"name": "m", "endpoints": [{"name": "e"}]}]}))
    assert local.main(["--host", "0.0.0.0", "--port", "0"]) == 2
    assert "X-Local-Iam-Principal" in capsys.readouterr().err


def test_a_tenant_gets_a_key_on_the_usage_plan_of_its_numbers(monkeypatch):
    import boto3
    from moto import mock_aws

    from gateway.auth.usage_plans import assign_usage_plan, plan_name

    for name, value in (("AWS_ACCESS_KEY_ID", "x"), ("AWS_SECRET_ACCESS_KEY", "x"), ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(name, value)
    with mock_aws():
        client = boto3.client("apigateway")
        api = client.create_rest_api(name="dg")["id"]
        tenant = Tenant("acme", "Acme", 0.0, limits=replace(DEFAULT_LIMITS, rate_per_s=5.0, burst=10))
        first = assign_usage_plan(tenant, api, "prod", client, now=1000.0)
        # Re-keying keeps the earlier key working while caches may still name it...
        second = assign_usage_plan(tenant, api, "prod", client, now=1010.0)
        other = assign_usage_plan(replace(tenant, tenant_id="globex"), api, "prod", client, now=1010.0)
        [plan] = client.get_usage_plans()["items"]
        assert plan["name"] == plan_name(5.0, 10) and plan["throttle"] == {"rateLimit": 5.0, "burstLimit": 10}
        values = {k["value"] for k in client.get_api_keys(includeValues=True)["items"]}
        assert values == {first, second, other}
        # ...and a later assignment, past RETIRE_AFTER_S, deletes what was replaced long enough ago.
        third = assign_usage_plan(tenant, api, "prod", client, now=1010.0 + 301)
        values = {k["value"] for k in client.get_api_keys(includeValues=True)["items"]}
        assert values == {second, third, other}
        assert len(client.get_usage_plan_keys(usagePlanId=plan["id"])["items"]) == 3


def test_a_changed_limit_takes_effect_within_the_tenant_caches_60_s(tmp_path):
    from gateway.auth.tenant_cache import TENANT_CACHE_S, TenantCache
    from gateway.auth.tenants import set_limits
    store = tenant_store(tmp_path / "g.db", "acme")
    clock = Clock()
    cache = TenantCache(store.tenants, clock=clock)
    assert cache.limits("acme").max_options == DEFAULT_LIMITS.max_options
    set_limits(store.tenants, "acme", max_options=16)
    clock.now += TENANT_CACHE_S - 1
    assert cache.limits("acme").max_options == DEFAULT_LIMITS.max_options  # still the remembered answer
    clock.now += 1
    assert TENANT_CACHE_S == 60.0 and cache.limits("acme").max_options == 16
