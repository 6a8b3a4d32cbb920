"""`@frozen` value classes behave as `@dataclass(frozen=True)` ones: each case declares the
same class both ways and holds them to the same outcome."""

from __future__ import annotations

import copy
import dataclasses
import pickle
from typing import Any, ClassVar

import pytest

from systemone.values import FrozenInstanceError, field, field_names, frozen, replace


def declare(decorator: Any) -> type:
    @decorator
    class Point:
        x: int
        y: int = 0
        tags: list[str] = field(default_factory=list)
        label: str | None = None

        @property
        def norm(self) -> int:
            return abs(self.x) + abs(self.y)

    return Point


BOTH = pytest.mark.parametrize("make", [frozen, dataclasses.dataclass(frozen=True)], ids=["frozen", "dataclass"])


def outcome(call: Any) -> Any:
    """What a call gives, or the kind of error it raises: the same for both kinds."""
    try:
        return ("ok", call())
    except Exception as exc:  # the kind is what is compared
        return ("raised", type(exc))


CONSTRUCTIONS = [
    ((1,), {}), ((1, 2), {}), ((1, 2, ["a"], "p"), {}), ((), {"x": 1, "label": "p"}), ((1,), {"y": 2}),
    ((), {}), ((1, 2, [], None, 5), {}), ((1,), {"x": 2}), ((1,), {"z": 2}), ((), {"y": 2}),
]


@pytest.mark.parametrize(("args", "kwargs"), CONSTRUCTIONS)
def test_construction_takes_and_refuses_the_same_arguments(args, kwargs):
    ours, theirs = declare(frozen), declare(dataclasses.dataclass(frozen=True))
    mine, reference = outcome(lambda: ours(*args, **kwargs)), outcome(lambda: theirs(*args, **kwargs))
    assert mine[0] == reference[0]
    if mine[0] == "ok":
        assert [getattr(mine[1], n) for n in field_names(ours)] == [getattr(reference[1], f.name)
                                                                    for f in dataclasses.fields(theirs)]
        assert repr(mine[1]) == repr(reference[1])
    else:
        assert mine[1] is reference[1] is TypeError


@BOTH
def test_values_compare_and_hash_by_their_fields_within_one_class(make):
    Point = declare(make)
    assert Point(1, 2) == Point(1, 2) and Point(1, 2) != Point(2, 1)
    Other = declare(make)  # another class with the same fields is not equal
    assert Point(1) != Other(1)
    assert Point(1).__eq__((1, 0, [], None)) is NotImplemented
    with pytest.raises(TypeError):
        hash(Point(1))  # a list field: unhashable, as a tuple holding it is

    @make
    class Key:
        name: str
        version: int = 1

    assert hash(Key("a")) == hash(Key("a", 1)) and {Key("a"): "kept"}[Key("a")] == "kept"


@BOTH
def test_a_default_factory_makes_a_new_object_for_each_value(make):
    Point = declare(make)
    first, second = Point(1), Point(2)
    first.tags.append("a")
    assert second.tags == []


@BOTH
def test_nothing_is_assigned_or_deleted_after_construction(make):
    point = declare(make)(1)
    with pytest.raises(FrozenInstanceError):
        point.x = 2
    with pytest.raises(FrozenInstanceError):
        point.other = 2
    with pytest.raises(FrozenInstanceError):
        del point.x
    assert point.x == 1 and point.norm == 1


@BOTH
def test_a_copy_a_pickle_and_a_pattern_see_the_same_value(make):
    Point = declare(make)
    point = Point(3, 4, ["t"], "p")
    assert copy.copy(point) == point and copy.deepcopy(point) == point
    assert Point.__match_args__ == ("x", "y", "tags", "label")
    match point:
        case Point(x, y, label="p"):
            assert (x, y) == (3, 4)
        case _:
            pytest.fail("the pattern did not match")


def test_a_pickle_round_trips():
    assert pickle.loads(pickle.dumps(PICKLED)) == PICKLED


@frozen
class Pickled:
    name: str
    count: int = 0


PICKLED = Pickled("a", 2)


def test_replace_changes_named_fields_and_refuses_unknown_ones():
    Point = declare(frozen)
    point = Point(1, 2, ["t"], "p")
    assert replace(point, y=5) == Point(1, 5, ["t"], "p") and point.y == 2
    with pytest.raises(TypeError, match="no field 'z'"):
        replace(point, z=1)


def test_a_method_the_class_writes_itself_is_kept():
    @frozen
    class Secret:
        key_id: str
        secret: str

        def __repr__(self) -> str:
            return f"Secret(key_id={self.key_id})"

    assert "hunter2" not in repr(Secret("k1", "hunter2"))

    @frozen
    class Keyed:
        key: str
        note: str = ""

        def __eq__(self, other: object) -> bool:
            return isinstance(other, Keyed) and other.key == self.key

    assert Keyed("a", "x") == Keyed("a", "y")
    assert hash(Keyed("a")) == hash(Keyed("a"))  # the __hash__ Python unset beside __eq__ is given back


@pytest.mark.parametrize("body", [
    "class Bad:\n    x: int = 0\n    y: int\n",  # a field without a default after one with
    "class Bad:\n    x: list = []\n",  # a shared mutable default
    "class Bad:\n    x: dict = field(default={})\n",  # the same, through field()
    "class Bad:\n    x: ClassVar[int] = 0\n",  # dataclasses' ClassVar: refused, not skipped
    "class Bad:\n    x: int = field(default=0, repr=False)\n",  # a field option beyond a default
    "class Bad:\n    x: int\n    def __setattr__(self, name, value): pass\n",  # assignment made possible again
    "class Bad(Pickled):\n    y: int = 0\n",  # one value class extending another
])
def test_what_it_cannot_do_as_dataclasses_do_is_refused_when_declared(body):
    with pytest.raises((TypeError, ValueError)):
        frozen(_declared(body))


def _declared(body: str) -> type:
    namespace: dict[str, Any] = {"field": field, "ClassVar": ClassVar, "Pickled": Pickled}
    exec(compile("from __future__ import annotations\n" + body, "<value>", "exec"), namespace)
    return namespace["Bad"]


def test_the_gateways_value_classes_are_frozen_values():
    # Every value class the decision path builds per request is one (a regression to
    # @dataclass(frozen=True) would cost the cold start again, docs/benchmarks.md).
    from gateway.decisions.model import Answer, Decision, DecisionResult, Option, Question

    for cls in (Answer, Decision, DecisionResult, Option, Question):
        assert field_names(cls) and not dataclasses.is_dataclass(cls)
