"""The admin CLI, against both stores."""

from __future__ import annotations

import json

import pytest

from devkit import admin


def run(capsys, *argv: str) -> list[dict]:
    assert admin.main(list(argv)) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


@pytest.fixture(params=["sqlite", "dynamodb"])
def where(request, tmp_path, monkeypatch):
    if request.param == "sqlite":
        yield ["--sqlite", str(tmp_path / "g.db")]
        return
    from moto import mock_aws

    for name, value in (("AWS_ACCESS_KEY_ID", "x"), ("AWS_SECRET_ACCESS_KEY", "x"), ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(name, value)
    with mock_aws():
        import boto3

        from gateway.stores.dynamodb import DynamoDBTables, create_tables

        create_tables(boto3.client("dynamodb"), DynamoDBTables("t", "k"))
        yield ["--dynamodb", "t", "k"]


def test_tenant_principal_key_and_token_lifecycle(where, tmp_path, capsys):
    keys_file = str(tmp_path / "keys.json")
    run(capsys, "new-signing-key", "--file", keys_file)
    run(capsys, *where, "create-tenant", "acme")
    [rule] = run(capsys, *where, "map-principal", "arn:aws:sts::123456789012:assumed-role/Apps/s1", "--tenant", "acme",
                 "--scopes", "decide,chat")
    assert rule["principal_arn"] == "arn:aws:iam::123456789012:role/Apps"
    [issued] = run(capsys, *where, "issue-key", "--tenant", "acme", "--scopes", "decide", "--ttl-days", "30")
    assert issued["api_key"].startswith("dgk_")
    [listed] = run(capsys, *where, "list-keys", "--tenant", "acme")
    assert listed["key_id"] == issued["key_id"] and "api_key" not in listed and listed["expires_at"]
    assert run(capsys, *where, "revoke-key", issued["key_id"]) == [{"key_id": issued["key_id"], "revoked": True}]
    [minted] = run(capsys, *where, "--signing-keys-file", keys_file, "mint-token", "--principal",
                   "arn:aws:iam::123456789012:role/Apps", "--scopes", "decide", "--ttl-s", "600")
    [revoked] = run(capsys, *where, "--signing-keys-file", keys_file, "revoke-token", minted["token"])
    assert revoked == {"token_id": minted["token_id"], "tenant_id": "acme", "revoked": True}
    run(capsys, "new-signing-key", "--file", keys_file)
    assert sum(1 for k in json.loads(open(keys_file).read()) if k.startswith("key:")) == 2


def test_mistakes_are_refused_with_a_message_and_status_2(where, capsys):
    assert admin.main([*where, "issue-key", "--tenant", "ghost", "--scopes", "decide"]) == 2
    assert admin.main([*where, "map-principal", "not-an-arn", "--tenant", "x", "--scopes", "decide"]) == 2
    assert "admin:" in capsys.readouterr().err


def test_an_operator_sets_sees_and_lifts_a_tenants_budgets(where, capsys):
    run(capsys, *where, "create-tenant", "acme")
    [limits] = run(capsys, *where, "set-limits", "acme", "--monthly-budget-usd", "25", "--endpoint-seconds-per-minute",
                   "90")
    assert limits["limits"] == {"monthly_budget_usd": 25.0, "endpoint_seconds_per_minute": 90.0}
    [report] = run(capsys, *where, "usage", "acme", "--from", "2026-12-01", "--to", "2026-12-31")
    assert report["total"] == {"requests": 0, "cost_usd": 0.0, "endpoint_seconds": 0.0, "stored_bytes": 0,
                               "input_tokens": 0, "cached_tokens": 0}
    assert report["budget"]["monthly_usd"] == 25.0
    [limits] = run(capsys, *where, "set-limits", "acme", "--monthly-budget-usd", "none")
    assert limits["limits"] == {"endpoint_seconds_per_minute": 90.0}
    assert admin.main([*where, "set-limits", "acme", "--monthly-budget-usd", "-1"]) == 2
    # Less endpoint time a minute than one attempt needs would fail every request: refused
    assert admin.main([*where, "set-limits", "acme", "--endpoint-seconds-per-minute", "1"]) == 2
    assert "between 5.0 and" in capsys.readouterr().err
    assert admin.main([*where, "usage", "ghost"]) == 2


def test_an_operator_weighs_a_tenants_share_of_the_scorers_within_bounds(where, capsys):
    # Given a tenant, when an operator gives it twice the others' turns on a scorer, then its
    # limits say so; a weight outside what the scorer honours (0.1 to 100) is refused
    run(capsys, *where, "create-tenant", "acme")
    [limits] = run(capsys, *where, "set-limits", "acme", "--share-weight", "2")
    assert limits["limits"] == {"share_weight": 2.0}
    assert admin.main([*where, "set-limits", "acme", "--share-weight", "0.01"]) == 2
    assert admin.main([*where, "set-limits", "acme", "--share-weight", "1000"]) == 2
    # And its work in flight: a figure of its own, or "none" for the model's (half its scorers' line)
    [limits] = run(capsys, *where, "set-limits", "acme", "--max-in-flight", "3")
    assert limits["limits"] == {"share_weight": 2.0, "max_in_flight": 3}
    [limits] = run(capsys, *where, "set-limits", "acme", "--max-in-flight", "none")
    assert limits["limits"] == {"share_weight": 2.0}
