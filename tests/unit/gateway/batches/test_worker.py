"""The worker's own rules, on a real SQLite store, with routes that answer as scripted: what is
run again (a refusal for a while, a line whose record was never written), what is final, and
what a resumed worker skips. The routes themselves are tests/integration/test_batches.py's."""

import json

import pytest

from gateway.auth.credentials import Principal
from gateway.batches.model import Batch, StoredFile, principal_document
from gateway.batches.worker import MAX_TRIES, BatchWorker
from gateway.stores.sqlite.batches import SQLiteBatches
from gateway.stores.sqlite.database import Database

PRINCIPAL = Principal("acme", frozenset({"decide"}), None, "k1")


class Routes:
    """Answers each call with the next scripted reply: (status, headers) or an exception."""

    def __init__(self, *replies):
        self.replies = list(replies)
        self.calls = []

    def __call__(self, principal, call):
        self.calls.append(call)
        reply = self.replies.pop(0) if self.replies else (200, {})
        if isinstance(reply, BaseException):
            raise reply
        status, headers = reply
        if status == 200:
            call.keep(200, {"answer": call.request_id})
        return status, headers, {"answer": call.request_id} if status == 200 else {"error": {"code": "x"}}


@pytest.fixture
def clock():
    return {"now": 1000.0}


def worker_for(tmp_path, clock, routes, lines=2, recorded=frozenset()):
    store = SQLiteBatches(Database(tmp_path / "gateway.db"))
    data = "\n".join(json.dumps({"custom_id": f"c{n}", "method": "POST", "url": "/v1/systemone",
                                 "body": {"model": "m"}}) for n in range(lines)).encode()
    store.put_file(StoredFile("file-a", "acme", "in.jsonl", "batch", 0, 1.0), [data])
    store.put_batch(Batch("batch_a", "acme", "/v1/systemone", "file-a", "24h", 1000.0, 1000.0 + 86400,
                          principal_document(PRINCIPAL)))
    ids = iter(f"d{n}" for n in range(100))
    worker = BatchWorker(store, routes, check_principal=lambda p: p, recorded=lambda t, d: d in recorded,
                         new_decision_id=lambda: next(ids), model_allowed=lambda p, m, e: None, owner="w",
                         clock=lambda: clock["now"])
    worker.run("batch_a", "acme", clock["now"] + 1)  # validates
    return worker, store


def test_a_refusal_for_a_while_runs_again_after_its_retry_after(tmp_path, clock):
    routes = Routes((503, {"Retry-After": "7"}), (200, {}), (200, {}))
    worker, store = worker_for(tmp_path, clock, routes)
    assert worker.run("batch_a", "acme", clock["now"] + 1)  # line 0 waits, line 1 answers; line 0 not yet due
    assert [c.request_id[-1] for c in routes.calls] == ["0", "1"]
    clock["now"] += 7
    assert not worker.run("batch_a", "acme", clock["now"] + 1)
    done = store.get_batch("acme", "batch_a")
    assert done.status == "completed" and (done.completed, done.failed) == (2, 0)
    assert routes.calls[0].decision_id == routes.calls[2].decision_id  # the same record id, tried again


@pytest.mark.parametrize("reply", [(429, {"x-should-retry": "false", "Retry-After": "1"}), (400, {}), (504, {})])
def test_an_answer_no_wait_mends_is_final(tmp_path, clock, reply):
    worker, store = worker_for(tmp_path, clock, Routes(reply), lines=1)
    assert not worker.run("batch_a", "acme", clock["now"] + 1)
    assert store.get_batch("acme", "batch_a").failed == 1


def test_a_line_refused_more_than_max_tries_fails_with_its_last_answer(tmp_path, clock):
    worker, store = worker_for(tmp_path, clock, Routes(*[(503, {"Retry-After": "1"})] * MAX_TRIES), lines=1)
    for _ in range(MAX_TRIES):
        worker.run("batch_a", "acme", clock["now"] + 1)
        clock["now"] += 2
    done = store.get_batch("acme", "batch_a")
    assert done.status == "completed" and done.failed == 1
    [line] = store.finished_lines("batch_a")
    assert json.loads(line.reply)["status_code"] == 503 and line.tries == MAX_TRIES


def test_a_refusal_that_would_wait_past_the_window_is_final(tmp_path, clock):
    worker, store = worker_for(tmp_path, clock, Routes((503, {"Retry-After": "60"})), lines=1)
    clock["now"] += 86400 - 30
    worker.run("batch_a", "acme", clock["now"] + 1)
    assert store.get_batch("acme", "batch_a").failed == 1


class Died(BaseException):
    pass


@pytest.mark.parametrize(("recorded", "runs_again"), [(frozenset(), True), (frozenset({"d0"}), False)])
def test_an_answered_line_is_done_once_its_record_exists_and_runs_again_otherwise(tmp_path, clock, recorded, runs_again):
    class DiesAfterKeeping(Routes):
        def __call__(self, principal, call):
            if not self.calls:
                self.calls.append(call)
                call.keep(200, {"answer": "first"})
                raise Died
            return super().__call__(principal, call)

    routes = DiesAfterKeeping()
    worker, store = worker_for(tmp_path, clock, routes, lines=1, recorded=recorded)
    with pytest.raises(Died):
        worker.run("batch_a", "acme", clock["now"] + 1)
    worker.run("batch_a", "acme", clock["now"] + 1)
    [line] = store.finished_lines("batch_a")
    assert (len(routes.calls) == 2) is runs_again
    assert json.loads(line.reply)["body"]["answer"] == ("batch_req_a_0" if runs_again else "first")
    assert line.decision_id == "d0"


def test_a_batch_whose_creator_no_longer_stands_fails_keeping_what_finished(tmp_path, clock):
    from gateway.errors import Unauthenticated

    worker, store = worker_for(tmp_path, clock, Routes(), lines=3)
    worker.run("batch_a", "acme", clock["now"] + 1, max_lines=1)

    def revoked(principal):
        raise Unauthenticated("invalid credentials")

    worker.check_principal = revoked
    assert not worker.run("batch_a", "acme", clock["now"] + 1)
    failed = store.get_batch("acme", "batch_a")
    assert failed.status == "failed" and failed.errors[0]["code"] == "credential_revoked"
    assert (failed.completed, failed.failed) == (1, 2) and failed.output_file_id and failed.error_file_id


def test_finishing_again_rewrites_the_same_files(tmp_path, clock):
    worker, store = worker_for(tmp_path, clock, Routes(), lines=2)
    worker.run("batch_a", "acme", clock["now"] + 1)
    done = store.get_batch("acme", "batch_a")
    worker.finalize(done, "completed", "", "")
    assert [f.id for f in store.list_files("acme", "batch_output", None, 10, True)] == [done.output_file_id]
