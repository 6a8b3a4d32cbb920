"""A backend for batch lines sent to an asynchronous pool: it answers a line's request from the
pool's output when the pool has written it, and otherwise takes the request down to be sent.

SageMaker's Asynchronous Inference answers later, in S3; the gateway's after-steps (admission,
calibration, policy, records, spend) run in the request's own route. So a line on that pool
runs through its route twice (`gateway.batches.worker`), with this backend in place of the
SageMaker invoker:

1. Its answer is not in the book: the route's call is taken down (`Asked`: the line's request as
   the scorer reads it, and its custom attributes) and refused with `AnsweredLater` (which the
   endpoint pool passes on as it is: no fallback, no circuit), so the route ends as a 503 that
   records nothing and charges nothing. The worker sends what was
   taken, a turn's lines at a time, as one invocation (`gateway.backends.async_pool`).
2. The pool has written its output: the worker puts each line's answer in the book (`learn`)
   and runs the line again. The same request (its route and body, digest for digest) gets its
   answer, or the error its status is (`sagemaker.container_error`, as a real-time answer's);
   a request that changed meanwhile (a catalog entry it names was edited) is not answered
   with another's answer, and one the pool did not run (busy: 429, 503) is not an error: both
   are taken down and sent again. No answer here reaches an endpoint's circuit as busy.

The book's `clock` runs ahead by the scorer's time for each answer it gives (`x_busy_ms`),
so the pool that times the attempt charges the line what the scorer spent on it, not the
instant the book took to answer.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass
from typing import Any

from gateway.backends.base import (
    ANONYMOUS,
    Caller,
    Endpoint,
    EndpointFailed,
    StreamedAnswer,
)
from gateway.backends.sagemaker import container_error, deadline_ms
from gateway.errors import AnsweredLater
from systemone.lines import busy_seconds, in_line
from systemone.sidechannel import Route, attributes

RESEND = frozenset({429, 503})  # a line the pool did not run (busy, its share taken): sent again, never a failure


def digest(route: Route, body: bytes) -> str:
    return hashlib.sha256(route.encode() + b"\n" + body).hexdigest()


@dataclass(frozen=True, slots=True)
class Asked:
    """A line's request as the asynchronous pool's scorer reads it (scorer_container.lines)."""

    request_id: str
    route: Route
    body: bytes  # the scorer's JSON body
    attributes: str  # what the custom attributes header says for a single request
    deadline_s: float  # its deadline there (what the attributes say): an invocation's lines fit its hour

    @property
    def line_id(self) -> str:
        """Its id in the invocation: the line's request id and the digest of what was sent, so
        that an answer is only ever given to the request it answers."""
        return f"{self.request_id}#{digest(self.route, self.body)}"

    def as_line(self) -> bytes:
        return in_line(self.line_id, self.route, self.attributes, self.body)


def read_line_id(line_id: Any) -> tuple[str, str] | None:
    """(request id, digest) from an output line's id, or None for an id this gateway never sent."""
    if not isinstance(line_id, str) or line_id.count("#") != 1:
        return None
    request_id, sent = line_id.split("#")
    return (request_id, sent) if request_id and len(sent) == 64 else None


@dataclass(frozen=True, slots=True)
class PoolAnswer:
    """One line of the pool's output: the scorer's status and body for the request of `digest`."""

    digest: str
    status: int
    body: bytes
    busy_s: float | None = None  # the scorer's time on the line, as the output says (else its body's usage)


class AnswerBook:
    """The backend of a worker whose lines run on an asynchronous pool (see the module)."""

    def __init__(self, wait_s: int) -> None:
        self.wait_s = wait_s  # the Retry-After of a request taken down (its line waits for the pool)
        self._asked: dict[str, Asked] = {}
        self._answers: dict[str, PoolAnswer] = {}
        self._ahead = 0.0
        self._lock = threading.Lock()

    def clock(self) -> float:
        """Monotonic time, ahead by the scorer time of the answers given (the pools' clock)."""
        return time.monotonic() + self._ahead

    def learn(self, request_id: str, answer: PoolAnswer) -> None:
        with self._lock:
            self._answers[request_id] = answer

    def __contains__(self, request_id: str) -> bool:
        """Whether an answer to this line waits in the book."""
        return request_id in self._answers

    def take(self, request_id: str) -> Asked | None:
        """The request this line's run took down, or None when it was answered or refused
        before it reached a backend; the book keeps nothing of the line after (an answer its
        route never asked for, refused first, is dropped: a warm worker's book stays empty)."""
        with self._lock:
            self._answers.pop(request_id, None)
            return self._asked.pop(request_id, None)

    def invoke(self, endpoint: Endpoint, body: bytes, route: Route, caller: Caller = ANONYMOUS) -> bytes:
        with self._lock:
            answer = self._answers.pop(caller.request_id, None)
            # None yet; another request's (this one changed since it was sent); or busy there (not
            # run in the invocation's hour, or refused its share): sent (again)
            if answer is None or answer.digest != digest(route, body) or answer.status in RESEND:
                timeout_ms = deadline_ms(endpoint)
                self._asked[caller.request_id] = Asked(
                    caller.request_id, route, body,
                    attributes(route, timeout_ms, caller.request_id, tenant=caller.tenant_tag, work=caller.work,
                               weight=caller.weight), timeout_ms / 1000)
                raise AnsweredLater("this request waits for the asynchronous pool's answer", self.wait_s)
            self._ahead += answer.busy_s if answer.busy_s is not None else _busy_s(answer.body)
        if answer.status == 200:
            return answer.body
        raise container_error(endpoint.name, answer.status, answer.body)

    def invoke_stream(self, endpoint: Endpoint, body: bytes, route: Route, caller: Caller,
                      deadline_s: float) -> StreamedAnswer:
        raise EndpointFailed(endpoint.name, "stream_on_async_pool")  # a batch line never streams


def _busy_s(body: bytes) -> float:
    """The scorer's own time on the request, as its answer says (`usage.x_busy_ms`), else 0."""
    try:
        usage: Any = json.loads(body).get("usage")
    except (ValueError, AttributeError):
        return 0.0
    return (busy_seconds(usage.get("x_busy_ms")) if isinstance(usage, dict) else None) or 0.0
