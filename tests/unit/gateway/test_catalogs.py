"""Catalogs through the handler: versions, references in both formats, catalog-only
tenants, thresholds and enforcing mode, records and outcomes, tenant isolation.
The store is a real SQLite file; the backend answers set probabilities."""

from __future__ import annotations

import json

import pytest

from devkit.gateway_stack import event, install
from gateway.auth.authenticate import Authenticator
from gateway.auth.tenants import create_tenant
from gateway.auth.tokens import CachedKeyRing, new_key_document
from tests.fakes import FixedBackend
from tests.gateway_helpers import call, register_credentials, tenant_store, unthrottled

ACME = {"principalId": "acme", "tenant_id": "acme", "scopes": "decide catalogs:read catalogs:write", "models": "*",
        "credential_id": "k-acme"}
GLOBEX = {**ACME, "principalId": "globex", "tenant_id": "globex", "credential_id": "k-globex"}
READER = {**ACME, "scopes": "catalogs:read"}
ROUTING = {
    "type": "choice",
    "instructions": "Which queue should handle this ticket?",
    "options": [{"name": "billing", "description": "payments, refunds"}, {"name": "delivery"}, {"name": "account"}],
    "abstain": {"name": "human", "description": "a person decides"},
    "policy": {"mode": "enforcing", "auto": {"min_top": 0.8}, "review": {"min_top": 0.5, "min_margin": 0.2}},
    "calibration": {"temperature": 1.0},
}
STATE = "Customer 4411 (alice@example.com): I was charged twice, refund one please."


@pytest.fixture
def store(tmp_path):
    return tenant_store(tmp_path / "g.db", "acme", "globex")


def stack(store, **probabilities) -> FixedBackend:
    backend = FixedBackend(**probabilities)
    document = new_key_document()
    install(backend, stores=store, authenticator=Authenticator(store, CachedKeyRing(lambda: document)))
    register_credentials(store, ACME, GLOBEX)
    return backend


def decide_openai(question: dict, principal=ACME):
    return call(event("POST", "/v1/decisions", {"model": "decision-default", "input": STATE, "questions": [question]},
                      principal=principal))


def put(entry: dict, principal=ACME, name: str = "support-routing"):
    return call(event("PUT", f"/v1/catalogs/{name}", entry, principal=principal))


def decide(question: dict, principal=ACME, **extra):
    return call(event("POST", "/v1/systemone", {"model": "jev-latest", "state": STATE, "questions": {"queue": question}, **extra},
                      principal=principal))


def test_versions_are_immutable_hashed_and_latest_moves(store):
    stack(store)
    status, _, first = put(ROUTING)
    assert status == 201 and first["version"] == 1 and len(first["hash"]) == 64 and first["created"]
    status, _, again = put(json.loads(json.dumps(ROUTING)))  # the same content, keys in any order
    assert status == 200 and not again["created"] and again["version"] == 1 and again["hash"] == first["hash"]
    changed = {**ROUTING, "options": [{"name": "billing", "description": "payments, refunds, invoices"}, *ROUTING["options"][1:]]}
    status, _, second = put(changed)
    assert status == 201 and second["version"] == 2 and second["hash"] != first["hash"]
    assert call(event("GET", "/v1/catalogs/support-routing", principal=READER))[2]["version"] == 2
    old = call(event("GET", "/v1/catalogs/support-routing/versions/1", principal=READER))[2]
    assert old["hash"] == first["hash"] and old["options"][0]["description"] == "payments, refunds"
    versions = call(event("GET", "/v1/catalogs/support-routing/versions", principal=READER))[2]["versions"]
    assert [v["version"] for v in versions] == [1, 2]
    assert [c["name"] for c in call(event("GET", "/v1/catalogs", principal=READER))[2]["catalogs"]] == ["support-routing"]


def test_catalog_writes_need_their_scope_and_bad_entries_are_422(store):
    stack(store)
    assert put(ROUTING, principal=READER)[0] == 403
    assert put({**ROUTING, "options": [{"name": "a"}, {"name": "a"}]})[0] == 422
    assert put({"type": "score", "levels": [{"label": "low"}]})[0] == 422
    assert put(ROUTING, name="Bad Name")[0] in (404, 422)
    assert call(event("GET", "/v1/catalogs/nothing", principal=READER))[0] == 404


@pytest.mark.parametrize(("top", "action", "choice"), [(0.9, "auto", "billing"), (0.6, "review", "billing"),
                                                        (0.45, "abstain", "human")])
def test_thresholds_decide_the_action_and_enforcing_mode_answers_the_abstain_option(store, top, action, choice):
    rest = (1 - top) / 2
    stack(store, choice={"billing": top, "delivery": rest, "account": rest})
    put(ROUTING)
    status, headers, body = decide({"catalog": "support-routing"})
    assert status == 200, body
    answer = body["answers"]["queue"]
    assert answer["x_action"] == action and answer["choice"] == choice
    assert answer["x_catalog"] == "support-routing@1" and answer["x_policy"]["mode"] == "enforcing"
    assert set(answer["probabilities"]) == {"billing", "delivery", "account"}
    assert body["x_decision_id"] == headers["x-decision-id"]


def test_advisory_mode_reports_abstain_but_keeps_the_answer(store):
    stack(store, choice={"billing": 0.4, "delivery": 0.35, "account": 0.25})
    put({**ROUTING, "policy": {**ROUTING["policy"], "mode": "advisory"}})
    answer = decide({"catalog": "support-routing"})[2]["answers"]["queue"]
    assert answer["x_action"] == "abstain" and answer["choice"] == "billing"


def test_calibration_runs_before_thresholds_and_score(store):
    stack(store, choice={"billing": 0.7, "delivery": 0.2, "account": 0.1}, score=[0.1, 0.2, 0.7])
    put({**ROUTING, "calibration": {"temperature": 0.5}})
    answer = decide({"catalog": "support-routing"})[2]["answers"]["queue"]
    assert answer["probabilities"]["billing"] == pytest.approx(0.49 / (0.49 + 0.04 + 0.01))
    assert answer["x_action"] == "auto"  # 0.907 after calibration, 0.7 before
    raw = decide({"catalog": "support-routing"}, x_calibrate=False)[2]["answers"]["queue"]
    assert raw["probabilities"]["billing"] == pytest.approx(0.7) and "x_action" not in raw
    put({"type": "score", "instructions": "How angry?", "levels": [{"label": "calm"}, {"label": "annoyed"}, {"label": "angry"}],
         "calibration": {"temperature": 2.0}}, name="anger")
    score = decide({"catalog": "anger"})[2]["answers"]["queue"]
    flat = [p ** 0.5 for p in (0.1, 0.2, 0.7)]
    assert score["score"] == pytest.approx(sum(i * p / sum(flat) for i, p in enumerate(flat)))


def test_a_pinned_version_is_used_as_it_was(store):
    backend = stack(store, choice={"billing": 0.9})
    put(ROUTING)
    put({**ROUTING, "instructions": "Route it."})
    decide({"catalog": "support-routing", "version": 1})
    assert backend.calls[-1][1]["questions"]["q0"]["instructions"] == ROUTING["instructions"]
    body = decide({"catalog": "support-routing", "version": 3})
    assert body[0] == 422 and body[2]["detail"][0]["loc"] == ["body", "questions", "queue", "catalog"]


def test_openai_decisions_reference_entries_too(store):
    stack(store, choice={"billing": 0.9})
    put(ROUTING)
    status, _, body = decide_openai({"catalog": "support-routing", "name": "queue"})
    assert status == 200, body
    [answer] = body["answers"]
    assert answer["choice"] == "billing" and answer["x_action"] == "auto" and body["id"].startswith("decision_")


def test_x_cache_false_reaches_the_scorer_from_either_format_and_an_entrys_false_wins(store):
    # Given a request or a catalog entry saying x_cache / cache false, the scorer is asked with
    # x_cache false (read afresh, kept nowhere); a request's true never overrides an entry's false,
    # and a request that says nothing sends nothing (the scorer's default: it may keep the state).
    backend = stack(store, choice={"billing": 0.9})
    put(ROUTING)
    put({**ROUTING, "cache": False}, name="private")
    asked = [decide({"catalog": "support-routing"}), decide({"catalog": "support-routing"}, x_cache=False),
             decide({"catalog": "private"}), decide({"catalog": "private"}, x_cache=True),
             call(event("POST", "/v1/decisions", {"model": "decision-default", "input": STATE, "x_cache": False,
                                                  "questions": [{"catalog": "support-routing"}]}, principal=ACME))]
    assert [status for status, _, _ in asked] == [200] * 5
    assert [sent.get("x_cache") for _, sent, _ in backend.calls[-5:]] == [None, False, False, False, False]
    assert put({**ROUTING, "cache": "no"}, name="bad")[0] == 422


def test_a_catalog_only_tenant_refuses_inline_questions(store):
    stack(store)
    create_tenant(store.tenants, "acme", catalog_only=True)
    put(ROUTING)
    status, _, body = decide({"type": "noul", "instructions": "Refund?"})
    assert status == 403 and "catalog" in body["detail"]["message"]
    assert decide({"catalog": "support-routing"})[0] == 200


def test_records_hold_versions_and_hashes_but_no_state_or_credential(store):
    stack(store, choice={"billing": 0.9})
    put(ROUTING)
    body = decide({"catalog": "support-routing"}, principal={**ACME, "credential_id": "k-acme"})[2]
    record = call(event("GET", f"/v1/records/{body['x_decision_id']}", principal=ACME))[2]
    [question] = record["questions"]
    assert question["catalog"] == "support-routing@1" and len(question["catalog_hash"]) == 64
    assert question["action"] == "auto" and question["answer"] == "billing" and question["policy"]["mode"] == "enforcing"
    assert record["model_sha256"] == "ab" * 32 and record["image_digest"].startswith("sha256:")
    assert record["prompt_version"] == "decision-prompt/1" and record["tenant_id"] == "acme"
    assert record["debias"]["ordering"] == "canonical" and record["debias"]["temperature"] == 0.8
    assert len(record["state_hash"]) == 64 and record["state_hash_key"]
    dumped = json.dumps(record) + open(store.tenants.db.path, "rb").read().decode("latin-1")
    assert STATE not in dumped and "alice@example.com" not in dumped


def test_outcomes_attach_to_the_tenants_own_records_and_feed_drift(store):
    stack(store, choice={"billing": 0.9})
    put({**ROUTING, "calibration": {"temperature": 1.0, "fit": {"fitted_at": 0.0, "samples": 100, "accuracy": 0.9,
                                                                "ece": 0.05, "brier": 0.1}}})
    ids = [decide({"catalog": "support-routing"})[2]["x_decision_id"] for _ in range(4)]
    for i, decision_id in enumerate(ids):
        expected = "billing" if i < 3 else "delivery"
        status, _, _ = call(event("POST", f"/v1/decisions/{decision_id}/outcome", {"answers": {"queue": expected}}, principal=ACME))
        assert status == 200
    assert call(event("POST", f"/v1/decisions/{ids[0]}/outcome", {"answers": {"queue": "x"}}, principal=GLOBEX))[0] == 404
    assert call(event("POST", f"/v1/decisions/{ids[0]}/outcome", {"answers": {"nope": "x"}}, principal=ACME))[0] == 422
    listed = call(event("GET", "/v1/records?catalog=support-routing", principal=ACME))[2]
    assert [r["id"] for r in listed["records"]] == ids[::-1]
    drift = listed["drift"]["support-routing"]
    assert drift["samples"] == 4 and drift["accuracy"] == pytest.approx(0.75)
    assert drift["accuracy_change"] == pytest.approx(-0.15) and drift["ece_at_fit"] == 0.05


def test_tenants_never_see_each_others_catalogs_or_records(store):
    stack(store, choice={"billing": 0.9})
    put(ROUTING)
    decision_id = decide({"catalog": "support-routing"})[2]["x_decision_id"]
    assert call(event("GET", "/v1/catalogs/support-routing", principal=GLOBEX))[0] == 404
    assert call(event("GET", "/v1/catalogs", principal=GLOBEX))[2]["catalogs"] == []
    assert decide({"catalog": "support-routing"}, principal=GLOBEX)[0] == 422
    assert call(event("GET", f"/v1/records/{decision_id}", principal=GLOBEX))[0] == 404
    assert call(event("GET", "/v1/records", principal=GLOBEX))[2]["records"] == []
    put({**ROUTING, "instructions": "Globex routing"}, principal=GLOBEX)
    assert call(event("GET", "/v1/catalogs/support-routing", principal=ACME))[2]["instructions"] == ROUTING["instructions"]


DECIDER = {**ACME, "scopes": "decide", "credential_id": "k-decider"}


def test_a_caller_holding_only_decide_cannot_switch_off_an_enforcing_policy(store):
    # Given an enforcing entry whose verdict for these probabilities is abstain (the human
    # route), when a decide-only caller asks for raw probabilities or another readout,
    # then it gets 403 and no backend call is made; a caller who may rewrite the entry
    # (catalogs:write) may read past it, as calibration runs do.
    backend = stack(store, choice={"billing": 0.4, "delivery": 0.35, "account": 0.25})
    register_credentials(store, DECIDER)
    put({**ROUTING, "readout": {"readout": "letters"}})
    calls = len(backend.calls)
    for extra in ({"x_calibrate": False}, {"x_readout": "likelihood"}):
        status, _, body = decide({"catalog": "support-routing"}, principal=DECIDER, **extra)
        assert status == 403 and body["detail"]["error_type"] == "permission_denied", extra
        assert "catalogs:write" in body["detail"]["message"]
    assert len(backend.calls) == calls
    status, _, body = decide({"catalog": "support-routing"}, principal=DECIDER, x_readout="letters")
    assert status == 200 and body["answers"]["queue"]["choice"] == "human"  # the entry's own readout is fine
    status, _, body = decide({"catalog": "support-routing"}, x_calibrate=False)  # ACME holds catalogs:write
    assert status == 200 and "x_action" not in body["answers"]["queue"]


def test_an_advisory_policy_may_be_read_past_by_any_decider(store):
    stack(store, choice={"billing": 0.4, "delivery": 0.35, "account": 0.25})
    register_credentials(store, DECIDER)
    put({**ROUTING, "policy": {**ROUTING["policy"], "mode": "advisory"}})
    status, _, _ = decide({"catalog": "support-routing"}, principal=DECIDER, x_calibrate=False)
    assert status == 200


def test_an_enforcing_entry_cannot_be_escaped_by_pinning_an_older_version_or_an_undeclared_readout(store):
    # Given v1 advisory and v2 enforcing (no readout declared), a decide-only caller pinning
    # v1 for raw probabilities, or setting any readout option on v2, gets 403.
    backend = stack(store, choice={"billing": 0.4, "delivery": 0.35, "account": 0.25})
    register_credentials(store, DECIDER)
    put({**ROUTING, "policy": {**ROUTING["policy"], "mode": "advisory"}})
    put(ROUTING)
    calls = len(backend.calls)
    for question, extra in (({"catalog": "support-routing", "version": 1}, {"x_calibrate": False}),
                            ({"catalog": "support-routing", "version": 1}, {}),
                            ({"catalog": "support-routing"}, {"x_prior": True}),
                            ({"catalog": "support-routing"}, {"x_order_average": False})):
        status, _, body = decide(question, principal=DECIDER, **extra)
        assert status == 403 and "catalogs:write" in body["detail"]["message"], (question, extra)
    assert len(backend.calls) == calls
    assert decide({"catalog": "support-routing", "version": 2}, principal=DECIDER)[0] == 200
    assert decide({"catalog": "support-routing", "version": 1}, x_calibrate=False)[0] == 200  # ACME may


# Readout declarations an entry can make, and what a request can set on top.
_READOUTS = ({}, {"readout": "letters"}, {"readout": "likelihood"}, {"prior": True}, {"order_average": False},
             {"readout": "letters", "prior": False})
_REQUEST_SETTINGS = ({}, {"x_readout": "letters"}, {"x_prior": True})


@pytest.mark.parametrize("own", _READOUTS)
@pytest.mark.parametrize("other", _READOUTS)
@pytest.mark.parametrize("other_enforces", (False, True))
@pytest.mark.parametrize("asked", _REQUEST_SETTINGS)
def test_no_combination_of_entries_changes_an_enforcing_entrys_readout(store, own, other, other_enforces, asked):
    # Given an enforcing entry and a second entry (advisory or enforcing) each declaring a
    # readout or none, when a decide-only caller names both in one request, with or without
    # settings of its own, then the scorer is asked with exactly the settings each enforcing
    # entry declares (the model's defaults for those it leaves out), or nothing is asked:
    # a setting of the caller's own is 403, another entry's is 422.
    backend = stack(store, choice={"billing": 0.9})
    register_credentials(store, DECIDER)
    put({**ROUTING, "readout": own}, name="routing")
    other_policy = ROUTING["policy"] if other_enforces else {**ROUTING["policy"], "mode": "advisory"}
    put({**ROUTING, "readout": other, "policy": other_policy}, name="second")
    calls = len(backend.calls)
    status, _, body = call(event("POST", "/v1/systemone", {
        "model": "jev-latest", "state": STATE, "questions": {"a": {"catalog": "routing"}, "b": {"catalog": "second"}},
        **asked}, principal=DECIDER))
    if status != 200:
        assert status in (403, 422), body
        assert len(backend.calls) == calls  # refused before any backend call
        return
    sent = backend.calls[-1][1]
    assert sent["x_reduce"] is False  # nor may the scorer cut the debiasing to fit its budget
    enforced = [own, other] if other_enforces else [own]
    for declared in enforced:
        for field in ("readout", "order_average", "prior"):
            assert sent.get(f"x_{field}") == declared.get(field), (field, declared, sent)


def test_a_second_entry_cannot_change_an_enforcing_entrys_readout(store):
    # Given an enforcing entry that leaves its readout to the model and an advisory one that
    # declares letters, a decide-only caller naming both gets 422 (it used to be asked with
    # letters, which the enforcing entry's thresholds were never set for).
    backend = stack(store, choice={"billing": 0.9})
    register_credentials(store, DECIDER)
    put(ROUTING, name="routing")
    put({**ROUTING, "readout": {"readout": "letters"}, "policy": {**ROUTING["policy"], "mode": "advisory"}},
        name="second")
    calls = len(backend.calls)
    status, _, body = call(event("POST", "/v1/systemone", {
        "model": "jev-latest", "state": STATE, "questions": {"a": {"catalog": "routing"}, "b": {"catalog": "second"}}},
        principal=DECIDER))
    assert status == 422 and body["detail"][0]["type"] == "catalog_conflict", body
    assert "'routing'" in body["detail"][0]["msg"] and "'second'" in body["detail"][0]["msg"]
    assert len(backend.calls) == calls


def test_the_openai_answer_id_names_its_record_for_outcomes_and_reads(store):
    # The id an OpenAI SDK caller is given (decision_<hex>) reports the outcome (it was a 422).
    stack(store, choice={"billing": 0.9})
    put(ROUTING)
    status, _, body = decide_openai({"catalog": "support-routing", "name": "queue"})
    assert status == 200 and body["id"].startswith("decision_")
    status, _, reply = call(event("POST", f"/v1/decisions/{body['id']}/outcome", {"answers": {"queue": "billing"}},
                                  principal=ACME))
    assert status == 200, reply
    record = call(event("GET", f"/v1/records/{body['id']}", principal=ACME))[2]
    assert record["outcome"]["answers"] == {"queue": "billing"}
    assert call(event("GET", f"/v1/records/{body['id'].removeprefix('decision_')}", principal=ACME))[0] == 200
    assert call(event("GET", "/v1/records/decision_xyz", principal=ACME))[0] == 422


def test_an_entry_leaves_room_for_the_scorers_depth_limit(store):
    # An entry nested as deep as allowed still makes a scorer request within the scorer's
    # limit; one level deeper is refused when written, not on every decision that names it.
    from gateway.catalogs.service import MAX_CONTENT_DEPTH
    from systemone.json_text import depth
    from systemone.limits import MAX_JSON_DEPTH

    backend = stack(store)

    def nested(levels):
        value = "deep"
        for _ in range(levels):
            value = [value]
        return value

    base = depth({**ROUTING, "instructions": "x"})
    room = MAX_CONTENT_DEPTH - 1  # the instructions' own container counts once
    fits = {**ROUTING, "instructions": nested(room)}
    assert depth(fits) == MAX_CONTENT_DEPTH >= base
    assert put(fits)[0] == 201
    assert decide({"catalog": "support-routing"})[0] == 200
    assert depth(backend.calls[-1][1]) <= MAX_JSON_DEPTH
    status, _, body = put({**ROUTING, "instructions": nested(room + 1)})
    assert status == 422 and "deeper than" in json.dumps(body)


def test_a_calibration_fitted_on_another_model_is_not_applied_and_an_enforcing_entry_sends_to_review(store):
    # Given an enforcing entry calibrated (T=2) on another model file than the one that
    # answers, when a decision names it, then its probabilities are the model's own, the
    # verdict is review with the reason, and the record says no temperature was applied;
    # once refitted on the answering model, the calibration and the rules apply again.
    stack(store, choice={"billing": 0.9})
    fit = {"fitted_at": 0.0, "samples": 100, "accuracy": 0.9, "ece": 0.05, "brier": 0.1,
           "model_sha256": "ef" * 32, "prompt_version": "decision-prompt/1"}
    put({**ROUTING, "calibration": {"temperature": 2.0, "fit": fit}})
    status, _, body = decide({"catalog": "support-routing"})
    answer = body["answers"]["queue"]
    assert status == 200 and answer["probabilities"]["billing"] == pytest.approx(0.9)
    assert (answer["x_action"], answer["x_action_reason"]) == ("review", "calibration_mismatch")
    assert answer["x_policy"]["temperature"] == 1.0
    [question] = call(event("GET", f"/v1/records/{body['x_decision_id']}", principal=ACME))[2]["questions"]
    assert (question["temperature"], question["action_reason"]) == (1.0, "calibration_mismatch")

    put({**ROUTING, "calibration": {"temperature": 2.0, "fit": {**fit, "model_sha256": "ab" * 32}}})  # the fake's model
    answer = decide({"catalog": "support-routing"})[2]["answers"]["queue"]
    assert answer["probabilities"]["billing"] < 0.8 and answer["x_policy"]["temperature"] == 2.0
    assert answer["x_action"] == "review" and "x_action_reason" not in answer  # the rules' own verdict, calibrated


TRAINER = {**ACME, "scopes": "decide catalogs:read catalogs:write outcomes:train", "credential_id": "k-trainer"}
FRUIT = {"type": "noul", "instructions": "Is the message about fruit?", "learning": {"keep_features": True}}
FRUITY = ["apples and pears", "a ripe mango", "banana bread recipe", "cherries in june", "fresh lemons",
          "peach season", "grapes on the vine", "an orange a day", "plums for jam", "kiwi smoothie"]
OTHER = ["the train was late", "my laptop crashed", "invoice for march", "a new password", "the parcel is lost",
         "concert tickets", "a broken chair", "renew my passport", "the meeting moved", "snow on the road"]


def learning_stack(store) -> FixedBackend:
    """A coin for a model (P(yes) = 0.5 whatever the text), tenants unthrottled: these tests
    send more decisions than a tenant's default rate."""
    backend = stack(store, noul=0.5)
    unthrottled(store, "acme", "globex")
    register_credentials(store, TRAINER, DECIDER)
    return backend


def _decide_state(state, principal=ACME):
    return call(event("POST", "/v1/systemone", {"model": "jev-latest", "state": state,
                                                "questions": {"fruit": {"catalog": "fruit"}}}, principal=principal))


def _label_fruit(suffixes):
    """Decide each text (with each suffix) on the fruit entry and attach its truth as a reviewer."""
    for text, truth in [(t, True) for t in FRUITY] + [(t, False) for t in OTHER]:
        for suffix in suffixes:
            decision_id = _decide_state(text + suffix)[2]["x_decision_id"]
            call(event("POST", f"/v1/decisions/{decision_id}/outcome", {"answers": {"fruit": truth}, "source": "review"},
                       principal=TRAINER))


def test_an_adapter_learns_from_training_outcomes_and_answers_the_entrys_decisions(store):
    # Given an entry that keeps features and a backend whose zero-shot answer is a coin
    # (0.5), when decisions get outcomes from a credential allowed to train and the entry
    # is refitted, then a new version holds an adapter that beats the coin out of fold,
    # its decisions are answered by it (x_adapter, the record names it), and no feature
    # reaches a caller or a record read back.
    backend = learning_stack(store)
    assert put(FRUIT, name="fruit")[0] == 201
    for text, truth in [(t, True) for t in FRUITY] + [(t, False) for t in OTHER]:
        for variant in (text, text + " today", "about " + text):
            status, _, body = _decide_state(variant)
            assert status == 200 and backend.calls[-1][1]["x_features"] is True
            assert "x_features" not in body["answers"]["fruit"]
            reply = call(event("POST", f"/v1/decisions/{body['x_decision_id']}/outcome",
                               {"answers": {"fruit": truth}, "source": "review"}, principal=TRAINER))
            assert reply[0] == 200 and reply[2]["outcome"]["trains"] is True
    record = call(event("GET", f"/v1/records/{body['x_decision_id']}", principal=ACME))[2]
    assert "features" not in record["questions"][0]

    status, _, refit = call(event("POST", "/v1/catalogs/fruit/refit", {}, principal=TRAINER))
    assert status == 200 and refit["applied"] is True and refit["version"] == 2, refit
    assert refit["adapter_out_of_fold"]["accuracy"] > refit["zero_shot_out_of_fold"]["accuracy"] + 0.3
    assert refit["outcomes"]["used"] == 60 and refit["samples"] == 60
    entry = call(event("GET", "/v1/catalogs/fruit", principal=READER))[2]
    assert entry["adapter"]["id"] == refit["adapter"] and entry["adapter"]["fit"]["sources"] == {"review": 60}
    assert entry["adapter"]["model_sha256"] == "ab" * 32

    status, _, body = _decide_state("a bowl of cherries and apples")
    answer = body["answers"]["fruit"]
    assert answer["x_adapter"] == refit["adapter"] and answer["noul"] > 0.7
    # Listed another way than the answers it learned from (the caller asked for the prior):
    # not applied, the probabilities are the model's own.
    other_way = call(event("POST", "/v1/systemone", {"model": "jev-latest", "state": "a bowl of cherries",
                                                     "questions": {"fruit": {"catalog": "fruit"}}, "x_prior": True},
                           principal=ACME))[2]["answers"]["fruit"]
    assert "x_adapter" not in other_way and other_way["noul"] == pytest.approx(0.5)
    assert _decide_state("my laptop crashed again")[2]["answers"]["fruit"]["noul"] < 0.3
    [question] = call(event("GET", f"/v1/records/{body['x_decision_id']}", principal=ACME))[2]["questions"]
    assert question["adapter"] == refit["adapter"] and question["catalog"] == "fruit@2"

    # Another tenant neither sees the adapter nor is answered by it, nor can refit it.
    assert call(event("GET", "/v1/catalogs/fruit", principal=GLOBEX))[0] == 404
    assert call(event("POST", "/v1/catalogs/fruit/refit", {}, principal=GLOBEX))[0] == 404
    put({**FRUIT, "learning": None}, principal=GLOBEX, name="fruit")
    other = _decide_state("a bowl of cherries and apples", principal=GLOBEX)[2]["answers"]["fruit"]
    assert "x_adapter" not in other and other["noul"] == pytest.approx(0.5)


def test_outcomes_that_train_need_their_scope_and_a_refit_of_an_enforcing_entry_is_explicit(store):
    learning_stack(store)
    put({**FRUIT, "policy": {"mode": "enforcing"}}, name="fruit")
    ids = []
    for text, truth in [(t, True) for t in FRUITY] + [(t, False) for t in OTHER]:
        for variant in (text, text + " today"):
            ids.append(_decide_state(variant)[2]["x_decision_id"])
            # A decide-only caller may record the truth for drift, never train the entry.
            denied = call(event("POST", f"/v1/decisions/{ids[-1]}/outcome",
                                {"answers": {"fruit": truth}, "source": "downstream"}, principal=DECIDER))
            assert denied[0] == 403 and "outcomes:train" in denied[2]["detail"]["message"]
            drift_only = call(event("POST", f"/v1/decisions/{ids[-1]}/outcome", {"answers": {"fruit": not truth}},
                                    principal=DECIDER))
            assert drift_only[0] == 200 and drift_only[2]["outcome"]["trains"] is False
    status, _, refit = call(event("POST", "/v1/catalogs/fruit/refit", {}, principal=TRAINER))
    assert status == 200 and refit["applied"] is False and refit["outcomes"]["no_training_outcome"] == 40

    for i, truth in enumerate([True] * len(FRUITY) + [False] * len(OTHER)):
        for j in range(2):
            call(event("POST", f"/v1/decisions/{ids[2 * i + j]}/outcome", {"answers": {"fruit": truth},
                                                                             "source": "audit"}, principal=TRAINER))
    # Nor may it erase an outcome that trains (which would steer the next fit by omission).
    erased = call(event("POST", f"/v1/decisions/{ids[0]}/outcome", {"answers": {"fruit": False}}, principal=DECIDER))
    assert erased[0] == 403 and "outcomes:train" in erased[2]["detail"]["message"]
    status, _, refit = call(event("POST", "/v1/catalogs/fruit/refit", {}, principal=TRAINER))
    assert status == 200 and refit["applied"] is False and "apply: true" in refit["reason"] and refit["adapter"]
    assert refit["fitted_on"]["model_sha256"] == "ab" * 32 and refit["fitted_on"]["listing"] == "canonical/reversal/raw"
    assert call(event("GET", "/v1/catalogs/fruit", principal=READER))[2]["version"] == 1  # unmoved, figures shown
    assert call(event("POST", "/v1/catalogs/fruit/refit", {"apply": True}, principal=DECIDER))[0] == 403
    status, _, refit = call(event("POST", "/v1/catalogs/fruit/refit", {"apply": True}, principal=TRAINER))
    assert status == 200 and refit["applied"] is True and refit["version"] == 2


def test_the_newest_decisions_listed_another_way_do_not_choose_what_the_entry_learns(store):
    # Given an advisory entry with training outcomes under the default listing, when a caller
    # who may only decide sends the newest decisions asking for the prior (and they are
    # labelled too, as a downstream system labels everything), then the refit still fits the
    # listing most outcomes were answered under, and counts the others as another model's.
    learning_stack(store)
    put(FRUIT, name="fruit")
    _label_fruit(["", " today"])
    for text in FRUITY[:3]:
        steered = call(event("POST", "/v1/systemone", {"model": "jev-latest", "state": text, "x_prior": True,
                                                       "questions": {"fruit": {"catalog": "fruit"}}}, principal=DECIDER))
        assert steered[0] == 200
        call(event("POST", f"/v1/decisions/{steered[2]['x_decision_id']}/outcome",
                   {"answers": {"fruit": True}, "source": "downstream"}, principal=TRAINER))
    status, _, refit = call(event("POST", "/v1/catalogs/fruit/refit", {}, principal=TRAINER))
    assert status == 200 and refit["fitted_on"]["listing"] == "canonical/reversal/raw", refit
    assert refit["outcomes"]["another_model"] == 3 and refit["samples"] == 40
    assert refit["applied"] is True


def test_a_tenant_runs_one_refit_at_a_time(store):
    # A refit reads megabytes and fits for seconds in the function that answers decisions:
    # while one holds the tenant's place, another is refused (429, saying why), and another
    # tenant's refit is not.
    import time

    learning_stack(store)
    put(FRUIT, name="fruit")
    put(FRUIT, name="fruit", principal=GLOBEX)
    now = time.time()
    assert store.counters.hold("refit:acme", "another-instance", 1, now + 60, now)
    status, headers, body = call(event("POST", "/v1/catalogs/fruit/refit", {}, principal=TRAINER))
    assert status == 429 and "one refit at a time" in body["detail"]["message"] and headers.get("retry-after")
    assert call(event("POST", "/v1/catalogs/fruit/refit", {}, principal=GLOBEX))[0] != 429
    store.counters.release("refit:acme", "another-instance")
    assert call(event("POST", "/v1/catalogs/fruit/refit", {}, principal=TRAINER))[0] == 200


def test_the_features_an_entry_keeps_count_in_the_records_size_before_the_model_runs(store):
    # 250 questions naming an entry that keeps features: without them the record would fit,
    # with them it cannot, so the request is refused with the figures before any backend call
    # (not after the scorer's work, when the record is written). 120 fit, features and all.
    from gateway.decisions.work_limits import MAX_RECORD_BYTES, features_bytes

    backend = learning_stack(store)
    put(FRUIT, name="fruit")

    def many(n):
        return call(event("POST", "/v1/systemone", {"model": "jev-latest", "state": "apples and pears", "questions": {
            f"q{i:03d}": {"catalog": "fruit"} for i in range(n)}}, principal=ACME))

    status, _, body = many(250)
    assert status == 413 and "features kept for refits" in body["detail"]["message"] and not backend.calls
    estimate = int(body["detail"]["message"].split("about ")[1].split(" bytes")[0])
    assert estimate > MAX_RECORD_BYTES > estimate - 250 * features_bytes(2)
    status, _, body = many(120)
    assert status == 200, body
    stored = store.records.get_record("acme", body["x_decision_id"])
    assert all(q.get("features") for q in stored["questions"])
    assert len(json.dumps(stored)) < MAX_RECORD_BYTES


def test_a_caller_naming_an_earlier_version_keeps_no_features_the_tenant_switched_off(store):
    backend = learning_stack(store)
    put(FRUIT, name="fruit")
    put({**FRUIT, "learning": None}, name="fruit")  # version 2: the tenant stops keeping features

    def stored(reference):
        body = call(event("POST", "/v1/systemone", {"model": "jev-latest", "state": "a ripe mango",
                                                    "questions": {"fruit": reference}}, principal=DECIDER))[2]
        return store.records.get_record("acme", body["x_decision_id"])["questions"][0]

    assert "features" not in stored({"catalog": "fruit", "version": 1}) and backend.calls[-1][1].get("x_features") is None
    assert "features" not in stored({"catalog": "fruit"})
    put(FRUIT, name="fruit")  # version 3 keeps them again: so may a pinned earlier version that did
    assert stored({"catalog": "fruit", "version": 1})["features"]["sketch"]


def test_a_decide_only_outcome_racing_a_trainers_cannot_replace_it(store, monkeypatch):
    # The service reads the record before writing; a trainer's outcome attached in between
    # (the read saw none) is still kept, by the write's own condition: 403, and it stands.
    learning_stack(store)
    put(FRUIT, name="fruit")
    decision_id = _decide_state("a ripe mango")[2]["x_decision_id"]
    trained = call(event("POST", f"/v1/decisions/{decision_id}/outcome", {"answers": {"fruit": True}, "source": "review"},
                         principal=TRAINER))
    assert trained[0] == 200
    read = store.records.get_record
    monkeypatch.setattr(store.records, "get_record", lambda tenant, rid: {**read(tenant, rid), "outcome": None})
    raced = call(event("POST", f"/v1/decisions/{decision_id}/outcome", {"answers": {"fruit": False}}, principal=DECIDER))
    assert raced[0] == 403 and "outcomes:train" in raced[2]["detail"]["message"]
    monkeypatch.undo()
    assert store.records.get_record("acme", decision_id.removeprefix("dec_"))["outcome"]["trains"] is True


def test_an_entrys_versions_come_a_page_at_a_time(store, monkeypatch):
    # An entry refitted daily gains a version a day: its list is paged by count and by size.
    from urllib.parse import urlencode

    from gateway.catalogs import service

    stack(store)
    for i in range(5):
        put({**FRUIT, "instructions": f"Is the message about fruit? ({i})"}, name="fruit")

    def page(query):
        status, _, body = call(event("GET", "/v1/catalogs/fruit/versions?" + urlencode(query), principal=READER))
        assert status == 200, body
        return [v["version"] for v in body["versions"]], body.get("next_after")

    assert page({}) == ([1, 2, 3, 4, 5], None)
    assert page({"limit": "2"}) == ([1, 2], 2) and page({"limit": "2", "after": "2"}) == ([3, 4], 4)
    assert page({"limit": "2", "after": "4"}) == ([5], None) and page({"after": "5"}) == ([], None)
    monkeypatch.setattr(service, "MAX_VERSIONS_PAGE_BYTES", 1)  # one version is always a page's
    assert page({}) == ([1], 1)
    assert call(event("GET", "/v1/catalogs/fruit/versions?limit=0", principal=READER))[0] == 422
    assert call(event("GET", "/v1/catalogs/nothing/versions?after=3", principal=READER))[0] == 404


def test_an_entry_with_no_room_for_an_adapter_is_refused_before_any_work(store):
    # An entry near the 256 KiB limit could never be written with an adapter: the refit says
    # so with the figures (413) before it reads a record; one with room is fitted as ever,
    # and the adapter it writes is within the bound the check used.
    from gateway.catalogs.model import adapter_bytes_bound

    learning_stack(store)
    assert put({**FRUIT, "instructions": "Is the message about fruit? " + "x" * 256_000}, name="big")[0] == 201
    status, _, body = call(event("POST", "/v1/catalogs/big/refit", {}, principal=TRAINER))
    assert status == 413 and "room for" in body["detail"]["message"], body
    put(FRUIT, name="fruit")
    _label_fruit(["", " today"])
    assert call(event("POST", "/v1/catalogs/fruit/refit", {}, principal=TRAINER))[2]["applied"] is True
    adapter = call(event("GET", "/v1/catalogs/fruit", principal=READER))[2]["adapter"]
    assert len(json.dumps(adapter)) <= adapter_bytes_bound(2)


def test_an_adapter_is_checked_on_write_and_never_applied_to_another_models_answers(store):
    learning_stack(store)
    put(FRUIT, name="fruit")
    _label_fruit(["", " today"])
    assert call(event("POST", "/v1/catalogs/fruit/refit", {}, principal=TRAINER))[2]["applied"] is True
    entry = call(event("GET", "/v1/catalogs/fruit", principal=READER))[2]
    content = {k: v for k, v in entry.items() if k not in ("name", "version", "hash", "created_at")}
    # Hand-edited numbers: the id no longer names them (422), as a tampered or truncated vector does.
    for broken in ({"scale": 5.0}, {"weights": entry["adapter"]["weights"][:-8]}, {"options": ["yes", "no"]}):
        assert put({**content, "adapter": {**entry["adapter"], **broken}}, name="fruit")[0] == 422, broken
    # Answers of another model file: uncalibrated, and the reason says so.
    moved = {**content, "adapter": {**entry["adapter"]}}
    moved["adapter"]["model_sha256"] = "ef" * 32
    from gateway.catalogs.vectors import adapter_id
    moved["adapter"]["id"] = adapter_id(moved["adapter"])
    written = put(moved, name="fruit")
    assert written[0] == 201, written
    answer = _decide_state("a bowl of cherries")[2]["answers"]["fruit"]
    assert "x_adapter" not in answer and answer["noul"] == pytest.approx(0.5)
    assert answer.get("x_action_reason") is None  # no policy: no verdict to hold; the probabilities are the model's


def test_a_refit_never_writes_over_an_edit_made_while_it_ran(store):
    from gateway.catalogs.service import CatalogService
    from gateway.errors import Conflict

    stack(store)
    put(FRUIT, name="fruit")
    put({**FRUIT, "instructions": "Is the message about fresh fruit?"}, name="fruit")  # version 2, meanwhile
    catalogs = CatalogService(store.catalogs)
    stale = catalogs.get("acme", "fruit", 1).entry()
    with pytest.raises(Conflict):
        catalogs.put("acme", "fruit", stale.model_copy(update={"instructions": "refitted"}), based_on=1)
    assert catalogs.get("acme", "fruit").version == 2


def test_the_list_of_entries_comes_a_page_at_a_time(store):
    stack(store)
    unthrottled(store, "acme")
    for name in ("a", "b", "c"):
        assert put({"type": "noul", "instructions": "?"}, name=name)[0] == 201
    status, _, page = call(event("GET", "/v1/catalogs?limit=2", principal=READER))
    assert status == 200 and [e["name"] for e in page["catalogs"]] == ["a", "b"] and page["next_after"] == "b"
    status, _, page = call(event("GET", "/v1/catalogs?after=b", principal=READER))
    assert [e["name"] for e in page["catalogs"]] == ["c"] and "next_after" not in page
    for bad in ("after=B%23", "limit=0", "limit=101"):
        assert call(event("GET", f"/v1/catalogs?{bad}", principal=READER))[0] == 422, bad
