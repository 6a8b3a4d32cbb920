"""The backend interface and its errors.

    EndpointError
     ├── EndpointBusy        saturated, starting, throttled or unreachable: another endpoint may answer
     ├── EndpointTimedOut    the work ran out of time (cut by the scorer, or no answer in time):
     │                       never re-sent, since the same work would run out of time again
     ├── EndpointRejected    the container refused the request (4xx): the same anywhere, never retried
     ├── EndpointRefused     the scorer refused this tenant or this request its share (tenant_share,
     │                       long_share): never the endpoint's saturation, never its circuit's
     ├── EndpointFailed      anything else (a container 5xx, a misconfigured endpoint, a bad reply)
     └── StreamBroken        a streamed answer that began and then failed: too late for another endpoint

Adapters translate their own exceptions into these once, so the domain never sees
botocore.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

from systemone.sidechannel import Route, State, Work


@dataclass(frozen=True, slots=True)
class Endpoint:
    name: str  # the SageMaker endpoint name
    region: str | None = None
    endpoint_url: str | None = None  # a local scorer, or a VPC endpoint
    connect_timeout_s: float = 2.0
    read_timeout_s: float = 25.0
    max_body_bytes: int | None = None  # what it accepts (SageMaker Serverless: 4 MB); None: whatever the gateway does
    usd_per_second: float = 0.0  # what a second of its time costs (0: unpriced)
    billed_by_duration: bool = False  # each invocation billed for its duration (Serverless), not instance hours


@dataclass(frozen=True, slots=True)
class Caller:
    """Whom one call is for, as the scorer tells work apart (systemone.sidechannel): the
    gateway's request id (both deployables log it), the tenant's tag (a keyed hash, never
    its id; "" sends the call to the scorer's shared lane), the kind of work, and the
    tenant's weight against other tenants."""

    request_id: str = ""
    tenant_tag: str = ""
    work: Work = "ordinary"
    weight: float = 1.0


ANONYMOUS = Caller()  # no request id, no tenant: the shared lane


class EndpointError(Exception):
    def __init__(self, endpoint: str, reason: str) -> None:
        super().__init__(f"{endpoint}: {reason}")
        self.endpoint = endpoint
        self.reason = reason  # a short code for logs and metrics, never the raw exception text


class EndpointBusy(EndpointError):
    def __init__(self, endpoint: str, reason: str, retry_after: int | None = None) -> None:
        super().__init__(endpoint, reason)
        self.retry_after = retry_after


class EndpointTimedOut(EndpointError):
    """`answered`: the scorer itself said it cut the job (it is healthy); otherwise nothing came back."""

    def __init__(self, endpoint: str, reason: str, answered: bool) -> None:
        super().__init__(endpoint, reason)
        self.answered = answered


class EndpointRejected(EndpointError):
    def __init__(self, endpoint: str, status: int, body: bytes) -> None:
        super().__init__(endpoint, f"container_{status}")
        self.status = status
        self.body = body  # the container's own error body (System One or OpenAI shape)


class EndpointRefused(EndpointError):
    """The scorer refused this call a share of its line (`state`: tenant_share, this tenant
    holds its share already; long_share, long work's share is taken). It answered, so it is
    alive, and it is not full for others: nothing here says the endpoint is saturated."""

    def __init__(self, endpoint: str, state: State, retry_after: int | None = None) -> None:
        super().__init__(endpoint, f"container_{state}")
        self.state = state
        self.retry_after = retry_after


class EndpointFailed(EndpointError):
    pass


class StreamBroken(EndpointError):
    pass


class StreamedAnswer:
    """An answer that arrives in pieces: its first piece has arrived, so the endpoint took the
    work. Iterating gives the pieces as they come (they do not align with lines or events)
    and raises StreamBroken when the endpoint fails after the first; `close()` hangs up, which
    stops the endpoint's work (the scorer stops generating when its caller goes)."""

    def __init__(self, endpoint: str, first: bytes, rest: Iterator[bytes], hang_up: Callable[[], None]) -> None:
        self.endpoint = endpoint
        self._first: bytes | None = first
        self._rest = rest
        self._hang_up = hang_up
        self.closed = False

    def __iter__(self) -> StreamedAnswer:
        return self

    def __next__(self) -> bytes:
        if self._first is not None:
            first, self._first = self._first, None
            return first
        if self.closed:
            raise StopIteration
        return next(self._rest)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._hang_up()


class InferenceBackend(Protocol):
    def invoke(self, endpoint: Endpoint, body: bytes, route: Route, caller: Caller = ANONYMOUS) -> bytes:
        """Send one JSON body to one endpoint and return the JSON it answered, or raise EndpointError.
        `caller` travels with it: the request id, so both deployables log one id, and whose
        work it is, which the scorer's scheduler serves tenants in turn by."""
        ...

    def invoke_stream(self, endpoint: Endpoint, body: bytes, route: Route, caller: Caller,
                      deadline_s: float) -> StreamedAnswer:
        """Send one JSON body and return its answer as it streams, once its first piece has
        arrived (a failure before it raises as `invoke` does, so another endpoint may be
        asked); the endpoint stops the work `deadline_s` from now."""
        ...
