"""Signing key rotation: the four Secrets Manager steps, and tokens minted before a
rotation still verifying after it.

Secrets Manager is emulated in memory here because the rotation protocol starts with a
pending version that has stages but no value yet, which moto cannot represent."""

from __future__ import annotations

import json

import pytest

from gateway.auth.tokens import CachedKeyRing, mint, verify
from gateway.functions import rotation

# The document Secrets Manager generates at deploy time (the template's GenerateSecretString).
INITIAL = {"current": "k1", "key:k1": "x" * 64}


class SecretsManager:
    class exceptions:
        class ResourceNotFoundException(Exception):
            pass

    def __init__(self) -> None:
        self.values = {"v1": json.dumps(INITIAL)}
        self.stages = {"v1": ["AWSCURRENT"]}

    def start_rotation(self, token: str) -> None:
        self.stages[token] = ["AWSPENDING"]  # what RotateSecret does before calling the function

    def describe_secret(self, SecretId):
        return {"VersionIdsToStages": {k: list(v) for k, v in self.stages.items()}}

    def get_secret_value(self, SecretId, VersionId=None, VersionStage="AWSCURRENT"):
        version = VersionId or next(v for v, s in self.stages.items() if VersionStage in s)
        if version not in self.values or VersionStage not in self.stages.get(version, []):
            raise self.exceptions.ResourceNotFoundException
        return {"SecretString": self.values[version]}

    def put_secret_value(self, SecretId, ClientRequestToken, SecretString, VersionStages):
        self.values[ClientRequestToken] = SecretString
        self.stages[ClientRequestToken] = list(VersionStages)

    def update_secret_version_stage(self, SecretId, VersionStage, MoveToVersionId, RemoveFromVersionId):
        self.stages[RemoveFromVersionId].remove(VersionStage)
        self.stages[MoveToVersionId].append(VersionStage)

    def current(self) -> str:
        return self.get_secret_value("s")["SecretString"]


def rotate(client: SecretsManager, token: str) -> None:
    client.start_rotation(token)
    for step in ("createSecret", "setSecret", "testSecret", "finishSecret"):
        rotation.lambda_handler({"SecretId": "s", "ClientRequestToken": token, "Step": step}, None, client=client)


def test_rotation_adds_a_current_key_and_tokens_signed_before_still_verify():
    client = SecretsManager()
    ring = CachedKeyRing(client.current)
    old_token, _ = mint(ring, "acme", ("decide",), None, 3600, now=1_000_000.0)
    rotate(client, "v2")
    document = json.loads(client.current())
    assert document["current"] != "k1" and document["key:k1"] == INITIAL["key:k1"]
    fresh = CachedKeyRing(client.current)
    assert verify(fresh, old_token, now=1_000_010.0).tenant_id == "acme"
    new_token, claims = mint(fresh, "acme", ("decide",), None, 3600, now=1_000_000.0)
    assert claims.key_id == document["current"] and verify(fresh, new_token, now=1_000_010.0).tenant_id == "acme"
    assert "AWSCURRENT" in client.stages["v2"] and client.stages["v1"] == []  # Secrets Manager drops AWSPENDING itself


def test_a_retried_step_and_a_finished_rotation_are_harmless():
    client = SecretsManager()
    client.start_rotation("v2")
    event = {"SecretId": "s", "ClientRequestToken": "v2", "Step": "createSecret"}
    rotation.lambda_handler(event, None, client=client)
    staged = client.values["v2"]
    rotation.lambda_handler(event, None, client=client)
    assert client.values["v2"] == staged
    for step in ("setSecret", "testSecret", "finishSecret", "finishSecret"):
        rotation.lambda_handler({**event, "Step": step}, None, client=client)


def test_a_version_that_is_not_pending_is_refused():
    client = SecretsManager()
    with pytest.raises(ValueError):
        rotation.lambda_handler({"SecretId": "s", "ClientRequestToken": "nope", "Step": "createSecret"}, None, client=client)
    client.stages["v3"] = []
    with pytest.raises(ValueError):
        rotation.lambda_handler({"SecretId": "s", "ClientRequestToken": "v3", "Step": "createSecret"}, None, client=client)
