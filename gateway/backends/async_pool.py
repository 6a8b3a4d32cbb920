"""The asynchronous pool: SageMaker Asynchronous Inference through S3 (template.yaml: AsyncEndpoint).

One invocation carries some of a batch's lines (`gateway.backends.deferred.Asked`: as many as
their deadlines fit in LINES_BUDGET_S) as one JSONL object (`async/in/<batch>/<submission>.jsonl`,
its tenant and batch in the object's metadata), in the format systemone.lines holds. SageMaker
queues it (for up to REQUEST_TTL_S, while the pool scales up from none), runs it for up to
INVOCATION_TIMEOUT_S (the scorer stops its lines LINES_BUDGET_S in, so that the answer is written
in time), writes the answer to `async/out/` or the reason it failed to `async/failed/`, and says
so on the pool's SNS topics. Beside the input, a sidecar (`<submission>.json`) says which lines
it carries (what its notice wakes, with no need to read the input) and, once it is sent, where
its answer or failure will be. What a line keeps of its invocation is a `Submission` (which one,
until when an answer may come, how often the line was sent); `outcome` reads what came of it.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import Any, Literal

from gateway.backends.deferred import Asked, PoolAnswer, read_line_id
from systemone.lines import JSONLINES, MAX_INVOCATION_S, read_out_line
from systemone.sidechannel import attributes

log = logging.getLogger("gateway.backends.async_pool")
INPUT_PREFIX = "async/in/"  # the bucket's prefixes (template.yaml grants each function its own)
OUTPUT_PREFIX = "async/out/"
FAILURE_PREFIX = "async/failed/"
REQUEST_TTL_S = 6 * 3600  # how long SageMaker keeps an invocation queued (a pool scaling up from none)
INVOCATION_TIMEOUT_S = int(MAX_INVOCATION_S)  # SageMaker's most
# The scorer's own deadline for the invocation's lines, before SageMaker's: the answer is still
# to be written back when the last line ends. An invocation carries lines whose deadlines fit it.
LINES_BUDGET_S = MAX_INVOCATION_S - 120
MAX_OUTPUT_BYTES = 64 << 20  # an output read back at most (its lines' answers: a few MB; past it, lines are resent)
FAILURE_READ_BYTES = 2048
SENT_WITHIN_S = 300.0  # a prepared invocation is sent at once: past this, its worker died or failed before
_GONE = ("NoSuchKey", "AccessDenied", "404", "403")  # without s3:ListBucket (no role has it) a missing key is 403


@dataclass(frozen=True, slots=True)
class Submission:
    """One invocation, as a line it carries keeps it (`Line.submission`): kept on its lines
    before the invocation is made, so that its notice always finds them marked."""

    id: str  # its InferenceId: the batch's id and a token ("": taken, not sent yet)
    key: str  # its input's key; beside it, its sidecar (`.json`): tenant, batch, lines, and where its answer goes
    sent_at: float
    until: float  # past this (queued and run at their longest), no answer will come
    sends: int = 1  # how often this line's request has been sent (MAX_ASYNC_SENDS bounds it)

    def text(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def read(cls, text: str) -> Submission:
        return cls(**json.loads(text))


@dataclass(frozen=True, slots=True)
class Outcome:
    state: Literal["answered", "failed", "waiting"]
    answers: dict[str, PoolAnswer]  # by request id (answered: those asked for)
    reason: str = ""  # why it failed


class AsyncPool:
    def __init__(self, sagemaker: Any, s3: Any, bucket: str, endpoint_name: str, *,
                 clock: Callable[[], float] = time.time) -> None:
        self.sagemaker = sagemaker  # botocore's sagemaker-runtime client
        self.s3 = s3
        self.bucket = bucket
        self.endpoint_name = endpoint_name
        self.clock = clock

    def prepare(self, tenant_id: str, batch_id: str, asked: list[Asked]) -> Submission:
        """The invocation's input and its sidecar written (which lines it carries, for its
        notice), not yet sent: its lines are marked with it first (`send` sends it)."""
        submission_id = f"{batch_id}.{secrets.token_hex(6)}"  # at most 64 characters (InferenceId)
        key = f"{INPUT_PREFIX}{batch_id}/{submission_id}.jsonl"
        self.s3.put_object(Bucket=self.bucket, Key=key, Body=b"".join(a.as_line() for a in asked),
                           ContentType=JSONLINES)
        self._sidecar(key, {"tenant": tenant_id, "batch": batch_id, "lines": [a.request_id for a in asked]})
        now = self.clock()
        return Submission(submission_id, key, now, now + REQUEST_TTL_S + INVOCATION_TIMEOUT_S)

    def send(self, submission: Submission, tenant_id: str, batch_id: str, lines: list[str]) -> None:
        """The invocation queued, and where its answer or failure will be written kept in its
        sidecar (read by `outcome`)."""
        reply = self.sagemaker.invoke_endpoint_async(
            EndpointName=self.endpoint_name, InputLocation=f"s3://{self.bucket}/{submission.key}",
            ContentType=JSONLINES, Accept=JSONLINES, InferenceId=submission.id, RequestTTLSeconds=REQUEST_TTL_S,
            InvocationTimeoutSeconds=INVOCATION_TIMEOUT_S,
            CustomAttributes=attributes("systemone", int(LINES_BUDGET_S * 1000)))
        self._sidecar(submission.key, {"tenant": tenant_id, "batch": batch_id, "lines": lines,
                                       "output": reply["OutputLocation"], "failure": reply.get("FailureLocation")})
        log.info("asynchronous invocation sent", extra={"batch_id": batch_id, "submission": submission.id,
                                                         "lines": len(lines)})

    def outcome(self, submission: Submission, wanted: set[str]) -> Outcome:
        """Its answers to the `wanted` requests (by id), once written; failed, when SageMaker says
        so, when it was never sent (its sidecar says no answer's place SENT_WITHIN_S after it was
        prepared) or when its time has passed; else waiting. The output is read as it streams:
        only the answers wanted are kept."""
        sidecar = self._read_sidecar(submission.key) or {}
        if not sidecar.get("output"):
            if self.clock() > submission.sent_at + SENT_WITHIN_S:
                return Outcome("failed", {}, "the invocation was prepared and never sent")
            return Outcome("waiting", {})
        body = self._open(sidecar["output"])
        if body is not None:
            return Outcome("answered", dict(read_output(_lines_of(body, MAX_OUTPUT_BYTES), wanted)))
        failure = self._open(sidecar["failure"]) if sidecar.get("failure") else None
        if failure is not None:
            reason = failure.read(FAILURE_READ_BYTES).decode("utf-8", "replace").strip()[:500]
            return Outcome("failed", {}, reason or "the invocation failed")
        if self.clock() > submission.until:
            return Outcome("failed", {}, "the invocation neither answered nor failed in its time")
        return Outcome("waiting", {})

    def sent_lines(self, input_location: str) -> tuple[str, str, list[str]]:
        """An invocation, as the pool's notice names its input: its tenant, its batch and its
        lines' request ids, from the sidecar written before it was sent."""
        bucket, key = _bucket_and_key(input_location)
        if bucket != self.bucket or not key.startswith(INPUT_PREFIX) or not key.endswith(".jsonl"):
            raise ValueError("the notice names an input this gateway did not write")
        sidecar = self._read_sidecar(key)
        if sidecar is None:
            raise ValueError("the notice names an input without its sidecar (expired, or not this gateway's)")
        return str(sidecar["tenant"]), str(sidecar["batch"]), [str(line) for line in sidecar["lines"]]

    def _sidecar(self, key: str, document: dict[str, Any]) -> None:
        self.s3.put_object(Bucket=self.bucket, Key=_sidecar_key(key), Body=json.dumps(document).encode(),
                           ContentType="application/json")

    def _read_sidecar(self, key: str) -> dict[str, Any] | None:
        body = self._open(f"s3://{self.bucket}/{_sidecar_key(key)}")
        return None if body is None else json.loads(body.read())

    def _open(self, uri: str) -> Any:
        """The object's body as it streams, or None when it is not (yet) there."""
        bucket, key = _bucket_and_key(uri)
        try:
            return self.s3.get_object(Bucket=bucket, Key=key)["Body"]
        except self.s3.exceptions.ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in _GONE:
                return None
            raise


def _sidecar_key(key: str) -> str:
    return key.removesuffix(".jsonl") + ".json"


def read_output(lines: Iterable[bytes], wanted: set[str] | None = None) -> Iterator[tuple[str, PoolAnswer]]:
    """The output's lines, each as (request id, answer), of the `wanted` requests (None: all); a
    line this gateway cannot read is left out (its request is sent again)."""
    for raw in lines:
        line = read_out_line(raw)
        found = read_line_id(line.id) if line is not None else None
        if line is None or found is None or (wanted is not None and found[0] not in wanted):
            continue
        yield found[0], PoolAnswer(found[1], line.status, line.body, line.busy_s)


def _lines_of(body: Any, limit: int) -> Iterator[bytes]:
    """The body's lines as they stream, up to `limit` bytes (the lines past it are not read)."""
    read = 0
    for raw in body.iter_lines():
        read += len(raw) + 1
        if read > limit:
            body.close()
            return
        yield raw


def _bucket_and_key(uri: str) -> tuple[str, str]:
    if not uri.startswith("s3://") or "/" not in uri[5:]:
        raise ValueError(f"not an S3 location: {uri[:200]!r}")
    bucket, key = uri[5:].split("/", 1)
    return bucket, key
