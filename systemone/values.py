"""Frozen value classes, declared as dataclasses are, built without generating code.

`@dataclass(frozen=True)` writes and compiles six methods for every class as its module
loads: about 0.45 ms a class on the benchmark's machine, 16 ms of the gateway's cold
start for its value classes (docs/benchmarks.md). `@frozen` gives a class the same
behaviour from methods written once, here:

- the constructor takes the fields by position or by name, in declaration order, with
  their defaults and `field(default_factory=...)`; a missing, repeated or unknown
  argument is a TypeError, as a dataclass's;
- two values are equal (and hash alike) when they are of the same class and their
  fields are equal; the repr names the class and each field;
- a field cannot be assigned or deleted after construction (FrozenInstanceError);
- a method the class defines itself (a `__repr__` that hides a secret) is kept;
- `replace` and `field_names` stand in for `dataclasses.replace` and `dataclasses.fields`.

What dataclasses can do beyond that (inheritance between value classes, ClassVar and
InitVar fields, `field` options other than a default) is refused when the class is
declared, never silently different. Mutable records stay dataclasses. The tests declare
each value both ways and compare them (tests/unit/test_values.py).
"""

from __future__ import annotations

import dataclasses
import inspect
import reprlib
from collections.abc import Callable
from typing import Any, TypeVar, dataclass_transform

T = TypeVar("T")
field = dataclasses.field  # only default= and default_factory= are honoured; others are refused
FrozenInstanceError = dataclasses.FrozenInstanceError
_NO_DEFAULT = dataclasses.MISSING
# What `field()` leaves as it is when only a default or a factory is given.
_PLAIN_FIELD = {"init": True, "repr": True, "hash": None, "compare": True, "metadata": {}, "kw_only": _NO_DEFAULT}


class _Spec:
    """A value class's fields: their names in order, and the defaults of those that have one."""

    __slots__ = ("defaults", "factories", "known", "names")

    def __init__(self, names: tuple[str, ...], defaults: dict[str, Any], factories: dict[str, Callable[[], Any]]):
        self.names = names
        self.known = frozenset(names)
        self.defaults = defaults
        self.factories = factories


@dataclass_transform(frozen_default=True, field_specifiers=(dataclasses.field,))
def frozen(cls: type[T]) -> type[T]:
    """Make `cls` a frozen value class from its annotated fields (see the module's docstring)."""
    if any("__value_fields__" in vars(base) for base in cls.__mro__[1:]):
        raise TypeError(f"{cls.__qualname__}: a value class cannot extend another")
    names: list[str] = []
    defaults: dict[str, Any] = {}
    factories: dict[str, Callable[[], Any]] = {}
    for name, annotation in inspect.get_annotations(cls).items():
        if str(annotation).startswith(("ClassVar", "typing.ClassVar", "InitVar", "dataclasses.InitVar")):
            raise TypeError(f"{cls.__qualname__}.{name}: ClassVar and InitVar are not supported")
        declared = vars(cls).get(name, _NO_DEFAULT)
        if isinstance(declared, dataclasses.Field):
            options = {option: getattr(declared, option) for option in _PLAIN_FIELD}
            if options != _PLAIN_FIELD:
                raise TypeError(f"{cls.__qualname__}.{name}: only field(default=...) or field(default_factory=...)")
            if declared.default_factory is not _NO_DEFAULT:
                factories[name] = declared.default_factory
            elif declared.default is not _NO_DEFAULT:
                _refuse_shared(cls, name, declared.default)
                defaults[name] = declared.default
            delattr(cls, name)  # as dataclasses do: the class keeps a plain default, never the Field
            if name in defaults:
                setattr(cls, name, defaults[name])
        elif declared is not _NO_DEFAULT:
            _refuse_shared(cls, name, declared)
            defaults[name] = declared
        elif defaults or factories:
            raise TypeError(f"{cls.__qualname__}: the field {name!r} without a default follows one with a default")
        names.append(name)
    cls.__value_fields__ = _Spec(tuple(names), defaults, factories)  # type: ignore[attr-defined]
    cls.__match_args__ = tuple(names)  # type: ignore[attr-defined]
    own = vars(cls)
    for name, method in _METHODS.items():
        if name in ("__setattr__", "__delattr__") and name in own:
            raise TypeError(f"{cls.__qualname__} defines {name}: a frozen value cannot")
        # A method the class writes itself is kept (a repr that hides a secret), as dataclasses
        # keep it; the __hash__ Python sets to None beside a class's own __eq__ is not one.
        explicit = name in own and not (name == "__hash__" and own[name] is None and "__eq__" in own)
        if not explicit:
            setattr(cls, name, method)
    return cls


def _refuse_shared(cls: type, name: str, default: Any) -> None:
    if type(default).__hash__ is None:  # dataclasses' rule: an unhashable default is a shared mutable one
        raise ValueError(f"{cls.__qualname__}.{name}: a mutable default is shared; use field(default_factory=...)")


def field_names(value: Any) -> tuple[str, ...]:
    """A value class's fields (or a value's), in declaration order."""
    return value.__value_fields__.names


def replace(value: T, **changes: Any) -> T:
    """A copy of `value` with the given fields changed (through its class's own constructor,
    when it has one)."""
    cls = type(value)
    spec: _Spec = value.__value_fields__  # type: ignore[attr-defined]
    if not spec.known.issuperset(changes):
        unknown = next(key for key in changes if key not in spec.known)
        raise TypeError(f"{cls.__qualname__} has no field {unknown!r}")
    if cls.__init__ is not _init:
        return cls(**{name: changes[name] if name in changes else getattr(value, name) for name in spec.names})
    copied = object.__new__(cls)
    state = copied.__dict__
    state.update({name: value.__dict__[name] for name in spec.names})
    state.update(changes)
    return copied


# The methods every value class shares (`_METHODS`, below).


def _init(self: Any, *args: Any, **kwargs: Any) -> None:
    spec: _Spec = self.__value_fields__
    names = spec.names
    if len(args) > len(names):
        raise TypeError(f"{type(self).__qualname__}() takes {len(names)} positional arguments but {len(args)} were given")
    state = self.__dict__  # written directly: assignment is refused once the value exists
    if args:
        state.update(zip(names, args, strict=False))  # the rest: by name or by default
    if kwargs:
        if not spec.known.issuperset(kwargs):
            unknown = next(key for key in kwargs if key not in spec.known)
            raise TypeError(f"{type(self).__qualname__}() got an unexpected keyword argument {unknown!r}")
        if args and not state.keys().isdisjoint(kwargs):
            repeated = next(key for key in kwargs if key in state)
            raise TypeError(f"{type(self).__qualname__}() got multiple values for argument {repeated!r}")
        state.update(kwargs)
    if len(state) < len(names):
        for key, default in spec.defaults.items():
            state.setdefault(key, default)
        for key, factory in spec.factories.items():
            if key not in state:
                state[key] = factory()
        if len(state) < len(names):
            missing = next(key for key in names if key not in state)
            raise TypeError(f"{type(self).__qualname__}() missing required argument {missing!r}")


def _values(value: Any) -> tuple[Any, ...]:
    return tuple([getattr(value, name) for name in value.__value_fields__.names])


def _eq(self: Any, other: Any) -> Any:
    if other.__class__ is not self.__class__:
        return NotImplemented
    return _values(self) == _values(other)



def _hash(self: Any) -> int:
    return hash(_values(self))



@reprlib.recursive_repr()
def _repr(self: Any) -> str:
    fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__value_fields__.names)
    return f"{type(self).__qualname__}({fields})"



def _setattr(self: Any, name: str, value: Any) -> None:
    raise FrozenInstanceError(f"cannot assign to field {name!r}")



def _delattr(self: Any, name: str) -> None:
    raise FrozenInstanceError(f"cannot delete field {name!r}")



_METHODS = {"__init__": _init, "__eq__": _eq, "__hash__": _hash, "__repr__": _repr, "__setattr__": _setattr,
            "__delattr__": _delattr}
