"""Fallback across two real scorer processes, through the real handler and boto3."""

from __future__ import annotations

import os

import pytest

from devkit.gateway_stack import event, install
from devkit.models import SMOLLM2_DIR
from devkit.scorer_process import ScorerProcess
from tests.gateway_helpers import call

pytestmark = pytest.mark.model

DECISION = {"model": "jev-latest", "state": "Refund my double charge, please.",
            "questions": {"refund": {"type": "noul", "instructions": "Is this a refund request?"}}}


@pytest.fixture(autouse=True)
def placeholder_aws_credentials(monkeypatch):
    for name, value in (("AWS_ACCESS_KEY_ID", "local"), ("AWS_SECRET_ACCESS_KEY", "local"), ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(name, os.environ.get(name, value))


def test_a_503_from_the_first_scorer_is_served_by_the_second(tmp_path):
    """Given a first scorer that answers 503 (its model folder is empty, so it never becomes
    ready) and a healthy second one, the request is answered by the second, and says so."""
    empty = tmp_path / "no-model"
    empty.mkdir()
    with ScorerProcess({"SM_LLAMA_CPP_MODEL_DIR": str(empty)}) as broken, \
            ScorerProcess({"SM_LLAMA_CPP_MODEL_DIR": str(SMOLLM2_DIR)}) as healthy:
        broken.wait("failed")
        healthy.wait("ready")
        install(endpoints=("first", "second"), urls={"first": broken.url, "second": healthy.url})
        status, headers, body = call(event("POST", "/v1/systemone", DECISION))
        assert status == 200, body
        assert (headers["x-endpoint"], headers["x-attempts"]) == ("second", "2")
        assert 0 <= body["answers"]["refund"]["noul"] <= 1

        # When the healthy one is gone too, nothing can answer: a prompt 503 (not a 429:
        # neither endpoint is merely full) with Retry-After, not a hang.
        healthy.kill()
        status, headers, body = call(event("POST", "/v1/systemone", DECISION))
        assert status == 503 and body["detail"]["error_type"] == "overloaded"
        assert int(headers["retry-after"]) >= 1
        assert "x-endpoint" not in headers
