"""gateway/aws.py: the one place the gateway's own AWS clients are made."""

from __future__ import annotations

import pytest

from gateway import aws


@pytest.mark.parametrize("service", ["dynamodb", "secretsmanager", "ssm", "apigateway"])
def test_an_endpoint_override_reaches_every_client_the_gateway_makes(monkeypatch, service):
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv(aws.ENDPOINT_URL_VARIABLE, "http://172.17.0.1:4566")
    assert aws.client(service).meta.endpoint_url == "http://172.17.0.1:4566"


@pytest.mark.parametrize("value", [None, "", "  "])
def test_without_an_override_the_clients_speak_to_aws(monkeypatch, value):
    """The template declares the variable empty: empty must mean AWS, not a malformed URL."""
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    if value is None:
        monkeypatch.delenv(aws.ENDPOINT_URL_VARIABLE, raising=False)
    else:
        monkeypatch.setenv(aws.ENDPOINT_URL_VARIABLE, value)
    assert aws.client("dynamodb").meta.endpoint_url == "https://dynamodb.eu-west-1.amazonaws.com"


def test_hot_path_clients_time_out_quickly(monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    config = aws.client("dynamodb", hot_path=True).meta.config
    assert (config.connect_timeout, config.read_timeout) == (1, 2)
    assert config.retries["total_max_attempts"] == 2


def test_the_stand_in_override_never_reaches_sagemakers_runtime(monkeypatch):
    """GATEWAY_AWS_ENDPOINT_URL is the stores' local stand-in (moto): SageMaker's endpoints
    have their own `endpoint_url`, or botocore's AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME."""
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    monkeypatch.setenv(aws.ENDPOINT_URL_VARIABLE, "http://172.17.0.1:4566")
    assert aws.client("sagemaker-runtime").meta.endpoint_url == "https://runtime.sagemaker.eu-west-1.amazonaws.com"


def test_every_client_the_code_makes_is_of_a_service_botocore_ships():
    import re
    from pathlib import Path

    import botocore.session

    root = Path(__file__).resolve().parents[3]
    made = set()
    for path in [*root.joinpath("gateway").rglob("*.py"), *root.joinpath("devkit").rglob("*.py")]:
        made |= set(re.findall(r"""(?:aws\.client|create_client)\(\s*["']([a-z0-9-]+)["']""", path.read_text()))
    assert {"dynamodb", "sagemaker-runtime"} <= made
    assert made <= set(botocore.session.get_session().get_available_services())
