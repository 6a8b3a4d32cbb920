"""Gateway settings: one JSON document, validated once, refused whole when wrong."""

from __future__ import annotations

import json

import pytest

from gateway.functions.composition import pool_policy
from gateway.settings import GatewaySettings, SettingsError

MODELS = {"models": [{"name": "decision-default", "aliases": ["jev-latest"], "endpoints": [{"name": "dg-gpu"}, {"name": "dg-cpu"}]}]}


def test_models_from_the_environment_or_a_file(tmp_path):
    direct = GatewaySettings.from_env({"GATEWAY_MODELS": json.dumps(MODELS), "AWS_REGION": "eu-west-1"})
    assert direct.region == "eu-west-1" and [e.name for e in direct.models[0].endpoints] == ["dg-gpu", "dg-cpu"]
    path = tmp_path / "models.json"
    path.write_text(json.dumps(MODELS))
    from_file = GatewaySettings.from_env({"GATEWAY_MODELS_FILE": str(path), "GATEWAY_SQLITE_PATH": "/tmp/x.db"})
    assert from_file.models == direct.models and from_file.auth.sqlite_path == "/tmp/x.db"


@pytest.mark.parametrize(("value", "served"), [(None, False), ("false", False), ("true", True), ("1", True)])
def test_the_api_reference_is_served_only_when_asked_for(value, served):
    env = {"GATEWAY_MODELS": json.dumps(MODELS), **({"GATEWAY_OPENAPI": value} if value is not None else {})}
    assert GatewaySettings.from_env(env).openapi is served


def test_a_reference_setting_that_is_not_a_yes_or_no_is_refused():
    with pytest.raises(SettingsError, match="openapi"):
        GatewaySettings.from_env({"GATEWAY_MODELS": json.dumps(MODELS), "GATEWAY_OPENAPI": "sometimes"})


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({}, "set GATEWAY_MODELS"),
        ({"GATEWAY_MODELS": "{nope"}, "not valid JSON"),
        ({"GATEWAY_MODELS": "[]"}, "JSON object"),
        ({"GATEWAY_MODELS_FILE": "/nonexistent/models.json"}, "cannot be read"),
        ({"GATEWAY_MODELS": json.dumps({"models": []})}, "models"),
        ({"GATEWAY_MODELS": json.dumps({"models": [{"name": "a", "endpoints": []}]})}, "endpoints"),
        ({"GATEWAY_MODELS": json.dumps({"models": [{"name": "a", "endpoints": [{"name": "x", "read_timeout_s": 30}]}]})}, "read_timeout_s"),
        ({"GATEWAY_MODELS": json.dumps({"models": [{"name": "a", "endpoints": [{"name": "bad name!"}]}]})}, "name"),
        ({"GATEWAY_MODELS": json.dumps({"models": [*MODELS["models"], {"name": "jev-latest", "endpoints": [{"name": "x"}]}]})}, "declared twice"),
        ({"GATEWAY_MODELS": json.dumps({"models": MODELS["models"], "surprise": 1})}, "surprise"),
    ],
)
def test_a_bad_configuration_is_refused_with_a_reason(env, message):
    with pytest.raises(SettingsError, match=message):
        GatewaySettings.from_env(env)


def test_models_from_an_ssm_parameter_read_through_boto3(monkeypatch):
    """In AWS the configuration lives in SSM (moto here): read once, with decryption."""
    from moto import mock_aws

    for name, value in (("AWS_ACCESS_KEY_ID", "x"), ("AWS_SECRET_ACCESS_KEY", "x"), ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(name, value)
    with mock_aws():
        import boto3

        boto3.client("ssm").put_parameter(Name="/dg/models", Value=json.dumps(MODELS), Type="SecureString")
        settings = GatewaySettings.from_env({"GATEWAY_MODELS_SSM_PARAMETER": "/dg/models"})
        assert settings.models[0].aliases == ("jev-latest",)
        with pytest.raises(SettingsError, match="ParameterNotFound"):
            GatewaySettings.from_env({"GATEWAY_MODELS_SSM_PARAMETER": "/dg/missing"})


def test_routing_policy_defaults_overrides_and_limits():
    settings = GatewaySettings.from_env({"GATEWAY_MODELS": json.dumps({
        "models": [{**MODELS["models"][0], "routing": {"extra_attempts": 0}}],
        "routing": {"deadline_s": 12, "cooldown_s": 30},
    })})
    assert pool_policy(settings.routing).deadline_s == 12 and pool_policy(settings.models[0].routing).extra_attempts == 0
    with pytest.raises(SettingsError, match="deadline_s"):
        GatewaySettings.from_env({"GATEWAY_MODELS": json.dumps({**MODELS, "routing": {"deadline_s": 29}})})


def serverless_model(*endpoints: dict) -> dict:
    return {"GATEWAY_MODELS": json.dumps({"models": [{"name": "decision-quiet", "endpoints": list(endpoints)}]})}


def test_a_cold_serverless_endpoint_is_a_pool_to_route_to_never_a_fallback():
    # Serverless first (a quiet tenant's pool, an instance behind it): accepted, 4 MB a body.
    from gateway.functions.composition import build_registry

    first = GatewaySettings.from_env(serverless_model({"name": "quiet", "serverless": True}, {"name": "cpu"}))
    (quiet, cpu) = build_registry(first).endpoints()
    assert (quiet.max_body_bytes, cpu.max_body_bytes) == (4_000_000, None)
    # Behind an instance it would be waited on cold: refused, unless provisioned.
    with pytest.raises(SettingsError, match="'quiet' is Serverless without provisioned concurrency"):
        GatewaySettings.from_env(serverless_model({"name": "cpu"}, {"name": "quiet", "serverless": True}))
    GatewaySettings.from_env(serverless_model({"name": "cpu"}, {"name": "quiet", "serverless": True, "provisioned": True}))
    # Beside an instance in the first tier, the pool's weighted order would make it second half the time.
    with pytest.raises(SettingsError, match="first tier alone"):
        GatewaySettings.from_env(serverless_model({"name": "cpu", "tier": 0}, {"name": "quiet", "serverless": True,
                                                                               "tier": 0}))


def test_an_endpoint_is_priced_by_its_instance_hour_or_its_serverless_memory():
    from gateway.functions.composition import build_registry

    settings = GatewaySettings.from_env(serverless_model(
        {"name": "quiet", "serverless": True, "memory_gb": 6}, {"name": "cpu", "usd_per_hour": 3.6}, {"name": "free"}))
    quiet, cpu, free = build_registry(settings).endpoints()
    assert quiet.usd_per_second == pytest.approx(6 * 0.00002)
    assert (cpu.usd_per_second, free.usd_per_second) == (pytest.approx(0.001), 0.0)


@pytest.mark.parametrize(("variables", "refusal"), [
    ({"GATEWAY_BATCHES_TABLE": "b"}, "GATEWAY_BATCH_BUCKET"),
    ({"GATEWAY_BATCHES_TABLE": "b", "GATEWAY_BATCH_BUCKET": "f"}, "GATEWAY_BATCH_QUEUE_URL"),  # accepted, never run
])
def test_batches_in_dynamodb_need_their_bucket_and_their_workers_queue(variables, refusal):
    from gateway.settings import AuthSettings

    tables = {"GATEWAY_TENANTS_TABLE": "t", "GATEWAY_KEYS_TABLE": "k"}
    with pytest.raises(SettingsError, match=refusal):
        AuthSettings.from_env({**tables, **variables})
    whole = AuthSettings.from_env({**tables, "GATEWAY_BATCHES_TABLE": "b", "GATEWAY_BATCH_BUCKET": "f",
                                   "GATEWAY_BATCH_QUEUE_URL": "https://sqs/q.fifo"})
    assert (whole.batches_table, whole.batch_bucket, whole.batch_queue_url) == ("b", "f", "https://sqs/q.fifo")
