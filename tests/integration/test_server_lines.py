"""An asynchronous invocation's body of lines, over real HTTP on the real model: each line answered
as its own request would be, in order, each refusal its own, and lines past the invocation's time
not run (so that their sender sends them again)."""

import json

import httpx
import pytest

from systemone.sidechannel import CUSTOM_ATTRIBUTES
from tests.e2e.test_batches import same_answer
from tests.integration.test_server import CHAT, DECISION

pytestmark = pytest.mark.model
JSONL = {"Content-Type": "application/jsonlines"}


def invoke(scorer_url: str, lines: list, headers: dict | None = None) -> list[dict]:
    body = "\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines).encode() + b"\n"
    reply = httpx.post(f"{scorer_url}/invocations", content=body, headers={**JSONL, **(headers or {})}, timeout=120)
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("application/jsonlines")
    return [json.loads(line) for line in reply.text.splitlines()]


def test_each_line_is_answered_as_its_own_request_in_order(scorer_url):
    other = {**DECISION, "state": "Where is my parcel? It was due on Monday."}
    lines = [{"id": "a", "route": "systemone", "body": DECISION, "attributes": "work=bulk;tenant=" + "a1" * 16},
             {"id": "b", "route": "chat", "body": CHAT},
             "{not json",
             {"id": "c", "route": "systemone", "body": {"model": "jev-latest"}},
             {"id": "d", "route": "chat", "body": {**CHAT, "stream": True}},
             {"id": "e", "body": other}]
    answers = invoke(scorer_url, lines)
    assert [(a["id"], a["line"], a["status"]) for a in answers] == [
        ("a", 1, 200), ("b", 2, 200), (None, 3, 400), ("c", 4, 422), ("d", 5, 400), ("e", 6, 200)]
    # Each line's time on the scorer: a chat's too, whose answer says none of its own
    assert answers[1]["x_busy_ms"] > 0 and all(isinstance(a["x_busy_ms"], int) and a["x_busy_ms"] >= 0 for a in answers)
    assert answers[0]["x_busy_ms"] >= answers[0]["body"]["usage"]["x_busy_ms"]
    for answer, asked in ((answers[0], DECISION), (answers[5], other)):
        same_answer(answer["body"], httpx.post(f"{scorer_url}/invocations", json=asked, timeout=60).json())
    assert answers[1]["body"]["choices"][0]["message"]["content"]
    assert answers[3]["body"]["detail"][0]["loc"][0] == "body"  # System One's validation shape, as alone


def test_lines_past_the_invocations_time_are_not_run(scorer_url):
    lines = [{"id": f"l{i}", "body": DECISION} for i in range(3)]
    answers = invoke(scorer_url, lines, {CUSTOM_ATTRIBUTES: "timeout_ms=500"})
    assert {(a["status"], a["body"]["x_state"]) for a in answers} == {(503, "queue_timeout")}
