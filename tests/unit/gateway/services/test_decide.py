"""A suspected prompt injection (the scorer's `x_injection`) through the handler: the catalog
rule's validation, the verdict and its reason on both formats, the record, the metrics
line, and a malformed signal. The backend answers set probabilities and a set signal."""

from __future__ import annotations

import json

import pytest

from devkit.gateway_stack import event
from gateway.decisions.records import DecisionRecord
from tests.gateway_helpers import call, tenant_store
from tests.unit.gateway.test_catalogs import ACME, ROUTING, decide, decide_openai, put, stack

CONFIDENT = {"billing": 0.9, "delivery": 0.05, "account": 0.05}
SUSPECTED = {"suspicion": 0.83, "probe": 0.41, "patterns": ["ignore_instructions"], "neutralised": ["invisible_characters"]}


@pytest.fixture
def store(tmp_path):
    return tenant_store(tmp_path / "g.db", "acme", "globex")


def test_an_injection_rule_out_of_range_is_a_422_naming_the_field(store):
    stack(store)
    for rule, field in (({"threshold": 1.5}, "threshold"), ({"threshold": "high"}, "threshold"),
                        ({"action": "auto"}, "action"), ({"threshold": 0.5, "surprise": 1}, "surprise")):
        status, _, body = put({**ROUTING, "policy": {**ROUTING["policy"], "injection": rule}})
        assert status == 422, rule
        [error] = body["detail"]
        assert error["loc"][-3:] == ["policy", "injection", field] and error["msg"], error
    status, _, body = put({**ROUTING, "policy": {**ROUTING["policy"], "injection": {"threshold": 1, "action": None}}})
    assert status == 201, body
    assert body["policy"]["injection"] == {"threshold": 1.0}  # a null action is the mode's default, left out


def test_a_suspected_injection_turns_auto_into_review_on_both_formats_and_says_why(store):
    stack(store, choice=CONFIDENT, injection=SUSPECTED, framing="spotlight")
    put(ROUTING)
    status, _, body = decide({"catalog": "support-routing"})
    assert status == 200, body
    answer = body["answers"]["queue"]
    assert (answer["x_action"], answer["x_action_reason"], answer["choice"]) == ("review", "injection_suspected", "billing")
    assert body["x_injection"] == SUSPECTED and body["x_framing"] == "spotlight"  # the scorer's fields, passed through
    [openai] = decide_openai({"catalog": "support-routing", "name": "queue"})[2]["answers"]
    assert (openai["x_action"], openai["x_action_reason"]) == ("review", "injection_suspected")


def test_an_abstain_rule_answers_the_abstain_option_of_an_enforcing_entry(store):
    stack(store, choice=CONFIDENT, injection={"suspicion": 0.6})
    put({**ROUTING, "policy": {**ROUTING["policy"], "injection": {"threshold": 0.6, "action": "abstain"}}})
    answer = decide({"catalog": "support-routing"})[2]["answers"]["queue"]
    assert (answer["x_action"], answer["x_action_reason"], answer["choice"]) == ("abstain", "injection_suspected", "human")


def test_below_the_threshold_or_from_an_older_scorer_nothing_changes(store):
    for injection in ({"suspicion": 0.1, "probe": None}, None):
        stack(store, choice=CONFIDENT, injection=injection)
        put(ROUTING)
        body = decide({"catalog": "support-routing"})[2]
        answer = body["answers"]["queue"]
        assert answer["x_action"] == "auto" and "x_action_reason" not in answer
        assert ("x_injection" in body) is (injection is not None)


def test_an_entry_that_requires_the_signal_sends_an_answer_without_one_to_review(store):
    stack(store, choice=CONFIDENT, injection=None)  # a backend without the scorer's check
    status, _, body = put({**ROUTING, "policy": {**ROUTING["policy"], "injection": {"require_signal": True}}})
    assert status == 201 and body["policy"]["injection"] == {"threshold": 0.5, "require_signal": True}, body
    answer = decide({"catalog": "support-routing"})[2]["answers"]["queue"]
    assert (answer["x_action"], answer["x_action_reason"]) == ("review", "injection_signal_missing")
    stack(store, choice=CONFIDENT, injection={"suspicion": 0.1})  # with a signal, below the threshold: trusted
    assert decide({"catalog": "support-routing"})[2]["answers"]["queue"]["x_action"] == "auto"


def test_require_signal_that_could_do_nothing_is_a_422_and_an_explicit_false_keeps_the_hash(store):
    stack(store)
    for policy in ({"mode": "advisory", "injection": {"require_signal": True}},
                   {**ROUTING["policy"], "injection": {"require_signal": True, "action": "ignore"}}):
        status, _, body = put({**ROUTING, "policy": policy})
        assert status == 422 and "require_signal" in body["detail"][0]["msg"], body
    _, _, plain = put({**ROUTING, "policy": {**ROUTING["policy"], "injection": {"threshold": 0.5}}})
    _, _, false = put({**ROUTING, "policy": {**ROUTING["policy"], "injection": {"threshold": 0.5, "require_signal": False}}})
    assert false["hash"] == plain["hash"] and false["version"] == plain["version"]  # the same entry: no new version


def test_the_record_keeps_the_signal_the_framing_and_the_reason(store):
    stack(store, choice=CONFIDENT, injection=SUSPECTED, framing="spotlight")
    put(ROUTING)
    decision_id = decide({"catalog": "support-routing"})[2]["x_decision_id"]
    record = call(event("GET", f"/v1/records/{decision_id}", principal=ACME))[2]
    assert record["injection"] == SUSPECTED and record["framing"] == "spotlight"
    [question] = record["questions"]
    assert (question["action"], question["action_reason"]) == ("review", "injection_suspected")
    stack(store, choice=CONFIDENT)  # an older scorer: the record says nothing about injection
    decision_id = decide({"catalog": "support-routing"})[2]["x_decision_id"]
    plain = call(event("GET", f"/v1/records/{decision_id}", principal=ACME))[2]
    assert plain["injection"] is None and plain["framing"] is None and "action_reason" not in plain["questions"][0]


def test_old_records_without_the_signal_still_read():
    old = {"id": "0" * 24, "request_id": "r", "tenant_id": "acme", "credential_id": "k", "created_at": 1.0, "route": "systemone",
           "model_requested": "jev-latest", "model": "m", "endpoint": "dg-cpu", "attempts": 1, "calibrated": True,
           "latency_ms": 1.0, "usage": {"input_tokens": 1, "output_tokens": 0},
           "questions": [{"name": "queue", "kind": "choice", "action": "auto"}]}
    record = DecisionRecord.model_validate(old)
    assert record.injection is None and record.framing is None and record.questions[0].action_reason is None


def emf_lines(text: str) -> list[dict]:
    found = []
    for line in text.splitlines():
        if line.startswith("{") and '"_aws"' in line:
            found.append(json.loads(line))
    return found


@pytest.mark.parametrize(("suspicion", "suspected"), [(0.83, 1), (0.5, 1), (0.2, 0)])
def test_the_metrics_line_carries_the_suspicion(store, capsys, suspicion, suspected):
    stack(store, choice=CONFIDENT, injection={"suspicion": suspicion})
    put(ROUTING)
    capsys.readouterr()
    assert decide({"catalog": "support-routing"})[0] == 200
    [line] = [m for m in emf_lines(capsys.readouterr().out) if "Requests" in m]
    assert (line["InjectionSuspicion"], line["InjectionSuspected"]) == ([suspicion], [suspected])  # one decision, one value
    [directive] = line["_aws"]["CloudWatchMetrics"]
    units = {m["Name"]: m["Unit"] for m in directive["Metrics"]}
    assert units["InjectionSuspicion"] == "None" and units["InjectionSuspected"] == "Count"
    assert directive["Namespace"] == "DecisionGateway"


def test_no_signal_is_counted_as_missing_not_as_a_suspicion(store, capsys):
    # An enforcing policy cannot act on a signal it never got: the metric says so.
    stack(store, choice=CONFIDENT)
    put(ROUTING)
    capsys.readouterr()
    assert decide({"catalog": "support-routing"})[0] == 200
    [line] = [m for m in emf_lines(capsys.readouterr().out) if "Requests" in m]
    assert "InjectionSuspicion" not in line and "InjectionSuspected" not in line
    assert line["InjectionSignalMissing"] == [1]


@pytest.mark.parametrize("injection", [{"suspicion": 2.0}, {"suspicion": "high"}, {"suspicion": None}, {"probe": 0.5},
                                       {"suspicion": 0.5, "patterns": "ignore_instructions"}, "suspicious"])
def test_a_malformed_signal_is_a_502_and_no_decision(store, injection):
    backend = stack(store, choice=CONFIDENT, injection=injection)
    put(ROUTING)
    status, headers, body = decide({"catalog": "support-routing"})
    assert status == 502 and "x_ fields" in body["detail"]["message"], body
    assert "x-decision-id" not in headers and backend.calls  # the scorer was asked; nothing was recorded
    assert call(event("GET", "/v1/records", principal=ACME))[2]["records"] == []


def test_each_decision_writes_its_cost_by_tenant_and_endpoint_and_its_record_keeps_it(store, capsys):
    # The spend of a tenant and the load of a pool are each one CloudWatch query: every
    # decision writes its cost and endpoint time once by tenant and once by endpoint.
    stack(store, choice=CONFIDENT, injection={"suspicion": 0.1})
    put(ROUTING)
    capsys.readouterr()
    status, _, body = decide({"catalog": "support-routing"})
    assert status == 200
    by_tenant, by_endpoint = [m for m in emf_lines(capsys.readouterr().out) if "DecisionCostUSD" in m]
    record = call(event("GET", f"/v1/records/{body['x_decision_id']}", principal=ACME))[2]
    assert record["usage"]["cost_usd"] == body["usage"]["x_cost_usd"] > 0  # the record keeps what the answer said
    for line, dimension in ((by_tenant, "tenant"), (by_endpoint, "endpoint")):
        assert line["DecisionCostUSD"] == [pytest.approx(body["usage"]["x_cost_usd"])]
        assert line["EndpointSeconds"][0] >= 0 and line[dimension]
        [directive] = line["_aws"]["CloudWatchMetrics"]
        assert [set(d) for d in directive["Dimensions"]] == [{"service", dimension}]
    assert by_tenant["tenant"] == "acme" and "endpoint" not in by_tenant and "tenant" not in by_endpoint
