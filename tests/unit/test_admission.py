import asyncio

import pytest

from scorer_container.admission import Admission
from scorer_container.errors import Overloaded


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
