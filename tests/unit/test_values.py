"""`@frozen` value classes behave as `@dataclass(frozen=True)` ones: each case declares the
same class both ways and holds them to the same outcome."""

from __future__ import annotations

import ast
import copy
import dataclasses
import pickle
import typing
from pathlib import Path
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


def test_replace_takes_a_field_named_value_as_dataclasses_replace_does():
    from gateway.decisions.model import Option

    assert replace(Option("k", "v"), value="w") == Option("k", "w")
    assert dataclasses.replace(declare(dataclasses.dataclass(frozen=True))(1), x=2).x == 2


@pytest.mark.skipif(not hasattr(copy, "replace"), reason="copy.replace: Python 3.13")
def test_copy_replace_works_on_a_value():
    assert copy.replace(PICKLED, count=3) == Pickled("a", 3)


def test_replace_goes_through_a_constructor_the_class_wrote_itself():
    @frozen
    class Normalised:
        name: str

        def __init__(self, name: str) -> None:
            object.__setattr__(self, "name", name.lower())

    assert replace(Normalised("A"), name="B").name == "b"


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


@pytest.mark.parametrize("future", [True, False], ids=["annotations-as-text", "annotations-as-objects"])
@pytest.mark.parametrize(("body", "refusal"), [
    ("class Bad:\n    x: int = 0\n    y: int\n", "without a default follows"),
    ("class Bad:\n    x: int = 0\n    y: int = field()\n", "without a default follows"),
    ("class Bad:\n    x: list = []\n", "mutable default"),
    ("class Bad:\n    x: dict = field(default={})\n", "mutable default"),
    ("class Bad:\n    x: ClassVar[int] = 0\n", "ClassVar"),
    ("class Bad:\n    x: typing.ClassVar[int] = 0\n", "ClassVar"),
    ("class Bad:\n    x: dataclasses.InitVar[int] = 0\n", "ClassVar, InitVar"),
    ("class Bad:\n    _: dataclasses.KW_ONLY\n    x: int = 0\n", "KW_ONLY"),
    ("class Bad:\n    x: int = field(default=0, repr=False)\n", "only field"),
    ("class Bad:\n    x: int\n    def __post_init__(self): pass\n", "__post_init__"),
    ("class Bad:\n    __slots__ = ('x',)\n    x: int\n", "__slots__"),
    ("class Bad:\n    x: int\n    def __setattr__(self, name, value): pass\n", "__setattr__"),
    ("class Bad(Pickled):\n    y: int = 0\n", "inherit fields"),
    ("@dataclasses.dataclass\nclass Base:\n    x: int = 0\nclass Bad(Base):\n    y: int = 0\n", "inherit fields"),
    ("class Base:\n    x: int = 0\nclass Bad(Base):\n    y: int = 0\n", "inherit fields"),
])
def test_what_it_cannot_do_as_dataclasses_do_is_refused_when_declared(body, refusal, future):
    with pytest.raises((TypeError, ValueError), match=refusal):
        frozen(_declared(body, future))


def _declared(body: str, future: bool) -> type:
    namespace: dict[str, Any] = {"field": field, "ClassVar": ClassVar, "Pickled": Pickled, "typing": typing,
                                 "dataclasses": dataclasses}
    exec(compile(("from __future__ import annotations\n" if future else "") + body, "<value>", "exec"), namespace)
    return namespace["Bad"]


def test_a_class_keeps_its_own_match_args():
    @frozen
    class Pair:
        __match_args__ = ("right",)
        left: int
        right: int

    assert Pair.__match_args__ == ("right",)


def test_no_frozen_dataclass_is_left_in_the_deployables_shared_code():
    # Every value class of the gateway and the contract is @frozen: one declared as
    # @dataclass(frozen=True) would cost the cold start again (docs/benchmarks.md). Mutable
    # records (plain @dataclass) are what dataclasses stay for.
    root = Path(__file__).resolve().parents[2]
    left = []
    for path in [*(root / "gateway").rglob("*.py"), *(root / "systemone").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                for decorator in node.decorator_list:
                    call = decorator if isinstance(decorator, ast.Call) else None
                    if call is not None and ast.unparse(call.func).endswith("dataclass") and any(
                            k.arg == "frozen" and ast.unparse(k.value) == "True" for k in call.keywords):
                        left.append(f"{path.relative_to(root)}:{node.lineno} {node.name}")
    assert not left
    from gateway.decisions.model import Answer, Option

    assert field_names(Option) == ("key", "value", "description", "label") and not dataclasses.is_dataclass(Answer)
