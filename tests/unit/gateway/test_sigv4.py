"""The gateway's SigV4 signatures are botocore's, byte for byte, and its credentials are
the function's own (the environment in Lambda, botocore's chain anywhere else)."""

from __future__ import annotations

import datetime

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials as BotocoreCredentials

from gateway import aws, sigv4
from gateway.sigv4 import Credentials, MissingCredentials, current_credentials, sign

NOW = datetime.datetime(2026, 12, 5, 1, 2, 3, tzinfo=datetime.UTC)


def botocore_authorization(host, path, headers, body, region, credentials, monkeypatch):
    import botocore.auth

    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda: NOW.replace(tzinfo=None))  # the same instant
    request = AWSRequest(method="POST", url=f"https://{host}{path}", data=body, headers=headers)
    SigV4Auth(BotocoreCredentials(credentials.access_key, credentials.secret_key, credentials.token),
              "sagemaker", region).add_auth(request)
    return request.headers["Authorization"], request.headers["X-Amz-Date"]


@pytest.mark.parametrize(("host", "path", "headers", "body", "region", "token"), [
    ("runtime.sagemaker.us-east-1.amazonaws.com", "/endpoints/dg-cpu/invocations",
     {"Content-Type": "application/json", "Accept": "application/json",
      "X-Amzn-SageMaker-Custom-Attributes": "route=systemone;timeout_ms=24750;request_id=abc",
      "X-Amzn-SageMaker-Inference-Id": "abc"}, b'{"state": "x"}', "us-east-1", None),
    ("runtime.sagemaker.eu-west-3.amazonaws.com", "/endpoints/dg-gpu/invocations-response-stream",
     {"Content-Type": "application/json", "X-Amzn-SageMaker-Accept": "application/json",
      "X-Amzn-SageMaker-Custom-Attributes": "route=chat;timeout_ms=99750"}, "é ünïcode".encode() * 100, "eu-west-3",
     "FwoGZXIvYXdzEJr//////////wEaDOsession+token/with=padding"),
    ("127.0.0.1:8080", "/prefix/endpoints/a%20b/invocations", {"Content-Type": "application/json",
     "X-Amzn-SageMaker-Custom-Attributes": "  spaced   value  "}, b"", "cn-north-1", "t"),
])
def test_a_signature_is_botocores(host, path, headers, body, region, token, monkeypatch):
    credentials = Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", token)
    signed = sign("POST", host, path, headers, body, region=region, service="sagemaker", credentials=credentials,
                  now=NOW)
    authorization, date = botocore_authorization(host, path, headers, body, region, credentials, monkeypatch)
    assert signed["X-Amz-Date"] == date
    assert signed["Authorization"] == authorization
    assert signed.get("X-Amz-Security-Token") == token


def test_a_signature_changes_with_every_signed_part():
    credentials = Credentials("AK", "SK")
    base = dict(method="POST", host="h", path="/p", headers={"Content-Type": "a"}, body=b"x")
    first = sign(**base, region="us-east-1", service="sagemaker", credentials=credentials, now=NOW)["Authorization"]
    for change in ({"body": b"y"}, {"path": "/q"}, {"host": "g"}, {"headers": {"Content-Type": "b"}}):
        other = sign(**{**base, **change}, region="us-east-1", service="sagemaker", credentials=credentials, now=NOW)
        assert other["Authorization"] != first, change


def test_credentials_never_show_their_secret():
    shown = repr(Credentials("AKIDEXAMPLE", "very-secret-key", "session-token-value"))
    assert "very-secret-key" not in shown and "session-token-value" not in shown


@pytest.fixture
def fresh_chain(monkeypatch, tmp_path):
    """No credentials in the environment, a profile in a file of this test's own, no instance metadata."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                 "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                 "AWS_CONTAINER_AUTHORIZATION_TOKEN", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    aws.reset_session()
    sigv4.forget_credentials()
    yield tmp_path
    aws.reset_session()
    sigv4.forget_credentials()


def test_the_environments_credentials_are_read_on_every_call(fresh_chain, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AK1")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "SK1")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "T1")
    assert current_credentials() == Credentials("AK1", "SK1", "T1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AK2")  # replaced by the runtime: never the old ones
    monkeypatch.delenv("AWS_SESSION_TOKEN")
    assert current_credentials() == Credentials("AK2", "SK1", None)


def test_without_them_botocores_chain_finds_a_profile(fresh_chain, monkeypatch):
    (fresh_chain / "credentials").write_text("[dev]\naws_access_key_id = AKPROFILE\naws_secret_access_key = SKPROFILE\n")
    monkeypatch.setenv("AWS_PROFILE", "dev")
    assert current_credentials() == Credentials("AKPROFILE", "SKPROFILE", None)


def test_no_credentials_anywhere_is_said_plainly(fresh_chain):
    with pytest.raises(MissingCredentials):
        current_credentials()


def test_the_init_phase_loads_the_chain_but_fetches_nothing(fresh_chain, monkeypatch):
    # A SnapStart snapshot is taken after the init phase: credentials fetched then would be
    # every resumed instance's. Here the profile's keys appear only after preparing, and are found.
    (fresh_chain / "config").write_text("[profile dev]\nregion = eu-west-1\n")
    monkeypatch.setenv("AWS_PROFILE", "dev")
    sigv4.prepare_credentials()
    assert sigv4._RESOLVER is not None and sigv4._CHAIN is None
    (fresh_chain / "credentials").write_text("[dev]\naws_access_key_id = AKLATER\naws_secret_access_key = SKLATER\n")
    assert current_credentials() == Credentials("AKLATER", "SKLATER", None)


def test_with_the_environments_credentials_the_init_phase_loads_no_chain(fresh_chain, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AK1")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "SK1")
    sigv4.prepare_credentials()
    assert sigv4._RESOLVER is None


def test_a_chain_that_cannot_be_loaded_fails_the_first_call_not_the_init_phase(fresh_chain, monkeypatch):
    monkeypatch.setenv("AWS_PROFILE", "does-not-exist")
    sigv4.prepare_credentials()  # the function still initialises
    with pytest.raises(Exception, match="does-not-exist"):
        current_credentials()


def test_a_failing_credential_source_is_asked_again_after_a_pause_not_by_every_call(fresh_chain, monkeypatch):
    # The container's endpoint down: each call would otherwise wait out botocore's retries in turn.
    asked = []

    class Down:
        def load_credentials(self):
            asked.append(1)
            raise RuntimeError("the container's credential endpoint answered 500")

    monkeypatch.setattr(sigv4, "_RESOLVER", Down())
    for _ in range(3):
        with pytest.raises(MissingCredentials, match="500"):
            current_credentials()
    assert len(asked) == 1
    monkeypatch.setattr(sigv4, "_FAILED_FOR_S", 0.0)
    with pytest.raises(MissingCredentials):
        current_credentials()
    assert len(asked) == 2
