"""End to end over HTTP: the official SDKs, unchanged, against the local stack
(gateway runner -> authorizer -> lambda_handler -> boto3 -> scorer with a real model)."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
import typesafe_sdk as ts

pytestmark = pytest.mark.model


@pytest.fixture
def client(local_stack):
    return openai.OpenAI(base_url=f"{local_stack.url}/v1", api_key=local_stack.api_key, max_retries=0)


@pytest.fixture
def typesafe(local_stack):
    with ts.TypeSafeClient(api_key=local_stack.api_key, base_url=local_stack.url, model="jev-latest",
                           retry=ts.RetryPolicy(max_retries=0)) as client:
        yield client


def test_openai_models_list(client):
    ids = [m.id for m in client.models.list()]
    assert ids == ["decision-default", "jev-latest", "chat-default"]


def test_openai_chat_without_and_with_stream(client):
    messages = [{"role": "user", "content": "Say hello."}]
    reply = client.chat.completions.create(model="chat-default", messages=messages, max_tokens=8, temperature=0)
    text = reply.choices[0].message.content
    assert text and reply.model == "smollm2-135m-instruct-q4_1"  # the real model, not the alias
    assert reply.usage.completion_tokens <= 8
    chunks = list(client.chat.completions.create(model="chat-default", messages=messages, max_tokens=8, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-1].usage.completion_tokens == reply.usage.completion_tokens


def test_openai_decisions_create(client):
    decision = client.decisions.create(
        model="decision-default",
        input=[{"role": "user", "content": "I was charged twice for order 4411. Refund one please."}],
        questions=[
            {"type": "predicate", "name": "refund", "instructions": "The customer asks for a refund."},
            {"type": "choice", "name": "queue", "instructions": "Which queue?",
             "choices": [{"value": "billing", "description": "payments and refunds"}, {"value": "delivery"}, {"value": True}]},
            {"type": "score", "name": "anger", "instructions": "How frustrated?",
             "levels": [{"label": "calm"}, {"label": "annoyed"}, {"label": "angry"}]},
        ],
    )
    refund, queue, anger = decision.answers
    assert 0 <= refund.probability <= 1
    assert [p.value for p in queue.probabilities] == ["billing", "delivery", True]
    assert sum(p.probability for p in queue.probabilities) == pytest.approx(1)
    assert queue.choice == max(queue.probabilities, key=lambda p: p.probability).value
    assert anger.score == pytest.approx(sum(p.value * p.probability for p in anger.probabilities))
    assert decision.usage.input_tokens > 0 and decision.usage.output_tokens == 0


def test_an_openai_caller_reports_the_outcome_with_the_id_it_was_given(client):
    # The id an OpenAI Decisions answer carries (decision_<hex>) is the one the records
    # routes take, through the SDK's own request machinery (no hand-made URL).
    decision = client.decisions.create(
        model="decision-default", input="I was charged twice for order 4411. Refund one please.",
        questions=[{"type": "predicate", "name": "refund", "instructions": "The customer asks for a refund."}])
    assert decision.id.startswith("decision_")
    reported = client.post(f"/decisions/{decision.id}/outcome", body={"answers": {"refund": True}}, cast_to=object)
    assert reported["id"] == decision.id and reported["outcome"]["answers"] == {"refund": True}
    record = client.get(f"/records/{decision.id}", cast_to=object)
    assert record["outcome"]["answers"] == {"refund": True}
    with pytest.raises(openai.UnprocessableEntityError):  # an answer the question does not allow
        client.post(f"/decisions/{decision.id}/outcome", body={"answers": {"refund": "maybe"}}, cast_to=object)


def test_a_decision_sent_twice_with_one_idempotency_key_is_one_decision(client):
    # Given an OpenAI SDK caller that sends the same decision twice with one Idempotency-Key
    # (as its own retry of a reply it never saw would), then both replies are the first
    # answer, the second marked as replayed, and the records hold one decision.
    import uuid

    key = f"test-{uuid.uuid4().hex}"
    body = {"model": "decision-default", "input": "Charged twice for order 4411, refund one please.",
            "questions": [{"type": "predicate", "name": "refund", "instructions": "The customer asks for a refund."}]}
    listed = len(client.get("/records", cast_to=object, options={"params": {"limit": 100}})["records"])
    first = client.decisions.create(**body, extra_headers={"Idempotency-Key": key})
    raw = client.decisions.with_raw_response.create(**body, extra_headers={"Idempotency-Key": key})
    second = raw.parse()
    assert raw.headers["idempotent-replayed"] == "true"
    assert second.id == first.id and second.model_dump() == first.model_dump()
    records = client.get("/records", cast_to=object, options={"params": {"limit": 100}})["records"]
    assert len(records) == listed + 1 and [r["id"] for r in records].count(first.id.removeprefix("decision_")) == 1


def test_typesafe_noul_choice_and_score(typesafe):
    result = typesafe.system_one(
        state="I was charged twice for order 4411. Refund one please.",
        questions={
            "refund 💸": ts.Noul(instructions="Does the customer ask for a refund?"),
            "queue": ts.Choice(instructions="Which queue?", criteria={"billing": "payments", "delivery": None, "account": None}),
            "anger": ts.Score(instructions="How frustrated is the customer?", criteria=["calm", "annoyed", "angry"]),
        },
    )
    assert 0 <= result.nouls["refund 💸"].noul <= 1
    queue = result.choices["queue"]
    assert set(queue.probabilities) == {"billing", "delivery", "account"}
    assert sum(queue.probabilities.values()) == pytest.approx(1)
    anger = result.scores["anger"]
    assert 0 <= anger.score <= 2 and set(anger.legend.values()) == {"calm", "annoyed", "angry"}
    assert isinstance(result.usage.input_tokens, int) and result.usage.input_tokens > 0
    assert [m.name for m in typesafe.models.list().models] == ["decision-default", "jev-latest", "chat-default"]


def test_sdk_errors_are_typed(local_stack, client, typesafe):
    with pytest.raises(openai.NotFoundError):
        client.decisions.create(model="nope", input="x", questions=[{"type": "predicate", "instructions": "x"}])
    with pytest.raises(ts.TypeSafeNotFoundError):
        typesafe.system_one(state="x", questions={"q": ts.Noul(instructions="x")}, model="nope")
    bad = openai.OpenAI(base_url=f"{local_stack.url}/v1", api_key="dgk_0123456789abcdef_" + "A" * 43, max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    anonymous = httpx.get(f"{local_stack.url}/v1/models", timeout=10)
    assert anonymous.status_code == 401
    assert anonymous.json()["error"]["type"] == anonymous.json()["detail"]["error_type"] == "authentication_error"


def test_curl_style_requests(local_stack):
    """A form-encoded body (curl -d) is still JSON to this API, and the answer names the request."""
    body = json.dumps({"model": "jev-latest", "state": "Refund please.", "questions": {"r": {"type": "noul", "instructions": "Refund?"}}})
    reply = httpx.post(f"{local_stack.url}/v1/systemone", content=body, timeout=60,
                       headers={"Authorization": f"Bearer {local_stack.api_key}", "Content-Type": "application/x-www-form-urlencoded"})
    assert reply.status_code == 200, reply.text
    assert reply.headers["x-typesafe-request-id"] == reply.headers["x-request-id"]
    health = httpx.get(f"{local_stack.url}/health", timeout=10)
    assert health.status_code == 200 and "authorization" not in health.text.lower()


def test_the_sdks_work_with_a_token_minted_by_a_sigv4_caller(local_stack):
    token = local_stack.mint(scopes=["decide"], ttl_s=600)
    client = openai.OpenAI(base_url=f"{local_stack.url}/v1", api_key=token, max_retries=0)
    decision = client.decisions.create(model="jev-latest", input="Refund my double charge.",
                                       questions=[{"type": "predicate", "name": "refund", "instructions": "Asks for a refund."}])
    assert 0 <= decision.answers[0].probability <= 1
    with pytest.raises(openai.PermissionDeniedError):  # narrowed to "decide": no chat
        client.chat.completions.create(model="chat-default", messages=[{"role": "user", "content": "hi"}])
    with ts.TypeSafeClient(api_key=token, base_url=local_stack.url, model="jev-latest", retry=ts.RetryPolicy(max_retries=0)) as t:
        result = t.system_one(state="Refund my double charge.", questions={"refund": ts.Noul(instructions="Refund?")})
        assert 0 <= result.nouls["refund"].noul <= 1


def test_the_api_key_never_appears_in_anything_the_gateway_writes(local_stack, client, typesafe, capsys):
    """A canary: every log line and metric the gateway printed while serving real SDK calls,
    good and bad ones, is free of the key, though the lines themselves are there."""
    client.models.list()
    typesafe.system_one(state="Refund?", questions={"r": ts.Noul(instructions="Refund?")})
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    leaked = openai.OpenAI(base_url=f"{local_stack.url}/v1", api_key=local_stack.api_key[:-1] + "Z", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        leaked.models.list()
    written = capsys.readouterr()
    output = written.out + written.err
    assert output.count('"message":"request"') >= 4
    assert local_stack.api_key not in output and local_stack.api_key[:-1] not in output
