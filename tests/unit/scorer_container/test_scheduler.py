"""The scheduler: a bounded line with a share per tenant, memory in fair order, turns a step at a time."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from dataclasses import replace

import pytest

from scorer_container.deadline import Deadline
from scorer_container.errors import CallerGone, LongOverShare, Overloaded, QueueTimeout, TenantOverShare
from scorer_container.scheduler import IDLE_CREDIT_S, MAX_LANES, UNTAGGED, Scheduler


def scheduler(**overrides) -> Scheduler:
    settings = dict(cells=8192, seqs=128, job_cells=4096, max_jobs=8, max_resident=4)
    settings.update(overrides)
    return Scheduler(**settings)


def soon(seconds: float = 30.0) -> Deadline:
    return Deadline(seconds)


# -- the line ---------------------------------------------------------------------------------


def test_a_tenant_over_its_share_of_the_line_is_refused_alone_and_others_still_get_in():
    # Given a line of 8 places, of which one tenant may hold half
    line = scheduler()
    held = [line.admit("a" * 24, "ordinary", soon()) for _ in range(4)]
    # When the same tenant asks for a fifth
    with pytest.raises(TenantOverShare) as refused:
        line.admit("a" * 24, "ordinary", soon())
    # Then it is a refusal of that tenant (429 tenant_share, with a Retry-After), not the endpoint's
    assert refused.value.status == 429 and refused.value.state == "tenant_share" and refused.value.retry_after >= 1
    # And another tenant, and the untagged lane (direct callers: no tenant, no cap), are still admitted
    others = [line.admit("b" * 24, "ordinary", soon())] + [line.admit("", "ordinary", soon()) for _ in range(3)]
    assert others[1].tenant == UNTAGGED and line.admitted == 8
    for job in held + others:
        job.release()
    assert line.admitted == 0


def test_a_full_line_is_busy_for_everyone_and_a_tenant_at_its_share_hears_about_its_share():
    line = scheduler(max_jobs=4)
    jobs = [line.admit(tenant, "ordinary", soon()) for tenant in ("a", "a", "b", "c")]
    with pytest.raises(Overloaded) as busy:
        line.admit("d", "ordinary", soon())
    assert busy.value.status == 503 and busy.value.state is None  # saturation: the gateway may go elsewhere
    with pytest.raises(TenantOverShare):
        line.admit("a", "ordinary", soon())  # its own share comes first: its retry depends on itself
    for job in jobs:
        job.release()


def test_long_work_never_takes_every_resident_place():
    # Given 4 resident places, long work may have at most 3 admitted
    line = scheduler()
    long_jobs = [line.admit(tenant, "long", soon(58)) for tenant in ("a", "b", "c")]
    with pytest.raises(LongOverShare) as refused:
        line.admit("d", "long", soon(58))
    assert refused.value.status == 429 and refused.value.state == "long_share"
    # And ordinary work is still admitted beside it
    line.admit("d", "ordinary", soon()).release()
    for job in long_jobs:
        job.release()


def test_a_job_is_released_exactly_once():
    line = scheduler()
    job = line.admit("a", "ordinary", soon())
    job.release()
    job.release()
    assert line.admitted == 0


# -- memory -----------------------------------------------------------------------------------


def test_memory_is_given_in_fair_order_and_a_tenant_always_leaves_room_for_another():
    async def scenario():
        line = scheduler(max_resident=3)
        # Given one tenant with three jobs that want memory
        flood = [line.admit("a", "ordinary", soon()) for _ in range(3)]
        waits = [asyncio.create_task(job.resident(1000, 1)) for job in flood]
        await asyncio.sleep(0.01)
        # Then it holds all but one resident place: room stays for someone else's next job
        assert [job.resident_now for job in flood] == [True, True, False]
        # When another tenant arrives, it gets that place at once
        other = line.admit("b", "ordinary", soon())
        await asyncio.wait_for(other.resident(1000, 1), 1)
        # And when one of the flood's ends, its third job comes in
        flood[0].release()
        await asyncio.wait_for(waits[2], 1)
        assert flood[2].resident_now and len({s for j in (*flood[1:], other) for s in j.seqs}) == 3
        for job in (*flood, other):
            job.release()
        await asyncio.gather(*waits)

    asyncio.run(scenario())


def test_long_work_holds_no_more_memory_than_leaves_one_jobs_context_free():
    async def scenario():
        line = scheduler()  # 8,192 cells, 4,096 one job's context
        first = line.admit("a", "long", soon(58))
        await first.resident(3000, 1)
        second = line.admit("b", "long", soon(58))
        waiting = asyncio.create_task(second.resident(3000, 1))
        await asyncio.sleep(0.01)
        assert not second.resident_now  # 6,000 cells of long work would leave less than a context
        ordinary = line.admit("c", "ordinary", soon())
        await asyncio.wait_for(ordinary.resident(4096, 1), 1)  # ordinary work still fits a whole context
        first.release()
        await asyncio.wait_for(waiting, 1)
        for job in (second, ordinary):
            job.release()

    asyncio.run(scenario())


def test_a_wait_for_memory_past_the_deadline_is_busy_and_gives_everything_back():
    async def scenario():
        line = scheduler(max_resident=1)
        holder = line.admit("a", "ordinary", soon())
        await holder.resident(100, 1)
        late = line.admit("b", "ordinary", Deadline(0.05))
        with pytest.raises(QueueTimeout) as busy:
            await late.resident(100, 1)
        assert busy.value.status == 503 and busy.value.state == "queue_timeout"
        late.release()
        gone = line.admit("c", "ordinary", Deadline(0.05))
        gone.deadline.caller_gone()
        with pytest.raises(CallerGone):
            await gone.resident(100, 1)
        gone.release()
        holder.release()
        assert line.admitted == 0 and line.figures()["line"]["cells_held"] == 0

    asyncio.run(scenario())


def test_a_job_that_waited_for_anothers_memory_or_plan_counts_its_time_as_shared():
    # A cut at its deadline after waiting for others is load (503, retry), not size (504): the
    # wait took time that the estimate which admitted it counted on
    async def scenario():
        clock = Clock()
        line = scheduler(max_resident=1, clock=clock)
        holder, waiter = line.admit("a", "ordinary", soon()), line.admit("b", "ordinary", soon())
        await holder.resident(100, 1)
        waiting = asyncio.create_task(waiter.resident(100, 1))
        await asyncio.sleep(0.01)
        clock.spend(5.0)
        holder.release()
        await asyncio.wait_for(waiting, 1)
        assert waiter.queued_s == 5.0 and waiter.shared and not holder.shared
        waiter.release()

        first, second = line.admit("a", "ordinary", soon()), line.admit("b", "ordinary", soon())

        async def plan(job):
            async with job.planning():
                await asyncio.sleep(0.01)
                clock.spend(2.0)

        await asyncio.gather(plan(first), plan(second))
        assert (first.queued_s, second.queued_s) == (0.0, 2.0) and second.shared  # 2 s of its 30
        assert not replace(second, queued_s=1.0).shared  # 1 s of 30: under QUEUED_SHARE, a cut is its size
        first.release()
        second.release()

    asyncio.run(scenario())


def test_planning_is_one_at_a_time_and_the_next_planner_is_chosen_fairly():
    async def scenario():
        line = scheduler()
        order = []
        gate = asyncio.Event()

        async def plan(job, name):
            async with job.planning():
                order.append(name)
                await gate.wait()

        # Given tenant a planning, with two more of its requests and one of tenant b's waiting
        jobs = [line.admit("a", "ordinary", soon()) for _ in range(3)] + [line.admit("b", "ordinary", soon())]
        tasks = [asyncio.create_task(plan(job, f"{job.tenant}{i}")) for i, job in enumerate(jobs)]
        await asyncio.sleep(0.01)
        assert order == ["a0"]
        # When each plan ends, b's goes next (a has had its time), then a's others in turn
        gate.set()
        await asyncio.gather(*tasks)
        assert order[:2] == ["a0", "b3"]
        for job in jobs:
            job.release()

    asyncio.run(scenario())


# -- turns --------------------------------------------------------------------------------------


class Clock:
    """Seconds that pass only when a step says so: turns are charged what they 'took'."""

    def __init__(self) -> None:
        self.now = 0.0
        self.lock = threading.Lock()

    def __call__(self) -> float:
        with self.lock:
            return self.now

    def spend(self, seconds: float) -> None:
        with self.lock:
            self.now += seconds


def run_steps(line: Scheduler, jobs: dict[str, tuple], clock: Clock) -> list[str]:
    """Each job (name -> (job, steps, seconds a step)) takes its steps in a thread of its own;
    the order the model served them in."""
    order: list[str] = []
    started = threading.Barrier(len(jobs))

    def work(name, job, steps, seconds):
        started.wait()
        for _ in range(steps):
            with job.step():
                order.append(name)
                clock.spend(seconds)
                time.sleep(0.002)  # the others are waiting for the turn by now

    threads = [threading.Thread(target=work, args=(name, *spec)) for name, spec in jobs.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    return order


def longest_run(order: list[str]) -> int:
    return max(len(list(run)) for _, run in itertools.groupby(order))


def resident(line: Scheduler, tenant: str, work: str = "ordinary", weight: float = 1.0):
    async def take():
        job = line.admit(tenant, work, Deadline(3600, clock=line.clock), weight)
        await job.resident(100, 1)
        return job

    return asyncio.run(take())


def test_long_work_yields_between_steps_and_gets_its_share_while_ordinary_work_waits():
    # Given a long job (1 s steps, as a long chat's prefill pieces) and an ordinary decision (0.25 s
    # steps) of two tenants, both ready to run
    clock = Clock()
    line = scheduler(clock=clock)
    long_job, decision = resident(line, "a", "long"), resident(line, "b")
    order = run_steps(line, {"long": (long_job, 12, 1.0), "decision": (decision, 24, 0.25)}, clock)
    # Then, until the decision is done, it never waits behind more than one of the long job's steps
    done_decision = max(i for i, name in enumerate(order) if name == "decision")
    served = "".join("L" if n == "long" else "d" for n in order[:done_decision])
    assert max(len(run) for run in served.split("d")) <= 1
    # And while both were ready, long work had about its share (25%) of the model's time
    long_s = sum(1.0 for name in order[:done_decision] if name == "long")
    assert 0.15 <= long_s / (long_s + 24 * 0.25) <= 0.4
    figures = line.figures()
    assert figures["busy_s_by_work"] == {"long": 12.0, "ordinary": 6.0}
    assert figures["busy_s_total_by_work"] == {"ordinary": 6.0, "long": 12.0, "bulk": 0.0}


def test_tenants_of_one_kind_share_the_model_by_their_weights():
    clock = Clock()
    line = scheduler(clock=clock)
    heavy, light = resident(line, "a", weight=2.0), resident(line, "b")
    order = run_steps(line, {"heavy": (heavy, 30, 0.1), "light": (light, 30, 0.1)}, clock)
    # While both were ready (until the light one's 10th step at least), 2 steps to 1
    first_30 = order[:30]
    assert 18 <= first_30.count("heavy") <= 22


def test_a_job_alone_gets_every_turn_long_work_included():
    clock = Clock()
    line = scheduler(clock=clock)
    alone = resident(line, "a", "long")
    assert run_steps(line, {"long": (alone, 20, 0.5)}, clock) == ["long"] * 20
    assert alone.own_s == 10.0 and not alone.shared


def test_a_tenant_that_arrives_late_gets_at_most_the_idle_credit_then_shares_level():
    # Given tenant a busy alone for a long while
    clock = Clock()
    line = scheduler(clock=clock)
    early = resident(line, "a")
    run_steps(line, {"early": (early, 10, 1.0)}, clock)
    # When tenant b arrives, it runs first for the service it saved by idling (IDLE_CREDIT_S), no
    # more: it banks no minutes of priority; then they alternate
    late = resident(line, "b")
    order = run_steps(line, {"early": (early, 20, 0.1), "late": (late, 20, 0.1)}, clock)
    head = order.index("early")
    assert round(IDLE_CREDIT_S / 0.1) <= head <= round(IDLE_CREDIT_S / 0.1) + 1  # + a float's rounding
    assert longest_run(order[head:30]) <= 2


def test_a_tenant_that_sends_back_to_back_saves_no_credit():
    # Given tenant a working all along, and tenant b sending one short job after another
    clock = Clock()
    line = scheduler(clock=clock)
    steady = resident(line, "a")
    first = resident(line, "b")
    run_steps(line, {"a": (steady, 10, 0.1), "b": (first, 10, 0.1)}, clock)
    first.release()
    # When b's next job comes at once, it starts level with a: alternating, no head start
    again = resident(line, "b")
    order = run_steps(line, {"a": (steady, 6, 0.1), "b": (again, 6, 0.1)}, clock)
    assert longest_run(order[:10]) <= 2 and order[:4].count("b") <= 2


def test_idle_lanes_are_remembered_within_a_bound():
    line = scheduler(max_jobs=10_000)
    for n in range(MAX_LANES + 10):
        line.admit(f"{n:024x}", "ordinary", soon()).release()
    assert len(line._lanes) <= MAX_LANES


def test_a_job_waiting_for_its_turn_stops_at_its_deadline():
    clock = Clock()
    line = scheduler()
    holder = resident(line, "a")
    late = line.admit("b", "ordinary", Deadline(0.2))
    asyncio.run(late.resident(100, 1))
    with holder.step():
        with pytest.raises(Exception) as cut:
            with late.step():
                pass
    assert type(cut.value).__name__ == "DeadlineExceeded"
    assert clock() == 0.0


def test_a_share_that_comes_back_after_others_ran_alone_starts_level_not_ahead_or_behind():
    # Given tenant a served an hour, then idle while tenant b arrived and ran alone
    clock = Clock()
    line = scheduler(clock=clock)
    a = resident(line, "a")
    run_steps(line, {"a": (a, 1, 3600.0)}, clock)
    a.release()
    b = resident(line, "b")
    run_steps(line, {"b": (b, 2, 1.0)}, clock)
    # When a comes back, neither is owed the hour: b's arrival started level with where a's
    # service ended, and a starts level again (less its idle credit, it idled)
    back = resident(line, "a")
    order = run_steps(line, {"a": (back, 10, 0.1), "b": (b, 10, 0.1)}, clock)
    assert order[:4].count("b") >= 1 and longest_run(order[:16]) <= round(IDLE_CREDIT_S / 0.1) + 2
    # And long work that arrives in a lull of ordinary work gets its share, not an hour's priority
    long_job = resident(line, "c", "long")
    order = run_steps(line, {"long": (long_job, 8, 0.5), "ordinary": (b, 24, 0.5)}, clock)
    assert order[:16].count("long") <= 7


def test_a_job_released_while_its_thread_runs_is_released_when_the_thread_ends():
    # Given a job whose work runs in a worker thread (a streamed chat whose caller then leaves)
    async def scenario():
        line = scheduler()
        job = line.admit("a", "ordinary", soon())
        await job.resident(100, 1)
        started, finish = threading.Event(), threading.Event()

        def work():
            started.set()
            finish.wait(5)

        running = job.run(work)
        await asyncio.to_thread(started.wait, 5)
        # When the job is released while the thread still runs
        job.release()
        # Then nothing of it is handed to another yet: its place, memory and sequences stay its own
        assert not job.released and job.resident_now and job.seqs and line.admitted == 1
        finish.set()
        await running
        # And the thread's end releases it
        assert job.released and line.admitted == 0 and line.figures()["line"]["cells_held"] == 0

    asyncio.run(scenario())


def test_an_abandoned_job_waiting_for_its_turn_stops_at_once():
    async def scenario():
        line = scheduler()
        holder, waiter = line.admit("a", "ordinary", soon()), line.admit("b", "ordinary", soon())
        for job in (holder, waiter):
            await job.resident(100, 1)
        outcome = {}

        def wait_for_turn():
            try:
                with waiter.step():
                    outcome["ran"] = True
            except CallerGone:
                outcome["gone"] = True

        with holder.step():
            running = waiter.run(wait_for_turn)
            await asyncio.sleep(0.05)
            waiter.release()  # its caller left while it waited
            await asyncio.wait_for(running, 2)  # it did not wait for the turn, nor its deadline
        assert outcome == {"gone": True} and waiter.released
        holder.release()

    asyncio.run(scenario())


def test_a_share_that_waited_for_memory_banks_no_priority_and_lends_none_to_newcomers():
    # Given tenant a served 30 s, then tenant w admitted but waiting (for memory), a served 30 s more
    clock = Clock()
    line = scheduler(clock=clock)
    a = resident(line, "a")
    run_steps(line, {"a": (a, 30, 1.0)}, clock)
    waiting = line.admit("w", "ordinary", Deadline(3600, clock=clock))
    run_steps(line, {"a": (a, 30, 1.0)}, clock)
    # When a newcomer arrives, it is levelled with a (who competes), not with w's frozen figure:
    # at most its idle credit ahead
    newcomer = resident(line, "n")
    order = run_steps(line, {"a": (a, 12, 0.1), "n": (newcomer, 30, 0.1)}, clock)
    assert order[:20].count("a") >= 4
    # And when w at last competes, it too has at most the credit, not the 30 s it waited
    asyncio.run(waiting.resident(100, 1))
    order = run_steps(line, {"a": (a, 12, 0.1), "w": (waiting, 30, 0.1)}, clock)
    assert order[:20].count("a") >= 4


def test_an_abandoned_job_gets_no_turn_even_on_a_free_model():
    async def scenario():
        line = scheduler()
        job = line.admit("a", "ordinary", soon())
        await job.resident(100, 1)
        go, outcome = threading.Event(), {}

        def work():
            go.wait(5)
            try:
                with job.step():
                    outcome["ran"] = True
            except CallerGone:
                outcome["gone"] = True

        running = job.run(work)
        job.release()  # its caller left while its thread ran
        go.set()
        await running
        assert outcome == {"gone": True} and job.released and line.admitted == 0

    asyncio.run(scenario())


def test_a_job_whose_caller_is_cancelled_before_its_thread_starts_is_still_released():
    async def scenario():
        line = scheduler(max_resident=1)  # one worker thread
        busy, free = line.admit("a", "ordinary", soon()), threading.Event()
        await busy.resident(10, 1)
        holding = busy.run(free.wait, 5)  # the one thread is taken
        queued = line.admit("a", "ordinary", soon())
        queued.resident_now = True  # as if granted, to reach run() behind the busy thread

        async def caller():
            with queued:
                await queued.run(lambda: None)

        task = asyncio.create_task(caller())
        await asyncio.sleep(0.05)
        task.cancel()  # the caller leaves while its work waits for a thread
        with pytest.raises(asyncio.CancelledError):
            await task
        free.set()
        await holding
        busy.release()
        for _ in range(50):
            if queued.released:
                break
            await asyncio.sleep(0.02)
        assert queued.released and line.admitted == 0

    asyncio.run(scenario())


def test_a_job_does_not_start_a_turn_it_could_not_finish_before_its_deadline():
    # Given turns of about 0.3 s, a job with less of its deadline left than that is cut before
    # its turn, so its 503 reaches the caller before the caller stops listening, not a turn late.
    line = scheduler()
    holder = resident(line, "a")
    with holder.step():
        time.sleep(0.3)
    near = line.admit("b", "ordinary", Deadline(0.25))
    asyncio.run(near.resident(100, 1))
    started = time.monotonic()
    with pytest.raises(Exception) as cut:
        with near.step():
            pass
    assert type(cut.value).__name__ == "DeadlineExceeded" and time.monotonic() - started < 0.2
    roomy = line.admit("c", "ordinary", Deadline(30.0))
    asyncio.run(roomy.resident(100, 1))
    with roomy.step():  # plenty of time: the turn is taken
        pass


def test_bulk_work_waits_for_an_interactive_job_between_its_steps_beyond_its_own_share():
    # Given a batch line (bulk, 0.25 s steps) always ready, and an interactive decision whose
    # thread works a little between its steps (reading the last step's logits, as the engine does)
    clock = Clock()
    line = scheduler(clock=clock)
    bulk, decision = resident(line, "a", "bulk"), resident(line, "b")
    order: list[str] = []

    def steps(job, name, count, between_s):
        for _ in range(count):
            time.sleep(between_s)
            with job.step():
                order.append(name)
                clock.spend(0.25)
                time.sleep(0.002)
        with line._turns:  # its thread is done with it (Job.run's end)
            job.working = False
            line._turns.notify_all()

    bulk.working = decision.working = True
    threads = [threading.Thread(target=steps, args=(decision, "decision", 24, 0.01)),
               threading.Thread(target=steps, args=(bulk, "bulk", 40, 0.0))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    # Then until the decision is done, bulk runs little more than its share (5%: a step in 20),
    # where without the rule it would take a step in each of the decision's gaps
    done_decision = max(i for i, name in enumerate(order) if name == "decision")
    # (1 s of idle credit is 4 of its steps, and its share one in 20 of the decision's 24)
    assert order[:done_decision].count("bulk") <= 6
    # And once the decision is done, bulk has the model to itself (work-conserving)
    assert len(order) == 64 and set(order[done_decision + 1:]) == {"bulk"}
