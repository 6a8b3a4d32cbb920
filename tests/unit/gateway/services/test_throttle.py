"""Per-tenant rate and work in flight, through the handler, on a real SQLite store shared
by two function instances (as many Lambda instances share DynamoDB)."""

from __future__ import annotations

import math
import threading
import time

import pytest

from devkit.fake_backend import UniformBackend
from devkit.gateway_stack import PRINCIPAL, event, settings_for
from gateway.auth.authenticate import Authenticator
from gateway.auth.store import PrincipalRule
from gateway.auth.tenants import set_limits
from gateway.backends.base import ANONYMOUS
from gateway.functions.composition import build_services
from gateway.functions.handler import GatewayFunction
from gateway.services.throttle import TenantThrottle
from gateway.stores.sqlite import open_sqlite
from tests.gateway_helpers import call, register_credentials, tenant_store

GLOBEX = {**PRINCIPAL, "principalId": "globex", "tenant_id": "globex", "credential_id": "k2"}
DECISION = {"model": "jev-latest", "state": "I was charged twice.",
            "questions": {"refund": {"type": "noul", "instructions": "Does the customer ask for a refund?"}}}
ROLE = "arn:aws:iam::123456789012:role/Analytics"


class ManualClock:
    """A settable clock a little ahead of the real one (the stores drop counters by the real
    clock), a quarter of a second into a window."""

    def __init__(self) -> None:
        self.now = math.floor(time.time()) + 1000.25

    def __call__(self) -> float:
        return self.now


def function(path, backend=None, clock=None) -> GatewayFunction:
    """One function instance over the SQLite file at `path` (its own connection, as a
    separate Lambda instance has its own client), with a settable clock for the throttle."""
    store = open_sqlite(path)
    services = build_services(settings_for(), backend or UniformBackend(), stores=store, authenticator=Authenticator(store))
    if clock is not None:
        services.throttle.clock = clock
    return GatewayFunction(services)


@pytest.fixture
def path(tmp_path):
    store = tenant_store(tmp_path / "g.db", "acme", "globex")
    register_credentials(store, PRINCIPAL, GLOBEX)
    return tmp_path / "g.db"


def test_each_tenant_has_its_own_rate_instead_of_one_shared_bucket(path):
    # Given two tenants without a usage plan of their own at 2 a second (burst 2), when
    # one sends three requests in a window, then its third is 429 naming its limit, with a
    # Retry-After to the window's end, and the other tenant is served as if nothing happened.
    store = open_sqlite(path)
    for tenant in ("acme", "globex"):
        set_limits(store.tenants, tenant, rate_per_s=2, burst=2)
    clock = ManualClock()
    handler = function(path, clock=clock)
    statuses = [call(event("GET", "/v1/models"), handler)[0] for _ in range(3)]
    assert statuses == [200, 200, 429]
    status, headers, body = call(event("GET", "/v1/models"), handler)
    assert status == 429 and headers["retry-after"] == "1" and "2 requests every 1 s" in body["error"]["message"]
    assert call(event("GET", "/v1/models", principal=GLOBEX), handler)[0] == 200
    clock.now += 1.0  # the next window
    assert call(event("GET", "/v1/models"), handler)[0] == 200


def test_the_rate_is_counted_once_across_function_instances(path):
    # Many Lambda instances serve one tenant: the count is the store's, not each instance's.
    set_limits(open_sqlite(path).tenants, "acme", rate_per_s=3, burst=3)
    clock = ManualClock()
    first, second = function(path, clock=clock), function(path, clock=clock)
    statuses = [call(event("GET", "/v1/models"), handler)[0] for handler in (first, second, first, second)]
    assert statuses == [200, 200, 200, 429]


def test_sigv4_callers_are_throttled_per_tenant_too(path):
    # The SigV4 routes have no authorizer to key a usage plan by: the gateway throttles them.
    store = open_sqlite(path)
    store.tenants.put_principal_rule(PrincipalRule(ROLE, "acme", ("decide",), None, 0.0))
    set_limits(store.tenants, "acme", rate_per_s=1, burst=1)
    handler = function(path, clock=ManualClock())
    iam = event("GET", "/iam/v1/models", principal=None)
    iam["requestContext"]["identity"] = {"userArn": "arn:aws:sts::123456789012:assumed-role/Analytics/s", "accessKey": "AKIA"}
    assert [call(iam, handler)[0] for _ in range(2)] == [200, 429]


class Gate(UniformBackend):
    """Holds every decision until `opened` is set, and says when one is inside."""

    def __init__(self) -> None:
        super().__init__()
        self.inside = threading.Semaphore(0)
        self.opened = threading.Event()

    def invoke(self, endpoint, body, route, caller=ANONYMOUS):
        self.inside.release()
        assert self.opened.wait(30)
        return super().invoke(endpoint, body, route, caller)


def test_a_tenant_at_its_limit_in_flight_gets_429_before_any_backend_call_and_others_are_served(path):
    # Given acme limited to 1 decision in flight and one running on another instance, when
    # acme sends a second, then it is 429 at once (no backend call); globex is served; once
    # the first has ended, acme's next is served.
    set_limits(open_sqlite(path).tenants, "acme", max_in_flight=1)
    gate = Gate()
    first, second = function(path, gate), function(path, gate)
    running: dict[str, tuple] = {}
    worker = threading.Thread(target=lambda: running.setdefault("reply", call(event("POST", "/v1/systemone", DECISION),
                                                                              first)))
    worker.start()
    assert gate.inside.acquire(timeout=30)
    calls = len(gate.calls)
    status, headers, body = call(event("POST", "/v1/systemone", DECISION), second)
    assert status == 429 and headers["retry-after"] == "1"
    assert "1 decisions or chats in flight" in body["detail"]["message"]
    assert len(gate.calls) == calls
    gate.opened.set()
    assert call(event("POST", "/v1/systemone", DECISION, principal=GLOBEX), second)[0] == 200
    worker.join(30)
    assert running["reply"][0] == 200
    assert call(event("POST", "/v1/systemone", DECISION), second)[0] == 200


def test_a_tenant_without_a_figure_of_its_own_may_hold_half_of_its_models_scorer_line(path):
    # Given acme with no max_in_flight of its own, on a model whose one scorer admits 8 jobs
    # at once (of which the scorer lets one tenant hold 4), and four of its decisions running
    store = open_sqlite(path)
    set_limits(store.tenants, "acme", max_in_flight=None)
    gate = Gate()
    replies: list[int] = []

    def send() -> threading.Thread:
        handler = function(path, gate)  # each on an instance of its own, with its own tenant cache
        worker = threading.Thread(target=lambda: replies.append(call(event("POST", "/v1/systemone", DECISION),
                                                                     handler)[0]))
        worker.start()
        return worker

    workers = [send() for _ in range(4)]
    try:
        for _ in range(4):
            assert gate.inside.acquire(timeout=30)
        # When it sends a fifth, then it is 429 before any backend call, naming the figure
        status, _, body = call(event("POST", "/v1/systemone", DECISION), function(path, gate))
        assert status == 429 and not gate.inside.acquire(timeout=0.2)
        assert "4 decisions or chats in flight at once on this model" in body["detail"]["message"]
        # And a figure of its own wins: at 5, the fifth is admitted
        set_limits(store.tenants, "acme", max_in_flight=5)
        workers.append(send())
        assert gate.inside.acquire(timeout=30)
    finally:
        gate.opened.set()
        for worker in workers:
            worker.join(30)
    assert replies == [200] * 5


@pytest.mark.parametrize(("line", "min_instances", "share"), [(8, 1, 4), (8, 3, 12), (2, 1, 1), (1, 1, 1), (8, 0, 1)])
def test_a_models_share_for_one_tenant_is_half_its_line_on_each_least_instance(line, min_instances, share):
    from gateway.backends.pools import PoolPolicy

    assert PoolPolicy(line=line, min_instances=min_instances).tenant_in_flight() == share


def test_a_failed_decision_gives_its_place_back(path):
    set_limits(open_sqlite(path).tenants, "acme", max_in_flight=1)
    handler = function(path)
    assert call(event("POST", "/v1/systemone", {**DECISION, "model": "nope"}), handler)[0] == 404
    assert call(event("POST", "/v1/systemone", DECISION), handler)[0] == 200
    assert call(event("POST", "/v1/systemone", DECISION), handler)[0] == 200


class BrokenStore:
    def count_within(self, *args):
        raise OSError("the table is unreachable")

    hold = count_within


def test_limits_that_cannot_be_checked_admit_nothing():
    # Neither a store that cannot count nor one whose tenant's limits cannot be read admits
    # anything unchecked: 503 (not an exception escaping the handler).
    from gateway.auth.store import DEFAULT_LIMITS
    from gateway.errors import BackendUnavailable

    def unreadable(tenant):
        raise OSError("the tenants table is unreachable")

    for limits in (lambda tenant: DEFAULT_LIMITS, unreadable):
        throttle = TenantThrottle(BrokenStore(), limits, hold_s=25)
        with pytest.raises(BackendUnavailable):
            throttle.admit("acme")
        with pytest.raises(BackendUnavailable), throttle.in_flight("acme", 4):
            pass
