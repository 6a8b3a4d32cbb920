"""Every validation rule of the System One request, and the 422 shape it produces."""

import pytest

from scorer_container.errors import InvalidRequest
from scorer_container.schema import ChatRequest, DecisionRequest, parse


def body(**questions):
    return {"model": "jev-latest", "state": "hello", "questions": questions or {"q": {"type": "noul", "instructions": "?"}}}


def errors_of(data, model=DecisionRequest):
    with pytest.raises(InvalidRequest) as caught:
        parse(model, data)
    return caught.value.details


def locs(details):
    return [tuple(d["loc"]) for d in details]


@pytest.mark.parametrize(
    ("data", "loc"),
    [
        ({"state": "s", "questions": {"q": {"type": "noul", "instructions": "?"}}}, ("body", "model")),
        ({**body(), "state": None}, ("body", "state")),
        ({**body(), "state": 3}, ("body", "state")),
        ({k: v for k, v in body().items() if k != "state"}, ("body", "state")),
        ({**body(), "questions": {}}, ("body", "questions")),
        ({**body(), "questions": []}, ("body", "questions")),
        (body(q={"type": "noul"}), ("body", "questions", "q")),
        (body(q={"type": "noul", "criteria": {}}), ("body", "questions", "q")),
        (body(q={"type": "noul", "instructions": 7}), ("body", "questions", "q", "instructions")),
        (body(q={"type": "choice", "criteria": {"only": None}}), ("body", "questions", "q", "criteria")),
        (body(q={"type": "choice", "criteria": {f"o{i}": None for i in range(256)}}), ("body", "questions", "q", "criteria")),
        (body(q={"type": "choice", "criteria": {" ": None, "b": None}}), ("body", "questions", "q", "criteria")),
        (body(q={"type": "choice", "criteria": {"a": 1, "b": None}}), ("body", "questions", "q", "criteria", "a")),
        (body(q={"type": "score", "criteria": {"0": "low", "1": "high"}}), ("body", "questions", "q", "criteria")),
        (body(q={"type": "score", "criteria": ["only"]}), ("body", "questions", "q", "criteria")),
        (body(q={"type": "score", "criteria": [str(i) for i in range(11)]}), ("body", "questions", "q", "criteria")),
        (body(q={"type": "score", "criteria": ["low", None]}), ("body", "questions", "q", "criteria", 1)),
        (body(q={"type": "box", "instructions": "find it"}), ("body", "questions", "q")),
        (body(q={"instructions": "no type"}), ("body", "questions", "q")),
        ({**body(), "questions": {"": {"type": "noul", "instructions": "?"}}}, ("body", "questions", "", "[key]")),
        ({**body(), "questions": {f"q{i}": {"type": "noul", "instructions": "?"} for i in range(401)}}, ("body", "questions")),
        ({**body(), "x_readout": "magic"}, ("body", "x_readout")),
        ([1, 2], ("body",)),
    ],
)
def test_invalid_requests_name_the_field(data, loc):
    details = errors_of(data)
    assert loc in locs(details), details
    for item in details:
        assert set(item) == {"loc", "msg", "type"} and item["msg"]


def test_a_question_id_that_is_a_type_name_stays_in_the_path():
    details = errors_of(body(choice={"type": "choice", "criteria": {"a": None}}))
    assert ("body", "questions", "choice", "criteria") in locs(details)


def test_valid_forms_are_accepted():
    request = parse(
        DecisionRequest,
        {
            "model": "jev-latest",
            "state": {"ticket": [1, 2, {"nested": True}]},
            "unknown_top_level": "ignored",
            "questions": {
                "émoji 🎟 id": {"type": "noul", "criteria": {"true": "asks for money back"}},
                "q2": {"type": "noul", "instructions": {"task": "structured"}, "criteria": None},
                "q3": {"type": "choice", "instructions": None, "criteria": {"a": None, "b": ["list", "desc"]}},
                "q4": {"type": "score", "criteria": ["low", {"label": "high"}]},
            },
            "x_readout": "letters",
            "x_order_average": False,
            "x_prior": False,
        },
    )
    assert list(request.questions) == ["émoji 🎟 id", "q2", "q3", "q4"]
    assert request.x_readout == "letters" and request.x_prior is False


def test_255_choices_and_10_levels_are_accepted_and_one_more_is_not():
    choice = parse(DecisionRequest, body(q={"type": "choice", "criteria": {f"o{i}": None for i in range(255)}}))
    score = parse(DecisionRequest, body(q={"type": "score", "criteria": [str(i) for i in range(10)]}))
    assert len(choice.questions["q"].criteria) == 255 and len(score.questions["q"].criteria) == 10
    assert locs(errors_of(body(q={"type": "choice", "criteria": {f"o{i}": None for i in range(256)}}))) == [
        ("body", "questions", "q", "criteria")]
    assert locs(errors_of(body(q={"type": "score", "criteria": [str(i) for i in range(11)]}))) == [
        ("body", "questions", "q", "criteria")]


@pytest.mark.parametrize(
    "data",
    [
        {"messages": []},
        {"messages": [{"role": "wizard", "content": "x"}]},
        {"messages": [{"role": "user", "content": "x"}], "n": 2},
        {"messages": [{"role": "user", "content": "x"}], "temperature": 3},
        {"messages": [{"role": "user", "content": "x"}], "max_tokens": 0},
        {"messages": [{"role": "user", "content": "x"}], "stop": ["a", "b", "c", "d", "e"]},
        {"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema"}},
    ],
)
def test_invalid_chat_requests(data):
    assert errors_of(data, ChatRequest)
