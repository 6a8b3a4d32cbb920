"""The asynchronous pool's adapter: the invocation it queues (checked against the service model
by botocore's Stubber), the input it writes and the outcome it reads back (S3 on moto)."""

from __future__ import annotations

import json

import boto3
import pytest
from botocore.stub import Stubber
from moto import mock_aws

from gateway import aws
from gateway.backends.async_pool import (
    INVOCATION_TIMEOUT_S,
    LINES_BUDGET_S,
    REQUEST_TTL_S,
    SENT_WITHIN_S,
    AsyncPool,
    Submission,
)
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
                 "route=systemone;timeout_ms=22000;work=bulk", 22.0)


def pool_with(s3, clock=lambda: 1000.0) -> tuple[AsyncPool, Stubber]:
    runtime = aws.session().create_client("sagemaker-runtime", region_name="us-east-1")
    return AsyncPool(runtime, s3, BUCKET, "dg-async", clock=clock), Stubber(runtime)


def test_a_turns_lines_go_as_one_input_and_one_invocation_whose_answers_place_its_sidecar_keeps(s3):
    pool, stub = pool_with(s3)
    out = f"s3://{BUCKET}/async/out/a.out"
    prepared = pool.prepare("acme", "batch_abc", [asked(0), asked(1)])
    assert prepared.id.startswith("batch_abc.") and len(prepared.id) <= 64  # InferenceId's most
    assert prepared.until == 1000.0 + REQUEST_TTL_S + INVOCATION_TIMEOUT_S and Submission.read(prepared.text()) == prepared
    # Its notice can be read before it is sent: which lines, whose
    location = f"s3://{BUCKET}/{prepared.key}"
    assert pool.sent_lines(location) == ("acme", "batch_abc", ["batch_req_abc_0", "batch_req_abc_1"])
    assert pool.outcome(prepared, {"batch_req_abc_0"}).state == "waiting"  # not sent yet
    stub.add_response("invoke_endpoint_async", {"InferenceId": prepared.id, "OutputLocation": out,
                                                "FailureLocation": f"s3://{BUCKET}/async/failed/a.out"},
                      {"EndpointName": "dg-async", "InputLocation": location,
                       "ContentType": "application/jsonlines", "Accept": "application/jsonlines",
                       "InferenceId": prepared.id, "RequestTTLSeconds": REQUEST_TTL_S,
                       "InvocationTimeoutSeconds": INVOCATION_TIMEOUT_S,
                       # the scorer stops the lines before SageMaker's hour ends, its answer still to write
                       "CustomAttributes": f"route=systemone;timeout_ms={int(LINES_BUDGET_S * 1000)}"})
    with stub:
        pool.send(prepared, "acme", "batch_abc", ["batch_req_abc_0", "batch_req_abc_1"])
    stub.assert_no_pending_responses()
    sent = [json.loads(line) for line in s3.get_object(Bucket=BUCKET, Key=prepared.key)["Body"].read().splitlines()]
    assert [line["id"] for line in sent] == [asked(0).line_id, asked(1).line_id]
    s3.put_object(Bucket=BUCKET, Key="async/out/a.out", Body=b"")
    assert pool.outcome(prepared, {"batch_req_abc_0"}).state == "answered"  # where the sidecar says


def test_a_prepared_invocation_never_sent_fails_once_it_should_have_been(s3):
    now = [1000.0]
    pool, _ = pool_with(s3, clock=lambda: now[0])
    prepared = pool.prepare("acme", "batch_abc", [asked(0)])
    assert pool.outcome(prepared, {"batch_req_abc_0"}).state == "waiting"
    now[0] += SENT_WITHIN_S + 1  # its worker died between preparing and sending
    failed = pool.outcome(prepared, {"batch_req_abc_0"})
    assert failed.state == "failed" and "never sent" in failed.reason


def sent(s3, pool, output: str = "async/out/1.out", failure: str = "async/failed/1.out") -> Submission:
    """A submission as `send` leaves it: its sidecar naming where its answer and failure go."""
    prepared = pool.prepare("acme", "batch_abc", [asked(n) for n in range(3)])
    s3.put_object(Bucket=BUCKET, Key=prepared.key.removesuffix(".jsonl") + ".json", Body=json.dumps(
        {"tenant": "acme", "batch": "batch_abc", "lines": [], "output": f"s3://{BUCKET}/{output}",
         "failure": f"s3://{BUCKET}/{failure}"}).encode())
    return prepared


def test_an_outcome_is_its_answers_its_failure_or_a_wait_until_neither_can_come(s3):
    now = [1000.0]
    pool, _ = pool_with(s3, clock=lambda: now[0])
    submission = sent(s3, pool)
    everyone = {"batch_req_abc_0", "batch_req_abc_1"}
    assert pool.outcome(submission, everyone).state == "waiting"
    now[0] = submission.until + 1
    lost = pool.outcome(submission, everyone)
    assert lost.state == "failed" and "in its time" in lost.reason
    s3.put_object(Bucket=BUCKET, Key="async/failed/1.out", Body=b"ClientError: the container ran out of memory")
    failed = pool.outcome(submission, everyone)
    assert failed.state == "failed" and "out of memory" in failed.reason
    first = asked(0)
    lines = [{"id": first.line_id, "line": 1, "status": 200, "body": {"answers": {}}, "x_busy_ms": 1250},
             {"id": "someone-else", "line": 2, "status": 200, "body": {}},  # not an id this gateway sent
             {"id": asked(1).line_id, "line": 3, "status": 413, "body": {"error": {"message": "too long"}}}]
    s3.put_object(Bucket=BUCKET, Key="async/out/1.out",
                  Body="\n".join(json.dumps(line) for line in lines).encode() + b"\nnot json\n")
    answered = pool.outcome(submission, everyone)
    assert answered.state == "answered" and set(answered.answers) == everyone
    assert set(pool.outcome(submission, {"batch_req_abc_1"}).answers) == {"batch_req_abc_1"}  # only those in hand
    got = answered.answers["batch_req_abc_0"]
    assert (got.digest, got.status, json.loads(got.body)) == (digest("systemone", first.body), 200, {"answers": {}})
    assert got.busy_s == 1.25 and answered.answers["batch_req_abc_1"].status == 413
    assert answered.answers["batch_req_abc_1"].busy_s is None  # not said: the body's own figure is read


def test_a_notice_naming_an_input_this_gateway_did_not_write_is_refused(s3):
    pool, _ = pool_with(s3)
    for location in ("s3://other-bucket/async/in/x.jsonl", f"s3://{BUCKET}/files/acme/file-1", "https://x/y",
                     f"s3://{BUCKET}/async/in/batch_x/none.jsonl"):  # ours in form, with no sidecar
        with pytest.raises(ValueError):
            pool.sent_lines(location)


def test_an_answer_not_there_yet_is_a_wait_though_s3_says_access_denied_without_a_listing_grant(s3):
    # No role may list the bucket: S3 then answers a missing key 403 AccessDenied, never NoSuchKey
    pool, _ = pool_with(s3)
    submission = sent(s3, pool)
    denying = aws.session().create_client("s3", region_name="us-east-1")
    sidecar = s3.get_object(Bucket=BUCKET, Key=submission.key.removesuffix(".jsonl") + ".json")["Body"].read()
    pool.s3 = denying
    with Stubber(denying) as stub:
        stub.add_response("get_object", {"Body": _body(sidecar)})
        for _ in range(2):  # the answer, then the failure
            stub.add_client_error("get_object", "AccessDenied", "Access Denied", 403)
        assert pool.outcome(submission, {"batch_req_abc_0"}).state == "waiting"
        stub.add_client_error("get_object", "SlowDown", "Please reduce your request rate", 503)
        with pytest.raises(denying.exceptions.ClientError):  # the store failing is not an absence
            pool.outcome(submission, {"batch_req_abc_0"})


def test_an_output_is_read_up_to_its_limit_and_the_lines_past_it_are_left_for_another_invocation(s3, monkeypatch):
    from gateway.backends import async_pool

    pool, _ = pool_with(s3)
    submission = sent(s3, pool, output="async/out/2.out")
    lines = [json.dumps({"id": asked(n).line_id, "line": n + 1, "status": 200, "body": {"n": n}}) for n in range(3)]
    s3.put_object(Bucket=BUCKET, Key="async/out/2.out", Body="\n".join(lines).encode() + b"\n")
    monkeypatch.setattr(async_pool, "MAX_OUTPUT_BYTES", len(lines[0]) + len(lines[1]) + 2)
    answered = pool.outcome(submission, {asked(n).request_id for n in range(3)})
    assert sorted(answered.answers) == ["batch_req_abc_0", "batch_req_abc_1"]


def _body(data: bytes):
    import io

    from botocore.response import StreamingBody

    return StreamingBody(io.BytesIO(data), len(data))
