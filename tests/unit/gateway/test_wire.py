"""The wire codecs and catalog reference expansion, called directly (the handler tests
reach them only through a whole request)."""

from __future__ import annotations

import pytest
from pydantic import TypeAdapter

from gateway.catalogs.model import CatalogContent
from gateway.catalogs.resolve import expand_references
from gateway.catalogs.service import CatalogService
from gateway.decisions.model import CatalogReference
from gateway.errors import Forbidden, InvalidRequest
from gateway.wire.openai_decisions import DecisionsRequest
from gateway.wire.systemone import SystemOneRequest
from tests.gateway_helpers import tenant_store
from tests.unit.gateway.test_catalogs import ROUTING


def test_system_one_gives_positional_ids_keeps_names_and_reads_extensions():
    decision = SystemOneRequest.model_validate({
        "model": "jev-latest", "state": {"ticket": 1}, "x_readout": "letters", "x_calibrate": False,
        "questions": {"refund?": {"type": "noul", "criteria": {"true": "asks for money back"}},
                      "routed": {"catalog": "support-routing", "version": 2}},
    }).to_decision()
    refund, routed = decision.questions
    assert (refund.id, refund.name, [o.value for o in refund.options]) == ("q0", "refund?", [True])
    assert isinstance(routed, CatalogReference) and (routed.id, routed.catalog, routed.version) == ("q1", "support-routing", 2)
    assert decision.engine_options == {"x_readout": "letters"} and decision.calibrate is False


@pytest.mark.parametrize("field", [{"x_framing": "plain"}, {"x_quarantine": False}, {"x_injection_probe": False},
                                   {"x_quarantine": "not even a bool"}])
def test_a_request_cannot_lower_how_the_scorer_shows_the_state(field):
    # Whoever writes the state may also write the request: the defenses are the deployment's.
    body = {"model": "jev-latest", "state": "s", "questions": {"q": {"type": "noul", "instructions": "?"}}, **field}
    request = SystemOneRequest.model_validate(body)
    assert request.to_decision().engine_options == {}
    assert not set(field) & set(request.model_dump())
    assert not set(field) & set(SystemOneRequest.model_json_schema()["properties"])


def test_openai_decisions_keep_value_types_and_join_the_input():
    decision = DecisionsRequest.model_validate({
        "model": "jev-latest",
        "input": [{"role": "user", "content": "first"}, {"role": "assistant", "content": [{"type": "output_text",
                                                                                           "text": "second"}]}],
        "questions": [{"type": "choice", "instructions": "?", "choices": [{"value": "true"}, {"value": True}]}],
    }).to_decision()
    (question,) = decision.questions
    assert [o.value for o in question.options] == ["true", True] and len({o.key for o in question.options}) == 2
    assert "first" in decision.state and "second" in decision.state


@pytest.fixture
def catalogs(tmp_path):
    service = CatalogService(tenant_store(tmp_path / "g.db", "acme").catalogs)
    service.put("acme", "support-routing", TypeAdapter(CatalogContent).validate_python(ROUTING))
    return service


def reference(**extra):
    return SystemOneRequest.model_validate({"model": "m", "state": "s", **extra,
                                            "questions": {"queue": {"catalog": "support-routing"}}}).to_decision()


def test_a_reference_becomes_its_entrys_question_with_its_binding(catalogs):
    (question,) = expand_references(reference(), "acme", catalogs, catalog_only=True).questions
    assert question.name == "queue" and [o.key for o in question.options] == ["billing", "delivery", "account"]
    assert question.binding.ref == "support-routing@1" and question.binding.policy.mode == "enforcing"
    assert question.binding.abstain.key == "human"


def test_references_are_refused_where_they_name_nothing_or_read_past_a_policy(catalogs):
    with pytest.raises(InvalidRequest) as missing:
        expand_references(reference(), "globex", catalogs, catalog_only=False)
    assert missing.value.details[0]["type"] == "catalog_not_found"
    with pytest.raises(Forbidden, match="x_calibrate"):
        expand_references(reference(x_calibrate=False), "acme", catalogs, catalog_only=False, may_override_policy=False)
    inline = SystemOneRequest.model_validate({"model": "m", "state": "s", "questions": {
        "q": {"type": "noul", "instructions": "?"}}}).to_decision()
    with pytest.raises(Forbidden, match="catalog questions only"):
        expand_references(inline, "acme", catalogs, catalog_only=True)
