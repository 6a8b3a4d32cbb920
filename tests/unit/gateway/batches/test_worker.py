"""The worker's own rules, on a real SQLite store, with routes that answer as scripted: what is
run again (a refusal for a while, a line whose record was never written), what is final, and
what a resumed worker skips. The routes themselves are tests/integration/test_batches.py's."""

import json

import pytest

from gateway.auth.credentials import Principal
from gateway.batches.model import Batch, StoredFile, principal_document
from gateway.batches.worker import BatchWorker
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


def worker_for(tmp_path, clock, routes, lines=2, recorded=frozenset(), endpoint="/v1/systemone"):
    store = SQLiteBatches(Database(tmp_path / "gateway.db"))
    data = "\n".join(json.dumps({"custom_id": f"c{n}", "method": "POST", "url": endpoint,
                                 "body": {"model": "m"}}) for n in range(lines)).encode()
    store.put_file(StoredFile("file-a", "acme", "in.jsonl", "batch", 0, 1.0), [data])
    store.put_batch(Batch("batch_a", "acme", endpoint, "file-a", "24h", 1000.0, 1000.0 + 86400,
                          principal_document(PRINCIPAL)))
    ids = iter(f"d{n}" for n in range(100))
    worker = BatchWorker(store, routes, check_principal=lambda p: p, recorded=lambda t, d: d in recorded,
                         new_decision_id=lambda: next(ids), model_allowed=lambda p, m, e: None, owner="w",
                         clock=lambda: clock["now"])
    worker.run("batch_a", "acme", clock["now"] + 1)  # validates
    return worker, store


def dies_after_keeping():
    """Routes whose first call keeps its answer and then dies (the worker's process ending)."""
    class DiesAfterKeeping(Routes):
        def __call__(self, principal, call):
            if not self.calls:
                self.calls.append(call)
                call.keep(200, {"answer": "first"})
                raise Died
            return super().__call__(principal, call)

    return DiesAfterKeeping()


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


def test_a_line_refused_for_a_while_is_tried_again_as_long_as_the_window_allows(tmp_path, clock):
    worker, store = worker_for(tmp_path, clock, Routes(*[(503, {"Retry-After": "60"})] * 50), lines=1)
    for _ in range(50):  # fifty busy answers, a minute apart: still not given up
        worker.run("batch_a", "acme", clock["now"] + 1)
        clock["now"] += 61
    assert store.get_batch("acme", "batch_a").status == "in_progress"
    assert worker.run("batch_a", "acme", clock["now"] + 1) is False  # the 51st answers
    assert store.get_batch("acme", "batch_a").completed == 1


def test_a_refusal_that_would_wait_past_the_window_is_final(tmp_path, clock):
    worker, store = worker_for(tmp_path, clock, Routes((503, {"Retry-After": "60"})), lines=1)
    clock["now"] += 86400 - 30
    worker.run("batch_a", "acme", clock["now"] + 1)
    assert store.get_batch("acme", "batch_a").failed == 1


class Died(BaseException):
    pass


@pytest.mark.parametrize(("endpoint", "recorded", "runs_again"), [
    ("/v1/systemone", frozenset(), True),  # kept, never recorded: runs again, with the same record id
    ("/v1/systemone", frozenset({"d0"}), False),  # kept and recorded: done
    ("/v1/chat/completions", frozenset(), False),  # a chat keeps no record: kept is done
])
def test_an_answered_line_is_done_once_its_record_exists_and_runs_again_otherwise(tmp_path, clock, endpoint, recorded,
                                                                                 runs_again):
    routes = dies_after_keeping()
    worker, store = worker_for(tmp_path, clock, routes, lines=1, recorded=recorded, endpoint=endpoint)
    with pytest.raises(Died):
        worker.run("batch_a", "acme", clock["now"] + 1)
    [line] = store.unfinished_lines("batch_a")
    assert line.state == "answered" and line.decision_id == ("d0" if endpoint == "/v1/systemone" else None)
    worker.run("batch_a", "acme", clock["now"] + 1)
    [output] = outputs(store)
    assert (len(routes.calls) == 2) is runs_again
    assert output["response"]["body"]["answer"] == ("batch_req_a_0" if runs_again else "first")


def test_a_cancel_keeps_a_line_that_was_answered_and_recorded(tmp_path, clock):
    worker, store = worker_for(tmp_path, clock, dies_after_keeping(), lines=2, recorded=frozenset({"d0"}))
    with pytest.raises(Died):
        worker.run("batch_a", "acme", clock["now"] + 1)
    cancelling = store.get_batch("acme", "batch_a")
    cancelling.status = "cancelling"
    store.update_batch(cancelling, "in_progress")
    worker.run("batch_a", "acme", clock["now"] + 1)
    done = store.get_batch("acme", "batch_a")
    assert done.status == "cancelled" and (done.completed, done.failed) == (1, 1)


def test_a_worker_whose_lease_was_taken_stops_and_a_line_is_taken_once(tmp_path, clock):
    routes = Routes()
    worker, store = worker_for(tmp_path, clock, routes, lines=2)
    assert store.lease("batch_a", "another", clock["now"] + 500, clock["now"] + 100)  # ours lapsed; another took it
    clock["now"] += 100
    assert worker.run("batch_a", "acme", clock["now"] + 1) is True and routes.calls == []
    line = store.runnable_lines("batch_a", clock["now"], 1)[0]
    line.tries = 1
    assert store.put_line(line, expect_tries=0) and not store.put_line(line, expect_tries=0)


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


def test_writing_a_batchs_output_again_rewrites_the_same_file(tmp_path, clock):
    worker, store = worker_for(tmp_path, clock, Routes(), lines=2)
    worker.run("batch_a", "acme", clock["now"] + 1, max_lines=2)  # both lines done, not yet finalized
    batch = store.get_batch("acme", "batch_a")
    first, again = worker._write_output(batch, failed=False), worker._write_output(batch, failed=False)
    assert first == again and [f.id for f in store.list_files("acme", "batch_output", None, 10, True)] == [first]
    worker.finalize(batch, "completed", "", "")
    assert store.get_batch("acme", "batch_a").error_file_id is None  # no line failed: no error file


def outputs(store) -> list[dict]:
    """The batch's output and error files' lines, as a caller downloads them."""
    batch = store.get_batch("acme", "batch_a")
    lines = []
    for file_id in (batch.output_file_id, batch.error_file_id):
        if file_id:
            lines += [json.loads(text) for text in b"".join(store.read_file("acme", file_id)).splitlines()]
    return lines


class LaggingIndex:
    """A store whose list of runnable lines lags behind its writes (DynamoDB's index does): it
    lists nothing for its first `blind` asks."""

    def __init__(self, store, blind: int) -> None:
        self.store, self.blind = store, blind

    def runnable_lines(self, batch_id, now, limit):
        if self.blind > 0:
            self.blind -= 1
            return []
        return self.store.runnable_lines(batch_id, now, limit)

    def unfinished_lines(self, batch_id):  # listed from the same index
        return iter(()) if self.blind > 0 else self.store.unfinished_lines(batch_id)

    def __getattr__(self, name):
        return getattr(self.store, name)


def test_a_batch_whose_lines_are_not_listed_yet_is_not_complete_until_its_counts_say_so(tmp_path, clock):
    worker, store = worker_for(tmp_path, clock, Routes((200, {}), (200, {})))
    worker.store = LaggingIndex(store, blind=2)
    assert worker.run("batch_a", "acme", clock["now"] + 1)  # nothing listed: more to do, not "completed with none"
    assert store.get_batch("acme", "batch_a").status == "in_progress"
    assert worker.run("batch_a", "acme", clock["now"] + 1) and not worker.run("batch_a", "acme", clock["now"] + 1)
    assert (store.get_batch("acme", "batch_a").status, store.get_batch("acme", "batch_a").completed) == ("completed", 2)


def test_a_batch_cancelled_while_validating_ignores_a_ledger_a_dead_validator_left(tmp_path, clock):
    store = SQLiteBatches(Database(tmp_path / "gateway.db"))
    store.put_batch(Batch("batch_a", "acme", "/v1/systemone", "file-a", "24h", 1000.0, 1000.0 + 86400,
                          principal_document(PRINCIPAL), status="cancelling"))
    with store.db.connect() as db:  # lines written, the status never flipped (the validator died between)
        db.execute("INSERT INTO batch_lines VALUES ('batch_a', 0, 'c0', '{}', 'pending', NULL, 0, 0, NULL, 0, NULL)")
    worker = BatchWorker(store, Routes(), check_principal=lambda p: p, recorded=lambda t, d: False,
                         new_decision_id=lambda: "d", model_allowed=lambda p, m, e: None, owner="w",
                         clock=lambda: clock["now"])
    worker.finalize(store.get_batch("acme", "batch_a"), "cancelled", "batch_cancelled", "cancelled")
    done = store.get_batch("acme", "batch_a")
    assert done.status == "cancelled" and (done.completed, done.failed, done.error_file_id) == (0, 0, None)
