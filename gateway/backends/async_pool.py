"""The asynchronous pool: SageMaker Asynchronous Inference through S3 (template.yaml: AsyncEndpoint).

One invocation carries a turn's lines (`gateway.backends.deferred.Asked`) as one JSONL object
(`async/in/<batch>/<submission>.jsonl`, its tenant and batch in the object's metadata), in the
scorer's lines format (scorer_container.lines). SageMaker queues it (for up to REQUEST_TTL_S,
while the pool scales up from none), runs it for up to INVOCATION_TIMEOUT_S, writes the answer to
`async/out/` or the reason it failed to `async/failed/`, and says so on the pool's SNS topics.
What the worker keeps of an invocation is a `Submission`: where its answer or failure will be,
and until when either may still come; `outcome` reads which it is.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any, Literal

from gateway.backends.deferred import Asked, PoolAnswer, read_line_id

log = logging.getLogger("gateway.backends.async_pool")
INPUT_PREFIX = "async/in/"  # the bucket's prefixes (template.yaml grants each function its own)
OUTPUT_PREFIX = "async/out/"
FAILURE_PREFIX = "async/failed/"
JSONLINES = "application/jsonlines"
REQUEST_TTL_S = 6 * 3600  # how long SageMaker keeps an invocation queued (a pool scaling up from none)
INVOCATION_TIMEOUT_S = 3600  # SageMaker's most: an invocation's lines answered within the hour
MAX_OUTPUT_BYTES = 64 << 20  # an output read back at most (500 lines' answers: a few MB; past it, lines are resent)
FAILURE_READ_BYTES = 2048


@dataclass(frozen=True, slots=True)
class Submission:
    """One invocation, as the lines it carries keep it (`Line.submission`)."""

    id: str  # its InferenceId: the batch's id and a token
    output: str  # the S3 URI its answer is written to
    failure: str  # the S3 URI its failure is written to
    until: float  # past this (queued and run at their longest), neither will come

    def text(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def read(cls, text: str) -> Submission:
        return cls(**json.loads(text))


@dataclass(frozen=True, slots=True)
class Outcome:
    state: Literal["answered", "failed", "waiting"]
    answers: dict[str, PoolAnswer]  # by request id (answered)
    reason: str = ""  # why it failed


class AsyncPool:
    def __init__(self, sagemaker: Any, s3: Any, bucket: str, endpoint_name: str, *,
                 clock: Callable[[], float] = time.time) -> None:
        self.sagemaker = sagemaker  # botocore's sagemaker-runtime client
        self.s3 = s3
        self.bucket = bucket
        self.endpoint_name = endpoint_name
        self.clock = clock

    def submit(self, tenant_id: str, batch_id: str, asked: list[Asked]) -> Submission:
        """The lines as one invocation: its input written, then the invocation queued."""
        submission_id = f"{batch_id}.{secrets.token_hex(6)}"  # at most 64 characters (InferenceId)
        key = f"{INPUT_PREFIX}{batch_id}/{submission_id}.jsonl"
        self.s3.put_object(Bucket=self.bucket, Key=key, Body=b"".join(a.as_line() for a in asked),
                           ContentType=JSONLINES, Metadata={"tenant": tenant_id, "batch": batch_id})
        sent_at = self.clock()
        reply = self.sagemaker.invoke_endpoint_async(
            EndpointName=self.endpoint_name, InputLocation=f"s3://{self.bucket}/{key}", ContentType=JSONLINES,
            Accept=JSONLINES, InferenceId=submission_id, RequestTTLSeconds=REQUEST_TTL_S,
            InvocationTimeoutSeconds=INVOCATION_TIMEOUT_S)
        log.info("asynchronous invocation sent", extra={"batch_id": batch_id, "submission": submission_id,
                                                         "lines": len(asked)})
        return Submission(submission_id, reply["OutputLocation"], reply.get("FailureLocation") or "",
                          sent_at + REQUEST_TTL_S + INVOCATION_TIMEOUT_S)

    def outcome(self, submission: Submission) -> Outcome:
        """Its answers, once written; failed, when SageMaker says so or the time for either has
        passed; else waiting."""
        text = self._read(submission.output, MAX_OUTPUT_BYTES)
        if text is not None:
            return Outcome("answered", dict(read_output(text)))
        failure = self._read(submission.failure, FAILURE_READ_BYTES) if submission.failure else None
        if failure is not None:
            return Outcome("failed", {}, failure.decode("utf-8", "replace").strip()[:500] or "the invocation failed")
        if self.clock() > submission.until:
            return Outcome("failed", {}, "the invocation neither answered nor failed in its time")
        return Outcome("waiting", {})

    def sent_lines(self, input_location: str) -> tuple[dict[str, str], list[str]]:
        """An invocation's input, as the pool's notice names it: its metadata (tenant, batch)
        and its lines' request ids."""
        bucket, key = _bucket_and_key(input_location)
        if bucket != self.bucket or not key.startswith(INPUT_PREFIX):
            raise ValueError("the notice names an input this gateway did not write")
        reply = self.s3.get_object(Bucket=bucket, Key=key)
        ids = []
        for raw in reply["Body"].iter_lines():
            try:
                found = read_line_id(json.loads(raw).get("id"))
            except (ValueError, AttributeError):
                found = None
            if found is not None:
                ids.append(found[0])
        return dict(reply.get("Metadata") or {}), ids

    def _read(self, uri: str, limit: int) -> bytes | None:
        bucket, key = _bucket_and_key(uri)
        try:
            reply = self.s3.get_object(Bucket=bucket, Key=key)
        except self.s3.exceptions.NoSuchKey:
            return None
        return reply["Body"].read(limit)  # past the limit, the lines cut off are not answered: sent again


def read_output(text: bytes) -> Iterator[tuple[str, PoolAnswer]]:
    """The output's lines, each as (request id, answer); a line this gateway cannot read is left
    out (its request waits, and is sent again when its invocation's time has passed)."""
    for raw in text.splitlines():
        try:
            line = json.loads(raw)
            found = read_line_id(line.get("id"))
            status = line.get("status")
        except (ValueError, AttributeError):
            continue
        if found is None or not isinstance(status, int) or isinstance(status, bool):
            continue
        busy = line.get("x_busy_ms")
        busy_s = busy / 1000 if isinstance(busy, int) and not isinstance(busy, bool) and 0 <= busy <= 3_600_000 else None
        yield found[0], PoolAnswer(found[1], status, json.dumps(line.get("body"), separators=(",", ":")).encode(), busy_s)


def _bucket_and_key(uri: str) -> tuple[str, str]:
    if not uri.startswith("s3://") or "/" not in uri[5:]:
        raise ValueError(f"not an S3 location: {uri[:200]!r}")
    bucket, key = uri[5:].split("/", 1)
    return bucket, key
