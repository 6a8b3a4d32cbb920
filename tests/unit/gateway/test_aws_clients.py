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


def test_every_service_the_code_makes_a_client_for_is_known_to_the_loader():
    """The session's loader checks names against aws.SERVICES instead of listing every
    service botocore ships: a client made for a service outside it would fail in AWS."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    made = set()
    for path in [*root.joinpath("gateway").rglob("*.py"), *root.joinpath("devkit").rglob("*.py")]:
        made |= set(re.findall(r"""(?:aws\.client|create_client)\(\s*["']([a-z0-9-]+)["']""", path.read_text()))
    assert made and made <= aws.SERVICES, made - aws.SERVICES
    assert "dynamodb" in made


@pytest.mark.parametrize("service", sorted(aws.SERVICES))
def test_each_known_service_loads(monkeypatch, service):
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    aws.reset_session()
    assert aws.session().create_client(service).meta.service_model.service_name


def test_a_service_outside_the_list_is_refused_by_name(monkeypatch):
    from botocore.exceptions import UnknownServiceError

    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    aws.reset_session()
    with pytest.raises(UnknownServiceError):
        aws.client("s3")
    assert aws.session().get_component("data_loader").list_available_services("service-2") == sorted(aws.SERVICES)
