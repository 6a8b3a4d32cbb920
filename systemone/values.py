"""Frozen value classes, declared as dataclasses are, built without generating code.

`@dataclass(frozen=True)` writes and compiles six methods for every class as its module
loads: about 0.45 ms a class on the benchmark's machine, 16 ms of the gateway's cold
start for the 36 value classes it loads (docs/benchmarks.md). `@frozen` gives a class
the same behaviour (Python 3.11's and 3.12's dataclasses) from methods written once:

- the constructor takes the fields by position or by name, in declaration order, with
  their defaults and `field(default_factory=...)`; a missing, repeated or unknown
  argument is a TypeError, as a dataclass's;
- two values are equal (and hash alike) when they are of the same class and their
  fields, compared as a tuple, are equal; the repr names the class and each field;
- a field cannot be assigned or deleted after construction (FrozenInstanceError);
- a method the class defines itself (a `__repr__` that hides a secret) is kept;
- `replace` (also as `copy.replace`) and `field_names` stand in for `dataclasses.replace`
  and `dataclasses.fields`.

What dataclasses can do beyond that (`__post_init__`, inheriting fields, ClassVar,
InitVar and KW_ONLY, `__slots__`, `field` options other than a default) is refused when
the class is declared, never silently different. Mutable records stay dataclasses. The
tests declare each value both ways and compare them (tests/unit/test_values.py).
"""

from __future__ import annotations

import dataclasses
import inspect
import operator
import reprlib
from collections.abc import Callable, Collection
from typing import Any, TypeVar, dataclass_transform

T = TypeVar("T")
field = dataclasses.field  # only default= and default_factory= are honoured; others are refused
FrozenInstanceError = dataclasses.FrozenInstanceError
_NO_DEFAULT = dataclasses.MISSING
# What `field()` leaves as it is when only a default or a factory is given.
_PLAIN_FIELD = {"init": True, "repr": True, "hash": None, "compare": True, "metadata": {}, "kw_only": _NO_DEFAULT}
_SPECIAL_ANNOTATIONS = ("ClassVar", "InitVar", "KW_ONLY")  # dataclasses' markers, however spelt


class _Spec:
    """A value class's fields: their names in order, the defaults of those that have one,
    and a reader of all their values as one tuple (what equality and hashing compare)."""

    __slots__ = ("defaults", "factories", "known", "names", "values")

    def __init__(self, names: tuple[str, ...], defaults: dict[str, Any], factories: dict[str, Callable[[], Any]]):
        self.names = names
        self.known = frozenset(names)
        self.defaults = defaults
        self.factories = factories
        get = operator.attrgetter(*names) if names else (lambda value: ())
        self.values: Callable[[Any], tuple[Any, ...]] = get if len(names) != 1 else (lambda value: (get(value),))

    def unknown(self, names: Collection[str]) -> str | None:
        """The first of `names` that is not a field, if there is one (`names` is read twice)."""
        if self.known.issuperset(names):
            return None
        return next(name for name in names if name not in self.known)


@dataclass_transform(frozen_default=True, field_specifiers=(dataclasses.field,))
def frozen(cls: type[T]) -> type[T]:
    """Make `cls` a frozen value class from its annotated fields (see the module's docstring)."""
    _refuse_what_dataclasses_would_do_otherwise(cls)
    names: list[str] = []
    defaults: dict[str, Any] = {}
    factories: dict[str, Callable[[], Any]] = {}
    for name, annotation in inspect.get_annotations(cls).items():
        head = str(annotation).split("[")[0].removesuffix("'>")
        if annotation is dataclasses.KW_ONLY or head.endswith(_SPECIAL_ANNOTATIONS):
            raise TypeError(f"{cls.__qualname__}.{name}: ClassVar, InitVar and KW_ONLY are not supported")
        declared = vars(cls).get(name, _NO_DEFAULT)
        if isinstance(declared, dataclasses.Field):
            options = {option: getattr(declared, option) for option in _PLAIN_FIELD}
            if options != _PLAIN_FIELD:
                raise TypeError(f"{cls.__qualname__}.{name}: only field(default=...) or field(default_factory=...)")
            delattr(cls, name)  # as dataclasses do: the class keeps a plain default, never the Field
            default, factory = declared.default, declared.default_factory
            if default is not _NO_DEFAULT:
                setattr(cls, name, default)
        else:
            default, factory = declared, _NO_DEFAULT
        if factory is not _NO_DEFAULT:
            factories[name] = factory
        elif default is not _NO_DEFAULT:
            if type(default).__hash__ is None:  # dataclasses' rule: an unhashable default is a shared mutable one
                raise ValueError(f"{cls.__qualname__}.{name}: a mutable default is shared; use field(default_factory=...)")
            defaults[name] = default
        elif defaults or factories:
            raise TypeError(f"{cls.__qualname__}: the field {name!r} without a default follows one with a default")
        names.append(name)
    cls.__value_fields__ = _Spec(tuple(names), defaults, factories)  # type: ignore[attr-defined]
    own = vars(cls)
    if "__match_args__" not in own:
        cls.__match_args__ = tuple(names)  # type: ignore[attr-defined]
    for name, method in _METHODS.items():
        # A method the class writes itself is kept (a repr that hides a secret), as dataclasses
        # keep it; the __hash__ Python sets to None beside a class's own __eq__ is not one.
        explicit = name in own and not (name == "__hash__" and own[name] is None and "__eq__" in own)
        if not explicit:
            setattr(cls, name, method)
    return cls


def _refuse_what_dataclasses_would_do_otherwise(cls: type) -> None:
    for name in ("__post_init__", "__slots__", "__setattr__", "__delattr__"):
        if name in vars(cls):
            raise TypeError(f"{cls.__qualname__} defines {name}: a frozen value class cannot")
    for base in cls.__mro__[1:-1]:  # its bases, object aside
        if "__value_fields__" in vars(base) or "__dataclass_fields__" in vars(base) or inspect.get_annotations(base):
            raise TypeError(f"{cls.__qualname__}: a value class cannot inherit fields ({base.__qualname__})")


def field_names(value: Any, /) -> tuple[str, ...]:
    """A value class's fields (or a value's), in declaration order."""
    return value.__value_fields__.names


def replace(value: T, /, **changes: Any) -> T:
    """A copy of `value` with the given fields changed (through its class's own constructor,
    when it has one)."""
    cls = type(value)
    spec: _Spec = value.__value_fields__  # type: ignore[attr-defined]
    if (unknown := spec.unknown(changes)) is not None:
        raise TypeError(f"{cls.__qualname__} has no field {unknown!r}")
    fields = {name: changes[name] if name in changes else getattr(value, name) for name in spec.names}
    if cls.__init__ is not _init:
        return cls(**fields)
    copied = object.__new__(cls)
    for name, field_value in fields.items():
        _set(copied, name, field_value)
    return copied


# The methods every value class shares (`_METHODS`, below). Fields are written with
# object.__setattr__, as dataclasses write them: an instance keeps Python's compact layout.
_set = object.__setattr__


def _init(self: Any, *args: Any, **kwargs: Any) -> None:
    spec: _Spec = self.__value_fields__
    names = spec.names
    if len(args) > len(names):
        raise TypeError(f"{type(self).__qualname__}() takes {len(names)} positional arguments but {len(args)} were given")
    for name, value in zip(names, args, strict=False):  # the rest: by name or by default
        _set(self, name, value)
    if kwargs:
        if (unknown := spec.unknown(kwargs)) is not None:
            raise TypeError(f"{type(self).__qualname__}() got an unexpected keyword argument {unknown!r}")
        positional = names[:len(args)]
        for name, value in kwargs.items():
            if name in positional:
                raise TypeError(f"{type(self).__qualname__}() got multiple values for argument {name!r}")
            _set(self, name, value)
    if len(args) + len(kwargs) < len(names):  # the rest from their defaults
        for name in names[len(args):]:
            if name in kwargs:
                continue
            if name in spec.defaults:
                _set(self, name, spec.defaults[name])
            elif name in spec.factories:
                _set(self, name, spec.factories[name]())
            else:
                raise TypeError(f"{type(self).__qualname__}() missing required argument {name!r}")


def _eq(self: Any, other: Any) -> Any:
    if other.__class__ is not self.__class__:
        return NotImplemented
    values = self.__value_fields__.values
    return values(self) == values(other)


def _hash(self: Any) -> int:
    return hash(self.__value_fields__.values(self))


@reprlib.recursive_repr()
def _repr(self: Any) -> str:
    fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__value_fields__.names)
    return f"{type(self).__qualname__}({fields})"


def _setattr(self: Any, name: str, value: Any) -> None:
    raise FrozenInstanceError(f"cannot assign to field {name!r}")


def _delattr(self: Any, name: str) -> None:
    raise FrozenInstanceError(f"cannot delete field {name!r}")


_METHODS = {"__init__": _init, "__eq__": _eq, "__hash__": _hash, "__repr__": _repr, "__setattr__": _setattr,
            "__delattr__": _delattr, "__replace__": replace}
