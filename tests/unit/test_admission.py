import asyncio

import pytest

from scorer_container.admission import Admission
from scorer_container.deadline import Deadline
from scorer_container.errors import CallerGone, DeadlineExceeded, Overloaded


def test_one_runs_the_line_waits_and_the_rest_is_refused_at_once():
    async def scenario():
        admission = Admission(max_waiting=1)
        release = asyncio.Event()
        started = []

        async def job(name):
            with admission.admit() as ticket:
                async with ticket.running():
                    started.append(name)
                    await release.wait()

        first = asyncio.create_task(job("first"))
        second = asyncio.create_task(job("second"))
        await asyncio.sleep(0.01)
        assert started == ["first"] and admission.admitted == 2
        with pytest.raises(Overloaded) as refused:
            admission.admit()
        assert refused.value.retry_after >= 1
        release.set()
        await asyncio.gather(first, second)
        assert started == ["first", "second"] and admission.admitted == 0

    asyncio.run(scenario())


def test_a_cancelled_waiter_gives_its_place_back():
    async def scenario():
        admission = Admission(max_waiting=1)
        hold = asyncio.Event()

        async def job():
            with admission.admit() as ticket:
                async with ticket.running():
                    await hold.wait()

        running = asyncio.create_task(job())
        waiting = asyncio.create_task(job())
        await asyncio.sleep(0.01)
        waiting.cancel()
        await asyncio.sleep(0.01)
        assert admission.admitted == 1
        hold.set()
        await running
        assert admission.admitted == 0

    asyncio.run(scenario())


class Line:
    """An admission with jobs that hold the model until `hold` is set; `ran` lists who ran."""

    def __init__(self) -> None:
        self.admission = Admission(max_waiting=1)
        self.hold = asyncio.Event()
        self.ran: list[str] = []

    async def job(self, name: str, deadline: Deadline | None = None) -> None:
        with self.admission.admit() as ticket:
            async with ticket.running(deadline):
                self.ran.append(name)
                await self.hold.wait()


def test_a_job_whose_deadline_passes_while_it_waits_never_runs():
    # Given one job holding the model, when a second one's deadline passes in line,
    # then it is refused with DeadlineExceeded without running and gives its place back.
    async def scenario():
        line = Line()
        first = asyncio.create_task(line.job("first"))
        await asyncio.sleep(0.01)
        with pytest.raises(DeadlineExceeded):
            await line.job("late", Deadline(0.05))
        assert line.ran == ["first"] and line.admission.admitted == 1
        line.hold.set()
        await first
        assert line.admission.admitted == 0

    asyncio.run(scenario())


def test_a_job_whose_caller_left_while_it_waited_never_runs():
    async def scenario():
        line = Line()
        gone = Deadline(60)
        first = asyncio.create_task(line.job("first"))
        await asyncio.sleep(0.01)
        second = asyncio.create_task(line.job("gone", gone))
        await asyncio.sleep(0.01)
        gone.caller_gone()
        line.hold.set()
        await first
        with pytest.raises(CallerGone):
            await second
        assert line.ran == ["first"] and line.admission.admitted == 0

    asyncio.run(scenario())


def test_long_work_is_admitted_only_when_the_model_is_idle():
    async def scenario():
        admission = Admission(max_waiting=4)
        # While any job holds a ticket, long work is refused at once, with a time to retry
        with admission.admit():
            with pytest.raises(Overloaded) as refused:
                admission.admit(alone=True)
            assert refused.value.retry_after >= 1 and "long" in refused.value.message
        # Once the model is idle it is admitted, and ordinary work lines up behind it as usual
        with admission.admit(alone=True) as long_ticket:
            async with long_ticket.running():
                with admission.admit():
                    assert admission.admitted == 2
        assert admission.admitted == 0

    asyncio.run(scenario())
