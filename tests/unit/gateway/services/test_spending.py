"""Each tenant's spend budgets and usage, through the handler, on a real SQLite store shared
by several function instances (as many Lambda instances share DynamoDB)."""

from __future__ import annotations

import calendar
import json
import threading
import time

import pytest

from devkit.fake_backend import UniformBackend
from devkit.gateway_stack import PRINCIPAL, event
from gateway.auth.authenticate import Authenticator
from gateway.auth.credentials import Principal
from gateway.auth.tenants import set_limits
from gateway.backends.base import ANONYMOUS
from gateway.decisions.cost import worst_case
from gateway.functions.composition import build_services
from gateway.functions.handler import GatewayFunction
from gateway.settings import GatewaySettings
from gateway.stores.sqlite import open_sqlite
from tests.gateway_helpers import call, register_credentials, tenant_store

ACME = {**PRINCIPAL, "scopes": "decide chat catalogs:read"}
GLOBEX = {**PRINCIPAL, "principalId": "globex", "tenant_id": "globex", "credential_id": "k2"}
DECISION = {"model": "jev-latest", "state": "I was charged twice.",
            "questions": {"refund": {"type": "noul", "instructions": "Does the customer ask for a refund?"}}}
OPENAI_DECISION = {"model": "jev-latest", "input": "I was charged twice.",
                   "questions": [{"type": "predicate", "name": "refund", "instructions": "Does the customer ask for a refund?"}]}
CHAT = {"model": "chat-default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
DEADLINE_S = 2.0
USD_PER_HOUR = 360.0  # ten cents a second: figures easy to read
WORST = worst_case(DEADLINE_S, USD_PER_HOUR / 3600).usd


class SlowBackend(UniformBackend):
    """Answers after `seconds` (the endpoint time a decision costs), counting its calls."""

    def __init__(self, seconds: float = 0.02) -> None:
        super().__init__()
        self.seconds = seconds

    def invoke(self, endpoint, body, route, caller=ANONYMOUS):
        time.sleep(self.seconds)
        return super().invoke(endpoint, body, route, caller)


def priced_settings() -> GatewaySettings:
    pool = [{"name": "dg-cpu", "usd_per_hour": USD_PER_HOUR}]
    return GatewaySettings.model_validate({
        "region": "us-east-1", "routing": {"deadline_s": DEADLINE_S},
        "models": [{"name": "decision-default", "aliases": ["jev-latest"], "serves": ["decisions"], "endpoints": pool},
                   {"name": "chat-default", "serves": ["chat"], "endpoints": pool}]})


def on_store(path) -> dict:
    """What build_services takes to run on the SQLite file at `path` with an authenticator."""
    stores = open_sqlite(path)
    return {"stores": stores, "authenticator": Authenticator(stores)}


def function(path, backend, clock=None) -> GatewayFunction:
    """One function instance over the SQLite file at `path`, with its own connection (and,
    given one, a clock for its budgets)."""
    services = build_services(priced_settings(), backend, **on_store(path))
    if clock is not None:
        services.spending.clock = clock
    return GatewayFunction(services)


@pytest.fixture
def path(tmp_path):
    store = tenant_store(tmp_path / "g.db", "acme", "globex")
    register_credentials(store, ACME, GLOBEX)
    for tenant in ("acme", "globex"):
        set_limits(store.tenants, tenant, rate_per_s=1000, burst=1000, max_in_flight=100)
    return tmp_path / "g.db"


def month_tally(path, tenant="acme") -> float:
    return open_sqlite(path).counters.tally(f"spend:{tenant}:{time.strftime('%Y-%m', time.gmtime())}") / 1e9


def test_a_decision_settles_what_it_spent_and_the_usage_report_shows_it(path):
    # Given a tenant with a budget, when it asks one decision and one chat, then the month's
    # tally holds what they cost (the reservation replaced), and /v1/usage reports them by
    # day and by entry with the same total as the answers' usage.
    set_limits(open_sqlite(path).tenants, "acme", monthly_budget_usd=10.0)
    handler = function(path, SlowBackend(0.05))
    status, _, answer = call(event("POST", "/v1/systemone", DECISION), handler)
    assert status == 200
    assert call(event("POST", "/v1/chat/completions", CHAT), handler)[0] == 200
    spent = month_tally(path)
    assert 0.005 <= spent < 0.05 and answer["usage"]["x_cost_usd"] <= spent
    status, _, report = call(event("GET", "/v1/usage", principal=ACME), handler)
    assert status == 200, report
    assert report["total"]["requests"] == 2 and report["total"]["cost_usd"] == pytest.approx(spent, abs=1e-8)
    assert [e["entry"] for e in report["by_entry"]] == ["(chat)", "(inline)"]
    assert [d["day"] for d in report["by_day"]] == [time.strftime("%Y-%m-%d", time.gmtime())]
    assert report["by_entry"][1]["cost_usd"] == pytest.approx(answer["usage"]["x_cost_usd"], abs=1e-8)
    assert report["budget"] == {"monthly_usd": 10.0, "month": time.strftime("%Y-%m", time.gmtime()),
                                "month_spent_usd": pytest.approx(spent, abs=1e-8), "endpoint_seconds_per_minute": None}


class CachingBackend(SlowBackend):
    """Reads 1,200 tokens a decision, of which the scorer restored 1,000 from the state it kept."""

    def invoke(self, endpoint, body, route, caller=ANONYMOUS):
        answer = json.loads(super().invoke(endpoint, body, route, caller))
        answer["usage"] = {"input_tokens": 1200, "output_tokens": 0, "x_cached_tokens": 1000}
        return json.dumps(answer).encode()


def test_the_tokens_read_and_those_restored_are_in_the_record_and_the_usage_by_entry(path, tmp_path):
    # Given a scorer that restored most of a state, when a decision asks an inline question,
    # then its answer, its record and the tenant's usage (total and entry) carry the cached tokens.
    handler = function(path, CachingBackend(0.0))
    status, _, answer = call(event("POST", "/v1/decisions", OPENAI_DECISION), handler)
    assert status == 200, answer
    assert answer["usage"]["input_tokens"] == 1200 and answer["usage"]["input_tokens_details"]["cached_tokens"] == 1000
    record = call(event("GET", f"/v1/records/{answer['id']}", principal=ACME), handler)[2]
    assert record["usage"]["cached_tokens"] == 1000 and record["usage"]["input_tokens"] == 1200
    status, _, systemone = call(event("POST", "/v1/systemone", DECISION), handler)
    assert status == 200 and systemone["usage"]["x_cached_tokens"] == 1000
    report = call(event("GET", "/v1/usage", principal=ACME), handler)[2]
    assert (report["total"]["input_tokens"], report["total"]["cached_tokens"]) == (2400, 2000)
    assert [(e["entry"], e["cached_tokens"]) for e in report["by_entry"]] == [("(inline)", 2000)]


def test_what_a_tenant_stores_is_in_its_usage_records_in_the_total_catalog_versions_under_their_entry(path):
    # Given a tenant that writes a catalog entry twice (one version; the same content again
    # writes nothing) and asks two decisions, its usage holds the bytes of the version and
    # of both records, each as the store counts it.
    writer = {**ACME, "scopes": "decide catalogs:read catalogs:write"}
    register_credentials(open_sqlite(path), writer)
    handler = function(path, SlowBackend(0.0))
    entry = {"type": "noul", "instructions": "Does the customer ask for a refund?" + " Say so." * 200}
    assert call(event("PUT", "/v1/catalogs/refunds", entry, principal=writer), handler)[0] == 201
    assert call(event("PUT", "/v1/catalogs/refunds", entry, principal=writer), handler)[0] == 200
    version = open_sqlite(path).catalogs.latest_catalog_version("acme", "refunds")
    for _ in range(2):
        assert call(event("POST", "/v1/systemone", DECISION), handler)[0] == 200
    status, _, report = call(event("GET", "/v1/usage", principal=ACME), handler)
    records = [r for r in open_sqlite(path).records.scan_records("acme")]
    assert len(records) == 2 and status == 200
    from gateway.decisions.records import record_item_bytes

    stored = sum(record_item_bytes("acme", r.record_id, [], json.dumps({k: v for k, v in r.record.items()
                                                                         if k != "outcome"})) for r in records)
    assert report["total"]["stored_bytes"] == len(version.content.encode()) + stored
    assert {e["entry"]: e["stored_bytes"] for e in report["by_entry"]}["refunds"] == len(version.content.encode())
    assert report["total"]["requests"] == 2  # writes are bytes, not requests


def test_a_tenant_over_its_budget_gets_429_naming_it_before_any_backend_call(path):
    # Given a budget below one request's worst case, the first request is admitted (the
    # tally was under it) and the next is refused with insufficient_quota, at once.
    set_limits(open_sqlite(path).tenants, "acme", monthly_budget_usd=0.001)
    backend = SlowBackend()
    handler = function(path, backend)
    assert call(event("POST", "/v1/systemone", DECISION), handler)[0] == 200
    status, headers, body = call(event("POST", "/v1/systemone", DECISION), handler)
    assert status == 429 and len(backend.calls) == 1
    assert body["detail"]["error_type"] == "budget_exhausted" and "0.00 USD a month" in body["detail"]["message"]
    assert headers["x-should-retry"] == "false"
    now = time.gmtime()
    month_end = calendar.timegm((now.tm_year + now.tm_mon // 12, now.tm_mon % 12 + 1, 1, 0, 0, 0))
    assert abs(int(headers["retry-after"]) - (month_end - time.time())) < 60
    status, _, body = call(event("POST", "/v1/chat/completions", CHAT), handler)
    assert status == 429 and body["error"]["type"] == "insufficient_quota" and len(backend.calls) == 1
    assert call(event("POST", "/v1/systemone", DECISION, principal=GLOBEX), handler)[0] == 200  # its own budget
    set_limits(open_sqlite(path).tenants, "acme", monthly_budget_usd=None)  # an operator lifts it
    assert call(event("POST", "/v1/systemone", DECISION), function(path, backend))[0] == 200


def test_a_concurrent_burst_from_many_instances_overshoots_by_at_most_one_worst_case(path):
    # Given four function instances and 24 decisions at once, each reserving its worst case
    # (2 s at ten cents a second) against a budget of 30 cents, then the tally (spent plus
    # reserved) never passes the budget by more than one worst case, every refusal came
    # before a backend call, and what was spent is what the usage report says.
    set_limits(open_sqlite(path).tenants, "acme", monthly_budget_usd=0.3)
    backend = SlowBackend(0.05)
    handlers = [function(path, backend) for _ in range(4)]
    peak, statuses, lock = [0.0], [], threading.Lock()
    start = threading.Barrier(24)

    def one(handler):
        start.wait()
        status = call(event("POST", "/v1/systemone", DECISION), handler)[0]
        with lock:
            statuses.append(status)
            peak[0] = max(peak[0], month_tally(path))

    threads = [threading.Thread(target=one, args=(handlers[i % 4],)) for i in range(24)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    admitted = statuses.count(200)
    assert statuses.count(429) == 24 - admitted and 2 <= admitted and len(backend.calls) == admitted
    assert peak[0] <= 0.3 + WORST
    spent = month_tally(path)
    assert spent <= 0.3 + WORST and spent == pytest.approx(call(event("GET", "/v1/usage", principal=ACME), handlers[0])[2]["total"]["cost_usd"])


def test_a_rate_of_work_refuses_past_its_endpoint_seconds_until_the_next_minute(path):
    # Given 5 endpoint-seconds a minute, 3.5 of them spent this minute, and a worst case of 2 s:
    # while one decision is in flight (reserving 2 s) a second waits for the next minute: 429
    # with Retry-After.
    set_limits(open_sqlite(path).tenants, "acme", endpoint_seconds_per_minute=5.0)
    gate, inside = threading.Event(), threading.Semaphore(0)

    class Held(SlowBackend):
        def invoke(self, endpoint, body, route, caller=ANONYMOUS):
            inside.release()
            assert gate.wait(30)
            return super().invoke(endpoint, body, route, caller)

    backend = Held()
    minute = (time.time() // 60 + 1) * 60 + 20.5  # both requests in one minute, 20.5 s into it
    open_sqlite(path).counters.add_within(f"work:acme:{minute - 20.5:.0f}", 3500, None, minute + 3600)
    handler = function(path, backend, clock=lambda: minute)
    worker = threading.Thread(target=lambda: call(event("POST", "/v1/systemone", DECISION), handler))
    worker.start()
    assert inside.acquire(timeout=30)
    status, headers, body = call(event("POST", "/v1/systemone", DECISION), function(path, backend, lambda: minute))
    gate.set()
    worker.join(30)
    assert status == 429 and headers["retry-after"] == "40"
    assert "5 s of model endpoint time a minute" in body["detail"]["message"] and len(backend.calls) == 1


def test_a_request_that_fails_on_the_endpoint_still_settles_its_time(path):
    # The endpoint was held until it failed: that time is spent, the reservation is not.
    from gateway.backends.base import EndpointFailed

    class Failing(SlowBackend):
        def invoke(self, endpoint, body, route, caller=ANONYMOUS):
            time.sleep(0.05)
            raise EndpointFailed(endpoint.name, "broken")

    set_limits(open_sqlite(path).tenants, "acme", monthly_budget_usd=10.0)
    assert call(event("POST", "/v1/systemone", DECISION), function(path, Failing()))[0] == 502
    assert 0.005 <= month_tally(path) < 0.05


def test_usage_needs_a_scope_that_may_read_catalog_names_and_checks_its_days(path):
    handler = function(path, SlowBackend())
    status, _, body = call(event("GET", "/v1/usage", principal=GLOBEX), handler)  # decide and chat only
    assert status == 403 and "catalogs:read" in body["detail"]["message"]
    for query, field in (("from=2026-13-01", "from"), ("from=2026-12-05&to=2026-12-01", None),
                         ("from=2026-01-01&to=2026-12-31", None), ("to=yesterday", "to")):
        status, _, body = call(event("GET", f"/v1/usage?{query}", principal=ACME), handler)
        assert status == 422, (query, body)
        assert field is None or field in str(body)


def test_the_store_unreachable_refuses_with_503_rather_than_admitting_unchecked(path):
    services = build_services(priced_settings(), SlowBackend(), **on_store(path))
    set_limits(services.authenticator.tenant_store, "acme", monthly_budget_usd=10.0)

    def broken(*args):
        raise OSError("disk gone")

    services.spending.counters.add_within = broken
    assert services.spending is not None
    principal = Principal("acme", frozenset({"decide"}), None, "k", None)
    with pytest.raises(Exception) as refused:
        with services.spending.spend(principal.tenant_id, worst_case(1.0, 1.0), ["(inline)"]):
            pass
    assert getattr(refused.value, "status", None) == 503


def test_a_decision_naming_many_entries_settles_in_a_bounded_number_of_writes(path):
    # Given a decision naming 20 catalog entries, its usage is one day row and at most eight
    # entry rows (the first seven by name, the rest as one), and its cost is all there.
    from gateway.auth.store import TenantLimits
    from gateway.services.spending import MAX_USAGE_ENTRIES, MORE_ENTRIES, Spending

    store = open_sqlite(path)
    writes = []
    add_usage = store.counters.add_usage
    store.counters.add_usage = lambda tenant, row, until: (writes.append(row), add_usage(tenant, row, until))
    spending = Spending(store.counters, lambda _: TenantLimits())
    entries = [f"entry-{k:02d}" for k in range(20)]
    with spending.spend("acme", worst_case(1.0, 0.1), entries) as meter:
        meter.add("dg-cpu", 0.5, 0.1)
    assert len(writes) == 1 + MAX_USAGE_ENTRIES and writes[-1].entry == MORE_ENTRIES
    report = spending.usage("acme", writes[0].day, writes[0].day, TenantLimits())
    assert report["total"]["requests"] == 1
    assert sum(e["cost_usd"] for e in report["by_entry"]) == pytest.approx(report["total"]["cost_usd"])
    # Each entry its twentieth: the shared row holds the thirteen entries past the seventh.
    by_entry = {e["entry"]: e["cost_usd"] for e in report["by_entry"]}
    assert by_entry[MORE_ENTRIES] == pytest.approx(13 * by_entry["entry-01"], rel=1e-6)


def test_a_budget_of_zero_suspends_the_tenant_from_its_first_request(path):
    backend = SlowBackend()
    set_limits(open_sqlite(path).tenants, "acme", monthly_budget_usd=0.0)
    status, _, body = call(event("POST", "/v1/systemone", DECISION), function(path, backend))
    assert status == 429 and body["detail"]["error_type"] == "budget_exhausted" and not backend.calls


def test_a_lone_tenant_runs_a_58_s_request_beside_its_decisions_and_each_settles_what_it_used(path):
    # Given a lone tenant at 60 endpoint-seconds a minute and 10 USD a month, and a pool whose
    # ordinary deadline is 25 s (its streaming routes' 58 s)
    from gateway.services.spending import Spending, nano_usd

    store = open_sqlite(path)
    set_limits(store.tenants, "acme", endpoint_seconds_per_minute=60.0, monthly_budget_usd=10.0)
    now = (time.time() // 60 + 1) * 60 + 5.0
    spending = Spending(store.counters, lambda tenant: store.tenants.get_tenant(tenant).limits, clock=lambda: now)
    minute, month = f"work:acme:{now - 5:.0f}", f"spend:acme:{time.strftime('%Y-%m', time.gmtime(now))}"
    long, ordinary = worst_case(58.0, 0.1), worst_case(25.0, 0.1)
    # When it starts a 58 s chat, then the minute holds its expected time (the ordinary
    # deadline), the month its worst case (a budget is never overspent)
    with spending.spend("acme", long, ["(chat)"], expected_s=25.0) as meter:
        assert store.counters.tally(minute) == 25_000 and store.counters.tally(month) == nano_usd(long.usd)
        # And two ordinary decisions still start beside it (25 + 25 is under 60: admitted)
        with spending.spend("acme", ordinary, ["(inline)"], expected_s=25.0) as first, \
                spending.spend("acme", ordinary, ["(inline)"], expected_s=25.0) as second:
            assert store.counters.tally(minute) == 75_000
            first.add("dg-cpu", 2.0, 0.1)
            second.add("dg-cpu", 3.0, 0.1)
        meter.add("dg-cpu", 40.0, 0.1)
    # Then each reservation is replaced by what it used: 40 + 2 + 3 s, in money too
    assert store.counters.tally(minute) == 45_000
    assert store.counters.tally(month) == sum(nano_usd(m.cost().usd) for m in (meter, first, second))


def test_the_decide_service_reserves_a_long_requests_ordinary_deadline_on_the_minute(path):
    # Given a tenant at 60 endpoint-seconds a minute on a pool whose ordinary deadline is 2 s
    set_limits(open_sqlite(path).tenants, "acme", endpoint_seconds_per_minute=60.0)
    services = build_services(priced_settings(), SlowBackend(), **on_store(path))
    now = (time.time() // 60 + 1) * 60 + 5.0
    services.spending.clock = lambda: now
    pool = services.registry.route_for("chat-default", "chat").pool
    # When a 58 s request holds its work, then the minute holds 2 s of it, the ordinary deadline
    with services.decide.work("acme", pool, b"{}", ["(chat)"], 58.0):
        assert open_sqlite(path).counters.tally(f"work:acme:{now - 5:.0f}") == 2_000


def test_a_request_taken_down_for_the_asynchronous_pool_gives_its_reservation_back_and_counts_nothing(path):
    # Given a budget, and a batch line whose call the asynchronous pool's answer book took down
    from gateway.errors import AnsweredLater
    from gateway.services.spending import Spending

    store = open_sqlite(path)
    set_limits(store.tenants, "acme", monthly_budget_usd=10.0)
    spending = Spending(store.counters, lambda tenant: store.tenants.get_tenant(tenant).limits)
    with pytest.raises(AnsweredLater), spending.spend("acme", worst_case(25.0, 0.1), ["(inline)"], bulk=True) as meter:
        meter.add("dg-async", 0.001, 0.1)
        raise AnsweredLater("waits for the pool", 60)
    # Then its month holds nothing of it, and its usage no request: the line counts when it is answered
    assert month_tally(path) == 0
    day = time.strftime("%Y-%m-%d", time.gmtime())
    assert spending.usage("acme", day, day, store.tenants.get_tenant("acme").limits)["total"]["requests"] == 0
