"""Streaming end to end over HTTP: the OpenAI SDK against the local stack, whose streaming
routes run the handler's streaming entry point (the one the Lambda runtime loop runs), the
SageMaker streaming invocation, and the scorer's chat stream with a real model."""

from __future__ import annotations

import json
import logging
import re
import time

import httpx
import openai
import pytest

pytestmark = pytest.mark.model

STORY = [{"role": "user", "content": "Tell me a long story about a lighthouse keeper."}]


def _auth(stack) -> dict[str, str]:
    return {"Authorization": f"Bearer {stack.api_key}"}


def test_chunks_arrive_while_the_model_generates(local_stack):
    # Given a completion of 48 tokens, streamed
    client = openai.OpenAI(base_url=f"{local_stack.url}/v1", api_key=local_stack.api_key, max_retries=0)
    started, arrivals, usage = time.perf_counter(), [], None
    # When the SDK reads it
    for chunk in client.chat.completions.create(model="chat-default", messages=STORY, max_tokens=48, temperature=0,
                                                stream=True, stream_options={"include_usage": True}):
        if chunk.choices and chunk.choices[0].delta.content:
            arrivals.append(time.perf_counter() - started)
        usage = chunk.usage or usage
    total = time.perf_counter() - started
    # Then the content came in many chunks over the generation, not at its end in one burst,
    # and the usage came last
    assert len(arrivals) >= 10
    assert arrivals[0] < total / 2 and arrivals[-1] - arrivals[0] > total / 4
    assert usage is not None and usage.completion_tokens == 48


def test_a_caller_gone_mid_stream_stops_the_generation_and_the_next_request_is_served(local_stack, caplog):
    caplog.set_level(logging.INFO, logger="scorer")
    body = {"model": "chat-default", "messages": STORY, "max_tokens": 400, "temperature": 0, "stream": True}
    # Given a stream of up to 400 tokens, of which the caller reads 5 content chunks and hangs up
    received = 0
    with httpx.Client(timeout=60) as http, http.stream("POST", f"{local_stack.url}/v1/chat/completions", json=body,
                                                       headers=_auth(local_stack)) as reply:
        assert reply.status_code == 200
        for line in reply.iter_lines():
            if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["delta"].get("content"):
                received += 1
                if received == 5:
                    break
    # Then the scorer stops generating within a decode step of it (measured here: 6 tokens
    # generated for 5 received; one more step may be in flight between the hops), far short
    # of the 400 asked
    generated = _generated_tokens(caplog, timeout_s=30)
    assert received <= generated <= received + 2, f"{generated} tokens generated, {received} received"
    # And the model is free: the next request is answered
    reply = httpx.post(f"{local_stack.url}/v1/chat/completions", headers=_auth(local_stack), timeout=60,
                       json={"model": "chat-default", "messages": STORY, "max_tokens": 4})
    assert reply.status_code == 200


def test_a_refusal_comes_before_the_stream_with_its_status(local_stack):
    # Given a streamed chat asking for more than the tenant may generate
    body = {"model": "chat-default", "messages": STORY, "max_tokens": 10**6, "stream": True}
    reply = httpx.post(f"{local_stack.url}/v1/chat/completions", json=body, headers=_auth(local_stack), timeout=30)
    # Then it is refused as any request is: a status and an OpenAI error body, no event stream
    assert reply.status_code == 413
    assert reply.headers["content-type"].startswith("application/json")
    assert reply.json()["error"]["code"]


def _generated_tokens(caplog, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for record in caplog.records:
            found = re.search(r"chat stream stopped, its caller gone after (\d+) generated tokens", record.getMessage())
            if found:
                return int(found.group(1))
        time.sleep(0.05)
    raise AssertionError(f"the scorer never said its stream stopped: {[(r.getMessage(), r.__dict__.get('ended')) for r in caplog.records]}")
