"""The batch worker: runs a batch's lines, one at a time, each exactly once, and writes its output.

`BatchWorker.run(batch_id, until)` does what a batch needs next until `until` (a Lambda's
remaining time, the local loop's slice) and says whether more is left. Any number of workers
may be pointed at the same batches: a batch is leased to one at a time (`LEASE_S`, renewed as
it works), and a worker that dies hands it on when its lease lapses. Each step is a ledger
write (`gateway.batches.model`), so the next worker starts where the last one stopped.

    validating    the input file read (`jsonl.read_input`): its lines into the ledger, or the
                  batch failed with OpenAI's errors list
    in_progress   the next runnable line, as its creator, through its route (`run_line`), at
                  the bulk priority; before each, the creator's credential is asked again
                  (a revoked one stops the batch: failed, with what finished kept)
    finalizing    the output and error files written, in input order
    cancelling    (a cancel) the lines not run are failed as batch_cancelled, then the files
    past its window   the lines not run are failed as batch_expired, then the files

A line refused for a while (503 busy, 429 the tenant's share of a scorer, a record not stored)
runs again later, after its Retry-After (or a backoff up to a minute), as long as the window
allows: bulk work is the lowest priority, and a busy hour is not a reason to give a line up.
Every other answer is final, a budget exhausted included (its 429 says `x-should-retry: false`):
the remaining lines fail as lines, each saying so.

On an asynchronous pool (`AsyncLines`: SageMaker's Asynchronous Inference), a turn takes many
lines at once (`run_on_pool`): each runs through its route with the pool's answer book as its
backend (gateway.backends.deferred), which takes its request down; the turn sends what it took
as one invocation (as many lines as their deadlines fit in its hour; at most
MAX_BATCH_INVOCATIONS waiting for one batch), and its lines wait for it (`Line.submission`).
When the pool's notice wakes them (or, a notice lost, the sweep gives the batch a turn), each
runs through its route again, now answered from the invocation's output, so that its record,
spend and output are a real-time line's. A line is sent at most MAX_ASYNC_SENDS times, then
fails with the pool's reason.

A batch is leased to one worker for longer than a line can take (`lease_s`: a line's deadline
and a margin), renewed before each line (on the asynchronous pool, before each group of lines,
which ends half a lease in); a worker that finds its lease taken stops, and taking a line is
conditional on its tries being what the worker read, so two workers never run one line.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any, Protocol

from gateway.auth.credentials import Principal
from gateway.backends.async_pool import LINES_BUDGET_S, AsyncPool, Outcome, Submission
from gateway.backends.deferred import AnswerBook, Asked
from gateway.batches.jsonl import read_input
from gateway.batches.model import (
    ENDPOINTS,
    FILE_TTL_S,
    FINAL,
    OUTPUT_PURPOSE,
    Batch,
    BatchStore,
    Line,
    LineUsage,
    StoredFile,
    principal_of,
)
from gateway.errors import ServiceError

log = logging.getLogger("gateway.batches.worker")
LEASE_S = 90.0  # longer than a line can take (the streaming routes' 58 s deadline, and a margin)
RETRY_STATUSES = frozenset({429, 503})
MAX_RETRY_WAIT_S = 60.0
SUBMISSION_LINES = 500  # an asynchronous invocation's most lines: its answers read back in one turn
# A line waiting for its invocation is not looked at before this (its notice wakes it sooner; a
# lost notice leaves it to the sweep's turn for a batch nothing touched, STALLED_S)
POLL_S = 900.0
MAX_ASYNC_SENDS = 3  # a line's request sent to the asynchronous pool at most this often, for any reason
# Invocations one batch may have waiting at once, so that no tenant fills the pool's queue, which
# SageMaker serves first come, first served
MAX_BATCH_INVOCATIONS = 2
MAX_TENANT_INVOCATIONS = 4  # and one tenant's, all its batches together
TENANT_BATCHES_READ = 100  # a tenant's newest batches read for its invocations waiting


@dataclass(frozen=True, slots=True)
class LineCall:
    """One line as its route runs it."""

    url: str
    body: str  # JSON text
    request_id: str
    decision_id: str | None  # the id its record takes (a decision line; None for chat, which keeps no record)
    keep: Callable[[int, Any], None]  # the reply, kept before the line's record is written (or its spend settled)


class LineRunner(Protocol):
    def __call__(self, principal: Principal, call: LineCall) -> tuple[int, dict[str, str], Any]:
        """The route's status, headers and JSON body for the line, as its creator."""
        ...


@dataclass(frozen=True, slots=True)
class AsyncLines:
    """An asynchronous pool's side of the worker: the answer book its line runs use as their
    backend (the gateway function it is given is built on it), and the pool its takes go to."""

    book: AnswerBook
    pool: AsyncPool
    max_lines: int = SUBMISSION_LINES
    poll_s: float = POLL_S


class BatchWorker:
    def __init__(self, store: BatchStore, run_line: LineRunner, *, check_principal: Callable[[Principal], Principal],
                 recorded: Callable[[str, str], bool], new_decision_id: Callable[[], str],
                 model_allowed: Callable[[Principal, str, str], str | None], owner: str,
                 count_stored: Callable[[str, int, str], None] | None = None,
                 clock: Callable[[], float] = time.time, lease_s: float = LEASE_S,
                 async_lines: AsyncLines | None = None) -> None:
        self.store = store
        self.async_lines = async_lines  # None: the lines run on the real-time pools
        self.run_line = run_line
        self.check_principal = check_principal  # the creator, as it stands now (Unauthenticated/Forbidden: revoked)
        self.recorded = recorded  # (tenant, decision id): is that record stored?
        self.new_decision_id = new_decision_id
        self.model_allowed = model_allowed  # (principal, model, endpoint): why the batch may not run it, or None
        self.owner = owner
        self.count_stored = count_stored or (lambda tenant_id, size, entry: None)  # output files, in the tenant's usage
        self.clock = clock
        self.lease_s = lease_s
        # Set to stop between two lines (a host asked to end: the line running settles as usual).
        self.stopping = threading.Event()

    def run(self, batch_id: str, tenant_id: str, until: float, max_lines: int | None = None) -> bool:
        """Work on the batch until `until` (and at most `max_lines` lines); True while it has
        more to do (now or later)."""
        now = self.clock()
        if not self.store.lease(batch_id, self.owner, now + self.lease_s, now):
            return True  # another worker has it
        batch = self.store.get_batch(tenant_id, batch_id)
        if batch is None or batch.status in FINAL:
            return False
        if batch.status == "validating":
            ending = self._ending(batch, now)
            if ending is not None:
                self.finalize(batch, *ending)
                return False
            self.validate(batch)
            return True
        while True:
            now = self.clock()
            if not self.store.lease(batch_id, self.owner, now + self.lease_s, now):
                return True  # another worker took it over: this one's lease lapsed
            batch = self.store.get_batch(tenant_id, batch_id)
            if batch is None or batch.status in FINAL:
                return False
            ending = self._ending(batch, now)
            if ending is not None:
                self.finalize(batch, *ending)
                return False
            # Complete when its counts say every line is done (read consistently: what lists a
            # store's runnable lines may lag behind its writes)
            if batch.status == "finalizing" or (batch.total and batch.completed + batch.failed >= batch.total):
                self.finalize(batch, "completed", "", "")
                return False
            if now >= until or max_lines == 0 or self.stopping.is_set():
                return True
            try:
                principal = self.check_principal(principal_of(batch.principal))
            except ServiceError as exc:
                log.info("batch stopped: its credential no longer stands", extra={"batch_id": batch.id})
                self.finalize(batch, "failed", "credential_revoked",
                              f"the credential that created this batch no longer stands ({exc.message})")
                return False
            lines = self.store.runnable_lines(batch.id, now, 1 if self.async_lines is None else self.async_lines.max_lines)
            if not lines:
                return True  # lines wait for their retry time (or are not listed yet)
            if self.async_lines is not None:
                if not self.run_on_pool(batch, principal, lines, until, self.async_lines):
                    return True  # its lines wait for the pool, or for room in it
                max_lines = None if max_lines is None else max_lines - len(lines)
                continue
            self.run_one(batch, principal, lines[0])
            max_lines = None if max_lines is None else max_lines - 1

    def validate(self, batch: Batch) -> None:
        chunks = self.store.read_file(batch.tenant_id, batch.input_file_id)
        if chunks is None:
            self._refuse(batch, [{"code": "file_not_found", "message": "the input file was deleted before the batch"
                                  " ran", "param": "input_file_id", "line": None}])
            return
        try:
            parsed, model, errors = read_input(_read_by_store(chunks), batch.endpoint)
        except _StoreFailed as failed:  # the store, not the file: the turn fails and is taken again
            raise failed.__cause__ from None
        except Exception:  # content no reading can take: refused, never read again on every pass
            log.exception("batch input could not be read", extra={"batch_id": batch.id})
            self._refuse(batch, [{"code": "invalid_file", "message": "the input file could not be read as a batch",
                                  "param": "input_file_id", "line": None}])
            return
        if not errors.count and model is not None:
            reason = self.model_allowed(principal_of(batch.principal), model, batch.endpoint)
            if reason is not None:
                errors.add("model_not_found", reason, param="body.model")
        if errors.count:
            self._refuse(batch, errors.items)
            return
        now = self.clock()
        batch.status, batch.in_progress_at, batch.model, batch.total = "in_progress", now, model, len(parsed)
        lines = [Line(batch.id, number, custom_id, body) for number, (custom_id, body) in enumerate(parsed)]
        if not self.store.add_lines(batch, lines, "validating"):
            log.info("batch changed while it was validated", extra={"batch_id": batch.id})

    def _refuse(self, batch: Batch, errors: list[dict[str, Any]]) -> None:
        batch.status, batch.failed_at, batch.errors = "failed", self.clock(), errors
        self.store.update_batch(batch, "validating")

    def run_one(self, batch: Batch, principal: Principal, line: Line) -> Asked | None:
        """One line, exactly once: a reply kept before its record is written is final once that
        record exists; a line taken and not answered runs again (it recorded nothing). On an
        asynchronous pool, the request its route took down to be sent (the line waits), if so."""
        if self._answered(batch, line):
            self._finish(line, failed=False)
            return None
        tries = line.tries
        line.state, line.tries, line.reply = "running", tries + 1, None
        if ENDPOINTS[batch.endpoint].records:
            line.decision_id = line.decision_id or self.new_decision_id()
        if not self.store.put_line(line, expect_tries=tries):
            return None  # another worker took it

        def keep(status: int, body: Any) -> None:
            line.state, line.reply = "answered", json.dumps({"status_code": status, "body": body})
            self.store.put_line(line)

        started = self.clock()
        status, headers, body = self.run_line(principal, LineCall(batch.endpoint, line.body, line.request_id,
                                                                  line.decision_id, keep))
        asked = self.async_lines.book.take(line.request_id) if self.async_lines is not None else None
        wait = MAX_RETRY_WAIT_S if asked is not None else self._retry_wait(status, headers, body, line, batch)
        if wait is not None:  # (taken down: waits until its invocation is sent, which says when to look)
            line.state, line.not_before, line.reply = "pending", self.clock() + wait, None
            self.store.put_line(line)
            return asked
        line.reply = json.dumps({"status_code": status, "body": body})
        self._finish(line, failed=status >= 400)
        log.info("batch line", extra={"batch_id": batch.id, "line": line.number, "status": status,
                                      "duration_ms": round((self.clock() - started) * 1000, 2)})
        return None

    def run_on_pool(self, batch: Batch, principal: Principal, lines: list[Line], until: float,
                    pool: AsyncLines) -> bool:
        """Lines on the asynchronous pool: each one answered by its invocation's output runs
        through its route; the requests of the others (new lines, lines whose invocation failed
        or did not answer them) are sent as one invocation, as many as their deadlines fit in
        its hour, while the batch has fewer than MAX_BATCH_INVOCATIONS waiting and its tenant
        fewer than MAX_TENANT_INVOCATIONS; those lines then wait for it. Stops at `until`, or half
        a lease in (the lease is renewed between calls). Whether anything was done (else the
        lines wait: for the pool, or for room in it)."""
        now = self.clock()
        stop = min(until, now + self.lease_s / 2)
        waiting = {name: at for name, at in batch.invocations.items() if at > now}
        room = min(MAX_BATCH_INVOCATIONS, MAX_TENANT_INVOCATIONS - self._tenants_waiting(batch, now)) - len(waiting)
        by_submission: dict[str, set[str]] = {}
        for line in lines:
            if line.submission is not None:
                by_submission.setdefault(Submission.read(line.submission).id, set()).add(line.request_id)
        outcomes: dict[str, Outcome] = {}
        taken: list[tuple[Line, Asked, int]] = []
        budget_s, done = LINES_BUDGET_S, False
        for line in lines:
            if self.clock() >= stop or self.stopping.is_set():
                break
            sends = 0
            if line.submission is not None:
                read = self._read_back(batch, line, pool, outcomes, by_submission, waiting)
                if read is None:  # dealt with: it waits on, or it failed
                    done = True
                    continue
                room, sends = room + read[1], read[0]
            if line.request_id not in pool.book and room <= 0:
                continue  # it would be sent: the batch's (or its tenant's) invocations waiting leave no room
            try:
                asked = self.run_one(batch, principal, line)
            finally:
                pool.book.take(line.request_id)  # nothing of a line stays in the book (a run that ended early)
            done = True
            if asked is None:
                continue
            if sends >= MAX_ASYNC_SENDS:  # sent that often, never answered: it fails
                self._unanswered(batch, line, sends, "its invocations did not answer it")
            elif room <= 0 or (taken and asked.deadline_s > budget_s):  # no room, or this one is full
                line.submission, line.not_before = Submission("", "", 0.0, 0.0, sends).text(), self.clock()
                self.store.put_line(line, expect_tries=line.tries)  # taken again when there is room
                if room > 0:
                    break
            else:
                taken.append((line, asked, sends))
                budget_s -= asked.deadline_s
        if taken:
            self._send(batch, taken, waiting, pool)
        elif waiting != batch.invocations:
            batch.invocations = waiting
            self.store.update_batch(batch, batch.status)  # a cancel meanwhile keeps its own
        return done

    def _send(self, batch: Batch, taken: list[tuple[Line, Asked, int]], waiting: dict[str, float],
              pool: AsyncLines) -> None:
        """The lines taken, as one invocation: prepared, kept on the batch and on its lines, then
        sent (so that its notice finds them marked, and a worker that dies before sending
        leaves lines that are sent again once SENT_WITHIN_S has passed)."""
        prepared = pool.pool.prepare(batch.tenant_id, batch.id, [asked for _, asked, _ in taken])
        batch.invocations = {**waiting, prepared.id: prepared.until}
        self.store.update_batch(batch, batch.status)
        for line, _, sends in taken:
            line.submission = replace(prepared, sends=sends + 1).text()
            line.not_before = min(prepared.until, self.clock() + pool.poll_s)
            self.store.put_line(line, expect_tries=line.tries)
        pool.pool.send(prepared, batch.tenant_id, batch.id, [asked.request_id for _, asked, _ in taken])

    def _tenants_waiting(self, batch: Batch, now: float) -> int:
        """The invocations the batch's tenant has waiting for its other batches, those it ended
        (a cancel stops no invocation) included: among its newest batches."""
        return sum(1 for other in self.store.list_batches(batch.tenant_id, None, TENANT_BATCHES_READ)
                   if other.id != batch.id for at in other.invocations.values() if at > now)

    def _read_back(self, batch: Batch, line: Line, pool: AsyncLines, outcomes: dict[str, Outcome],
                   by_submission: dict[str, set[str]], waiting: dict[str, float]) -> tuple[int, int] | None:
        """A line sent before: its answer put in the book; how often it was sent, and the room
        its invocation's end made (1 when it ends here). None when the line is dealt with here:
        its invocation still waits (looked at later), or it was sent MAX_ASYNC_SENDS times and
        never answered (failed)."""
        submission = Submission.read(line.submission or "")
        line.submission = None
        if not submission.id:  # taken, and left for the next invocation: not sent
            return submission.sends, 0
        if submission.id not in outcomes:
            outcomes[submission.id] = pool.pool.outcome(submission, by_submission[submission.id])
        outcome = outcomes[submission.id]
        if outcome.state == "waiting":  # a turn the sweep gave: look again later
            line.submission, line.not_before = submission.text(), min(submission.until, self.clock() + pool.poll_s)
            self.store.put_line(line, expect_tries=line.tries)
            return None
        ended = int(waiting.pop(submission.id, None) is not None)
        if line.request_id in outcome.answers:
            pool.book.learn(line.request_id, outcome.answers[line.request_id])
        elif submission.sends >= MAX_ASYNC_SENDS:
            reason = outcome.reason if outcome.state == "failed" else "its answers did not include this request"
            self._unanswered(batch, line, submission.sends, reason)
            return None
        return submission.sends, ended

    def _unanswered(self, batch: Batch, line: Line, sends: int, reason: str) -> None:
        log.warning("a line the asynchronous pool never answered", extra={"batch_id": batch.id, "line": line.number,
                                                                           "sends": sends})
        line.reply = json.dumps({"error": {"code": "model_failed", "message": "the asynchronous pool did not answer"
                                           f" this request, sent {sends} times: {reason}"}})
        self._finish(line, failed=True)

    def pool_is_full(self, batch_id: str, tenant_id: str) -> bool:
        """No invocation may be sent for the batch now (it, or its tenant, has as many waiting as
        it may): its lines wait for one of them to end."""
        batch = self.store.get_batch(tenant_id, batch_id)
        if batch is None:
            return False
        now = self.clock()
        own = sum(1 for at in batch.invocations.values() if at > now)
        return own >= MAX_BATCH_INVOCATIONS or own + self._tenants_waiting(batch, now) >= MAX_TENANT_INVOCATIONS

    def _answered(self, batch: Batch, line: Line) -> bool:
        """Its reply was kept and stands: a chat line's, or a decision line's whose record exists."""
        return line.state == "answered" and (line.decision_id is None
                                             or self.recorded(batch.tenant_id, line.decision_id))

    def _finish(self, line: Line, *, failed: bool) -> None:
        line.state, line.failed = "done", failed
        self.store.finish_line(line, line_usage(line))

    def _retry_wait(self, status: int, headers: dict[str, str], body: Any, line: Line, batch: Batch) -> float | None:
        """How long to wait before the line runs again, or None when its answer is final."""
        headers = {k.lower(): v for k, v in headers.items()}
        # x-should-retry: false marks a refusal no wait mends (a month's budget spent, say).
        if status not in RETRY_STATUSES or headers.get("x-should-retry") == "false":
            return None
        retry_after = headers.get("retry-after", "")
        wait = min(MAX_RETRY_WAIT_S, float(retry_after) if retry_after.isdigit() else 2.0 ** min(line.tries, 5))
        return wait if self.clock() + wait < batch.expires_at else None

    def _ending(self, batch: Batch, now: float) -> tuple[str, str, str] | None:
        """How the batch ends now (its final status, and the error of each line not run), or None."""
        if batch.status == "cancelling":
            return "cancelled", "batch_cancelled", "the batch was cancelled before this request ran"
        if now >= batch.expires_at:
            return "expired", "batch_expired", "this request could not be run before the batch's completion window ended"
        return None

    def finalize(self, batch: Batch, status: str, code: str, message: str) -> None:
        """The lines not run failed with `code`, the output and error files written, the batch
        `status`. Each step may be done again (the files' ids are the batch's own): a worker that
        dies here is followed by one that finishes it."""
        was = batch.status
        if batch.in_progress_at is None:  # never in progress: a ledger a validator that died left is not its own
            self.store.drop_lines(batch.id)
        if status == "completed" and was != "finalizing":
            batch.status, batch.finalizing_at = "finalizing", self.clock()
            if not self.store.update_batch(batch, was):
                return
            was = "finalizing"
        for line in list(self.store.unfinished_lines(batch.id)):
            if self._answered(batch, line):  # it ran, was recorded and charged: its answer stands
                self._finish(line, failed=False)
                continue
            line.reply = json.dumps({"error": {"code": code, "message": message}})
            self._finish(line, failed=True)
        counted = self.store.get_batch(batch.tenant_id, batch.id) or batch  # the counts, every line now done
        batch.output_file_id = self._write_output(batch, failed=False) if counted.completed else None
        batch.error_file_id = self._write_output(batch, failed=True) if counted.failed else None
        now = self.clock()
        batch.status = status  # type: ignore[assignment]
        setattr(batch, f"{status}_at", now)
        if status == "failed" and code:
            batch.errors = [{"code": code, "message": message, "param": None, "line": None}]
        if not self.store.update_batch(batch, was):
            log.info("batch changed while it was finalized", extra={"batch_id": batch.id})
            return
        self.store.drop_lines(batch.id)  # its files hold what it answered

    def _write_output(self, batch: Batch, *, failed: bool) -> str:
        suffix = "errors" if failed else "output"
        file_id = f"file-{batch.id.removeprefix('batch_')}{suffix[0]}"
        now = self.clock()
        ttl = batch.output_ttl_s or FILE_TTL_S
        file = StoredFile(file_id, batch.tenant_id, f"{batch.id}_{suffix}.jsonl", OUTPUT_PURPOSE, 0, now, now + ttl,
                          scope=ENDPOINTS[batch.endpoint].scope)  # what it answered is for whom may ask the same
        stored = self.store.put_file(file, self._output_lines(batch, failed))
        self.count_stored(batch.tenant_id, stored.bytes, "(files)")
        return file_id

    def _output_lines(self, batch: Batch, failed: bool) -> Iterator[bytes]:
        for line in self.store.finished_lines(batch.id):
            if line.failed == failed:
                yield (json.dumps(output_line(line), ensure_ascii=False, separators=(",", ":")) + "\n").encode()


class _StoreFailed(Exception):
    """The store failed while a file was read (its cause): not the file's fault."""


def _read_by_store(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """The file's pieces, a failure to read them marked as the store's (_StoreFailed)."""
    try:
        yield from chunks
    except Exception as exc:
        raise _StoreFailed from exc


def output_line(line: Line) -> dict[str, Any]:
    """A line as OpenAI's output and error files show it."""
    reply = json.loads(line.reply or "{}")
    if "error" in reply:
        return {"id": line.request_id, "custom_id": line.custom_id, "response": None, "error": reply["error"]}
    return {"id": line.request_id, "custom_id": line.custom_id,
            "response": {"status_code": reply["status_code"], "request_id": line.request_id, "body": reply["body"]},
            "error": None}


def line_usage(line: Line) -> LineUsage:
    """A done line's tokens and cost, from its reply's usage (a decision's or a chat's)."""
    reply = json.loads(line.reply or "{}")
    body = reply.get("body")
    usage = body.get("usage") if isinstance(body, dict) else None
    if not isinstance(usage, dict):
        return LineUsage()
    details = usage.get("prompt_tokens_details") if isinstance(usage.get("prompt_tokens_details"), dict) else {}
    return LineUsage(_count(usage.get("input_tokens", usage.get("prompt_tokens"))),
                     _count(usage.get("output_tokens", usage.get("completion_tokens"))),
                     _count(usage.get("x_cached_tokens", details.get("cached_tokens"))),
                     float(usage["x_cost_usd"]) if isinstance(usage.get("x_cost_usd"), (int, float)) else 0.0)


def _count(value: Any) -> int:
    return value if isinstance(value, int) and value >= 0 else 0

