"""The Batch API end to end: the official OpenAI SDK over HTTP against the local stack, its
batches run by the local worker process (`python -m devkit.batch_worker`, as `make up` starts it)
on the real model; and that worker killed mid-batch and started again."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
import time

import openai
import pytest

pytestmark = pytest.mark.model

QUESTIONS = {"refund": {"type": "noul", "instructions": "Is the customer asking for a refund?"},
             "queue": {"type": "choice", "instructions": "Which queue?",
                       "criteria": {"billing": "payments", "delivery": "shipping"}}}
BODIES = {
    "/v1/systemone": lambda i: {"model": "jev-latest", "state": f"Ticket {i}: I was charged twice, refund one.",
                                "questions": QUESTIONS},
    "/v1/decisions": lambda i: {"model": "decision-default",
                                "input": [{"role": "user", "content": f"Order {i} never arrived."}],
                                "questions": [{"type": "predicate", "name": "late", "instructions": "Delivery is late."}]},
    "/v1/chat/completions": lambda i: {"model": "chat-default", "max_tokens": 6, "temperature": 0,
                                       "messages": [{"role": "user", "content": f"Say the number {i}."}]},
}


def worker_process(stack, lease_s: float = 2.0) -> subprocess.Popen:
    env = {**os.environ, "GATEWAY_MODELS": json.dumps(stack.settings.model_dump(mode="json", include={"models", "region"})),
           "GATEWAY_SQLITE_PATH": str(stack.folder / "gateway.db"),
           "GATEWAY_SIGNING_KEYS_FILE": str(stack.folder / "signing-keys.json"),
           "GATEWAY_RECORD_KEYS_FILE": str(stack.folder / "record-keys.json"), "POWERTOOLS_METRICS_DISABLED": "true"}
    return subprocess.Popen([sys.executable, "-m", "devkit.batch_worker", "--poll-s", "0.1", "--lease-s", str(lease_s)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@pytest.fixture
def worker(local_stack):
    process = worker_process(local_stack)
    yield process
    process.terminate()
    process.wait(10)


@pytest.fixture
def client(local_stack):
    return openai.OpenAI(base_url=f"{local_stack.url}/v1", api_key=local_stack.api_key, max_retries=0, timeout=60)


def submit(client, endpoint: str, lines: list) -> str:
    data = "\n".join(json.dumps(line) for line in lines).encode()
    uploaded = client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
    assert uploaded.purpose == "batch" and uploaded.bytes == len(data)
    return client.batches.create(input_file_id=uploaded.id, endpoint=endpoint, completion_window="24h",
                                 metadata={"job": "e2e"}).id


def wait(client, batch_id: str, until=lambda b: b.status in ("completed", "failed", "expired", "cancelled"),
         timeout_s: float = 240.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        batch = client.batches.retrieve(batch_id)
        if until(batch):
            return batch
        time.sleep(0.1)
    raise AssertionError(f"batch {batch_id} is still {batch.status}: {batch.request_counts}")


def output(client, file_id: str | None) -> list[dict]:
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()] if file_id else []


def same_answer(batch_body: dict, sync_body: dict) -> None:
    """The same answer: the same structure and text, probabilities equal within what the scorer's
    kept state changes (the second read of a state is restored, not evaluated afresh)."""
    def volatile(key: str) -> bool:
        return key in ("id", "created", "x_decision_id", "x_endpoint_s", "x_cost_usd", "x_cached_tokens") or \
            key.startswith("cached")

    def walk(a, b):
        if isinstance(a, dict):
            assert {k for k in a if not volatile(k)} == {k for k in b if not volatile(k)}
            for k in a:
                if not volatile(k):
                    walk(a[k], b[k])
        elif isinstance(a, list):
            assert len(a) == len(b)
            for x, y in zip(a, b, strict=True):
                walk(x, y)
        elif isinstance(a, float):
            assert abs(a - b) <= 0.03
        elif not isinstance(a, int):  # token counts differ by what was restored
            assert a == b

    walk(batch_body, sync_body)


@pytest.mark.parametrize("endpoint", list(BODIES))
def test_a_batch_on_each_endpoint_answers_as_the_synchronous_route(local_stack, worker, client, endpoint):
    lines = [{"custom_id": f"line-{i}", "method": "POST", "url": endpoint, "body": BODIES[endpoint](i)} for i in range(3)]
    lines.append({"custom_id": "broken", "method": "POST", "url": endpoint, "body": {"model": lines[0]["body"]["model"]}})
    batch = wait(client, submit(client, endpoint, lines))
    assert batch.status == "completed" and batch.metadata == {"job": "e2e"}
    counts = batch.request_counts
    assert (counts.total, counts.completed, counts.failed) == (4, 3, 1)
    done = output(client, batch.output_file_id)
    assert [line["custom_id"] for line in done] == ["line-0", "line-1", "line-2"]
    for line, asked in zip(done, lines, strict=False):
        sync = client.post(endpoint.removeprefix("/v1"), body=asked["body"], cast_to=object)
        same_answer(line["response"]["body"], sync)
    [broken] = output(client, batch.error_file_id)
    assert broken["custom_id"] == "broken" and broken["response"]["status_code"] == 422
    if endpoint != "/v1/chat/completions":
        decision_id = done[0]["response"]["body"].get("x_decision_id") or done[0]["response"]["body"]["id"]
        attached = client.post(f"/decisions/{decision_id}/outcome", body={"answers": {"refund" if endpoint ==
                               "/v1/systemone" else "late": True}}, cast_to=object)
        assert attached["outcome"]["answers"]


def test_cancel_stops_a_running_batch_within_seconds_and_keeps_what_finished(local_stack, worker, client):
    endpoint = "/v1/systemone"
    batch_id = submit(client, endpoint, [{"custom_id": f"c{i}", "method": "POST", "url": endpoint,
                                          "body": BODIES[endpoint](i)} for i in range(40)])
    wait(client, batch_id, until=lambda b: b.request_counts and b.request_counts.completed >= 1)
    assert client.batches.cancel(batch_id).status == "cancelling"
    cancelled = wait(client, batch_id, timeout_s=10)
    counts = cancelled.request_counts
    assert cancelled.status == "cancelled" and counts.completed + counts.failed == counts.total == 40
    assert 1 <= counts.completed < 40 and len(output(client, cancelled.output_file_id)) == counts.completed
    assert {line["error"]["code"] for line in output(client, cancelled.error_file_id)} == {"batch_cancelled"}


def test_a_worker_killed_mid_batch_is_resumed_by_the_next_without_a_line_twice(local_stack, client):
    endpoint = "/v1/systemone"
    charged_before = requests_charged(client)
    first = worker_process(local_stack)
    try:
        batch_id = submit(client, endpoint, [{"custom_id": f"k{i}", "method": "POST", "url": endpoint,
                                              "body": BODIES[endpoint](100 + i)} for i in range(12)])
        wait(client, batch_id, until=lambda b: b.request_counts and b.request_counts.completed >= 3)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    assert client.batches.retrieve(batch_id).status == "in_progress"
    second = worker_process(local_stack)
    try:
        done = wait(client, batch_id)
    finally:
        second.terminate()
        second.wait(10)
    assert done.status == "completed" and done.request_counts.completed == 12
    prefix = "batch_req_" + batch_id.removeprefix("batch_")
    recorded = [r.record["request_id"] for r in local_stack.store.records.scan_records("acme")
                if r.record and r.record["request_id"].startswith(prefix)]
    assert sorted(recorded) == sorted(f"{prefix}_{n}" for n in range(12))  # each line recorded once
    ids = [line["response"]["body"]["x_decision_id"] for line in output(client, done.output_file_id)]
    assert len(set(ids)) == 12
    assert requests_charged(client) - charged_before == 12  # each line charged once


def requests_charged(client) -> int:
    """The requests the tenant's usage counts today (each settles its spend once)."""
    return client.get("/usage", cast_to=object)["total"]["requests"]


def test_the_batches_pages_example_runs_as_written(local_stack, worker):
    # The concept page's example, unchanged, with DG_URL and DG_API_KEY set as the README says
    from tests.e2e.test_readme import ROOT, environment, fenced_blocks

    [code] = fenced_blocks(ROOT / "docs" / "concepts" / "batches.md", "python")
    done = subprocess.run([sys.executable, "-c", code], env=environment(local_stack), cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    printed = done.stdout.splitlines()
    assert [line.split()[0] for line in printed] == ["ticket-0", "ticket-1", "ticket-2"]


@pytest.fixture
def aws_stack(scorer_url, tmp_path, monkeypatch):
    """The gateway as deployed in AWS, its batch store and queue on moto (in process), its
    SageMaker calls passed through to the real scorer: the local runner over HTTP in front."""
    import boto3
    from moto import mock_aws

    from devkit.gateway_stack import settings_for
    from gateway.auth.authenticate import Authenticator
    from gateway.auth.tenants import create_tenant, issue_api_key
    from gateway.auth.tokens import file_key_ring, new_key_document
    from gateway.functions.composition import build_services
    from gateway.functions.handler import GatewayFunction
    from gateway.stores.dynamodb import DynamoDBTables, create_tables, dynamodb_stores
    from tests.gateway_helpers import unthrottled

    for name, value in (("AWS_ACCESS_KEY_ID", "x"), ("AWS_SECRET_ACCESS_KEY", "x"), ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(name, value)  # moto takes any credential: placeholders
    with mock_aws(config={"core": {"passthrough": {"urls": [r"http://127\.0\.0\.1:\d+/.*"]}}}):  # the scorer
        tables = DynamoDBTables("dg-tenants", "dg-keys", "dg-catalogs", "dg-records", "dg-batches", "dg-batch-files")
        create_tables(boto3.client("dynamodb"), tables)
        boto3.client("s3").create_bucket(Bucket=tables.batch_bucket)
        sqs = boto3.client("sqs")
        url = sqs.create_queue(QueueName="dg-batches.fifo", Attributes={"FifoQueue": "true"})["QueueUrl"]
        store = dynamodb_stores(boto3.client("dynamodb"), tables, s3=boto3.client("s3"))
        create_tenant(store.tenants, "acme")
        unthrottled(store, "acme")
        key = issue_api_key(store.tenants, "acme", ["decide"])
        (tmp_path / "keys.json").write_text(new_key_document())
        (tmp_path / "records.json").write_text(new_key_document())
        authenticator = Authenticator(store, file_key_ring(tmp_path / "keys.json"))
        # The batch tables as the template names them, and an asynchronous pool its worker may use
        settings = settings_for(scorer_url, auth={"batch_queue_url": url, "batches_table": tables.batches,
                                                  "batch_bucket": tables.batch_bucket, "async_endpoint": "dg-async"})
        services = build_services(settings, stores=store, authenticator=authenticator,
                                  record_keys=file_key_ring(tmp_path / "records.json"))
        yield GatewayFunction(services), authenticator, key.secret, sqs, url, store


def run_turns(function, sqs, url: str, async_lines=None, notices: list | None = None) -> None:
    """The event source mapping: each message to a new invocation of the worker, deleted once
    processed; and, with an asynchronous pool, each of its notices to the notice function."""
    from gateway.functions.batch_queue import BatchQueue, take_turn, wake
    from gateway.functions.batch_worker import batch_store, build_worker

    queue = BatchQueue(sqs, url, batch_store(function))
    for turn in range(20):
        while notices:
            wake(batch_store(function), queue, async_lines.pool, notices.pop(0), time.time())
        received = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=1).get("Messages", [])
        if not received:
            if notices:  # published while the last turn ran
                continue
            return
        record = {"messageId": received[0]["MessageId"], "receiptHandle": received[0]["ReceiptHandle"],
                  "body": received[0]["Body"]}
        if take_turn(build_worker(function, f"lambda-{turn}", async_lines=async_lines), queue, record, remaining_s=300.0):
            sqs.delete_message(QueueUrl=url, ReceiptHandle=record["receiptHandle"])


def sdk_round_trip(function, authenticator, secret: str, run) -> list[dict]:
    """Three System One lines sent as a batch with the OpenAI SDK, run by `run`, each answered as
    the synchronous route answers the same request; the output's lines."""
    from devkit.local import InProcessFunction, LocalApiGateway, make_server
    from gateway.functions.authorizer import Authorizer

    server = make_server("127.0.0.1", 0, LocalApiGateway(InProcessFunction(function), authorizer=Authorizer(authenticator)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{server.server_address[1]}/v1", api_key=secret,
                               max_retries=0, timeout=60)
        endpoint = "/v1/systemone"
        lines = [{"custom_id": f"line-{i}", "method": "POST", "url": endpoint, "body": BODIES[endpoint](i)} for i in range(3)]
        batch_id = submit(client, endpoint, lines)
        run()
        batch = client.batches.retrieve(batch_id)
        assert batch.status == "completed" and batch.request_counts.completed == 3
        done = output(client, batch.output_file_id)
        assert [line["custom_id"] for line in done] == ["line-0", "line-1", "line-2"]
        for line, asked in zip(done, lines, strict=True):
            same_answer(line["response"]["body"], client.post("/systemone", body=asked["body"], cast_to=object))
        return done
    finally:
        server.shutdown()
        server.server_close()


def test_the_sdk_round_trip_on_the_aws_path_answers_as_the_synchronous_route(aws_stack):
    """The same round trip on DynamoDB, S3 and SQS (moto) as the local stack's, the real model answering."""
    function, authenticator, secret, sqs, url, _ = aws_stack
    sdk_round_trip(function, authenticator, secret, lambda: run_turns(function, sqs, url))


def scorer_answers(scorer_url: str):
    """An invocation's body as SageMaker hands it to the container: POSTed to its /invocations."""
    import urllib.request

    def answer(body: bytes) -> bytes:
        request = urllib.request.Request(f"{scorer_url}/invocations", data=body, method="POST",
                                         headers={"Content-Type": "application/jsonlines"})
        with urllib.request.urlopen(request, timeout=300) as answered:
            return answered.read()

    return answer


def test_the_sdk_round_trip_on_the_asynchronous_pool_answers_as_the_synchronous_route(aws_stack, scorer_url, tmp_path):
    """The same round trip with the worker's lines on an asynchronous pool: sent as one
    invocation, answered by the real scorer's lines route, read back through the routes when
    the notice wakes them; records and spend as a real-time line's."""
    from gateway.auth.tokens import file_key_ring
    from gateway.functions.composition import build_async_lines
    from gateway.functions.handler import GatewayFunction
    from tests.gateway_helpers import asynchronous_inference

    function, authenticator, secret, sqs, url, store = aws_stack
    worker_services, async_lines = build_async_lines(function.services.settings, stores=store, authenticator=authenticator,
                                                     record_keys=file_key_ring(tmp_path / "records.json"))
    notices = asynchronous_inference(async_lines.pool, scorer_answers(scorer_url))
    done = sdk_round_trip(function, authenticator, secret,
                          lambda: run_turns(GatewayFunction(worker_services), sqs, url, async_lines, notices))
    sent = store.batches.s3.list_objects_v2(Bucket=store.batches.bucket, Prefix="async/in/")["Contents"]
    assert len([item for item in sent if item["Key"].endswith(".jsonl")]) == 1  # the three lines as one invocation
    for line in done:  # charged the scorer's own time on the pool, not the instant its answer was read back
        assert line["response"]["body"]["usage"]["x_endpoint_s"] > 0.01
