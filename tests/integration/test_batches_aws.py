"""The Batch API on its AWS path, through the real handler: items in DynamoDB, bytes in S3, turns
in an SQS FIFO queue that the worker function takes one message at a time (moto, in process),
as `gateway.functions.batch_queue` runs it in AWS. The backend answers uniformly."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator

import pytest

from devkit.fake_backend import UniformBackend
from devkit.gateway_stack import PRINCIPAL, _installed_function, event, install, settings_for
from gateway.backends.base import Endpoint
from gateway.functions import batch_queue
from gateway.functions.batch_worker import batch_store, build_worker
from tests.gateway_helpers import call, dynamodb_tenant_store, multipart, register_credentials, served, unthrottled
from tests.integration.test_batches import OTHER, batch, create, jsonl, lines_of, systemone_line, upload


@pytest.fixture
def aws(monkeypatch):
    import boto3

    with dynamodb_tenant_store(monkeypatch, "acme", "globex") as store:
        unthrottled(store, "acme", "globex")
        register_credentials(store, PRINCIPAL, OTHER)
        sqs = boto3.client("sqs")
        url = sqs.create_queue(QueueName="dg-batches.fifo", Attributes={"FifoQueue": "true",
                                                                         "VisibilityTimeout": "360"})["QueueUrl"]
        install(UniformBackend(), stores=store, settings=settings_for(auth={"batch_queue_url": url}))
        yield store, sqs, url


def messages(sqs, url: str, most: int = 10) -> list[dict]:
    reply = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=most, AttributeNames=["MessageGroupId"])
    return [{"messageId": m["MessageId"], "receiptHandle": m["ReceiptHandle"], "body": m["Body"],
             "attributes": m["Attributes"]} for m in reply.get("Messages", [])]


def queue_of(sqs, url: str):
    return batch_queue.BatchQueue(sqs, url, batch_store(_installed_function()))


def turn(sqs, url: str, record: dict, max_lines: int | None = None, owner: str = "lambda-1") -> bool:
    """One invocation of the worker function, as its own Lambda request (its own lease owner)."""
    worker = build_worker(_installed_function(), owner)
    return batch_queue.take_turn(worker, queue_of(sqs, url), record, remaining_s=300.0, max_lines=max_lines)


def run_queue(sqs, url: str, turns: int = 50, max_lines: int | None = None) -> list[str]:
    """What the event source mapping does: each message to a new invocation of the worker
    function, deleted when it was processed. The batch ids of the turns, in order."""
    order = []
    for number in range(turns):
        received = messages(sqs, url, 1)
        if not received:
            return order
        [record] = received
        order.append(json.loads(record["body"])["batch_id"])
        if turn(sqs, url, record, max_lines, owner=f"lambda-{number}"):
            sqs.delete_message(QueueUrl=url, ReceiptHandle=record["receiptHandle"])
    raise AssertionError("the queue did not empty")


def test_a_batch_is_announced_in_its_tenants_group_and_runs_to_its_output_from_s3(aws):
    store, sqs, url = aws
    lines = [systemone_line(i) for i in range(3)] + [systemone_line(3, state=7)]
    status, created = create(upload(jsonl(lines))["id"])
    assert status == 200
    [announced] = messages(sqs, url)
    assert json.loads(announced["body"]) == {"batch_id": created["id"], "tenant_id": "acme", "turn": 1}
    assert "acme" not in announced["attributes"]["MessageGroupId"]
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=announced["receiptHandle"], VisibilityTimeout=0)
    order = run_queue(sqs, url)
    done = batch(created["id"])
    assert done["status"] == "completed" and done["request_counts"] == {"total": 4, "completed": 3, "failed": 1}
    assert [line["custom_id"] for line in lines_of(done["output_file_id"])] == ["ticket-0", "ticket-1", "ticket-2"]
    assert lines_of(done["error_file_id"])[0]["response"]["status_code"] == 422
    assert list(store.batches.unfinished_lines(created["id"])) == []  # its ledger dropped: its files hold it
    # Each turn a new invocation: each let its lease go, so none spun waiting for the last one's
    assert len(order) == 2  # validation, then every line and the output


def test_a_tenants_batches_take_turns_one_at_a_time_beside_another_tenants(aws):
    _, sqs, url = aws
    acme = [create(upload(jsonl([systemone_line(i) for i in range(3)]))["id"])[1]["id"] for _ in range(2)]
    globex = create(upload(jsonl([systemone_line(i) for i in range(3)]), principal=OTHER)["id"], principal=OTHER)[1]["id"]
    # SQS hands out one turn of each tenant's at a time: acme's second waits for its first
    in_flight = messages(sqs, url, 1) + messages(sqs, url, 1) + messages(sqs, url, 1)
    assert sorted(json.loads(m["body"])["batch_id"] for m in in_flight) == sorted([acme[0], globex])
    for message in in_flight:
        sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=message["receiptHandle"], VisibilityTimeout=0)
    order = run_queue(sqs, url, max_lines=1)
    assert {batch(b)["status"] for b in acme} == {"completed"} and batch(globex, OTHER)["status"] == "completed"
    assert order.count(globex) == 4  # validation, then a line a turn, the last one ending it
    acme_order = [b for b in order if b in acme]
    assert acme_order[:4] == [acme[0], acme[1], acme[0], acme[1]]  # its two batches in turn, not one then the other


def waiting_line(store, batch_id: str) -> None:
    """Validated, and its first line refused for a while (a Retry-After of 30 s)."""
    worker = build_worker(_installed_function(), "lambda-0")
    worker.run(batch_id, "acme", worker.clock() + 5, max_lines=0)
    now = worker.clock()
    [line] = store.batches.runnable_lines(batch_id, now, 1)
    line.not_before = now + 30
    store.batches.put_line(line)
    assert store.batches.lease(batch_id, "lambda-0", now, now)  # its turn over, as take_turn ends one


def test_a_lone_batch_whose_lines_wait_has_its_message_come_back_when_they_may_run(aws, monkeypatch):
    store, sqs, url = aws
    created = create(upload(jsonl([systemone_line(0)]))["id"])[1]
    [record] = messages(sqs, url)
    waiting_line(store, created["id"])
    back_in = []
    monkeypatch.setattr(batch_queue.BatchQueue, "come_back_in", lambda self, receipt, seconds: back_in.append(seconds))
    assert not turn(sqs, url, record)  # not processed: SQS gives it back when its line may run
    assert 28 < back_in[0] <= 30 and store.batches.turn_of(created["id"]) == 1  # the same turn, not a new one


def test_a_batch_whose_end_lost_a_race_with_a_cancel_gets_its_next_turn(aws, monkeypatch):
    _, sqs, url = aws
    create(upload(jsonl([systemone_line(0)]))["id"])
    [record] = messages(sqs, url)
    monkeypatch.setattr(batch_queue.BatchWorker, "run", lambda *args: False)  # "ended", its end refused meanwhile
    assert turn(sqs, url, record)
    sqs.delete_message(QueueUrl=url, ReceiptHandle=record["receiptHandle"])
    assert [json.loads(m["body"])["turn"] for m in messages(sqs, url)] == [2]


def test_a_waiting_batch_never_holds_its_tenants_others_up(aws):
    store, sqs, url = aws
    first = create(upload(jsonl([systemone_line(0)]))["id"])[1]
    second = create(upload(jsonl([systemone_line(1)]))["id"])[1]
    [record] = messages(sqs, url, 1)
    waiting_line(store, first["id"])
    assert turn(sqs, url, record)  # processed: its next turn goes behind the tenant's other batch
    sqs.delete_message(QueueUrl=url, ReceiptHandle=record["receiptHandle"])
    assert [json.loads(m["body"])["batch_id"] for m in messages(sqs, url, 1)] == [second["id"]]


def test_the_sweep_announces_a_batch_nothing_touched_and_its_old_turn_is_then_a_stale_copy(aws):
    store, sqs, url = aws
    created = create(upload(jsonl([systemone_line(0)]))["id"])[1]
    [lost] = messages(sqs, url)  # the announcement, taken and never deleted (its function died)
    clock = [created["created_at"] + 60]
    queue = batch_queue.BatchQueue(sqs, url, store.batches, clock=lambda: clock[0])

    def sweep_at(at: float) -> dict:
        clock[0] = at
        return batch_queue.sweep(store.batches, queue, at)

    assert sweep_at(created["created_at"] + 60)["announced"] == 0  # not quiet long enough
    summary = sweep_at(created["created_at"] + batch_queue.STALLED_S + 1)
    assert summary["announced"] == 1 and summary["past_window"] == 0
    assert sweep_at(created["created_at"] + batch_queue.STALLED_S + 2)["announced"] == 0  # announced just now
    assert turn(sqs, url, lost) and batch(created["id"])["status"] == "validating"  # the old turn: dropped, no work
    assert sweep_at(created["expires_at"] + batch_queue.PAST_WINDOW_S + 1)["past_window"] == 1


def test_the_worker_function_reports_the_turns_to_come_back_and_drops_what_names_no_batch(aws, monkeypatch):
    from gateway.functions import handler

    _, sqs, url = aws
    monkeypatch.setattr(handler, "_function", _installed_function())
    for name, value in (("GATEWAY_BATCH_QUEUE_URL", url), ("GATEWAY_TENANTS_TABLE", "dg-tenants"),
                        ("GATEWAY_KEYS_TABLE", "dg-keys"), ("GATEWAY_BATCHES_TABLE", "dg-batches"),
                        ("GATEWAY_BATCH_BUCKET", "dg-batch-files")):
        monkeypatch.setenv(name, value)  # the template's variables, naming the tables and queue moto holds
    created = create(upload(jsonl([systemone_line(0)]))["id"])[1]
    [announced] = messages(sqs, url)
    garbage = {"messageId": "m-garbage", "receiptHandle": "r", "body": "{not json"}

    class Context:
        aws_request_id = "req-1"

        @staticmethod
        def get_remaining_time_in_millis() -> int:
            return 300_000

    assert batch_queue.worker_handler({"Records": [garbage, announced]}, Context()) == {"batchItemFailures": []}
    # Validated in that turn, its next announced (behind the message in hand, which the event
    # source mapping deletes as processed); the garbage dropped, nothing came of it
    sqs.delete_message(QueueUrl=url, ReceiptHandle=announced["receiptHandle"])
    [next_turn] = messages(sqs, url)
    assert json.loads(next_turn["body"]) == {"batch_id": created["id"], "tenant_id": "acme", "turn": 2}
    assert batch(created["id"])["status"] == "in_progress"
    for name in ("GATEWAY_TENANTS_TABLE", "GATEWAY_KEYS_TABLE"):  # the sweep needs its own variables only
        monkeypatch.delenv(name)
    assert template_variables("BatchSweepFunction") == {"GATEWAY_BATCH_QUEUE_URL", "GATEWAY_BATCHES_TABLE",
                                                         "GATEWAY_BATCH_BUCKET"}
    assert batch_queue.sweep_handler({}, None)["announced"] == 0


def test_the_openai_sdk_round_trip_over_http_on_the_aws_path(aws):
    """What a caller does, with the official SDK against the local runner: upload, create, wait
    while the queue's turns run, read the output; every byte and item through S3, DynamoDB, SQS."""
    import io

    import openai

    _, sqs, url = aws
    with served(PRINCIPAL) as base:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="dgk_x", max_retries=0)
        data = jsonl([systemone_line(i) for i in range(3)])
        uploaded = client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
        assert uploaded.bytes == len(data) and client.files.content(uploaded.id).read() == data
        created = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/systemone", completion_window="24h")
        run_queue(sqs, url)
        done = client.batches.retrieve(created.id)
        assert done.status == "completed" and done.request_counts.completed == 3
        lines = [json.loads(line) for line in client.files.content(done.output_file_id).text.splitlines()]
        assert [line["custom_id"] for line in lines] == ["ticket-0", "ticket-1", "ticket-2"]
        assert [b.id for b in client.batches.list()] == [created.id]
        assert client.files.delete(uploaded.id).deleted and client.files.retrieve(done.output_file_id).bytes > 0


# -- what each function calls, against what the template grants it ------------------------------

# The IAM action each call needs: a transaction's items need their own actions (Put, Update),
# a multipart upload's calls s3:PutObject, DeleteObjects s3:DeleteObject for each key.
IAM_ACTIONS = {("dynamodb", "TransactWriteItems"): ("dynamodb:PutItem", "dynamodb:UpdateItem"),
               ("s3", "CreateMultipartUpload"): ("s3:PutObject",), ("s3", "UploadPart"): ("s3:PutObject",),
               ("s3", "CompleteMultipartUpload"): ("s3:PutObject",), ("s3", "DeleteObjects"): ("s3:DeleteObject",)}


@contextlib.contextmanager
def calls_made(*clients) -> Iterator[set[str]]:
    """The IAM actions of every call the clients make meanwhile."""
    made: set[str] = set()

    def record(model, **kwargs):
        service = model.service_model.signing_name  # IAM's prefix: dynamodb, s3, sqs
        made.update(IAM_ACTIONS.get((service, model.name), (f"{service}:{model.name}",)))

    for client in clients:  # first: a stand-in's own before-call handler answers the call and ends the event
        client.meta.events.register_first("before-call", record)
    try:
        yield made
    finally:
        for client in clients:
            client.meta.events.unregister("before-call", record)


def granted(function: str) -> set[str]:
    import yaml

    from tests.infra.test_template import TEMPLATE, CfnLoader, as_list, statements

    policies = yaml.load(TEMPLATE.read_text(), Loader=CfnLoader)["Resources"][function]["Properties"]["Policies"]
    return {a for s in statements(policies) for a in as_list(s["Action"])}


def template_variables(function: str) -> set[str]:
    import yaml

    from tests.infra.test_template import TEMPLATE, CfnLoader

    return set(yaml.load(TEMPLATE.read_text(), Loader=CfnLoader)["Resources"][function]["Properties"]["Environment"]
               ["Variables"])


def batch_clients(store, sqs) -> tuple:
    """The batch store's clients, the test's SQS client and the API's own (its BatchQueue's)."""
    api_queue = _installed_function().services.batches.announce.__self__
    return store.batches.table.client, store.batches.s3, sqs, api_queue.sqs


def test_each_function_is_granted_every_call_it_makes_on_the_batch_table_bucket_and_queue(aws):
    store, sqs, url = aws
    with calls_made(*batch_clients(store, sqs)) as api:  # the API: files, uploads, batches
        data = jsonl([systemone_line(i) for i in range(2)])
        file_id = upload(data)["id"]
        lines_of(file_id)
        created = create(file_id)[1]
        batch(created["id"])
        started = call(event("POST", "/v1/uploads", {"purpose": "batch", "filename": "x.jsonl", "bytes": len(data),
                                                     "mime_type": "text/jsonl"}))[2]
        body, content_type = multipart({}, {"data": ("blob", data)})
        part = call(event("POST", f"/v1/uploads/{started['id']}/parts", raw=body, headers={"Content-Type": content_type}))[2]
        completed = call(event("POST", f"/v1/uploads/{started['id']}/complete", {"part_ids": [part["id"]]}))[2]
        assert call(event("DELETE", f"/v1/files/{completed['file']['id']}"))[0] == 200
    with calls_made(*batch_clients(store, sqs)) as worker:
        run_queue(sqs, url)
    pending = call(event("POST", "/v1/uploads", {"purpose": "batch", "filename": "y.jsonl", "bytes": 9,
                                                 "mime_type": "text/jsonl"}))[2]
    stalled = create(upload(data)["id"])[1]
    with calls_made(*batch_clients(store, sqs)) as sweeper:  # an expired upload, a stalled batch
        queue = batch_queue.BatchQueue(sqs, url, store.batches)
        batch_queue.sweep(store.batches, queue, max(pending["expires_at"], stalled["created_at"] + batch_queue.STALLED_S) + 1)
    assert batch(created["id"])["status"] == "completed" and {"s3:PutObject", "sqs:SendMessage"} <= api
    assert {"dynamodb:UpdateItem", "sqs:SendMessage"} <= sweeper and "s3:GetObject" in worker
    for function, made in (("GatewayFunction", api), ("BatchWorkerFunction", worker), ("BatchSweepFunction", sweeper)):
        assert made - {"sqs:ReceiveMessage", "sqs:DeleteMessage"} <= granted(function), (function, made - granted(function))


# -- the asynchronous pool: a turn's lines as one invocation, read back when its notice comes ----


def uniform_invocation(body: bytes) -> bytes:
    """An invocation's lines answered as the scorer's lines route answers them, each by the
    uniform backend."""
    answers = []
    for number, raw in enumerate(body.splitlines(), 1):
        line = json.loads(raw)
        answered = UniformBackend().invoke(Endpoint("dg-async"), json.dumps(line["body"]).encode(), line["route"])
        answers.append(json.dumps({"id": line["id"], "line": number, "status": 200, "body": json.loads(answered)}))
    return "\n".join(answers).encode() + b"\n"


@pytest.fixture
def on_pool(aws):
    """The worker's services on an asynchronous pool (the installed function's settings, with
    GATEWAY_ASYNC_ENDPOINT), its invocations answered as `answer` says (`pool.answer`)."""
    from devkit.gateway_stack import RECORD_KEYS
    from gateway.auth.tokens import CachedKeyRing
    from gateway.functions.composition import build_async_lines
    from gateway.functions.handler import GatewayFunction
    from tests.gateway_helpers import asynchronous_inference

    store, _, _ = aws
    installed = _installed_function().services
    auth = installed.settings.auth.model_copy(update={"batches_table": "dg-batches", "batch_bucket": "dg-batch-files",
                                                      "async_endpoint": "dg-async",
                                                      "async_instance_type": "ml.g5.xlarge"})
    services, lines = build_async_lines(installed.settings.model_copy(update={"auth": auth}), stores=store,
                                        authenticator=installed.authenticator,
                                        record_keys=CachedKeyRing(lambda: RECORD_KEYS))
    answers: list = [uniform_invocation]
    notices = asynchronous_inference(lines.pool, lambda body: answers[0](body))
    return GatewayFunction(services), lines, notices, answers


def pool_turns(sqs, url: str, function, lines, notices: list, most: int = 30) -> list[str]:
    """The queue's turns on the pool's worker, and each notice to the notice function's `wake`
    as it comes; what each turn was (the batch ids)."""
    store, order = batch_store(function), []
    for number in range(most):
        while notices:
            batch_queue.wake(store, batch_queue.BatchQueue(sqs, url, store), lines.pool, notices.pop(0), time.time())
        received = messages(sqs, url, 1)
        if not received:
            if notices:  # published while the last turn ran
                continue
            return order
        [record] = received
        order.append(json.loads(record["body"])["batch_id"])
        worker = build_worker(function, f"lambda-{number}", async_lines=lines)
        if batch_queue.take_turn(worker, batch_queue.BatchQueue(sqs, url, store), record, remaining_s=300.0):
            sqs.delete_message(QueueUrl=url, ReceiptHandle=record["receiptHandle"])
    raise AssertionError("the queue did not empty")


def test_a_turns_lines_go_as_one_invocation_and_run_through_their_routes_when_its_notice_comes(aws, on_pool):
    store, sqs, url = aws
    function, lines, notices, _ = on_pool
    created = create(upload(jsonl([systemone_line(i) for i in range(3)] + [systemone_line(3, state=7)]))["id"])[1]
    order = pool_turns(sqs, url, function, lines, notices)
    done = batch(created["id"])
    assert done["status"] == "completed" and done["request_counts"] == {"total": 4, "completed": 3, "failed": 1}
    output = lines_of(done["output_file_id"])
    assert [line["custom_id"] for line in output] == ["ticket-0", "ticket-1", "ticket-2"]
    assert lines_of(done["error_file_id"])[0]["response"]["status_code"] == 422  # refused by its route: never sent
    [sent] = inputs_sent(store)  # one invocation
    sent_lines = store.batches.s3.get_object(Bucket="dg-batch-files", Key=sent)["Body"].read().splitlines()
    assert len(sent_lines) == 3 and all("work=bulk" in json.loads(line)["attributes"] for line in sent_lines)
    for line in output:  # recorded as a real-time line is, under the id its ledger chose
        decision_id = line["response"]["body"]["x_decision_id"]
        assert store.records.get_record("acme", decision_id) is not None
    # validation, the lines sent, then (woken by the notice) read back, the output written
    assert order == [created["id"]] * 3


def test_a_failed_invocation_sends_its_lines_again_until_the_line_fails_with_the_pools_reason(aws, on_pool):
    from gateway.batches.worker import MAX_ASYNC_SENDS

    _, sqs, url = aws
    function, lines, notices, answers = on_pool
    answers[0] = lambda body: None  # every invocation fails
    created = create(upload(jsonl([systemone_line(0)]))["id"])[1]
    pool_turns(sqs, url, function, lines, notices)
    done = batch(created["id"])
    assert done["status"] == "completed" and done["request_counts"] == {"total": 1, "completed": 0, "failed": 1}
    [failed] = lines_of(done["error_file_id"])
    assert failed["error"]["code"] == "model_failed" and "server error (500)" in failed["error"]["message"]
    assert len(inputs_sent(aws[0])) == MAX_ASYNC_SENDS


def test_the_notice_function_wakes_only_its_invocations_waiting_lines_and_drops_what_is_not_its_own(aws, on_pool,
                                                                                                    monkeypatch):
    store, sqs, url = aws
    function, lines, notices, _ = on_pool
    for name, value in (("GATEWAY_BATCH_QUEUE_URL", url), ("GATEWAY_BATCHES_TABLE", "dg-batches"),
                        ("GATEWAY_BATCH_BUCKET", "dg-batch-files"), ("GATEWAY_ASYNC_ENDPOINT", "dg-async")):
        monkeypatch.setenv(name, value)  # the function's own variables in the template (none of Globals')
    assert template_variables("BatchNoticeFunction") == {"GATEWAY_BATCH_QUEUE_URL", "GATEWAY_BATCHES_TABLE",
                                                          "GATEWAY_BATCH_BUCKET", "GATEWAY_ASYNC_ENDPOINT"}
    created = create(upload(jsonl([systemone_line(i) for i in range(2)]))["id"])[1]
    for number in range(2):  # validated, then its lines sent as one invocation
        [record] = messages(sqs, url, 1)
        assert batch_queue.take_turn(build_worker(function, f"lambda-{number}", async_lines=lines),
                                     batch_queue.BatchQueue(sqs, url, store.batches), record, remaining_s=300.0)
        sqs.delete_message(QueueUrl=url, ReceiptHandle=record["receiptHandle"])
    assert messages(sqs, url) == [] and store.batches.runnable_lines(created["id"], time.time(), 5) == []  # they wait
    [notice] = notices

    def sns(*messages_: dict | str) -> dict:
        return {"Records": [{"EventSource": "aws:sns", "Sns": {"Message": m if isinstance(m, str) else json.dumps(m)}}
                            for m in messages_]}

    foreign = {**notice, "requestParameters": {**notice["requestParameters"],
                                               "inputLocation": "s3://someone-elses/async/in/x.jsonl"}}
    assert batch_queue.notice_handler(sns("not json", {"no": "invocation"}, foreign), None) == {"woken": 0}
    assert batch_queue.notice_handler(sns(notice), None) == {"woken": 2}
    assert batch_queue.notice_handler(sns(notice), None) == {"woken": 0}  # SNS delivered it twice: woken once
    announced = messages(sqs, url)  # (a turn each time: the second, stale once the first ran)
    assert {json.loads(m["body"])["batch_id"] for m in announced} == {created["id"]}
    assert len(store.batches.runnable_lines(created["id"], time.time(), 5)) == 2


def test_the_pools_worker_and_notice_function_are_granted_every_call_they_make(aws, on_pool):
    store, sqs, url = aws
    function, lines, notices, _ = on_pool
    create(upload(jsonl([systemone_line(i) for i in range(2)]))["id"])
    clients = (*batch_clients(store, sqs), lines.pool.sagemaker, lines.pool.s3)
    with calls_made(*clients) as worker:  # validation, the lines sent as one invocation
        for number in range(2):
            [record] = messages(sqs, url, 1)
            batch_queue.take_turn(build_worker(function, f"lambda-{number}", async_lines=lines),
                                  batch_queue.BatchQueue(sqs, url, store.batches), record, remaining_s=300.0)
            sqs.delete_message(QueueUrl=url, ReceiptHandle=record["receiptHandle"])
    with calls_made(*clients) as notice:
        [sent] = notices
        assert batch_queue.wake(store.batches, batch_queue.BatchQueue(sqs, url, store.batches), lines.pool, sent,
                                time.time()) == 2
    with calls_made(*clients) as reading_back:
        pool_turns(sqs, url, function, lines, notices)
    worker |= reading_back
    assert {"sagemaker:InvokeEndpointAsync", "s3:PutObject", "s3:GetObject"} <= worker
    assert {"s3:GetObject", "dynamodb:UpdateItem", "sqs:SendMessage"} <= notice
    for name, made in (("BatchWorkerFunction", worker), ("BatchNoticeFunction", notice)):
        assert made - {"sqs:ReceiveMessage", "sqs:DeleteMessage"} <= granted(name), (name, made - granted(name))


def inputs_sent(store) -> list[str]:
    listed = store.batches.s3.list_objects_v2(Bucket="dg-batch-files", Prefix="async/in/")
    return [item["Key"] for item in listed.get("Contents", []) if item["Key"].endswith(".jsonl")]  # not sidecars


def one_turn(sqs, url: str, store, function, lines, number: int) -> None:
    [record] = messages(sqs, url, 1)
    assert batch_queue.take_turn(build_worker(function, f"lambda-{number}", async_lines=lines),
                                 batch_queue.BatchQueue(sqs, url, store.batches), record, remaining_s=300.0)
    sqs.delete_message(QueueUrl=url, ReceiptHandle=record["receiptHandle"])


def test_an_invocation_carries_the_lines_whose_deadlines_fit_its_hour_and_a_batch_has_two_waiting_at_most(
        aws, on_pool, monkeypatch):
    from gateway.batches import worker as worker_module

    store, sqs, url = aws
    function, lines, notices, _ = on_pool
    monkeypatch.setattr(worker_module, "LINES_BUDGET_S", 50.0)  # two lines' deadlines (about 23 s each)
    created = create(upload(jsonl([systemone_line(i) for i in range(6)]))["id"])[1]
    one_turn(sqs, url, store, function, lines, 0)  # validated
    one_turn(sqs, url, store, function, lines, 1)  # two invocations of two lines: no room for a third
    assert len(inputs_sent(store)) == 2 and len(notices) == 2 and messages(sqs, url) == []  # it waits for them
    assert batch(created["id"])["request_counts"]["completed"] == 0
    pool_turns(sqs, url, function, lines, notices)
    done = batch(created["id"])
    assert done["status"] == "completed" and done["request_counts"] == {"total": 6, "completed": 6, "failed": 0}
    assert len(inputs_sent(store)) == 3
    assert store.batches.get_batch("acme", created["id"]).invocations == {}  # none waiting once read back


def test_a_line_the_pool_did_not_run_in_its_hour_is_sent_again_and_answered_then(aws, on_pool):
    store, sqs, url = aws
    function, lines, notices, answers = on_pool

    def first_line_not_run(body: bytes) -> bytes:  # the invocation's time ran out before its last line
        answered = uniform_invocation(body).splitlines()
        if len(answered) < 2:
            return uniform_invocation(body)
        last = json.loads(answered[-1])
        last |= {"status": 503, "body": {"error": {"message": "not run"}, "x_state": "queue_timeout", "x_retry_after": 1}}
        return b"\n".join([*answered[:-1], json.dumps(last).encode()]) + b"\n"

    answers[0] = first_line_not_run
    created = create(upload(jsonl([systemone_line(i) for i in range(3)]))["id"])[1]
    pool_turns(sqs, url, function, lines, notices)
    done = batch(created["id"])
    assert done["status"] == "completed" and done["request_counts"] == {"total": 3, "completed": 3, "failed": 0}
    assert len(inputs_sent(store)) == 2  # the three, then the one not run


def test_a_notice_that_comes_after_its_lines_poll_still_gives_the_batch_a_turn(aws, on_pool):
    store, sqs, url = aws
    function, lines, notices, _ = on_pool
    created = create(upload(jsonl([systemone_line(i) for i in range(2)]))["id"])[1]
    for number in range(2):  # validated, then its lines sent: the turn ends, nothing announced
        one_turn(sqs, url, store, function, lines, number)
    assert messages(sqs, url) == []
    later = time.time() + lines.poll_s + 60  # a cold pool: the notice comes after the lines' poll
    for line in store.batches.unfinished_lines(created["id"]):
        assert line.not_before < later  # runnable by then, and yet no turn would come without the notice
    queue = batch_queue.BatchQueue(sqs, url, store.batches)
    assert batch_queue.wake(store.batches, queue, lines.pool, notices.pop(), later) == 0  # none to move
    [announced] = messages(sqs, url)
    assert json.loads(announced["body"])["batch_id"] == created["id"]
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=announced["receiptHandle"], VisibilityTimeout=0)


def test_an_invocation_that_was_prepared_and_never_sent_is_sent_again(aws, on_pool, monkeypatch):
    from gateway.backends import async_pool

    store, sqs, url = aws
    function, lines, notices, _ = on_pool
    created = create(upload(jsonl([systemone_line(0)]))["id"])[1]
    one_turn(sqs, url, store, function, lines, 0)  # validated
    send = lines.pool.send

    def throttled(*args):
        raise RuntimeError("SageMaker throttled the invocation")

    monkeypatch.setattr(lines.pool, "send", throttled)
    [record] = messages(sqs, url, 1)
    with pytest.raises(RuntimeError):  # the turn fails (its message comes back after the visibility timeout)
        batch_queue.take_turn(build_worker(function, "lambda-1", async_lines=lines),
                              batch_queue.BatchQueue(sqs, url, store.batches), record, remaining_s=300.0)
    monkeypatch.setattr(lines.pool, "send", send)
    monkeypatch.setattr(async_pool, "SENT_WITHIN_S", 0.0)  # the time for it to have been sent has passed
    now = time.time()
    assert store.batches.lease(created["id"], "lambda-1", now, now)  # the failed turn's lease, lapsed
    [line] = list(store.batches.unfinished_lines(created["id"]))
    line.not_before = 0.0  # its poll come, as the sweep's turn finds it
    store.batches.put_line(line)
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=record["receiptHandle"], VisibilityTimeout=0)
    pool_turns(sqs, url, function, lines, notices)
    assert batch(created["id"])["request_counts"] == {"total": 1, "completed": 1, "failed": 0}
    assert len(inputs_sent(store)) == 2  # the one prepared, and the one sent
    assert store.batches.get_batch("acme", created["id"]).invocations == {}


def test_a_tenant_has_four_invocations_waiting_at_most_and_a_cancelled_batchs_keep_their_places(
        aws, on_pool, monkeypatch):
    from gateway.batches import worker as worker_module

    store, sqs, url = aws
    function, lines, notices, _ = on_pool
    monkeypatch.setattr(worker_module, "LINES_BUDGET_S", 25.0)  # one line an invocation
    batches = [create(upload(jsonl([systemone_line(i) for i in range(3)]))["id"])[1]["id"] for _ in range(3)]
    for number in range(12):  # every turn the queue hands out while no notice is read
        received = messages(sqs, url, 1)
        if not received:
            break
        worker = build_worker(function, f"lambda-{number}", async_lines=lines)
        assert batch_queue.take_turn(worker, batch_queue.BatchQueue(sqs, url, store.batches), received[0], 300.0)
        sqs.delete_message(QueueUrl=url, ReceiptHandle=received[0]["receiptHandle"])
    assert len(notices) == 4  # two for the first batch, two for the second, none for the third yet
    assert [len(store.batches.get_batch("acme", b).invocations) for b in batches] == [2, 2, 0]
    assert call(event("POST", f"/v1/batches/{batches[0]}/cancel"))[0] == 200
    pool_turns(sqs, url, function, lines, notices)
    assert batch(batches[0])["status"] == "cancelled"
    assert [batch(b)["request_counts"]["completed"] for b in batches[1:]] == [3, 3]
