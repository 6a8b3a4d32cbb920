"""The SQS adapter: the queue of batches' turns (`gateway.functions.batch_queue` says how a batch
moves through it). One message per turn, in its tenant's FIFO message group, named by the turn
number the batch store gave it, so that a copy of an older turn is known as stale."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from typing import Any

from gateway.batches.model import BatchStore, tenant_hash

MIN_COME_BACK_S = 30.0  # the shortest a message in hand waits: each wait is a receive (the redrive policy counts them)


class BatchQueue:
    """The queue of batches' turns: one message per turn, grouped by tenant."""

    def __init__(self, sqs: Any, url: str, store: BatchStore, clock: Callable[[], float] = time.time) -> None:
        self.sqs = sqs
        self.url = url
        self.store = store
        self.clock = clock

    def announce(self, batch_id: str, tenant_id: str) -> bool:
        """The batch's next turn, at the back of its tenant's group; False for a batch that ended.
        (A send that fails after botocore's own retries leaves the batch with a turn no message
        holds: the sweep announces it again, `gateway.functions.batch_queue.STALLED_S`.)"""
        turn = self.store.next_turn(batch_id, self.clock())
        if turn is None:
            return False
        # The group names the tenant by a hash (group ids show in the console and in metrics);
        # the deduplication id is the turn's own, so a send retried by botocore is one message.
        self.sqs.send_message(QueueUrl=self.url, MessageGroupId=tenant_hash(tenant_id),
                              MessageBody=json.dumps({"batch_id": batch_id, "tenant_id": tenant_id, "turn": turn}),
                              MessageDeduplicationId=f"{batch_id}-{turn}")
        return True

    def come_back_in(self, receipt: str, seconds: float) -> None:
        """The message in hand returns to the queue after `seconds` (SQS takes up to 12 hours)."""
        self.sqs.change_message_visibility(QueueUrl=self.url, ReceiptHandle=receipt,
                                           VisibilityTimeout=min(43_200, math.ceil(max(MIN_COME_BACK_S, seconds))))
