"""The gateway function through `lambda_handler`, with a fake backend (no model)."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys

import pytest
import zstandard

from devkit.fake_backend import UniformBackend
from devkit.gateway_stack import PRINCIPAL, event, install
from gateway.backends.base import EndpointBusy, EndpointFailed, EndpointRejected
from tests.fakes import FailingBackend
from tests.gateway_helpers import call

SYSTEM_ONE = {
    "model": "jev-latest",
    "state": "I was charged twice for order 4411.",
    "questions": {
        "is refund? 🤔": {"type": "noul", "instructions": "Does the customer ask for a refund?"},
        "queue": {"type": "choice", "criteria": {"billing": "payments", "delivery": None, "account": None}},
        "anger": {"type": "score", "criteria": ["calm", {"level": "annoyed"}, "angry"]},
    },
}
DECISIONS = {
    "model": "decision-default",
    "input": [{"role": "user", "content": "I was charged twice."}, {"role": "assistant", "content": [{"type": "output_text", "text": "Sorry!"}]}],
    "questions": [
        {"type": "predicate", "name": "refund", "instructions": "The customer asks for a refund."},
        {"type": "choice", "instructions": "Which?", "choices": [{"value": True}, {"value": "true"}, {"value": "billing", "description": "money"}]},
        {"type": "score", "name": "anger", "instructions": "How angry?", "levels": [{"label": "calm"}, {"label": "angry", "description": "shouting"}]},
    ],
}


@pytest.fixture
def backend():
    backend = UniformBackend()
    install(backend)
    return backend


def test_system_one_answers_every_question_by_its_own_id(backend):
    status, headers, body = call(event("POST", "/v1/systemone", SYSTEM_ONE))
    assert status == 200, body
    assert list(body["answers"]) == list(SYSTEM_ONE["questions"])
    assert body["answers"]["is refund? 🤔"] == {"type": "noul", "noul": 0.5}
    queue = body["answers"]["queue"]
    assert list(queue["probabilities"]) == ["billing", "delivery", "account"] and queue["confidence"] == 0.0
    anger = body["answers"]["anger"]
    assert anger["legend"] == {"0": "calm", "1": {"level": "annoyed"}, "2": "angry"} and anger["score"] == pytest.approx(1.0)
    usage = body["usage"]
    assert {k: usage[k] for k in ("input_tokens", "output_tokens")} == {"input_tokens": 10, "output_tokens": 0}
    assert usage["x_endpoint_s"] >= 0 and usage["x_cost_usd"] > 0  # an unpriced pool: the gateway's share alone
    assert headers["x-request-id"] == headers["x-typesafe-request-id"]
    # The backend never sees the caller's ids, and the alias became the model's real name.
    _, sent, route = backend.calls[0]
    assert route == "systemone" and list(sent["questions"]) == ["q0", "q1", "q2"] and sent["model"] == "decision-default"


def test_openai_decisions_keep_choice_types_and_order(backend):
    status, _, body = call(event("POST", "/v1/decisions", DECISIONS))
    assert status == 200, body
    assert body["object"] == "decision" and body["id"].startswith("decision_")
    refund, which, anger = body["answers"]
    assert refund == {"type": "predicate", "name": "refund", "probability": 0.5}
    assert which["name"] is None and [p["value"] for p in which["probabilities"]] == [True, "true", "billing"]
    assert which["choice"] is True
    assert [p["label"] for p in anger["probabilities"]] == ["calm", "angry"]
    assert body["usage"]["total_tokens"] == 10 and body["usage"]["output_tokens_details"] == {"reasoning_tokens": 0}
    _, sent, _ = backend.calls[0]
    assert sent["state"] == "I was charged twice.\n\nSorry!"
    assert list(sent["questions"]["q1"]["criteria"]) == ["true", "true (2)", "billing"]
    assert sent["questions"]["q2"]["criteria"] == ["calm", "angry: shouting"]


def test_models_body_satisfies_both_list_shapes(backend):
    status, _, body = call(event("GET", "/v1/models"))
    assert status == 200
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == ["decision-default", "jev-latest", "chat-default"]
    assert {m["name"] for m in body["models"]} == {"decision-default", "jev-latest", "chat-default"}
    assert all(m["release_date"] for m in body["models"])


def test_chat_stream_is_framed_as_server_sent_events(backend):
    request = {"model": "chat-default", "messages": [{"role": "user", "content": "hi"}], "stream": True,
               "stream_options": {"include_usage": True}}
    status, headers, text = call(event("POST", "/v1/chat/completions", request))
    assert status == 200 and headers["content-type"] == "text/event-stream"
    events = [line.removeprefix("data: ") for line in text.split("\n\n") if line]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]) == "hello"
    assert chunks[-1]["usage"]["total_tokens"] == 4
    _, sent, route = backend.calls[0]
    assert route == "chat" and sent["stream"] is False and "stream_options" not in sent


@pytest.mark.parametrize("encoding", ["gzip", "zstd"])
def test_compressed_bodies_are_inflated(backend, encoding):
    data = json.dumps(SYSTEM_ONE).encode()
    packed = gzip.compress(data) if encoding == "gzip" else zstandard.ZstdCompressor().compress(data)
    status, _, body = call(event("POST", "/v1/systemone", raw=packed, headers={"Content-Encoding": encoding}))
    assert status == 200, body


@pytest.mark.parametrize(
    ("path", "raw", "headers", "status", "kind"),
    [
        ("/v1/systemone", b"{not json", {}, 422, "json_invalid"),
        ("/v1/systemone", b'{"model": "m", "state": NaN, "questions": {}}', {}, 422, "json_invalid"),
        ("/v1/systemone", b"", {}, 422, "missing"),
        # No body under a form's type (no boundary either): still a JSON route's missing body
        ("/v1/systemone", b"", {"Content-Type": "multipart/form-data"}, 422, "missing"),
        ("/v1/systemone", b"{}", {"Content-Type": "multipart/form-data"}, 422, "missing"),
        ("/v1/systemone", b"[1, 2]", {}, 422, "model_attributes_type"),
        ("/v1/systemone", b"\x1f\x8b garbage", {"Content-Encoding": "gzip"}, 422, "decompression_error"),
        ("/v1/systemone", b"{}", {"Content-Encoding": "br"}, 415, None),
        ("/v1/systemone", gzip.compress(b" " * (7 * 1024 * 1024), mtime=0), {"Content-Encoding": "gzip"}, 413, None),
    ],
)
def test_bad_bodies_get_4xx_in_the_system_one_shape(backend, path, raw, headers, status, kind):
    code, _, body = call(event("POST", path, raw=raw, headers=headers))
    assert code == status, body
    if kind:
        assert body["detail"][0]["type"] == kind and body["detail"][0]["loc"][0] == "body"
    else:
        assert set(body["detail"]) == {"error_type", "message"}
    assert not backend.calls


@pytest.mark.parametrize(
    ("questions", "loc", "kind"),
    [
        ({}, ["body", "questions"], "too_short"),
        ({"q": {"type": "score", "criteria": {"0": "low", "1": "high"}}}, ["body", "questions", "q", "criteria"], "list_type"),
        ({"q": {"type": "choice", "criteria": {"only": None}}}, ["body", "questions", "q", "criteria"], "too_short"),
        ({"q": {"type": "noul"}}, ["body", "questions", "q"], "value_error"),
        ({"q": {"type": "box"}}, ["body", "questions", "q"], "union_tag_invalid"),
        ({"q": {"type": "noul", "instructions": 3}}, ["body", "questions", "q", "instructions"], "text_type"),
        ({"q": {"type": "choice", "criteria": {f"o{i}": None for i in range(256)}}}, ["body", "questions", "q", "criteria"], "too_long"),
    ],
)
def test_invalid_questions_are_422_with_the_path_to_the_problem(backend, questions, loc, kind):
    status, _, body = call(event("POST", "/v1/systemone", {"model": "jev-latest", "state": "s", "questions": questions}))
    assert status == 422
    assert {"loc": loc, "type": kind} in [{"loc": d["loc"], "type": d["type"]} for d in body["detail"]], body
    assert all(set(d) == {"loc", "msg", "type"} for d in body["detail"])


def test_openai_routes_answer_errors_in_the_openai_shape(backend):
    bad = {**DECISIONS, "questions": [{"type": "choice", "instructions": "x", "choices": [{"value": "a"}, {"value": "a"}]}]}
    status, _, body = call(event("POST", "/v1/decisions", bad))
    assert status == 422
    assert body["error"]["type"] == "invalid_request_error" and body["error"]["param"] == "questions.0.choices"
    status, _, body = call(event("POST", "/v1/decisions", {**DECISIONS, "input": [{"role": "user", "content": [
        {"type": "input_image", "image_url": "https://example.com/a.png"}]}]}))
    assert status == 422 and "input_image" in body["error"]["message"]


def test_unknown_model_is_404_and_the_wrong_kind_too(backend):
    status, _, body = call(event("POST", "/v1/systemone", {**SYSTEM_ONE, "model": "nope"}))
    assert status == 404 and body["detail"]["error_type"] == "not_found"
    status, _, body = call(event("POST", "/v1/chat/completions", {"model": "decision-default", "messages": [{"role": "user", "content": "x"}]}))
    assert status == 404 and body["error"]["code"] == "model_not_found"


def test_credentials_and_scopes_are_checked_per_route(backend):
    status, _, body = call(event("POST", "/v1/systemone", SYSTEM_ONE, principal={"tenant_id": "", "reason": "invalid credentials"}))
    assert status == 401 and body["detail"] == {"error_type": "authentication_error", "message": "invalid credentials"}
    chat_only = {"tenant_id": "acme", "scopes": "chat", "models": "*"}
    status, _, body = call(event("POST", "/v1/decisions", DECISIONS, principal=chat_only))
    assert status == 403 and body["error"]["type"] == "permission_error"
    limited = {"tenant_id": "acme", "scopes": "decide", "models": json.dumps(["chat-default"])}
    status, _, _ = call(event("POST", "/v1/systemone", SYSTEM_ONE, principal=limited))
    assert status == 404
    status, _, body = call(event("GET", "/v1/models", principal=limited))
    assert [m["id"] for m in body["data"]] == ["chat-default"]
    status, _, body = call(event("GET", "/health", principal=None))
    assert status == 200
    assert not backend.calls


def test_unknown_route_is_404_in_both_shapes(backend):
    status, _, body = call(event("GET", "/v2/nothing"))
    assert status == 404
    assert body["error"]["code"] == "unknown_url" and body["detail"]["error_type"] == "not_found"


@pytest.mark.parametrize(
    ("error", "status", "retry_after"),
    [
        (EndpointBusy("dg-cpu", "container_503"), 429, "2"),
        (EndpointBusy("dg-cpu", "container_503", retry_after=7), 429, "7"),
        (EndpointBusy("dg-cpu", "connection_closed"), 503, "2"),
        (EndpointFailed("dg-cpu", "ValidationError"), 502, None),
        (EndpointRejected("dg-cpu", 413, b'{"detail": {"error_type": "max_tokens_exceeded", "message": "too long"}}'), 413, None),
        (EndpointRejected("dg-cpu", 422, b'{"detail": [{"loc": ["body", "state"], "msg": "bad", "type": "x"}]}'), 422, None),
        (EndpointRejected("dg-cpu", 400, b"not json"), 400, None),
    ],
)
def test_backend_errors_map_to_statuses_without_leaking_internals(error, status, retry_after):
    install(FailingBackend({"dg-cpu": error}), routing={"extra_attempts": 0})
    code, headers, body = call(event("POST", "/v1/systemone", SYSTEM_ONE))
    assert code == status
    assert headers.get("retry-after") == retry_after
    assert "dg-cpu" not in json.dumps(body) and "Traceback" not in json.dumps(body)


@pytest.mark.parametrize("flavor", ("systemone", "openai"))
def test_work_the_scorer_cut_is_a_504_the_caller_is_told_not_to_retry(flavor):
    # Given a first endpoint that cut the work at its deadline, when a decision is asked on
    # a pool of two, then the caller gets 504 with `x-should-retry: false` and no
    # Retry-After (the OpenAI SDKs retry a 5xx twice unless told not to), the second
    # endpoint is never asked, and nothing says "overloaded".
    from gateway.backends.base import EndpointTimedOut

    backend = FailingBackend({"dg-gpu": EndpointTimedOut("dg-gpu", "container_deadline", True)})
    install(backend, endpoints=("dg-gpu", "dg-cpu"))
    path, body = ("/v1/systemone", SYSTEM_ONE) if flavor == "systemone" else ("/v1/decisions", DECISIONS)
    status, headers, reply = call(event("POST", path, body))
    assert status == 504 and headers.get("x-should-retry") == "false" and "retry-after" not in headers
    assert [name for name, _, _ in backend.calls] == ["dg-gpu"]
    kind = reply["detail"]["error_type"] if flavor == "systemone" else reply["error"]["code"]
    assert kind == "timeout" and "overloaded" not in json.dumps(reply)


def test_an_endpoint_that_said_nothing_in_time_is_a_503_to_retry_later_not_sent_again():
    from gateway.backends.base import EndpointTimedOut

    backend = FailingBackend({"dg-gpu": EndpointTimedOut("dg-gpu", "read_timeout", False)})
    install(backend, endpoints=("dg-gpu", "dg-cpu"))
    status, headers, reply = call(event("POST", "/v1/systemone", SYSTEM_ONE))
    assert status == 503 and int(headers["retry-after"]) >= 1 and "x-should-retry" not in headers
    assert reply["detail"]["error_type"] == "timeout"
    assert [name for name, _, _ in backend.calls] == ["dg-gpu"]


def test_a_refusal_that_retrying_cannot_mend_says_so_and_one_that_can_does_not():
    install(FailingBackend({"dg-cpu": EndpointRejected("dg-cpu", 413, b'{"detail": {"error_type": "x", "message": "m"}}')}))
    assert call(event("POST", "/v1/systemone", SYSTEM_ONE))[1].get("x-should-retry") == "false"
    install(FailingBackend({"dg-cpu": EndpointBusy("dg-cpu", "container_503")}), routing={"extra_attempts": 0})
    status, headers, _ = call(event("POST", "/v1/systemone", SYSTEM_ONE))
    assert status == 429 and "x-should-retry" not in headers and headers["retry-after"] == "2"


def test_a_busy_endpoint_hands_the_request_to_the_next_one():
    backend = FailingBackend({"dg-gpu": EndpointBusy("dg-gpu", "container_503")})
    install(backend, endpoints=("dg-gpu", "dg-cpu"))
    status, headers, _ = call(event("POST", "/v1/systemone", SYSTEM_ONE))
    assert status == 200 and headers["x-endpoint"] == "dg-cpu" and headers["x-attempts"] == "2"
    assert [name for name, _, _ in backend.calls] == ["dg-gpu", "dg-cpu"]


def test_a_rejection_is_not_retried_elsewhere():
    backend = FailingBackend({"dg-gpu": EndpointRejected("dg-gpu", 422, b"{}")})
    install(backend, endpoints=("dg-gpu", "dg-cpu"))
    status, _, _ = call(event("POST", "/v1/systemone", SYSTEM_ONE))
    assert status == 422 and [name for name, _, _ in backend.calls] == ["dg-gpu"]


def test_an_empty_question_id_is_refused(backend):
    status, _, body = call(event("POST", "/v1/systemone", {**SYSTEM_ONE, "questions": {"": {"type": "noul", "instructions": "x"}}}))
    assert status == 422 and body["detail"][0]["loc"] == ["body", "questions", "", "[key]"]


def test_token_routes_without_a_configured_authenticator_are_403_not_500(backend):
    status, _, body = call(event("POST", "/v1/tokens", {}))
    assert status == 403 and "not configured" in body["error"]["message"]
    status, _, _ = call(event("POST", "/v1/tokens/revoke", {"token": "dgt_x.y"}, principal={**PRINCIPAL, "scopes": "admin"}))
    assert status == 403


def test_the_iam_prefix_serves_the_same_routes_with_the_same_shapes(backend):
    status, headers, body = call(event("POST", "/iam/v1/systemone", SYSTEM_ONE))
    assert status == 200 and headers["x-typesafe-request-id"]
    status, _, body = call(event("POST", "/iam/v1/systemone", {**SYSTEM_ONE, "model": "nope"}))
    assert status == 404 and body["detail"]["error_type"] == "not_found"


def test_an_unpaired_surrogate_is_a_422_and_a_pair_is_text(backend):
    """Found by the fuzzer: "\\ud800" parses as JSON but is no text, so it failed deep inside (500)."""
    lone = b'{"model": "jev-latest", "state": "a\\ud800b", "questions": {"q": {"type": "noul", "instructions": "x"}}}'
    status, _, body = call(event("POST", "/v1/systemone", raw=lone))
    assert status == 422 and body["detail"][0]["type"] == "json_invalid"
    pair = b'{"model": "jev-latest", "state": "a\\ud83d\\ude00b", "questions": {"q": {"type": "noul", "instructions": "x"}}}'
    assert call(event("POST", "/v1/systemone", raw=pair))[0] == 200


def _largest_valid_system_one() -> dict:
    criteria = {f"option {k:03d}": f"the description of option number {k}" for k in range(255)}
    return {"model": "jev-latest", "state": "A ticket.",
            "questions": {f"q{i}": {"type": "choice", "criteria": criteria} for i in range(400)}}


def test_a_request_over_the_work_budget_is_413_before_any_backend_call(backend):
    # Given 400 questions of 255 options (valid by the contract, about 5 MB), when it is
    # sent in either format, then the gateway refuses it with 413 in that API's shape and
    # the backend is never called.
    largest = _largest_valid_system_one()
    status, _, body = call(event("POST", "/v1/systemone", largest))  # 5.1 MB: over what one invocation carries
    assert status == 413 and "4669440" in body["detail"]["message"]
    largest["questions"] = dict(list(largest["questions"].items())[:40])
    status, _, body = call(event("POST", "/v1/systemone", largest))
    assert status == 413
    assert body["detail"]["error_type"] == "max_tokens_exceeded" and "split its questions" in body["detail"]["message"]
    choices = [{"value": f"option {k}", "description": "the description of an option"} for k in range(255)]
    openai = {"model": "decision-default", "input": "A ticket.",
              "questions": [{"type": "choice", "instructions": "Which?", "choices": choices} for _ in range(400)]}
    status, _, body = call(event("POST", "/v1/decisions", openai))  # 5.3 MB: over what one invocation carries
    assert status == 413 and body["error"]["code"] == "context_length_exceeded" and "4669440" in body["error"]["message"]
    openai["questions"] = openai["questions"][:40]
    status, _, body = call(event("POST", "/v1/decisions", openai))
    assert status == 413 and "split its questions" in body["error"]["message"]
    assert backend.calls == []


def test_a_request_inside_the_budget_is_sent(backend):
    # One question of 255 options is well inside the default budget.
    body = _largest_valid_system_one()
    body["questions"] = {"q0": body["questions"]["q0"]}
    status, _, _ = call(event("POST", "/v1/systemone", body))
    assert status == 200 and len(backend.calls) == 1


def test_the_budget_is_a_setting_of_each_model():
    # Given a model configured with a small budget, a request the default accepts is refused.
    from devkit.gateway_stack import settings_for

    backend = UniformBackend()
    settings = settings_for()
    small = settings.models[0].model_copy(update={"max_request_tokens": 256})
    install(backend, settings=settings.model_copy(update={"models": (small, *settings.models[1:])}))
    body = _largest_valid_system_one()
    body["questions"] = {"q0": body["questions"]["q0"]}
    status, _, reply = call(event("POST", "/v1/systemone", body))
    assert status == 413 and "at most 256" in reply["detail"]["message"]
    assert backend.calls == []


def test_the_estimate_counts_both_orders_and_the_prior_only_when_asked_for():
    from gateway.decisions.model import Decision, Option, Question
    from gateway.decisions.work_limits import estimated_tokens

    question = Question("q0", "choice", "Which?", tuple(Option(f"o{k}", f"o{k}", "x" * 40) for k in range(10)))
    plain = Decision("m", "state " * 100, (question,))
    asked = Decision("m", "state " * 100, (question,), engine_options={"x_order_average": True, "x_prior": True})
    # Asked-for debiasing (both orders, the prior) counts the question fourfold; the state once
    # (150 tokens). Not asked for, the scorer may drop it to fit, so it is not counted.
    assert estimated_tokens(asked) - estimated_tokens(plain) == 3 * (estimated_tokens(plain) - 150)
    assert estimated_tokens(plain) == estimated_tokens(
        Decision("m", "state " * 100, (question,), engine_options={"x_order_average": False, "x_prior": False}))


_INIT_PHASE = r"""
import json, sys
import gateway.functions.handler as handler
function = handler._function
clients = len(function.services.decide.backend._clients) if function is not None else None
pending = sorted({m.__qualname__ for m in handler.declared_models() if not m.__pydantic_complete__})
from pydantic import TypeAdapter
pending += sorted(f"{name}.{attr}" for name, module in list(sys.modules.items())
                  if name.startswith(("gateway.", "systemone."))
                  for attr, value in vars(module).items() if isinstance(value, TypeAdapter) and not value.pydantic_complete)
print(json.dumps({"built": function is not None, "init_s": handler.INIT_SECONDS, "clients": clients,
                  "models_to_build": pending}))
"""


def _load_handler(tmp_path, **env):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[4]
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "GATEWAY_"))}
    result = subprocess.run([sys.executable, "-c", _INIT_PHASE], capture_output=True, text=True, timeout=120,
                            cwd=root, env={**clean, "PYTHONPATH": str(root), "AWS_DEFAULT_REGION": "us-east-1",
                                           "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", **env})
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1]), result.stderr


MODELS = {"models": [{"name": "decision-default", "serves": ["decisions"],
                      "endpoints": [{"name": "a", "endpoint_url": "http://127.0.0.1:9"},
                                    {"name": "b", "endpoint_url": "http://127.0.0.1:10"}]},
                     {"name": "chat-default", "serves": ["chat"],
                      "endpoints": [{"name": "a", "endpoint_url": "http://127.0.0.1:9"}]}]}


def test_in_lambda_the_function_and_its_sagemaker_clients_are_built_in_the_init_phase(tmp_path):
    # Given Lambda's environment, loading the handler builds the function and a client for
    # each endpoint the routes can call (two here: "a" serves both models), before any request.
    loaded, _ = _load_handler(tmp_path, AWS_LAMBDA_FUNCTION_NAME="gateway", GATEWAY_MODELS=json.dumps(MODELS))
    assert loaded["built"] and loaded["clients"] == 2 and loaded["init_s"] > 0


def test_models_build_on_first_use_except_under_snapstart_whose_snapshot_carries_them_all(tmp_path):
    # A plain cold start builds only what its first request reads (the decision's wire models
    # wait); a SnapStart init phase builds them all, once, for every instance resumed.
    plain, _ = _load_handler(tmp_path, AWS_LAMBDA_FUNCTION_NAME="gateway", GATEWAY_MODELS=json.dumps(MODELS))
    assert {"DecisionRequest", "DecisionRecord", "NoulEntry", "gateway.catalogs.model._CONTENT",
            "gateway.backends.scorer._ANSWER"} <= set(plain["models_to_build"])
    snapped, _ = _load_handler(tmp_path, AWS_LAMBDA_FUNCTION_NAME="gateway", GATEWAY_MODELS=json.dumps(MODELS),
                               AWS_LAMBDA_INITIALIZATION_TYPE="snap-start")
    assert snapped["built"] and snapped["models_to_build"] == []


def test_a_function_that_cannot_be_built_in_the_init_phase_still_loads_and_says_why(tmp_path):
    # Given settings that do not validate, the module still loads (Lambda would otherwise
    # fail every init); the first request builds it again and answers the error.
    loaded, log = _load_handler(tmp_path, AWS_LAMBDA_FUNCTION_NAME="gateway", GATEWAY_MODELS="{not json")
    assert not loaded["built"] and "could not be built in the init phase" in log


def test_outside_lambda_nothing_is_built_at_import(tmp_path):
    loaded, _ = _load_handler(tmp_path, GATEWAY_MODELS=json.dumps(MODELS))
    assert not loaded["built"] and loaded["init_s"] == 0


def test_instances_resumed_from_one_snapshot_draw_their_own_endpoint_order(monkeypatch):
    # Given a pool of four equal endpoints whose random state was captured in a snapshot,
    # two instances resumed from it would pick the same endpoints in the same order; the
    # restore hook gives each its own.
    import sys
    import types

    from gateway.functions import handler
    from gateway.settings import GatewaySettings

    pool_settings = [{"name": name, "tier": 0} for name in "abcd"]  # one tier: a weighted random order
    services = install(UniformBackend(), settings=GatewaySettings.model_validate({"region": "us-east-1", "models": [
        {"name": "decision-default", "aliases": ["jev-latest"], "serves": ["decisions"], "endpoints": pool_settings}]}))
    pool = services.registry.route_for("jev-latest", "decisions").pool
    snapshot = pool.rng.getstate()

    def orders() -> list[tuple[str, ...]]:
        return [tuple(e.name for e in pool.order()) for _ in range(20)]

    first = orders()
    pool.rng.setstate(snapshot)
    assert orders() == first  # resumed twice, unchanged: the same sequence
    registered = []
    monkeypatch.setitem(sys.modules, "snapshot_restore_py",
                        types.SimpleNamespace(register_after_restore=registered.append))
    handler._register_restore_hook()
    assert registered == [handler.after_restore]
    monkeypatch.setattr(handler, "_function", handler.GatewayFunction(services))
    pool.rng.setstate(snapshot)
    registered[0]()
    assert orders() != first


def test_the_function_starts_and_decides_without_importing_numpy():
    # numpy is in the artifact for refits only: a cold start that imported it would pay for
    # it on every decision function (the import alone is tens of milliseconds).
    script = ("import sys\nimport gateway.functions.handler, gateway.streaming.integration, gateway.functions.runtime_loop\n"
              "from gateway.catalogs import adapters, policy\n"
              "sys.exit(1 if 'numpy' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", script], check=False).returncode == 0


def _declared_models() -> list[type]:
    """Every pydantic model the gateway and the contract declare (all their modules loaded)."""
    import importlib
    import pkgutil

    import gateway
    import systemone
    from gateway.functions.handler import declared_models

    for package in (gateway, systemone):  # the entry points too: outside Lambda they build nothing at import
        for module in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            importlib.import_module(module.name)
    return list(declared_models())


def test_the_modules_that_declare_models_keep_their_annotations_as_objects():
    # Under `from __future__ import annotations` every annotation is text, and pydantic
    # compiles each one when its model class is made: about a quarter of a model's cost at a
    # cold start (make bench-gateway). Modules that declare models leave annotations as
    # objects (a class naming itself says `Self`).
    import ast
    import importlib
    from pathlib import Path

    declaring = {m.__module__ for m in _declared_models()}
    assert "systemone.models" in declaring and "gateway.settings" in declaring
    for name in sorted(declaring):
        source = Path(importlib.import_module(name).__file__).read_text()
        future = [n for n in ast.parse(source).body if isinstance(n, ast.ImportFrom) and n.module == "__future__"]
        assert not future, f"{name} declares pydantic models under `from __future__ import annotations`"


def test_every_model_builds_its_validator_on_first_use():
    # A cold start builds only the validators its first request reads (a SnapStart init
    # phase builds them all): every model says defer_build, mixins included.
    eager = [f"{m.__module__}.{m.__qualname__}" for m in _declared_models() if not m.model_config.get("defer_build")]
    assert not eager
