"""Work past API Gateway's 29 s, end to end as `make up` serves it (bench/long.py): a decision
needing about 40 s of the scorer's time, which the buffered route must refuse, answered
through the streaming route; refused at once, with a time to retry, while the model is busy."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.model


def test_a_decision_needing_40_s_is_refused_buffered_and_answered_on_the_streaming_route():
    from bench.long import run
    from bench.stack import local_stack
    from devkit.models import GEMMA_DIR

    with local_stack(GEMMA_DIR) as stack:
        report = run(stack, target_s=40.0)
    assert report["buffered"]["status"] == 413 and report["buffered"]["seconds"] < 1
    assert report["while_busy"]["status"] == 429 and int(report["while_busy"]["retry_after"]) >= 1
    assert report["streaming_route"]["status"] == 200
    assert report["streaming_route"]["answers"] == report["questions"]
    assert 29 < report["streaming_route"]["seconds"] < 60
