"""The batch worker in AWS: an SQS FIFO queue holds each open batch's next turn, and the
function its event source mapping invokes runs it (template.yaml: BatchQueue,
BatchWorkerFunction, BatchSweepFunction). No loop of its own: SQS keeps the turns, Lambda runs
them, and a schedule sweeps.

A batch's way through it:

1. `POST /v1/batches` (`BatchService.create`) stores the batch and announces it
   (`BatchQueue.announce`): the store gives the batch a new turn number (`next_turn`) and a
   message naming batch and turn goes to the queue, in its tenant's message group.
2. SQS hands a group's messages out one at a time: a tenant's batches run one after another,
   in turn, while other tenants' run beside them (the event source's maximum concurrency, 4,
   bounds how many at once; the scorer's line serves their lines fairly in any case).
3. `worker_handler` takes the message (`take_turn`): a message whose turn is no longer the
   batch's is a stale copy, dropped. Otherwise `BatchWorker.run` works on the batch for up to
   TURN_S (the first turn reads and validates its input file into the ledger), each line
   through the gateway's own routes at the bulk priority, then lets its lease go.
4. More to do now: the next turn is announced at the back of the group, and this message is
   done. Lines waiting for an asynchronous invocation: the message is done, and the pool's
   notice (`wake`) announces the next turn. Lines waiting for a Retry-After (the scorer
   busy): when another of the tenant's batches can run now, its next turn goes to the back of
   the group, so that a waiting batch never holds its tenant's others up; else the message
   itself comes back when they may run (its visibility, at least MIN_COME_BACK_S; the message
   reported as not processed). Ended:
   nothing follows (a batch that did not end after all, its end refused by a cancel at the
   same moment, is announced again).
5. The last turn writes the output and error files (S3 `files/`) and drops the ledger.

A turn that fails comes back after the queue's visibility timeout (its tenant's group waits for
it meanwhile); after MAX_RECEIVES receives (failures and waits alike: a day of waits) the
dead-letter queue keeps it. The sweep
(every SWEEP_MINUTES) removes expired files and uploads, announces again every open batch that
nothing touched for STALLED_S (its turn lost or dead-lettered, or an asynchronous pool's notice
lost: the new turn makes any old message stale), and publishes BatchesPastWindow: open batches more than PAST_WINDOW_S past their
window, which a working queue would have ended. Alarms watch that metric and the dead-letter queue.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from gateway.backends.async_pool import AsyncPool, Submission
from gateway.batches.model import BatchStore
from gateway.batches.worker import MAX_RETRY_WAIT_S, AsyncLines, BatchWorker
from gateway.stores.sqs import BatchQueue

log = logging.getLogger("gateway.functions.batch_queue")
TURN_S = 120.0  # a batch's turn before its tenant's next batch has one
STALLED_S = 3600.0  # nothing touched an open batch this long: announced again (a tenant's 10 batches cycle in 20 min)
PAST_WINDOW_S = 3600.0  # an open batch this far past its window is stuck (BatchesPastWindow)
SWEEP_MINUTES = 10  # the sweep's schedule (template.yaml: BatchSweepFunction)
MAX_RECEIVES = 2880  # the queue's redrive policy: a day of waits (MIN_COME_BACK_S) before a turn is dead-lettered
HELD_ELSEWHERE_S = 30.0  # a batch another worker holds: its message comes back after this
INDEX_LAG_S = 5.0


def take_turn(worker: BatchWorker, queue: BatchQueue, record: dict[str, Any], remaining_s: float,
              max_lines: int | None = None) -> bool:
    """One message's turn of its batch (of at most `max_lines` lines); False when the message
    is to come back (not processed)."""
    try:
        message = json.loads(record["body"])
        batch_id, tenant_id, turn = str(message["batch_id"]), str(message["tenant_id"]), int(message["turn"])
    except (ValueError, KeyError, TypeError):
        log.error("a batch queue message names no batch; dropped", extra={"message_id": record.get("messageId")})
        return True
    store = worker.store
    if store.turn_of(batch_id) != turn:
        return True  # a stale copy (the sweep announced the batch again), or the batch ended
    started = worker.clock()
    # The turn stops in time for its last line to end before the invocation does
    more = worker.run(batch_id, tenant_id, started + min(TURN_S, remaining_s - worker.lease_s), max_lines)
    now = worker.clock()
    if not more:
        if store.turn_of(batch_id) is not None:  # still open: its end lost a race with a cancel
            queue.announce(batch_id, tenant_id)
        return True
    if not store.lease(batch_id, worker.owner, now, now):  # let its lease go: the next turn is anyone's
        queue.come_back_in(record["receiptHandle"], HELD_ELSEWHERE_S)
        return False
    if worker.async_lines is not None and (waits_for_pool(store, batch_id, now, worker.async_lines.poll_s)
                                           or worker.pool_is_full(batch_id, tenant_id)):
        # Its lines wait for their invocations (or for room among them): a notice gives the batch
        # its next turn (the sweep, if the notices are lost). A message kept to come back would
        # hold the tenant's group shut.
        return True
    wait = next_turn_in(store, batch_id, now)
    if wait > 0 and not _others_ready(store, batch_id, tenant_id, now):
        queue.come_back_in(record["receiptHandle"], wait)
        return False
    queue.announce(batch_id, tenant_id)
    return True


def next_turn_in(store: BatchStore, batch_id: str, now: float) -> float:
    """Seconds until the batch has a line to run: 0 with one runnable now, else until the first
    waiting for a retry may run (a minute at most); none seen at all is an index still catching
    up with a ledger just written, a few seconds behind."""
    if store.runnable_lines(batch_id, now, 1):
        return 0.0
    soon = store.runnable_lines(batch_id, now + MAX_RETRY_WAIT_S, 1)
    return max(1.0, soon[0].not_before - now) if soon else INDEX_LAG_S


def waits_for_pool(store: BatchStore, batch_id: str, now: float, poll_s: float) -> bool:
    """No line of the batch may run within a retry's wait, and some wait for an asynchronous
    invocation (looked at again within `poll_s`)."""
    return not store.runnable_lines(batch_id, now + MAX_RETRY_WAIT_S, 1) and bool(
        store.runnable_lines(batch_id, now + poll_s + 1, 1))


def _others_ready(store: BatchStore, batch_id: str, tenant_id: str, now: float) -> bool:
    """Another of the tenant's open batches has work now (validation, or a runnable line)."""
    return any(b.tenant_id == tenant_id and b.id != batch_id
               and (b.status != "in_progress" or store.runnable_lines(b.id, now, 1)) for b in store.open_batches())


def sweep(store: BatchStore, queue: BatchQueue, now: float) -> dict[str, int]:
    """Expired files and uploads removed, stalled batches announced, stuck ones counted."""
    removed = store.delete_expired(now)
    announced = 0
    for batch in store.stalled(now, STALLED_S):
        try:
            announced += queue.announce(batch.id, batch.tenant_id)
        except Exception:  # one batch's announcement failing leaves the others' and the metric to come
            log.exception("a stalled batch could not be announced", extra={"batch_id": batch.id})
    stuck = sum(1 for batch in store.open_batches() if now > batch.expires_at + PAST_WINDOW_S)
    return {"removed": removed, "announced": announced, "past_window": stuck}


def wake(store: BatchStore, queue: BatchQueue, pool: AsyncPool, message: dict[str, Any], now: float) -> int:
    """An asynchronous invocation's notice (answered or failed): its lines that still wait for it
    may run now, and their batch has a turn, and so have its tenant's other open batches (the
    invocation's end may make room for theirs). The lines it names are read from the sidecar the
    gateway wrote before sending it (the notice's own fields are only where to look). The lines
    woken (made runnable: one past its poll is, and is given its turn all the same)."""
    submission_id = message.get("inferenceId")
    location = (message.get("requestParameters") or {}).get("inputLocation")
    if not isinstance(submission_id, str) or not isinstance(location, str):
        log.error("an asynchronous pool's notice names no invocation; dropped")
        return 0
    tenant_id, batch_id, request_ids = pool.sent_lines(location)
    if store.turn_of(batch_id) is None:
        return 0  # the batch ended (cancelled, expired) meanwhile
    woken = waiting = 0
    for request_id in request_ids:
        number = request_id.rpartition("_")[2]
        line = store.get_line(batch_id, int(number)) if number.isdigit() else None
        if line is None or line.state == "done" or line.submission is None:
            continue
        if Submission.read(line.submission).id != submission_id:
            continue  # sent again since
        waiting += 1
        if line.not_before > now:  # (one past its poll is runnable already, and waits for a turn all the same)
            line.not_before = now
            woken += store.put_line(line, expect_tries=line.tries)
    if waiting:
        queue.announce(batch_id, tenant_id)
        for other in store.open_batches():
            if other.tenant_id == tenant_id and other.id != batch_id:
                queue.announce(other.id, tenant_id)
    log.info("asynchronous invocation ended", extra={"batch_id": batch_id, "submission": submission_id,
                                                     "status": message.get("invocationStatus"), "woken": woken,
                                                     "waiting": waiting})
    return woken


# -- the functions ------------------------------------------------------------------------------


def _queue(store: BatchStore) -> BatchQueue:
    from gateway.functions.composition import build_batch_queue
    from gateway.settings import AuthSettings

    queue = build_batch_queue(AuthSettings.from_env(), store)
    if queue is None:
        raise RuntimeError("the batch worker needs its queue: GATEWAY_BATCH_QUEUE_URL")
    return queue


_async: tuple[Any, AsyncLines] | None = None  # the asynchronous pool's function and lines, built once


def _worker_function() -> tuple[Any, AsyncLines | None]:
    """The gateway function the worker runs lines through: the instance's own, or (an
    asynchronous pool configured) one built on that pool's answer book."""
    global _async
    from gateway.functions.composition import build_async_lines
    from gateway.functions.handler import GatewayFunction, built_function
    from gateway.settings import AuthSettings, GatewaySettings

    if _async is None:
        if not AuthSettings.from_env().async_endpoint:
            return built_function(), None
        services, lines = build_async_lines(GatewaySettings.from_env())
        _async = GatewayFunction(services), lines
    return _async


def worker_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """BatchWorkerFunction: the turns SQS hands it (one at a time: its event source mapping's
    batch size), each line run as the gateway function's own routes run it."""
    from gateway.functions.batch_worker import batch_store, build_worker

    function, async_lines = _worker_function()
    store = batch_store(function)
    worker = build_worker(function, owner=f"lambda-{getattr(context, 'aws_request_id', '')}", async_lines=async_lines)
    queue = _queue(store)
    failures = []
    for record in event.get("Records", []):
        remaining_s = context.get_remaining_time_in_millis() / 1000 if context is not None else 300.0
        try:
            processed = take_turn(worker, queue, record, remaining_s)
        except Exception:
            log.exception("a batch turn failed; its message comes back after the queue's visibility timeout")
            processed = False
        if not processed:
            failures.append({"itemIdentifier": record["messageId"]})
    return {"batchItemFailures": failures}


def sweep_handler(event: dict[str, Any], context: Any) -> dict[str, int]:
    """BatchSweepFunction: the schedule's sweep, and the BatchesPastWindow metric."""
    from gateway.functions.composition import build_batch_store
    from gateway.observability import configure_logging, metrics
    from gateway.settings import AuthSettings

    configure_logging()
    store = build_batch_store(AuthSettings.from_env())
    if store is None:
        raise RuntimeError("the batch sweep needs the batch store: GATEWAY_BATCHES_TABLE and GATEWAY_BATCH_BUCKET")
    summary = sweep(store, _queue(store), time.time())
    recorder = metrics()
    recorder.add_metric(name="BatchesPastWindow", unit="Count", value=summary["past_window"])
    recorder.flush_metrics()
    log.info("batch sweep", extra={"summary": summary})
    return summary


def notice_handler(event: dict[str, Any], context: Any) -> dict[str, int]:
    """BatchNoticeFunction: the asynchronous pool's SNS notices, success and failure alike."""
    from gateway.functions.composition import build_async_pool, build_batch_store
    from gateway.observability import configure_logging
    from gateway.settings import AuthSettings

    configure_logging()
    settings = AuthSettings.from_env()
    store = build_batch_store(settings)
    if store is None:
        raise RuntimeError("the notices need the batch store: GATEWAY_BATCHES_TABLE and GATEWAY_BATCH_BUCKET")
    pool = build_async_pool(settings)
    queue, woken = _queue(store), 0
    for record in event.get("Records", []):
        try:
            message = json.loads(record["Sns"]["Message"])
        except (KeyError, TypeError, ValueError):
            log.error("an SNS record without a JSON message; dropped")
            continue
        try:
            woken += wake(store, queue, pool, message if isinstance(message, dict) else {}, time.time())
        except ValueError:  # an input this gateway did not write: nothing of its own to wake
            log.error("an asynchronous pool's notice names an input that is not this gateway's; dropped")
    return {"woken": woken}
