"""Work past API Gateway's 29 s, end to end as `make up` serves it (bench/long.py): a decision
needing about 40 s of the scorer's time is refused with the ordinary deadline (413, saying how
to ask for more), and answered on the streaming route when its caller asks for the time
(`Prefer: wait=58`): on an idle model, and beside another decision, the two taking turns (or
refused as busy, with a Retry-After, when the wait left too little of its deadline)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.model


def test_a_decision_needing_40_s_is_answered_when_its_caller_asks_for_the_time():
    import os

    from bench.long import run
    from bench.stack import local_stack
    from devkit.models import GEMMA_DIR

    environment = dict(os.environ)
    with local_stack(GEMMA_DIR) as stack:
        report = run(stack, target_s=40.0)
    assert dict(os.environ) == environment  # the stack's quiet settings leave with it (the tests after it log)
    ordinary, busy, asked = report["ordinary"], report["while_busy"], report["asked_for_time"]
    assert ordinary["status"] == 413 and ordinary["seconds"] < 1 and "Prefer: wait=58" in ordinary["message"]
    # Beside another decision it takes turns (200), or, when waiting for the other's plan and turns
    # left too little of its deadline for work this size, it is refused as busy: a retry can succeed
    assert (busy["status"] == 200 and busy["seconds"] < 60) or (busy["status"] == 429 and int(busy["retry_after"]) >= 1)
    assert asked["status"] == 200 and asked["answers"] == report["questions"]
    assert 29 < asked["seconds"] < 60
