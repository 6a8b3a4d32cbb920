"""Endpoint pools: order, fallback, the error matrix, the deadline, backoff and circuits.

A scripted backend and a fake clock: every wait is simulated, so the tests are exact
and instant.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest

from gateway.backends.base import (
    ANONYMOUS,
    Caller,
    Endpoint,
    EndpointBusy,
    EndpointFailed,
    EndpointRefused,
    EndpointRejected,
    EndpointTimedOut,
)
from gateway.backends.pools import Circuits, EndpointPool, PoolEndpoint, PoolPolicy
from gateway.errors import (
    BackendFailed,
    BackendUnavailable,
    InvalidRequest,
    NoAnswerInTime,
    PayloadTooLarge,
    RateLimited,
    WorkTimedOut,
)
from tests.fakes import ManualClock

OK = b'{"ok": true}'


def Clock() -> ManualClock:
    return ManualClock(1000.0)


class Scripted:
    """Each endpoint answers from its script, in turn (the last entry repeats); each call costs `cost_s`."""

    def __init__(self, clock: Clock, scripts: dict[str, list], cost_s: float = 0.1) -> None:
        self.clock, self.scripts, self.cost_s = clock, scripts, cost_s
        self.calls: list[tuple[str, float]] = []

    def invoke(self, endpoint: Endpoint, body: bytes, route: str, caller: Caller = ANONYMOUS) -> bytes:
        self.calls.append((endpoint.name, endpoint.read_timeout_s))
        script = self.scripts[endpoint.name]
        outcome = script.pop(0) if len(script) > 1 else script[0]
        self.clock.now += min(self.cost_s, endpoint.read_timeout_s)  # a call cannot outlast its read timeout
        if isinstance(outcome, Exception):
            raise outcome
        return outcome


class Metrics:
    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def count(self, name: str) -> None:
        self.counts[name] += 1


def pool(clock: Clock, names=("gpu", "cpu"), policy: PoolPolicy | None = None, circuits: Circuits | None = None, **kw):
    policy = policy or PoolPolicy(**kw)
    members = tuple(PoolEndpoint(Endpoint(n, read_timeout_s=20.0), tier=i) for i, n in enumerate(names))
    return EndpointPool(members, policy, circuits or Circuits(policy, clock), clock=clock, sleep=clock.sleep,
                        rng=random.Random(7))


def busy(reason="container_503", retry_after=None, name="gpu"):
    return EndpointBusy(name, reason, retry_after)


@pytest.mark.parametrize(
    "reason",
    ["container_503", "container_429", "container_queue_timeout", "container_not_ready", "ServiceUnavailable",
     "ModelNotReadyException", "ThrottlingException", "InternalFailure", "connect_failed", "connection_closed"],
)
def test_every_busy_kind_falls_back_to_the_next_endpoint(reason):
    clock, metrics = Clock(), Metrics()
    backend = Scripted(clock, {"gpu": [busy(reason)], "cpu": [OK]})
    invocation = pool(clock).ask(backend, b"{}", "systemone", metrics)
    assert (invocation.endpoint, invocation.attempts) == ("cpu", 2)
    assert [name for name, _ in backend.calls] == ["gpu", "cpu"]
    assert metrics.counts == {"AttemptBusy": 1, "AttemptOk": 1, "Fallback": 1}
    assert clock.slept == []  # falling back to another endpoint does not wait


@pytest.mark.parametrize(
    ("error", "raised"),
    [
        (EndpointRejected("gpu", 422, b'{"detail": [{"loc": ["body", "state"], "msg": "m", "type": "t"}]}'), InvalidRequest),
        (EndpointRejected("gpu", 413, b'{"detail": {"error_type": "max_tokens_exceeded", "message": "too long"}}'), PayloadTooLarge),
        (EndpointFailed("gpu", "ValidationError"), BackendFailed),
        (EndpointFailed("gpu", "container_500"), BackendFailed),
    ],
)
def test_refusals_and_failures_never_fall_back(error, raised):
    clock = Clock()
    backend = Scripted(clock, {"gpu": [error], "cpu": [OK]})
    with pytest.raises(raised):
        pool(clock).ask(backend, b"{}", "systemone")
    assert [name for name, _ in backend.calls] == ["gpu"]


def test_a_rejection_keeps_the_containers_own_words():
    clock = Clock()
    backend = Scripted(clock, {"gpu": [EndpointRejected("gpu", 413, b'{"detail": {"error_type": "x", "message": "prompt of 9000 tokens"}}')]})
    with pytest.raises(PayloadTooLarge, match="9000 tokens"):
        pool(clock, names=("gpu",)).ask(backend, b"{}", "systemone")


def test_saturation_everywhere_is_429_and_takes_the_longest_retry_after():
    clock = Clock()
    backend = Scripted(clock, {"gpu": [busy("container_503", 3)], "cpu": [busy("ThrottlingException", name="cpu")]})
    with pytest.raises(RateLimited) as raised:
        pool(clock, extra_attempts=0).ask(backend, b"{}", "systemone")
    assert raised.value.retry_after == 3


def test_unreachable_endpoints_are_503_but_one_saturated_endpoint_makes_it_429():
    clock = Clock()
    backend = Scripted(clock, {"gpu": [busy("connection_closed")], "cpu": [busy("connect_failed", name="cpu")]})
    with pytest.raises(BackendUnavailable):
        pool(clock, extra_attempts=0).ask(backend, b"{}", "systemone")
    backend = Scripted(clock, {"gpu": [busy("connection_closed")], "cpu": [busy("container_503", name="cpu")]})
    with pytest.raises(RateLimited):  # the cpu endpoint is alive, only full: retry later
        pool(clock, extra_attempts=0).ask(backend, b"{}", "systemone")


def test_a_saturated_endpoint_is_skipped_only_as_long_as_it_asked():
    clock = Clock()
    policy = PoolPolicy(extra_attempts=0, failure_threshold=1, cooldown_s=15)
    circuits = Circuits(policy, clock)
    backend = Scripted(clock, {"gpu": [busy(retry_after=2), OK], "cpu": [OK]})
    p = pool(clock, policy=policy, circuits=circuits)
    assert p.ask(backend, b"{}", "systemone").endpoint == "cpu"
    assert not circuits.allow("gpu") and circuits.open_reason("gpu") == "container_503"
    clock.now += 2
    assert p.ask(backend, b"{}", "systemone").endpoint == "gpu"


def test_extra_attempts_back_off_with_jitter():
    clock = Clock()
    backend = Scripted(clock, {"gpu": [busy("connection_closed"), OK]})
    invocation = pool(clock, names=("gpu",), extra_attempts=1, backoff_base_s=0.4, backoff_max_s=2).ask(backend, b"{}", "chat")
    assert invocation.attempts == 2 and len(clock.slept) == 1 and 0 <= clock.slept[0] <= 0.4


def test_a_saturated_endpoint_is_not_asked_again_in_the_same_request():
    """It said "later": the caller gets 429 and its Retry-After at once, no queueing here."""
    clock = Clock()
    backend = Scripted(clock, {"gpu": [busy(retry_after=3), OK]})
    with pytest.raises(RateLimited) as raised:
        pool(clock, names=("gpu",), extra_attempts=2).ask(backend, b"{}", "chat")
    assert raised.value.retry_after == 3 and len(backend.calls) == 1 and clock.slept == []


def test_at_most_one_pass_plus_the_extra_attempts():
    clock = Clock()
    backend = Scripted(clock, {"gpu": [busy("connection_closed")], "cpu": [busy("connection_closed", name="cpu")]})
    with pytest.raises(BackendUnavailable):
        pool(clock, extra_attempts=1, failure_threshold=100).ask(backend, b"{}", "systemone")
    assert [name for name, _ in backend.calls] == ["gpu", "cpu", "gpu"]


def test_a_retry_after_beyond_the_deadline_is_not_waited_for():
    clock = Clock()
    backend = Scripted(clock, {"gpu": [busy(retry_after=60), OK]})
    with pytest.raises(RateLimited) as raised:
        pool(clock, names=("gpu",), extra_attempts=2, deadline_s=10).ask(backend, b"{}", "systemone")
    assert clock.slept == [] and raised.value.retry_after == 60 and len(backend.calls) == 1


def test_a_first_attempt_gets_nearly_the_whole_deadline():
    # Given an endpoint whose own read timeout (28 s) outlasts the 25 s deadline,
    # when the first attempt is made, then it may read for 23 s (25 less the 2 s connect timeout).
    clock = Clock()
    backend = Scripted(clock, {"gpu": [OK]})
    pool = EndpointPool((PoolEndpoint(Endpoint("gpu", read_timeout_s=28.0), tier=0),), PoolPolicy(), Circuits(PoolPolicy(), clock),
                        clock=clock, sleep=clock.sleep)
    pool.ask(backend, b"{}", "systemone")
    assert backend.calls == [("gpu", 23.0)]


def test_the_deadline_bounds_the_whole_request_and_each_read_timeout():
    clock = Clock()
    backend = Scripted(clock, {"gpu": [busy("connection_closed")], "cpu": [busy("connection_closed", name="cpu")]}, cost_s=9.0)
    started = clock.now
    with pytest.raises(BackendUnavailable):
        pool(clock, extra_attempts=3, deadline_s=25, backoff_base_s=0, failure_threshold=100).ask(backend, b"{}", "systemone")
    assert clock.now - started <= 25
    # The first attempt keeps its configured 20 s; later ones get less than what is left.
    timeouts = [t for _, t in backend.calls]
    assert timeouts[0] == 20.0 and all(t < 20.0 for t in timeouts[1:])
    assert [name for name, _ in backend.calls][:3] == ["gpu", "cpu", "gpu"]


def test_a_circuit_opens_after_repeated_busy_then_half_opens_for_one_probe():
    clock = Clock()
    policy = PoolPolicy(extra_attempts=0, failure_threshold=2, cooldown_s=10)
    circuits = Circuits(policy, clock)
    backend = Scripted(clock, {"gpu": [busy(), busy(), busy(), OK], "cpu": [OK]})
    p = pool(clock, policy=policy, circuits=circuits)
    metrics = Metrics()
    for _ in range(2):
        assert p.ask(backend, b"{}", "systemone", metrics).endpoint == "cpu"
    assert metrics.counts["CircuitOpened"] == 1
    calls_before = len(backend.calls)
    assert p.ask(backend, b"{}", "systemone", metrics).attempts == 1  # gpu skipped: no latency spent on it
    assert [name for name, _ in backend.calls[calls_before:]] == ["cpu"]
    clock.now += 10
    # Half-open: one probe; it fails, so the circuit opens again for a full cooldown.
    assert p.ask(backend, b"{}", "systemone").endpoint == "cpu"
    assert [name for name, _ in backend.calls[-2:]] == ["gpu", "cpu"]
    assert not circuits.allow("gpu")
    clock.now += 10
    assert p.ask(backend, b"{}", "systemone").endpoint == "gpu"  # the probe succeeds: closed again
    assert circuits.allow("gpu") and circuits.allow("gpu")


def test_while_a_probe_is_out_other_requests_skip_the_endpoint():
    clock = Clock()
    circuits = Circuits(PoolPolicy(failure_threshold=1, cooldown_s=5), clock)
    circuits.failed("gpu")
    clock.now += 5
    assert circuits.allow("gpu") and not circuits.allow("gpu")
    circuits.release("gpu")
    assert circuits.allow("gpu")


def test_a_probe_that_raised_anything_never_holds_its_endpoint_shut():
    # A probe whose call escaped with an unexpected error (a bug, a deployment's fault) would
    # otherwise leave the endpoint "probing" for the rest of the warm instance's life.
    clock = Clock()
    policy = PoolPolicy(extra_attempts=0, failure_threshold=1, cooldown_s=5)
    circuits = Circuits(policy, clock)
    circuits.failed("gpu")
    clock.now += 5
    backend = Scripted(clock, {"gpu": [RuntimeError("unexpected"), OK]})
    with pytest.raises(RuntimeError):
        pool(clock, names=("gpu",), policy=policy, circuits=circuits).ask(backend, b"{}", "systemone")
    assert circuits.allow("gpu")


@pytest.mark.parametrize("status", ["429", "503"])
def test_a_busy_answer_with_only_a_status_is_saturation(status):
    # A load balancer's 429 or 503 with no error code: the endpoint said it is full, so this
    # request does not ask it again and the caller may get 429 with a retry.
    clock = Clock()
    backend = Scripted(clock, {"gpu": [busy(status)], "cpu": [busy(status, name="cpu")]})
    with pytest.raises(RateLimited):
        pool(clock, extra_attempts=2).ask(backend, b"{}", "systemone")
    assert [name for name, _ in backend.calls] == ["gpu", "cpu"]


def test_every_circuit_open_is_503_with_the_time_until_a_probe():
    clock = Clock()
    policy = PoolPolicy(failure_threshold=1, cooldown_s=8)
    circuits = Circuits(policy, clock)
    circuits.failed("gpu")
    circuits.failed("cpu")
    clock.now += 3
    backend = Scripted(clock, {"gpu": [OK], "cpu": [OK]})
    with pytest.raises(BackendUnavailable) as raised:
        pool(clock, policy=policy, circuits=circuits).ask(backend, b"{}", "systemone")
    assert backend.calls == [] and raised.value.retry_after == 5


def test_weights_spread_load_within_a_tier_and_tiers_stay_ordered():
    clock = Clock()
    policy = PoolPolicy()
    members = (PoolEndpoint(Endpoint("a"), 0, 3.0), PoolEndpoint(Endpoint("b"), 0, 1.0), PoolEndpoint(Endpoint("cpu"), 1))
    p = EndpointPool(members, policy, Circuits(policy, clock), clock=clock, rng=random.Random(1))
    firsts = Counter(p.order()[0].name for _ in range(4000))
    assert set(firsts) == {"a", "b"} and 2.6 < firsts["a"] / firsts["b"] < 3.4
    assert all(p.order()[-1].name == "cpu" for _ in range(100))


@pytest.mark.parametrize("answered", (True, False))
def test_work_that_ran_out_of_time_is_never_sent_again(answered):
    # Given a first endpoint whose attempt ran out of time, when the pool handles it, then no
    # other endpoint is asked (the work may still run there, and would hold a second model):
    # cut by the scorer, it is WorkTimedOut (504, not retryable: it would run out anywhere);
    # with no answer at all, NoAnswerInTime (503 with Retry-After: a hung endpoint, most likely).
    clock, metrics = Clock(), Metrics()
    reason = "container_deadline" if answered else "read_timeout"
    backend = Scripted(clock, {"gpu": [EndpointTimedOut("gpu", reason, answered), OK], "cpu": [OK]})
    with pytest.raises(WorkTimedOut if answered else NoAnswerInTime) as raised:
        pool(clock, extra_attempts=2).ask(backend, b"{}", "systemone", metrics)
    assert [name for name, _ in backend.calls] == ["gpu"]
    if answered:
        assert raised.value.status == 504 and raised.value.retryable is False
    else:
        assert raised.value.status == 503 and raised.value.retry_after >= 1 and raised.value.retryable is None
    assert metrics.counts["AttemptTimedOut"] == 1


def test_a_scorer_that_cut_a_job_itself_is_healthy_and_keeps_its_circuit_closed():
    # Given three requests in a row whose work the scorer cut at the deadline, the circuit
    # stays closed (one caller's oversized work must not become everyone's outage); three
    # read timeouts (nothing came back) open it, as any endpoint that stops answering does.
    clock = Clock()
    policy = PoolPolicy(extra_attempts=0, failure_threshold=3)
    for answered, open_after in ((True, False), (False, True)):
        circuits = Circuits(policy, clock)
        p = pool(clock, names=("gpu",), policy=policy, circuits=circuits)
        reason = "container_deadline" if answered else "read_timeout"
        for _ in range(3):
            with pytest.raises((WorkTimedOut, NoAnswerInTime)):
                p.ask(Scripted(clock, {"gpu": [EndpointTimedOut("gpu", reason, answered)]}), b"{}", "systemone")
        assert circuits.allow("gpu") is not open_after


def serverless_pool(clock, *others):
    members = (PoolEndpoint(Endpoint("quiet", read_timeout_s=20.0, max_body_bytes=100), tier=0),
               *(PoolEndpoint(Endpoint(n, read_timeout_s=20.0), tier=1) for n in others))
    return EndpointPool(members, PoolPolicy(), Circuits(PoolPolicy(), clock), clock=clock, sleep=clock.sleep,
                        rng=random.Random(7))


def test_a_body_an_endpoint_cannot_take_goes_to_one_that_can():
    # Given a Serverless endpoint (100 bytes here, 4 MB in AWS) first and an instance next, a
    # larger body is never sent to the first: the second answers it, and a small one goes first.
    clock = Clock()
    backend = Scripted(clock, {"quiet": [OK], "cpu": [OK]})
    assert serverless_pool(clock, "cpu").ask(backend, b"x" * 101, "systemone").endpoint == "cpu"
    assert serverless_pool(clock, "cpu").ask(backend, b"x" * 100, "systemone").endpoint == "quiet"
    assert [name for name, _ in backend.calls] == ["cpu", "quiet"]


def test_a_body_no_endpoint_takes_is_413_with_the_figures_and_sent_nowhere():
    clock = Clock()
    backend = Scripted(clock, {"quiet": [OK]})
    with pytest.raises(PayloadTooLarge, match="as 101 bytes; this model's endpoints take at most 100"):
        serverless_pool(clock).ask(backend, b"x" * 101, "systemone")
    assert backend.calls == []


def test_every_attempt_is_paid_at_its_endpoints_price():
    # Given a priced GPU (busy, 0.1 s) and a priced CPU that answers (0.1 s), the request
    # used 0.2 s of endpoints and costs each one's time at its own price, the gateway's share beside.
    from gateway.decisions.cost import gateway_usd

    clock = Clock()
    members = (PoolEndpoint(Endpoint("gpu", read_timeout_s=20.0, usd_per_second=0.01), tier=0),
               PoolEndpoint(Endpoint("cpu", read_timeout_s=20.0, usd_per_second=0.001), tier=1))
    priced = EndpointPool(members, PoolPolicy(), Circuits(PoolPolicy(), clock), clock=clock, sleep=clock.sleep,
                          rng=random.Random(7))
    invocation = priced.ask(Scripted(clock, {"gpu": [busy()], "cpu": [OK]}), b"{}", "systemone")
    assert invocation.cost.endpoint_seconds == pytest.approx(0.2)
    assert invocation.cost.endpoint_usd == pytest.approx(0.1 * 0.01 + 0.1 * 0.001)
    assert invocation.cost.usd == pytest.approx(invocation.cost.endpoint_usd + gateway_usd(0.2))


def refused(state: str, retry_after: int | None = 4, name: str = "gpu") -> EndpointRefused:
    return EndpointRefused(name, state, retry_after)


def test_a_tenants_share_taken_ends_the_request_at_once_and_never_counts_against_the_circuit():
    # Given a circuit that opens on the first busy answer, when the first endpoint refuses this
    # tenant its share, then the caller gets 429 with the scorer's Retry-After, no other
    # endpoint is asked, and the circuit stays closed
    clock, metrics = Clock(), Metrics()
    policy = PoolPolicy(failure_threshold=1)
    circuits = Circuits(policy, clock)
    backend = Scripted(clock, {"gpu": [refused("tenant_share")], "cpu": [OK]})
    with pytest.raises(RateLimited) as raised:
        pool(clock, policy=policy, circuits=circuits).ask(backend, b"{}", "systemone", metrics)
    assert raised.value.retry_after == 4 and "holds its share" in raised.value.message
    assert [name for name, _ in backend.calls] == ["gpu"] and circuits.allow("gpu")
    assert metrics.counts == {"AttemptRefused": 1, "TenantShareRefused": 1}


def test_long_works_share_taken_tries_the_next_endpoint_and_is_429_when_none_has_room():
    clock, metrics = Clock(), Metrics()
    policy = PoolPolicy(failure_threshold=1, extra_attempts=2)
    circuits = Circuits(policy, clock)
    backend = Scripted(clock, {"gpu": [refused("long_share"), OK], "cpu": [refused("long_share", 9, "cpu"), OK]})
    with pytest.raises(RateLimited) as raised:
        pool(clock, policy=policy, circuits=circuits).ask(backend, b"{}", "chat", metrics, deadline_s=40)
    # Each asked once (it said "later"), the longest Retry-After, and neither circuit counted it
    assert [name for name, _ in backend.calls] == ["gpu", "cpu"] and clock.slept == []
    assert raised.value.retry_after == 9 and "long work's share" in raised.value.message
    assert circuits.allow("gpu") and circuits.allow("cpu")
    assert metrics.counts == {"AttemptRefused": 2, "LongShareRefused": 1}


def test_a_probe_refused_its_share_is_released_neither_succeeded_nor_failed():
    # Given a half-open endpoint whose probe (an ordinary request) is refused this tenant's share
    clock = Clock()
    policy = PoolPolicy(extra_attempts=0, failure_threshold=1, cooldown_s=5)
    circuits = Circuits(policy, clock)
    circuits.failed("gpu", "container_503")
    clock.now += 5
    with pytest.raises(RateLimited):
        pool(clock, names=("gpu",), policy=policy, circuits=circuits).ask(
            Scripted(clock, {"gpu": [refused("tenant_share")]}), b"{}", "systemone")
    # Then the circuit is still open (not closed by an answer that proves nothing), and the
    # next request may probe it
    assert circuits.open_reason("gpu") == "container_503"
    assert circuits.allow("gpu") and not circuits.allow("gpu")


def test_a_long_request_never_takes_the_half_open_probe():
    # Given a GPU endpoint whose circuit is half-open and a CPU endpoint that answers
    clock = Clock()
    policy = PoolPolicy(failure_threshold=1, cooldown_s=5)
    circuits = Circuits(policy, clock)
    circuits.failed("gpu", "container_503")
    clock.now += 5
    backend = Scripted(clock, {"gpu": [OK], "cpu": [OK]})
    p = pool(clock, policy=policy, circuits=circuits)
    # When a long request comes, then it skips the GPU (leaving probing to ordinary requests)
    assert p.ask(backend, b"{}", "chat", deadline_s=40).endpoint == "cpu"
    # And the next ordinary request takes the probe, which closes the circuit
    assert p.ask(backend, b"{}", "chat").endpoint == "gpu"
    assert [name for name, _ in backend.calls] == ["cpu", "gpu"] and circuits.open_reason("gpu") is None
