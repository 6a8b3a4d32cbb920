"""The Batch API through the real handler and a real SQLite store: files and uploads over
multipart, batches run by the worker on the same function (each line through its route), and
their output as OpenAI's files show it. The backend answers uniformly (devkit.fake_backend); the
real scorer's round trip with the OpenAI SDK is tests/e2e/test_batches.py's."""

from __future__ import annotations

import hashlib
import json
import time

import pytest

from devkit.fake_backend import UniformBackend
from devkit.gateway_stack import PRINCIPAL, _installed_function, event, install, settings_for
from gateway.functions.batch_worker import batch_store, build_worker, work_once
from tests.gateway_helpers import call, multipart, register_credentials, tenant_store, unthrottled

OTHER = {**PRINCIPAL, "principalId": "globex", "tenant_id": "globex", "credential_id": "k2"}
QUESTIONS = {"refund": {"type": "noul", "instructions": "Is this a refund request?"},
             "queue": {"type": "choice", "instructions": "Which queue?", "criteria": {"billing": None, "delivery": None}}}


def systemone_line(i: int, **body) -> dict:
    return {"custom_id": f"ticket-{i}", "method": "POST", "url": "/v1/systemone",
            "body": {"model": "jev-latest", "state": f"Ticket {i}: I was charged twice.", "questions": QUESTIONS, **body}}


def jsonl(lines: list) -> bytes:
    return "\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines).encode() + b"\n"


@pytest.fixture
def gateway(tmp_path):
    store = tenant_store(tmp_path / "gateway.db", "acme", "globex")
    unthrottled(store, "acme", "globex")
    register_credentials(store, PRINCIPAL, OTHER)
    backend = UniformBackend()
    install(backend, stores=store)
    return store, backend, _installed_function()


def upload(data: bytes, principal=PRINCIPAL, name: str = "in.jsonl") -> dict:
    body, content_type = multipart({"purpose": b"batch"}, {"file": (name, data)})
    status, _, reply = call(event("POST", "/v1/files", raw=body, headers={"Content-Type": content_type},
                                  principal=principal))
    assert status == 200, reply
    return reply


def create(file_id: str, endpoint: str = "/v1/systemone", principal=PRINCIPAL, **extra) -> tuple[int, dict]:
    status, _, reply = call(event("POST", "/v1/batches", {"input_file_id": file_id, "endpoint": endpoint,
                                                           "completion_window": "24h", **extra}, principal=principal))
    return status, reply


def drain(function, clock=time.time, steps: int = 200, owner: str = "test-worker") -> None:
    worker = build_worker(function, owner, clock=clock)
    store = batch_store(function)
    for _ in range(steps):
        work_once(worker, store)
        if not store.open_batches():
            return
    raise AssertionError("the batches did not finish")


def batch(batch_id: str, principal=PRINCIPAL) -> dict:
    status, _, reply = call(event("GET", f"/v1/batches/{batch_id}", principal=principal))
    assert status == 200, reply
    return reply


def lines_of(file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    status, headers, body = call(event("GET", f"/v1/files/{file_id}/content"))
    assert status == 200 and headers["content-type"] == "application/octet-stream"
    text = body if isinstance(body, str) else json.dumps(body)
    return [json.loads(line) for line in text.splitlines() if line]


def without_volatile(body: dict) -> dict:
    """An answer without what differs between two runs of one request: its ids and its time's figures."""
    body = {k: v for k, v in body.items() if k not in ("x_decision_id", "id", "created")}
    if isinstance(body.get("usage"), dict):
        body["usage"] = {k: v for k, v in body["usage"].items() if k not in ("x_endpoint_s", "x_cost_usd")}
    return body


def test_each_line_answers_as_its_synchronous_twin_with_a_record_outcomes_attach_to(gateway):
    _, backend, function = gateway
    lines = [systemone_line(i) for i in range(4)] + [systemone_line(4, state=7)]  # the last: not a valid request
    created_status, created = create(upload(jsonl(lines))["id"])
    assert created_status == 200 and created["status"] == "validating" and created["object"] == "batch"
    drain(function)
    done = batch(created["id"])
    assert done["status"] == "completed" and done["model"] == "jev-latest"
    assert done["request_counts"] == {"total": 5, "completed": 4, "failed": 1}
    output, errors = lines_of(done["output_file_id"]), lines_of(done["error_file_id"])
    assert [line["custom_id"] for line in output] == [f"ticket-{i}" for i in range(4)]
    for line, asked in zip(output, lines, strict=False):
        status, _, sync = call(event("POST", "/v1/systemone", asked["body"]))
        assert line["response"]["status_code"] == status == 200 and line["error"] is None
        assert without_volatile(line["response"]["body"]) == without_volatile(sync)
        record_id = line["response"]["body"]["x_decision_id"]
        record_status, _, record = call(event("GET", f"/v1/records/{record_id}"))
        assert record_status == 200 and record["request_id"] == line["id"] == line["response"]["request_id"]
        outcome, _, _ = call(event("POST", f"/v1/decisions/{record_id}/outcome", {"answers": {"refund": True}}))
        assert outcome == 200
    status, _, sync_error = call(event("POST", "/v1/systemone", lines[4]["body"]))
    assert errors[0]["custom_id"] == "ticket-4" and errors[0]["response"]["status_code"] == status == 422
    assert errors[0]["response"]["body"] == sync_error
    bulk = [c for c in backend.callers if c.request_id.startswith("batch_req_")]
    assert len(bulk) == 4 and {c.work for c in bulk} == {"bulk"}
    assert done["usage"]["input_tokens"] > 0 and done["x_cost_usd"] > 0


def test_decisions_and_chat_batches_answer_in_their_own_shapes(gateway):
    _, _, function = gateway
    decision = {"model": "decision-default", "input": [{"role": "user", "content": "charged twice"}],
                "questions": [{"type": "predicate", "name": "refund", "instructions": "asks for a refund"}]}
    chat = {"model": "chat-default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    ids = []
    for endpoint, body in (("/v1/decisions", decision), ("/v1/chat/completions", chat)):
        line = {"custom_id": "one", "method": "POST", "url": endpoint, "body": body}
        ids.append((endpoint, body, create(upload(jsonl([line]))["id"], endpoint)[1]["id"]))
    drain(function)
    for endpoint, body, batch_id in ids:
        done = batch(batch_id)
        assert done["status"] == "completed" and done["request_counts"]["completed"] == 1, done
        [line] = lines_of(done["output_file_id"])
        _, _, sync = call(event("POST", endpoint, body))
        assert without_volatile(line["response"]["body"]) == without_volatile(sync)
        assert line["response"]["body"]["usage"]["x_cost_usd"] >= 0


@pytest.mark.parametrize(("lines", "code", "line"), [
    (["not json"], "invalid_json_line", 1),
    ([systemone_line(1), systemone_line(1)], "duplicate_custom_id", 2),
    ([systemone_line(1), {**systemone_line(2), "url": "/v1/decisions"}], "mismatched_endpoint", 2),
    ([systemone_line(1, stream=True)], "streaming_unsupported", 1),
    ([systemone_line(1), systemone_line(2, model="decision-default")], "mismatched_model", None),
    ([{**systemone_line(1), "method": "GET"}], "invalid_method", 1),
    ([systemone_line(1, model="no-such-model")], "model_not_found", None),
    ([], "empty_file", None),
])
def test_a_file_that_is_not_a_batch_of_its_endpoint_fails_validation_with_openais_errors(gateway, lines, code, line):
    _, backend, function = gateway
    _, created = create(upload(jsonl(lines) if lines else b"\n")["id"])
    drain(function)
    failed = batch(created["id"])
    assert failed["status"] == "failed" and failed["failed_at"] is not None
    assert failed["errors"]["object"] == "list"
    assert (failed["errors"]["data"][0]["code"], failed["errors"]["data"][0]["line"]) == (code, line)
    assert failed["output_file_id"] is None and not backend.calls


def test_files_and_batches_are_the_tenants_own(gateway):
    file_id = upload(jsonl([systemone_line(1)]))["id"]
    _, created = create(file_id)
    for method, path in (("GET", f"/v1/files/{file_id}"), ("GET", f"/v1/files/{file_id}/content"),
                         ("DELETE", f"/v1/files/{file_id}"), ("GET", f"/v1/batches/{created['id']}"),
                         ("POST", f"/v1/batches/{created['id']}/cancel")):
        status, _, body = call(event(method, path, principal=OTHER))
        assert status == 404 and body["error"]["type"] == "invalid_request_error", (path, body)
    assert create(file_id, principal=OTHER)[0] == 404
    assert call(event("GET", "/v1/files", principal=OTHER))[2]["data"] == []
    assert call(event("GET", "/v1/batches", principal=OTHER))[2]["data"] == []
    assert call(event("GET", f"/v1/files/{file_id}"))[0] == 200


def test_creation_refuses_what_can_never_run_at_once(gateway, tmp_path):
    file_id = upload(jsonl([systemone_line(1)]))["id"]
    assert create(file_id, endpoint="/v1/embeddings")[0] == 400
    assert create(file_id, completion_window="1h")[0] == 400
    assert create(file_id, metadata={f"k{i}": "v" for i in range(17)})[0] == 400
    assert create("file-nope")[0] == 404
    read_only = {**PRINCIPAL, "scopes": "chat"}
    status, body = create(file_id, principal=read_only)
    assert status == 403 and "decide" in body["error"]["message"]


def test_a_batch_whose_work_cannot_fit_its_window_is_refused_with_the_figures(tmp_path):
    store = tenant_store(tmp_path / "gateway.db", "acme")
    register_credentials(store, PRINCIPAL)
    install(UniformBackend(), stores=store, settings=settings_for(batches={"tokens_per_second": 0.0001}))
    status, body = create(upload(jsonl([systemone_line(i) for i in range(20)]))["id"])
    assert status == 413 and "tokens a second" in body["error"]["message"] and "s of model time" in body["error"]["message"]


def test_cancel_keeps_what_finished_and_fails_the_rest_as_cancelled(gateway):
    _, _, function = gateway
    created, _ = started(function, lines=6, done=2)
    status, _, cancelling = call(event("POST", f"/v1/batches/{created['id']}/cancel"))
    assert status == 200 and cancelling["status"] == "cancelling" and cancelling["cancelling_at"]
    assert call(event("POST", f"/v1/batches/{created['id']}/cancel"))[2]["status"] == "cancelling"
    drain(function, owner="w")  # the worker that holds the batch's lease
    cancelled = batch(created["id"])
    assert cancelled["status"] == "cancelled" and cancelled["request_counts"] == {"total": 6, "completed": 2, "failed": 4}
    assert len(lines_of(cancelled["output_file_id"])) == 2
    assert {line["error"]["code"] for line in lines_of(cancelled["error_file_id"])} == {"batch_cancelled"}
    status, _, body = call(event("POST", f"/v1/batches/{created['id']}/cancel"))
    assert status == 200 and body["status"] == "cancelled"


def records_and_requests(store) -> tuple[int, int]:
    """The tenant's stored records, and the requests its usage counts (spend settled)."""
    records = sum(1 for _ in store.records.scan_records("acme"))
    status, _, usage = call(event("GET", "/v1/usage", principal={**PRINCIPAL, "scopes": "catalogs:read"}))
    assert status == 200, usage
    return records, usage["total"]["requests"]


class Died(BaseException):
    """The worker's process ending mid-line (nothing above the worker catches it)."""


@pytest.mark.parametrize("dies", ["before_its_record", "after_its_record"])
def test_a_worker_that_dies_mid_line_is_resumed_without_a_second_record_or_charge(gateway, dies):
    store, _, function = gateway
    _, created = create(upload(jsonl([systemone_line(i) for i in range(3)]))["id"])
    worker = build_worker(function, "first")
    worker.run(created["id"], "acme", time.time() + 60)  # validates
    real = function.run_line

    def dying(principal, call):
        if dies == "after_its_record":  # answered, recorded and charged; the ledger never hears of it
            real(principal, call)
            raise Died
        return real(principal, type(call)(call.url, call.body, call.request_id, call.decision_id,
                                          lambda status, body: (call.keep(status, body), _raise(Died()))))

    worker.run_line = dying
    with pytest.raises(Died):
        worker.run(created["id"], "acme", time.time() + 60, max_lines=1)
    assert records_and_requests(store)[0] == (1 if dies == "after_its_record" else 0)
    drain(function, clock=lambda: time.time() + 120)  # another worker, once the first one's lease has lapsed
    done = batch(created["id"])
    assert done["status"] == "completed" and done["request_counts"] == {"total": 3, "completed": 3, "failed": 0}
    assert records_and_requests(store) == (3, 3)
    output = lines_of(done["output_file_id"])
    assert [line["custom_id"] for line in output] == ["ticket-0", "ticket-1", "ticket-2"]
    assert len({line["response"]["body"]["x_decision_id"] for line in output}) == 3


def _raise(exc: BaseException) -> None:
    raise exc


def started(function, lines: int, done: int) -> tuple[dict, object]:
    """A batch of `lines` whose first `done` lines a worker ("w", which holds its lease) has run."""
    _, created = create(upload(jsonl([systemone_line(i) for i in range(lines)]))["id"])
    worker = build_worker(function, "w")
    worker.run(created["id"], "acme", time.time() + 60)  # validates
    worker.run(created["id"], "acme", time.time() + 60, max_lines=done)
    return created, worker


def test_a_batch_past_its_window_expires_with_its_partial_output(gateway):
    _, _, function = gateway
    created, _ = started(function, lines=4, done=1)
    drain(function, clock=lambda: time.time() + 86_401, owner="w")
    expired = batch(created["id"])
    assert expired["status"] == "expired" and expired["expired_at"] and expired["completed_at"] is None
    assert expired["request_counts"] == {"total": 4, "completed": 1, "failed": 3}
    assert {line["error"]["code"] for line in lines_of(expired["error_file_id"])} == {"batch_expired"}
    assert lines_of(expired["error_file_id"])[0]["response"] is None


def test_a_revoked_key_stops_its_batch_and_keeps_what_finished(gateway):
    store, _, function = gateway
    created, worker = started(function, lines=4, done=2)
    store.tenants.revoke_api_key(PRINCIPAL["credential_id"], time.time())
    function.services.authenticator.revocations.forget(f"apikey:{PRINCIPAL['credential_id']}")  # its 10 s passed
    worker.run(created["id"], "acme", time.time() + 60)
    stopped = batch_store(function).get_batch("acme", created["id"])
    assert stopped.status == "failed" and stopped.errors[0]["code"] == "credential_revoked"
    assert (stopped.completed, stopped.failed) == (2, 2)


def test_a_budget_spent_mid_batch_fails_the_remaining_lines_as_lines(gateway):
    from gateway.auth.tenants import set_limits

    store, backend, _ = gateway
    _, created = create(upload(jsonl([systemone_line(i) for i in range(3)]))["id"])
    set_limits(store.tenants, "acme", monthly_budget_usd=0.0)
    install(backend, stores=store)  # a function instance that reads the tenant's limits anew
    drain(_installed_function())
    done = batch(created["id"])
    assert done["status"] == "completed" and done["request_counts"] == {"total": 3, "completed": 0, "failed": 3}
    errors = lines_of(done["error_file_id"])
    assert {line["response"]["status_code"] for line in errors} == {429}
    assert {line["response"]["body"]["detail"]["error_type"] for line in errors} == {"budget_exhausted"}


def post_part(upload_id: str, data: bytes) -> tuple[int, dict]:
    body, content_type = multipart({}, {"data": ("blob", data)})
    status, _, reply = call(event("POST", f"/v1/uploads/{upload_id}/parts", raw=body,
                                  headers={"Content-Type": content_type}))
    return status, reply


def start_upload(size: int) -> dict:
    status, _, upload_object = call(event("POST", "/v1/uploads", {"bytes": size, "filename": "big.jsonl",
                                                                   "mime_type": "application/jsonl", "purpose": "batch"}))
    assert status == 200 and upload_object["status"] == "pending", upload_object
    return upload_object


def test_an_upload_in_parts_becomes_one_file_and_checks_what_it_was_told(gateway):
    data = jsonl([systemone_line(i) for i in range(40)])
    first, second = data[:1000], data[1000:]
    pending = start_upload(len(data))
    part_ids = [post_part(pending["id"], piece)[1]["id"] for piece in (first, second)]
    assert post_part(pending["id"], b"x")[0] == 400  # more than the upload was created for
    status, _, refused = call(event("POST", f"/v1/uploads/{pending['id']}/complete",
                                    {"part_ids": part_ids, "md5": "0" * 32}))
    assert status == 400 and "md5" in refused["error"]["message"]
    assert call(event("POST", f"/v1/uploads/{pending['id']}/complete", {"part_ids": part_ids[:1]}))[0] == 400
    status, _, done = call(event("POST", f"/v1/uploads/{pending['id']}/complete",
                                 {"part_ids": part_ids, "md5": hashlib.md5(data).hexdigest()}))
    assert status == 200 and done["status"] == "completed" and done["file"]["bytes"] == len(data)
    status, _, content = call(event("GET", f"/v1/files/{done['file']['id']}/content"))
    assert status == 200 and content.encode() == data
    assert post_part(pending["id"], b"x")[0] == 400  # a completed upload takes no more parts
    cancelled = start_upload(10)
    status, _, body = call(event("POST", f"/v1/uploads/{cancelled['id']}/cancel"))
    assert status == 200 and body["status"] == "cancelled"
    assert call(event("POST", f"/v1/uploads/{cancelled['id']}/cancel", principal=OTHER))[0] == 404


def test_what_one_request_cannot_carry_is_refused_with_the_figures(gateway):
    from gateway.settings import MAX_BODY_BYTES

    too_big = b"x" * (MAX_BODY_BYTES + 1)
    body, content_type = multipart({"purpose": b"batch"}, {"file": ("in.jsonl", too_big)})
    status, _, reply = call(event("POST", "/v1/files", raw=body, headers={"Content-Type": content_type}))
    assert status == 413 and "/v1/uploads" in reply["error"]["message"]
    status, _, reply = call(event("POST", "/v1/uploads", {"bytes": 300 * 1024 * 1024, "filename": "x.jsonl",
                                                           "mime_type": "application/jsonl", "purpose": "batch"}))
    assert status == 413 and str(200 * 1024 * 1024) in reply["error"]["message"]
    body, content_type = multipart({"purpose": b"fine-tune"}, {"file": ("in.jsonl", b"{}")})
    assert call(event("POST", "/v1/files", raw=body, headers={"Content-Type": content_type}))[0] == 400
    whole_file_limit = b"x" * (4 * 1024 * 1024 + 1)  # within one request, past what a file sent whole may be
    body, content_type = multipart({"purpose": b"batch"}, {"file": ("in.jsonl", whole_file_limit)})
    status, _, reply = call(event("POST", "/v1/files", raw=body, headers={"Content-Type": content_type}))
    assert status == 413 and reply["error"]["code"] == "file_too_large" and "Uploads API" in reply["error"]["message"]


@pytest.mark.slow
def test_fifty_thousand_lines_travel_through_the_uploads_api_into_one_batch(gateway):
    _, _, function = gateway
    data = jsonl([systemone_line(i) for i in range(50_000)])
    part = 4 * 1024 * 1024  # the OpenAI SDK's upload_file_chunked(part_size=...) as the docs say
    pending = start_upload(len(data))
    part_ids = []
    for start in range(0, len(data), part):
        status, reply = post_part(pending["id"], data[start:start + part])
        assert status == 200, reply
        part_ids.append(reply["id"])
    status, _, done = call(event("POST", f"/v1/uploads/{pending['id']}/complete", {"part_ids": part_ids}))
    assert status == 200 and done["file"]["bytes"] == len(data) > 10 * 1024 * 1024
    _, created = create(done["file"]["id"])
    build_worker(function, "w").run(created["id"], "acme", time.time() + 60)  # validates
    assert batch(created["id"])["request_counts"]["total"] == 50_000
    call(event("POST", f"/v1/batches/{created['id']}/cancel"))
    drain(function, owner="w")
    cancelled = batch(created["id"])
    assert cancelled["status"] == "cancelled" and cancelled["request_counts"]["failed"] == 50_000


def test_an_output_larger_than_a_lambda_response_streams_and_is_refused_buffered(gateway):
    _, _, function = gateway
    # four questions of 250 short options: each answer gives every option its probability
    many = {f"q{i}": {"type": "choice", "instructions": "Which?", "criteria": {f"o{j}": None for j in range(250)}}
            for i in range(4)}
    _, created = create(upload(jsonl([systemone_line(i, questions=many) for i in range(220)]))["id"])
    drain(function)
    done = batch(created["id"])
    assert done["request_counts"]["completed"] == 220, done
    size = call(event("GET", f"/v1/files/{done['output_file_id']}"))[2]["bytes"]
    assert size > 6 * 1024 * 1024
    assert call(event("GET", f"/v1/files/{done['output_file_id']}/content"))[0] == 413  # the buffered integration
    streamed = b"".join(function.stream(event("GET", f"/v1/files/{done['output_file_id']}/content"), None))
    from gateway.streaming.integration import read_prelude

    meta, body = read_prelude(streamed)
    assert meta["statusCode"] == 200 and len(body) == size
    assert [json.loads(line)["custom_id"] for line in body.splitlines()] == [f"ticket-{i}" for i in range(220)]


def test_batch_lines_take_none_of_the_tenants_minute_of_endpoint_time(gateway):
    from gateway.auth.tenants import set_limits

    store, backend, _ = gateway
    set_limits(store.tenants, "acme", endpoint_seconds_per_minute=5.0)
    install(backend, stores=store)
    _, created = create(upload(jsonl([systemone_line(i) for i in range(3)]))["id"])
    drain(_installed_function())
    assert batch(created["id"])["request_counts"]["completed"] == 3
    def minute_tallies() -> int:  # this minute's and the last (the batch may have run across one)
        minute = int(time.time() // 60 * 60)
        return sum(store.counters.tally(f"work:acme:{m}") for m in (minute - 60, minute))

    assert minute_tallies() == 0  # the interactive rate's tally: untouched
    assert call(event("POST", "/v1/systemone", systemone_line(9)["body"]))[0] == 200
    assert minute_tallies() > 0  # an interactive request reserves on it


def test_the_objects_and_pages_are_what_the_openai_sdk_reads(gateway):
    from openai.pagination import SyncCursorPage
    from openai.types import Batch, FileDeleted, FileObject, Upload

    file = FileObject.model_validate(upload(jsonl([systemone_line(1)])))
    assert file.purpose == "batch" and file.status == "processed"
    created = Batch.model_validate(create(file.id, metadata={"job": "nightly"})[1])
    assert created.status == "validating" and created.metadata == {"job": "nightly"}
    assert Upload.model_validate(start_upload(10)).status == "pending"
    second = create(upload(jsonl([systemone_line(2)]))["id"])[1]
    status, _, first_page = call(event("GET", "/v1/batches?limit=1"))
    assert status == 200 and [b["id"] for b in first_page["data"]] == [second["id"]] and first_page["has_more"]
    status, _, next_page = call(event("GET", f"/v1/batches?limit=1&after={first_page['last_id']}"))
    assert [b["id"] for b in next_page["data"]] == [created.id] and not next_page["has_more"]
    SyncCursorPage[Batch].model_validate(first_page)
    status, _, oldest_first = call(event("GET", "/v1/files?order=asc&purpose=batch&limit=1"))
    assert oldest_first["data"][0]["id"] == file.id
    deleted = FileDeleted.model_validate(call(event("DELETE", f"/v1/files/{file.id}"))[2])
    assert deleted.deleted and call(event("GET", f"/v1/files/{file.id}"))[0] == 404


def test_a_credential_sees_only_the_batches_and_outputs_its_scopes_may_run(gateway):
    _, _, function = gateway
    _, created = create(upload(jsonl([systemone_line(1)]))["id"])
    drain(function)
    done = batch(created["id"])
    chat_only = {**PRINCIPAL, "scopes": "chat"}
    for path in (f"/v1/batches/{created['id']}", f"/v1/files/{done['output_file_id']}",
                 f"/v1/files/{done['output_file_id']}/content"):
        assert call(event("GET", path, principal=chat_only))[0] == 404, path
    assert call(event("GET", "/v1/batches", principal=chat_only))[2]["data"] == []
    assert done["output_file_id"] not in [f["id"] for f in call(event("GET", "/v1/files", principal=chat_only))[2]["data"]]


def test_a_tenant_has_a_bounded_number_of_batches_open(gateway):
    from gateway.batches.model import MAX_OPEN_BATCHES

    file_id = upload(jsonl([systemone_line(1)]))["id"]
    for _ in range(MAX_OPEN_BATCHES):
        assert create(file_id)[0] == 200
    status, body = create(file_id)
    assert status == 429 and str(MAX_OPEN_BATCHES) in body["error"]["message"]
    assert create(upload(jsonl([systemone_line(1)]), principal=OTHER)["id"], principal=OTHER)[0] == 200


def test_the_files_apis_answer_what_they_cannot_read_400_as_openai_does(gateway):
    status, _, body = call(event("POST", "/v1/batches", {"endpoint": "/v1/systemone"}))
    assert status == 400 and body["error"]["type"] == "invalid_request_error"
    assert call(event("POST", "/v1/files", raw=b"{}"))[0] == 400  # not a form
    body, content_type = multipart({"purpose": b"batch", "expires_after[anchor]": b"created_at",
                                    "expires_after[seconds]": b"7200"}, {"file": ("in.jsonl", jsonl([systemone_line(1)]))})
    status, _, kept = call(event("POST", "/v1/files", raw=body, headers={"Content-Type": content_type}))
    assert status == 200 and kept["expires_at"] - kept["created_at"] == 7200
    form, content_type = multipart({}, {"data": ("x", b"abc")})
    status, _, _ = call(event("POST", "/v1/systemone", raw=form, headers={"Content-Type": content_type}))
    assert status == 422  # a form sent to a JSON route is refused as what it is, never a 500


def test_a_file_no_reading_can_take_fails_its_batch_instead_of_holding_the_worker(gateway):
    _, _, function = gateway
    deep = b'{"custom_id": "a", "method": "POST", "url": "/v1/systemone", "body": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    status, created = create(upload(deep + b"\n" + jsonl([systemone_line(1)]))["id"])
    assert status == 200
    drain(function)
    failed = batch(created["id"])
    assert failed["status"] == "failed" and failed["errors"]["data"][0]["code"] == "invalid_json_line"


def test_a_download_names_its_file_safely(gateway):
    import httpx

    form = httpx.Request("POST", "http://x", data={"purpose": "batch"},
                         files={"file": ('we"ird;name.jsonl', jsonl([systemone_line(1)]))})
    file = call(event("POST", "/v1/files", raw=form.read(), headers={"Content-Type": form.headers["content-type"]}))[2]
    assert file["filename"] == 'we"ird;name.jsonl'

    _, headers, _ = call(event("GET", f"/v1/files/{file['id']}/content"))
    assert headers["content-disposition"].startswith('attachment; filename="we_ird_name.jsonl"; filename*=UTF-8')
