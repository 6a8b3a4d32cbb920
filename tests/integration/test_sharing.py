"""Tenants share the real scorer: a running job yields to another tenant's work between steps, and a
tenant over its share is refused alone (the scheduler's unit tests hold the order; these hold it
against llama.cpp over HTTP)."""

import threading
import time

import httpx
import pytest

from scorer_container.server import create_app
from scorer_container.settings import ScorerSettings
from systemone.sidechannel import attributes, tenant_tag
from tests.conftest import ServerThread, words

pytestmark = pytest.mark.model

A, B = tenant_tag("tenant-a", b"k" * 32), tenant_tag("tenant-b", b"k" * 32)
DECISION = {
    "model": "m",
    "state": "I was charged twice for order 4411, refund one please.",
    "questions": {"refund": {"type": "noul", "instructions": "Is this a refund request?"},
                  "queue": {"type": "choice", "instructions": "Which queue?",
                            "criteria": {"billing": "payments", "delivery": "shipping", "account": None}}},
}
LONG_CHAT = {"model": "m", "messages": [{"role": "user", "content": "Tell a very long story about a lighthouse."}],
             "max_tokens": 600, "temperature": 0.8, "seed": 7, "stream": True}


@pytest.fixture(scope="module")
def shared_scorer(smollm2_path):
    # A line of 2 places, one per tenant at most; a fixed budget (the derived one depends on the machine)
    settings = ScorerSettings.from_env({"SM_LLAMA_CPP_MODEL": str(smollm2_path), "SM_LLAMA_CPP_THREADS": "2",
                                        "SCORER_MAX_REQUEST_TOKENS": "60000", "SCORER_MAX_JOBS": "2"})
    with ServerThread(create_app(settings, load_in_background=False)) as server:
        yield server.url


def invoke(url, body, tenant, timeout_ms=20_000, route="systemone"):
    return httpx.post(f"{url}/invocations", json=body, timeout=90,
                      headers={"X-Amzn-SageMaker-Custom-Attributes": attributes(route, timeout_ms, tenant=tenant)})


def decision_alone_s(url) -> float:
    invoke(url, DECISION, B)  # warm: priors cached, as they are while the chat runs
    start = time.monotonic()
    assert invoke(url, DECISION, B).status_code == 200
    return time.monotonic() - start


def test_another_tenants_decision_is_answered_while_a_long_chat_streams(shared_scorer):
    # Given tenant b's decision time alone, and tenant a streaming a long chat (long work: a 58 s deadline)
    alone_s = decision_alone_s(shared_scorer)
    chat: dict = {}

    def stream():
        started = time.monotonic()
        with httpx.stream("POST", f"{shared_scorer}/invocations", json=LONG_CHAT, timeout=90, headers={
                "X-Amzn-SageMaker-Custom-Attributes": attributes("chat", 58_000, tenant=A, work="long")}) as response:
            chat["status"] = response.status_code
            chat["first_s"] = None
            for line in response.iter_lines():
                if line.startswith("data: {") and chat["first_s"] is None:
                    chat["first_s"] = time.monotonic() - started
            chat["ended"] = time.monotonic()

    worker = threading.Thread(target=stream)
    worker.start()
    while chat.get("first_s") is None and worker.is_alive():
        time.sleep(0.05)
    # When tenant b decides while the chat generates
    start = time.monotonic()
    answered = invoke(shared_scorer, DECISION, B)
    took_s, answered_at = time.monotonic() - start, time.monotonic()
    worker.join()
    # Then it is answered before the chat ends, in little more than its time alone: the chat
    # yielded between its tokens (before, the decision waited behind the whole chat)
    assert answered.status_code == 200 and chat["status"] == 200
    assert answered_at < chat["ended"]
    assert took_s < 3 * alone_s + 1.0
    figures = httpx.get(f"{shared_scorer}/stats").json()
    assert figures["busy_s_by_tenant"][A] > 0 and figures["busy_s_by_tenant"][B] > 0
    assert figures["busy_s_by_work"]["long"] > 0 and figures["line"]["admitted"] == 0


def test_a_tenant_over_its_share_is_refused_429_alone_and_another_tenant_is_served(shared_scorer):
    # Given tenant a holding its one place with a long chat, generating
    chat: dict = {}
    generating = threading.Event()

    def stream():
        with httpx.stream("POST", f"{shared_scorer}/invocations", json=LONG_CHAT, timeout=90, headers={
                "X-Amzn-SageMaker-Custom-Attributes": attributes("chat", 58_000, tenant=A)}) as response:
            chat["status"] = response.status_code
            for line in response.iter_lines():
                if words(line):
                    generating.set()

    worker = threading.Thread(target=stream)
    worker.start()
    assert generating.wait(30)
    # When tenant a asks again, and tenant b asks
    refused = invoke(shared_scorer, DECISION, A)
    served = invoke(shared_scorer, DECISION, B)
    worker.join()
    # Then a's is refused with a refusal of its own (429 tenant_share, Retry-After, in the body too),
    # which a gateway never counts against the endpoint; b's is answered (before, both got 503)
    assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1
    body = refused.json()
    assert body["x_state"] == "tenant_share" and body["x_retry_after"] >= 1
    assert body["detail"]["error_type"] == "rate_limit_error" and "share" in body["detail"]["message"]
    assert served.status_code == 200 and chat["status"] == 200


def test_streams_whose_callers_leave_give_their_places_back(shared_scorer):
    def line_when_drained() -> dict:
        deadline = time.monotonic() + 10
        while (line := httpx.get(f"{shared_scorer}/stats").json()["line"])["admitted"] and time.monotonic() < deadline:
            time.sleep(0.05)
        return line

    # Given streamed chats whose callers leave at once, before or while they generate
    for _ in range(4):
        with httpx.stream("POST", f"{shared_scorer}/invocations", json=LONG_CHAT, timeout=30, headers={
                "X-Amzn-SageMaker-Custom-Attributes": attributes("chat", 58_000, tenant=A)}) as response:
            assert response.status_code == 200
        # Then each gives its place, memory and sequences back within a step: the line is whole again
        line = line_when_drained()
        assert line["admitted"] == 0 and line["resident"] == 0 and line["cells_held"] == 0
    assert invoke(shared_scorer, DECISION, A).status_code == 200  # and the tenant is served again
