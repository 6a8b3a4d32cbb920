"""The asynchronous pool's adapter: the invocation it queues (checked against the service model
by botocore's Stubber), the input it writes and the outcome it reads back (S3 on moto)."""

from __future__ import annotations

import json

import boto3
import pytest
from botocore.stub import ANY, Stubber
from moto import mock_aws

from gateway import aws
from gateway.backends.async_pool import INVOCATION_TIMEOUT_S, REQUEST_TTL_S, AsyncPool, Submission
from gateway.backends.deferred import Asked, digest

BUCKET = "dg-batch-files"


@pytest.fixture
def s3(monkeypatch):
    for name, value in (("AWS_ACCESS_KEY_ID", "x"), ("AWS_SECRET_ACCESS_KEY", "x"), ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with mock_aws():
        client = boto3.client("s3")
        client.create_bucket(Bucket=BUCKET)
        yield client


def asked(number: int) -> Asked:
    return Asked(f"batch_req_abc_{number}", "systemone", json.dumps({"state": f"s{number}"}).encode(),
                 "route=systemone;timeout_ms=22000;work=bulk")


def pool_with(s3, clock=lambda: 1000.0) -> tuple[AsyncPool, Stubber]:
    runtime = aws.session().create_client("sagemaker-runtime", region_name="us-east-1")
    return AsyncPool(runtime, s3, BUCKET, "dg-async", clock=clock), Stubber(runtime)


def test_a_turns_lines_go_as_one_input_and_one_invocation_that_says_where_its_answer_will_be(s3):
    pool, stub = pool_with(s3)
    out = f"s3://{BUCKET}/async/out/a.out"
    stub.add_response("invoke_endpoint_async", {"InferenceId": "x", "OutputLocation": out,
                                                "FailureLocation": f"s3://{BUCKET}/async/failed/a.out"},
                      {"EndpointName": "dg-async", "InputLocation": ANY,
                       "ContentType": "application/jsonlines", "Accept": "application/jsonlines",
                       "InferenceId": ANY, "RequestTTLSeconds": REQUEST_TTL_S,
                       "InvocationTimeoutSeconds": INVOCATION_TIMEOUT_S})
    with stub:
        submission = pool.submit("acme", "batch_abc", [asked(0), asked(1)])
    stub.assert_no_pending_responses()
    assert submission.output == out and submission.until == 1000.0 + REQUEST_TTL_S + INVOCATION_TIMEOUT_S
    assert submission.id.startswith("batch_abc.") and len(submission.id) <= 64
    assert Submission.read(submission.text()) == submission
    metadata, ids = pool.sent_lines(f"s3://{BUCKET}/async/in/batch_abc/{submission.id}.jsonl")
    assert metadata == {"tenant": "acme", "batch": "batch_abc"} and ids == ["batch_req_abc_0", "batch_req_abc_1"]


def test_an_outcome_is_its_answers_its_failure_or_a_wait_until_neither_can_come(s3):
    now = [1000.0]
    pool, _ = pool_with(s3, clock=lambda: now[0])
    submission = Submission("batch_abc.1", f"s3://{BUCKET}/async/out/1.out", f"s3://{BUCKET}/async/failed/1.out", 2000.0)
    assert pool.outcome(submission).state == "waiting"
    now[0] = 2001.0
    lost = pool.outcome(submission)
    assert lost.state == "failed" and "in its time" in lost.reason
    s3.put_object(Bucket=BUCKET, Key="async/failed/1.out", Body=b"ClientError: the container ran out of memory")
    failed = pool.outcome(submission)
    assert failed.state == "failed" and "out of memory" in failed.reason
    sent = asked(0)
    lines = [{"id": sent.line_id, "line": 1, "status": 200, "body": {"answers": {}}, "x_busy_ms": 1250},
             {"id": "someone-else", "line": 2, "status": 200, "body": {}},  # not an id this gateway sent
             {"id": asked(1).line_id, "line": 3, "status": 413, "body": {"error": {"message": "too long"}}}]
    s3.put_object(Bucket=BUCKET, Key="async/out/1.out",
                  Body="\n".join(json.dumps(line) for line in lines).encode() + b"\nnot json\n")
    answered = pool.outcome(submission)
    assert answered.state == "answered" and set(answered.answers) == {"batch_req_abc_0", "batch_req_abc_1"}
    first = answered.answers["batch_req_abc_0"]
    assert (first.digest, first.status, json.loads(first.body)) == (digest("systemone", sent.body), 200, {"answers": {}})
    assert first.busy_s == 1.25 and answered.answers["batch_req_abc_1"].status == 413
    assert answered.answers["batch_req_abc_1"].busy_s is None  # not said: the body's own figure is read


def test_a_notice_naming_an_input_this_gateway_did_not_write_is_refused(s3):
    pool, _ = pool_with(s3)
    for location in ("s3://other-bucket/async/in/x.jsonl", f"s3://{BUCKET}/files/acme/file-1", "https://x/y"):
        with pytest.raises(ValueError):
            pool.sent_lines(location)

