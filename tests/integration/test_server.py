"""The scorer over real HTTP: SageMaker contract, dispatch, errors, admission, SDK clients."""

import gzip
import json
import shutil
import threading
import time

import boto3
import httpx
import pytest
import zstandard
from botocore.config import Config

from scorer_container.server import create_app
from scorer_container.settings import ScorerSettings
from tests.conftest import ServerThread

pytestmark = pytest.mark.model

DECISION = {
    "model": "jev-latest",
    "state": "I was charged twice for order 4411, refund one please.",
    "questions": {"refund": {"type": "noul", "instructions": "Is this a refund request?"}},
}
CHAT = {"model": "chat-default", "messages": [{"role": "user", "content": "Say hello"}], "max_tokens": 8, "temperature": 0}


def test_ping_is_ready_and_models_answers_both_shapes(scorer_url):
    assert httpx.get(f"{scorer_url}/ping").status_code == 200
    body = httpx.get(f"{scorer_url}/v1/models").json()
    assert body["object"] == "list" and body["data"][0]["object"] == "model"
    assert body["models"][0]["name"] == body["data"][0]["id"] == "smollm2-135m-instruct-q4_1"


def test_invocations_dispatch_on_the_body(scorer_url):
    started = time.perf_counter()
    decision = httpx.post(f"{scorer_url}/invocations", json=DECISION, timeout=60)
    took_ms = (time.perf_counter() - started) * 1000
    assert decision.status_code == 200 and "refund" in decision.json()["answers"]
    # The time the scorer worked on it, which the gateway charges on a shared instance.
    assert 0 < decision.json()["usage"]["x_busy_ms"] <= took_ms
    assert decision.headers["x-typesafe-request-id"] == decision.headers["x-request-id"]
    chat = httpx.post(f"{scorer_url}/invocations", json=CHAT, timeout=60)
    assert chat.status_code == 200 and chat.json()["object"] == "chat.completion"


def test_invocations_dispatch_on_custom_attributes(scorer_url):
    # A body with both keys goes where the header says.
    body = {**DECISION, "messages": CHAT["messages"], "max_tokens": 4}
    chat = httpx.post(f"{scorer_url}/invocations", json=body, timeout=60,
                      headers={"X-Amzn-SageMaker-Custom-Attributes": "route=chat"})
    assert chat.json()["object"] == "chat.completion"
    decision = httpx.post(f"{scorer_url}/invocations", json=body, timeout=60)
    assert "answers" in decision.json()


def test_boto3_sagemaker_runtime_client_works_unchanged(scorer_url):
    client = boto3.client(
        "sagemaker-runtime", endpoint_url=scorer_url, region_name="us-east-1",
        aws_access_key_id="local", aws_secret_access_key="local",
        config=Config(retries={"max_attempts": 1}),
    )
    reply = client.invoke_endpoint(EndpointName="decisions-cpu", ContentType="application/json",
                                   Body=json.dumps(DECISION).encode())
    assert "refund" in json.loads(reply["Body"].read())["answers"]


def test_a_chat_stream_is_chunked_on_invocations_as_sagemaker_streams_it(scorer_url):
    # Given a streamed chat sent the way SageMaker forwards InvokeEndpointWithResponseStream:
    # POST /invocations, the route in the custom attributes
    body = {**CHAT, "max_tokens": 24, "temperature": 0, "stream": True}
    arrivals = []
    with httpx.stream("POST", f"{scorer_url}/invocations", json=body, timeout=60,
                      headers={"X-Amzn-SageMaker-Custom-Attributes": "route=chat;timeout_ms=20000"}) as reply:
        # Then the answer is chunked server-sent events, each piece flushed as it is generated
        assert reply.status_code == 200 and reply.headers["transfer-encoding"] == "chunked"
        assert reply.headers["content-type"].startswith("text/event-stream")
        for piece in reply.iter_raw():
            arrivals.append((time.perf_counter(), piece))
    text = b"".join(piece for _, piece in arrivals)
    assert text.endswith(b"data: [DONE]\n\n") and len(arrivals) >= 10
    assert arrivals[-1][0] - arrivals[0][0] > 0.05  # spread over the generation, not sent at its end


def test_botocore_streams_the_scorer_through_invoke_endpoint_with_response_stream(scorer_url):
    client = boto3.client("sagemaker-runtime", endpoint_url=scorer_url, region_name="us-east-1",
                          aws_access_key_id="local", aws_secret_access_key="local")
    reply = client.invoke_endpoint_with_response_stream(
        EndpointName="chat-cpu", ContentType="application/json", CustomAttributes="route=chat",
        Body=json.dumps({**CHAT, "max_tokens": 8, "stream": True, "stream_options": {"include_usage": True}}).encode())
    parts = [event["PayloadPart"]["Bytes"] for event in reply["Body"]]
    assert reply["ContentType"].startswith("text/event-stream") and len(parts) > 3
    events = [e for e in b"".join(parts).decode().split("\n\n") if e]
    assert events[-1] == "data: [DONE]" and json.loads(events[-2][6:])["usage"]["completion_tokens"] <= 8


def test_boto3_sees_a_container_error_as_sagemaker_reports_it(scorer_url):
    """Given a bad decision sent through InvokeEndpoint, boto3 raises ModelError (HTTP 424)
    with the container's own status and body, as it does against AWS."""
    client = boto3.client(
        "sagemaker-runtime", endpoint_url=scorer_url, region_name="us-east-1",
        aws_access_key_id="local", aws_secret_access_key="local",
        config=Config(retries={"max_attempts": 1}),
    )
    bad = {"model": "m", "state": "s", "questions": {"q": {"type": "score", "criteria": {"0": "low"}}}}
    with pytest.raises(client.exceptions.ModelError) as raised:
        client.invoke_endpoint(EndpointName="decisions-cpu", ContentType="application/json", Body=json.dumps(bad).encode())
    error = raised.value.response
    assert error["ResponseMetadata"]["HTTPStatusCode"] == 424
    assert error["OriginalStatusCode"] == 422
    assert json.loads(error["OriginalMessage"])["detail"][0]["loc"][:3] == ["body", "questions", "q"]


@pytest.mark.parametrize("encoding", ["gzip", "zstd"])
def test_compressed_bodies_are_accepted(scorer_url, encoding):
    raw = json.dumps(DECISION).encode()
    data = gzip.compress(raw) if encoding == "gzip" else zstandard.ZstdCompressor().compress(raw)
    reply = httpx.post(f"{scorer_url}/v1/systemone", content=data, timeout=60,
                       headers={"content-type": "application/json", "content-encoding": encoding})
    assert reply.status_code == 200, reply.text


@pytest.mark.parametrize(
    ("content", "headers", "status"),
    [
        (b"{not json", {}, 422),
        (b"", {}, 422),
        (b"\x00\x01garbage", {"content-encoding": "gzip"}, 422),
        (b"{}", {"content-encoding": "br"}, 415),
        (json.dumps({**DECISION, "state": None}).encode(), {}, 422),
        (json.dumps({**DECISION, "state": "a\ud800b"}).encode(), {}, 422),  # an unpaired surrogate is no text
        (b" " * (6 * 1024 * 1024 + 1), {}, 413),
        (gzip.compress(b"[" + b"1," * (4 * 1024 * 1024) + b"1]"), {"content-encoding": "gzip"}, 413),
    ],
)
def test_bad_requests_get_4xx_in_the_system_one_shape(scorer_url, content, headers, status):
    reply = httpx.post(f"{scorer_url}/v1/systemone", content=content, headers=headers, timeout=60)
    assert reply.status_code == status
    detail = reply.json()["detail"]
    if status == 422:
        assert isinstance(detail, list) and detail[0]["loc"][0] == "body"
    else:
        assert set(detail) == {"error_type", "message"}


def test_a_prompt_beyond_the_context_is_413_not_truncated(scorer_url):
    body = {**DECISION, "state": "word " * 6000}
    reply = httpx.post(f"{scorer_url}/v1/systemone", json=body, timeout=60)
    assert reply.status_code == 413 and reply.json()["detail"]["error_type"] == "max_tokens_exceeded"


def test_chat_errors_use_the_openai_shape(scorer_url):
    reply = httpx.post(f"{scorer_url}/v1/chat/completions", json={"messages": []}, timeout=60)
    assert reply.status_code == 422
    assert set(reply.json()["error"]) == {"message", "type", "param", "code"}


def test_openai_sdk_chat_with_and_without_stream(scorer_url):
    from openai import OpenAI

    client = OpenAI(base_url=f"{scorer_url}/v1", api_key="unused-locally", max_retries=0)
    completion = client.chat.completions.create(model="x", messages=CHAT["messages"], max_tokens=8, temperature=0)
    text = completion.choices[0].message.content
    assert text and completion.usage.completion_tokens <= 8
    stream = client.chat.completions.create(model="x", messages=CHAT["messages"], max_tokens=8, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    pieces, usage = [], None
    for event in stream:
        if event.choices and event.choices[0].delta.content:
            pieces.append(event.choices[0].delta.content)
        usage = event.usage or usage
    assert "".join(pieces) == text  # greedy: the same text both ways
    assert usage.completion_tokens == completion.usage.completion_tokens


def test_stop_strings_end_the_text_before_them(scorer_url):
    base = {"messages": [{"role": "user", "content": "Count: 1, 2, 3, 4, 5, 6"}], "max_tokens": 30, "temperature": 0}
    full = httpx.post(f"{scorer_url}/v1/chat/completions", json=base, timeout=60).json()
    text = full["choices"][0]["message"]["content"]
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    cut = httpx.post(f"{scorer_url}/v1/chat/completions", json={**base, "stop": [stop]}, timeout=60).json()
    assert cut["choices"][0]["message"]["content"] == text[: text.find(stop)]
    assert cut["choices"][0]["finish_reason"] == "stop"


def long_decision(n_questions=12):
    questions = {f"q{i}": {"type": "choice", "instructions": f"Question {i}: which team?",
                           "criteria": {f"team {k}": f"handles case type {k}" for k in range(8)}}
                 for i in range(n_questions)}
    return {"model": "m", "state": "A long ticket. " * 150, "questions": questions}


@pytest.fixture(scope="module")
def tight_scorer(smollm2_path):
    settings = ScorerSettings.from_env(
        {"SM_LLAMA_CPP_MODEL": str(smollm2_path), "SM_LLAMA_CPP_THREADS": "2", "SCORER_MAX_JOBS": "1",
         "SCORER_MAX_REQUEST_TOKENS": "60000"}
    )
    with ServerThread(create_app(settings, load_in_background=False)) as server:
        yield server.url


def test_ping_answers_while_a_long_decision_runs_and_saturation_gets_503(tight_scorer):
    results = {}

    def slow():
        results["slow"] = httpx.post(f"{tight_scorer}/v1/systemone", json=long_decision(), timeout=120)

    worker = threading.Thread(target=slow)
    worker.start()
    time.sleep(1.0)
    assert "slow" not in results, "the long decision should still be running"
    ping = httpx.get(f"{tight_scorer}/ping", timeout=30)
    # Answered while the decision still holds the model: /ping never waits for it.
    ping_during_the_decision = "slow" not in results
    busy = httpx.post(f"{tight_scorer}/v1/systemone", json=DECISION, timeout=30)
    still_running = "slow" not in results
    worker.join()
    assert still_running
    assert ping.status_code == 200 and ping_during_the_decision
    assert busy.status_code == 503
    assert int(busy.headers["retry-after"]) >= 1
    assert busy.json()["detail"]["error_type"] == "overloaded"
    assert results["slow"].status_code == 200
    # Once the line is free again, the same request is served.
    assert httpx.post(f"{tight_scorer}/v1/systemone", json=DECISION, timeout=60).status_code == 200


def test_a_model_that_does_not_match_its_manifest_never_becomes_healthy(tmp_path, smollm2_path):
    folder = tmp_path / "model"
    folder.mkdir()
    shutil.copy(smollm2_path.parent / "model-manifest.json", folder / "model-manifest.json")
    tampered = folder / smollm2_path.name
    shutil.copy(smollm2_path, tampered)
    with tampered.open("r+b") as handle:
        handle.seek(-1, 2)
        last = handle.read(1)
        handle.seek(-1, 2)
        handle.write(bytes([last[0] ^ 0xFF]))
    settings = ScorerSettings.from_env({"SM_LLAMA_CPP_MODEL_DIR": str(folder)})
    with ServerThread(create_app(settings)) as server:
        deadline = time.monotonic() + 30
        while (ping := httpx.get(f"{server.url}/ping")).json()["status"] == "loading" and time.monotonic() < deadline:
            time.sleep(0.1)
        assert ping.status_code == 503
        assert ping.json()["status"] == "failed" and "sha256" in ping.json()["reason"]
        assert httpx.get(f"{server.url}/stats").status_code == 503  # no scheduler without a model: not a 500
        refused = httpx.post(f"{server.url}/v1/systemone", json=DECISION)
        assert refused.status_code == 503


@pytest.fixture(scope="module")
def bounded_scorer(smollm2_path):
    settings = ScorerSettings.from_env(
        {"SM_LLAMA_CPP_MODEL": str(smollm2_path), "SM_LLAMA_CPP_THREADS": "2", "SCORER_MAX_JOBS": "3",
         "SCORER_MAX_REQUEST_TOKENS": "8000"}
    )
    with ServerThread(create_app(settings, load_in_background=False)) as server:
        yield server.url


def plain(body):
    return {**body, "x_order_average": False, "x_prior": False}


def huge_decision():
    """400 questions x 255 options: the largest body the contract allows (about 1.7 MB)."""
    criteria = {f"option {k:03d}": f"the description of option number {k}" for k in range(255)}
    return {"model": "m", "state": "A ticket.", "questions": {f"q{i}": {"type": "choice", "criteria": criteria}
                                                              for i in range(400)}}


def test_a_request_over_the_work_budget_is_refused_at_once_while_the_model_is_busy(bounded_scorer):
    # Given a long decision holding the model, when a request over the budget arrives,
    # then it gets 413 with the figures and what to split before the long one finishes:
    # it never waited for the model.
    results = {}

    def slow():
        results["slow"] = httpx.post(f"{bounded_scorer}/v1/systemone", json=plain(long_decision()), timeout=120)

    worker = threading.Thread(target=slow)
    worker.start()
    time.sleep(1.0)
    refused = httpx.post(f"{bounded_scorer}/v1/systemone", json=huge_decision(), timeout=60)
    finished_first = "slow" in results
    worker.join()
    assert not finished_first
    assert refused.status_code == 413
    detail = refused.json()["detail"]
    assert detail["error_type"] == "max_tokens_exceeded"
    assert "8000" in detail["message"] and "split its questions" in detail["message"]
    assert results["slow"].status_code == 200


def test_the_ping_shows_the_budget(bounded_scorer):
    assert httpx.get(f"{bounded_scorer}/ping").json()["max_request_tokens"] == 8000


@pytest.fixture(scope="module")
def measured_scorer(smollm2_path):
    """A scorer whose budget is measured here (no SCORER_MAX_REQUEST_TOKENS), as deployed."""
    settings = ScorerSettings.from_env({"SM_LLAMA_CPP_MODEL": str(smollm2_path), "SM_LLAMA_CPP_THREADS": "2"})
    with ServerThread(create_app(settings, load_in_background=False)) as server:
        yield server.url


def test_work_that_cannot_finish_before_its_deadline_is_refused_at_once_with_the_figures(measured_scorer):
    # Given a scorer whose budget was measured on a real decision at load, when a decision
    # needs more seconds than its caller's deadline leaves (2 s here), then it gets 413 at
    # once, saying how long it would take, never a 503 or a 504 after the work was cut.
    ping = httpx.get(f"{measured_scorer}/ping").json()
    assert ping["units_per_s_at_load"] > 0 and ping["max_request_tokens"] >= 256
    start = time.monotonic()
    refused = invoke(measured_scorer, plain(long_decision(n_questions=40)), "route=systemone;timeout_ms=2000")
    assert refused.status_code == 413, refused.text
    assert time.monotonic() - start < 5  # counted, not run (a generous bound on a shared machine)
    assert "s on this machine" in refused.json()["detail"]["message"]
    # The same decision with the whole budget's time: answered, or refused the same way;
    # never cut at its deadline.
    answered = invoke(measured_scorer, plain(long_decision(n_questions=4)), "route=systemone")
    assert answered.status_code == 200, answered.text


def test_the_estimate_is_checked_against_what_decisions_cost_as_they_run(measured_scorer):
    # Given decisions answered by a measured scorer, /ping shows the rate they ran at beside
    # the load measurement, and the rate the budget uses is never the faster of the two.
    for _ in range(2):
        assert invoke(measured_scorer, plain(long_decision(n_questions=3)), "route=systemone").status_code == 200
    ping = httpx.get(f"{measured_scorer}/ping").json()
    assert ping["units_per_s_observed"] is not None
    assert ping["units_per_s"] == min(ping["units_per_s_at_load"], ping["units_per_s_observed"])


@pytest.fixture(scope="module")
def long_job_s(bounded_scorer):
    """How long the long decision takes when nothing stops it, measured here and now.

    The deadline tests compare against this, not against fixed seconds: the machine is
    shared, and one decode of the state alone can take seconds when it is busy.
    """
    start = time.monotonic()
    assert httpx.post(f"{bounded_scorer}/v1/systemone", json=plain(long_decision()), timeout=300).status_code == 200
    return time.monotonic() - start


def invoke(url, body, attributes, timeout=120):
    return httpx.post(f"{url}/invocations", json=body, timeout=timeout,
                      headers={"X-Amzn-SageMaker-Custom-Attributes": attributes})


def test_a_job_past_its_deadline_is_abandoned_and_the_model_serves_the_next_at_once(bounded_scorer, long_job_s):
    # Given a decision that takes many seconds, a fixed budget that admits it, and a caller
    # deadline of 1 s, when it runs, then it answers 504 (deadline_exceeded, no Retry-After:
    # the same work would run out of time again) within a decode of the deadline, and a
    # request queued behind it is served without waiting out the long job.
    results = {}

    def late():
        start = time.monotonic()
        results["late"] = invoke(bounded_scorer, plain(long_decision()), "route=systemone;timeout_ms=1000")
        results["late_s"] = time.monotonic() - start

    worker = threading.Thread(target=late)
    worker.start()
    time.sleep(0.3)
    start = time.monotonic()
    following = invoke(bounded_scorer, DECISION, "route=systemone")
    following_s = time.monotonic() - start
    worker.join()
    late_response = results["late"]
    assert late_response.status_code == 504
    assert "retry-after" not in late_response.headers
    assert late_response.json()["x_state"] == "deadline_exceeded"
    assert following.status_code == 200
    # Half the uninterrupted job: the deadline (1 s) plus at most one decode of the state
    # (about 500 tokens) stays well under it, however slow the machine is today.
    assert results["late_s"] < long_job_s / 2 and following_s < long_job_s / 2


def test_a_job_whose_caller_hung_up_is_abandoned(bounded_scorer, long_job_s):
    # Given a caller that gives up after 1 s (its client times out and closes the
    # connection), the job stops, and the next request does not wait out the long job.
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{bounded_scorer}/v1/systemone", json=plain(long_decision()), timeout=1.0)
    start = time.monotonic()
    assert httpx.post(f"{bounded_scorer}/v1/systemone", json=DECISION, timeout=60).status_code == 200
    assert time.monotonic() - start < long_job_s / 2



def test_the_gateways_request_id_is_the_scorers(scorer_url):
    reply = invoke(scorer_url, DECISION, "route=systemone;request_id=gw-0123456789abcdef")
    assert reply.headers["x-request-id"] == reply.headers["x-typesafe-request-id"] == "gw-0123456789abcdef"
    hostile = invoke(scorer_url, DECISION, "route=systemone;request_id=a b%0A\tc")
    assert hostile.headers["x-request-id"] == "ab0Ac"


@pytest.mark.parametrize("fragment", [b"[" * 100_000 + b"]" * 100_000, b'{"a":' * 900 + b"1" + b"}" * 900, b"1e400", b"NaN",
                                      b"-Infinity", b"9" * 5000])
def test_json_no_model_can_hold_is_a_422_at_the_scorer_too(scorer_url, fragment):
    raw = b'{"model": "m", "questions": {"q": {"type": "noul", "instructions": "?"}}, "state": ' + fragment + b"}"
    reply = httpx.post(f"{scorer_url}/v1/systemone", content=raw, headers={"Content-Type": "application/json"}, timeout=60)
    assert reply.status_code == 422 and reply.json()["detail"][0]["type"] == "json_invalid"


def test_a_decision_is_planned_once_and_run_as_planned(scorer_url, monkeypatch):
    # Given counters on what planning builds (the state as the model reads it, each prepared
    # question, each listing of a question), when one decision is served, each was built
    # once: the engine ran the plan the request was admitted with, building none of it again.
    import collections

    from scorer_container import planning

    built = collections.Counter()

    def counted(name, build):
        def wrapper(*args, **kwargs):
            built[name] += 1
            return build(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(planning.untrusted, "for_model", counted("state", planning.untrusted.for_model))
    monkeypatch.setattr(planning, "prepare_question", counted("question", planning.prepare_question))
    monkeypatch.setattr(planning.Planner, "listing", counted("listing", planning.Planner.listing))
    body = {**DECISION, "x_order_average": True, "x_prior": True, "questions": {
        **DECISION["questions"],
        "queue": {"type": "choice", "criteria": {"billing": None, "delivery": None, "account": None}}}}
    reply = httpx.post(f"{scorer_url}/v1/systemone", json=body, timeout=120)
    assert reply.status_code == 200 and "reduced_for_budget" not in reply.json()["x_debias"]
    assert built == {"state": 1, "question": 2, "listing": 4}  # two questions, each in two orders
