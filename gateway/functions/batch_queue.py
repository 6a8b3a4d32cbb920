"""The batch worker in AWS: an SQS FIFO queue holds each open batch's next turn, and the
function its event source mapping invokes runs it (template.yaml: BatchQueue,
BatchWorkerFunction, BatchSweepFunction). No loop of its own: SQS keeps the turns, Lambda runs
them, and a schedule sweeps.

- A batch is announced when it is created (`BatchService`'s `announce`): a message naming it,
  in its tenant's message group, so that SQS hands one tenant's batches to one worker at a
  time, in turn, while other tenants' run beside them (the function's reserved concurrency
  bounds how many at once; the scorer's line serves their lines fairly in any case).
- A turn runs the batch for up to TURN_S, or what the invocation has left less the longest a
  line may take. With lines runnable now, its next turn is announced at the back of its group;
  with lines waiting for a Retry-After, the message itself comes back when they may run (its
  visibility set to the wait, the message reported as not processed); an ended batch's message
  is deleted. A turn that fails comes back after the queue's visibility timeout, and after
  MAX_RECEIVES the dead-letter queue keeps it (an alarm watches that queue).
- The sweep (every SWEEP_MINUTES) removes expired files and uploads, announces every open
  batch that no worker has held for STALLED_S (its message lost or dead-lettered), and
  publishes BatchesPastWindow: open batches more than an hour past their window, which a
  working queue would have ended (an alarm watches it).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
import uuid
from typing import Any

from gateway.batches.model import BatchStore
from gateway.batches.worker import MAX_RETRY_WAIT_S

log = logging.getLogger("gateway.batches.queue")
TURN_S = 120.0  # a batch's turn before its tenant's next batch has one
LINE_RESERVE_S = 65.0  # the longest a line may take (a streaming route's 58 s) and a margin
STALLED_S = 900.0  # an open batch no worker held this long is announced again by the sweep
PAST_WINDOW_S = 3600.0  # an open batch this far past its window is stuck (BatchesPastWindow)
SWEEP_MINUTES = 10
MAX_RECEIVES = 100  # the queue's redrive policy: a turn that fails (or waits) this often is dead-lettered


class BatchQueue:
    """The queue of batches' turns: one message per turn, grouped by tenant."""

    def __init__(self, sqs: Any, url: str) -> None:
        self.sqs = sqs
        self.url = url

    def announce(self, batch_id: str, tenant_id: str) -> None:
        # The group is a hash of the tenant (a message's attributes show in the console and in
        # logs; a tenant id is nobody's business there); each turn is a message of its own.
        self.sqs.send_message(QueueUrl=self.url, MessageBody=json.dumps({"batch_id": batch_id, "tenant_id": tenant_id}),
                              MessageGroupId=hashlib.sha256(tenant_id.encode()).hexdigest()[:32],
                              MessageDeduplicationId=uuid.uuid4().hex)

    def come_back_in(self, receipt: str, seconds: float) -> None:
        """The message in hand returns to the queue after `seconds` (SQS takes up to 12 hours)."""
        self.sqs.change_message_visibility(QueueUrl=self.url, ReceiptHandle=receipt,
                                           VisibilityTimeout=min(43_200, max(1, math.ceil(seconds))))


def take_turn(worker: Any, store: BatchStore, queue: BatchQueue, record: dict[str, Any], remaining_s: float,
              max_lines: int | None = None) -> bool:
    """One message's turn of its batch (of at most `max_lines` lines); False when the message is
    to come back (not processed)."""
    try:
        message = json.loads(record["body"])
        batch_id, tenant_id = str(message["batch_id"]), str(message["tenant_id"])
    except (ValueError, KeyError, TypeError):
        log.error("a batch queue message names no batch; dropped", extra={"message_id": record.get("messageId")})
        return True
    now = worker.clock()
    until = now + min(TURN_S, remaining_s - LINE_RESERVE_S)
    if not worker.run(batch_id, tenant_id, until, max_lines):
        return True  # ended: nothing comes after this turn
    wait = next_turn_in(store, batch_id, worker.clock())
    if wait <= 0:
        queue.announce(batch_id, tenant_id)
        return True
    queue.come_back_in(record["receiptHandle"], wait)
    return False


def next_turn_in(store: BatchStore, batch_id: str, now: float) -> float:
    """Seconds until the batch has work: 0 with a line runnable now (or no ledger yet: it was
    validated), else until its first line waiting for a retry may run (a minute at most)."""
    if store.runnable_lines(batch_id, now, 1) or next(store.unfinished_lines(batch_id), None) is None:
        return 0.0
    soon = store.runnable_lines(batch_id, now + MAX_RETRY_WAIT_S, 1)
    return max(1.0, soon[0].not_before - now) if soon else MAX_RETRY_WAIT_S


def sweep(store: BatchStore, queue: BatchQueue, now: float) -> dict[str, int]:
    """Expired files and uploads removed, stalled batches announced, stuck ones counted."""
    removed = store.delete_expired(now)
    announced = stuck = 0
    for batch in store.stalled(now, STALLED_S):
        queue.announce(batch.id, batch.tenant_id)
        announced += 1
    stuck = sum(1 for batch in store.open_batches() if now > batch.expires_at + PAST_WINDOW_S)
    return {"removed": removed, "announced": announced, "past_window": stuck}


# -- the functions ------------------------------------------------------------------------------


def _queue() -> BatchQueue:
    from gateway.functions.composition import build_batch_queue
    from gateway.settings import AuthSettings

    queue = build_batch_queue(AuthSettings.from_env())
    if queue is None:
        raise RuntimeError("the batch worker needs its queue: GATEWAY_BATCH_QUEUE_URL")
    return queue


def worker_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """BatchWorkerFunction: the turns SQS hands it (one at a time: its event source mapping's
    batch size), as the gateway function's own routes run each line."""
    from gateway.functions.batch_worker import batch_store, build_worker
    from gateway.functions.handler import built_function

    function = built_function()
    store = batch_store(function)
    worker = build_worker(function, owner=f"lambda-{getattr(context, 'aws_request_id', uuid.uuid4().hex)}")
    queue = _queue()
    failures = []
    for record in event.get("Records", []):
        remaining_s = context.get_remaining_time_in_millis() / 1000 if context is not None else 300.0
        try:
            done = take_turn(worker, store, queue, record, remaining_s)
        except Exception:
            log.exception("a batch turn failed; its message comes back after the queue's visibility timeout")
            done = False
        if not done:
            failures.append({"itemIdentifier": record["messageId"]})
    return {"batchItemFailures": failures}


def sweep_handler(event: dict[str, Any], context: Any) -> dict[str, int]:
    """BatchSweepFunction: the schedule's sweep, and the BatchesPastWindow metric."""
    from gateway.functions.composition import build_stores
    from gateway.observability import configure_logging, metrics
    from gateway.settings import AuthSettings

    configure_logging()
    stores = build_stores(AuthSettings.from_env())
    if stores is None or stores.batches is None:
        raise RuntimeError("the batch sweep needs the batch store: GATEWAY_BATCHES_TABLE and GATEWAY_BATCH_BUCKET")
    summary = sweep(stores.batches, _queue(), time.time())
    recorder = metrics()
    recorder.add_metric(name="BatchesPastWindow", unit="Count", value=summary["past_window"])
    recorder.flush_metrics()
    log.info("batch sweep", extra={"summary": summary})
    return summary
