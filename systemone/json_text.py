"""Request bodies as JSON values, with the limits no model of this contract can do without.

`json.loads` alone accepts what is not JSON (NaN, Infinity), turns what it cannot hold
into something else (1e400 becomes inf) or fails with an error no caller caused
(nesting past the interpreter's recursion limit is a RecursionError, a 5000-digit
integer a ValueError). Here each of those is a JSONDecodeError with the reason:

- NaN, Infinity and numbers that overflow a float: not JSON, and not probabilities;
- integers of more than `MAX_INT_DIGITS` digits;
- nesting deeper than `MAX_JSON_DEPTH` arrays and objects (every renderer and validator
  below walks it);
- unpaired surrogates (\\ud800-\\udfff): not Unicode, so no model, store or log takes them.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from systemone.limits import MAX_INT_DIGITS, MAX_JSON_DEPTH

# An escaped UTF-16 surrogate (\ud800-\udfff): paired they are fine, alone they are not text.
_ESCAPED_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")


def loads(text: str) -> Any:
    def refuse(constant: str) -> Any:
        raise json.JSONDecodeError(f"{constant} is not valid JSON", text, 0)

    def finite(literal: str) -> float:
        value = float(literal)
        if not math.isfinite(value):
            raise json.JSONDecodeError(f"the number {literal[:40]} is too large for a 64-bit float", text, 0)
        return value

    def bounded_int(literal: str) -> int:
        if len(literal.lstrip("-")) > MAX_INT_DIGITS:
            raise json.JSONDecodeError(f"an integer has more than {MAX_INT_DIGITS} digits", text, 0)
        return int(literal)

    too_deep = f"the body nests arrays and objects deeper than {MAX_JSON_DEPTH} levels"
    try:
        value = json.loads(text, parse_constant=refuse, parse_float=finite, parse_int=bounded_int)
    except RecursionError:
        raise json.JSONDecodeError(too_deep, text, 0) from None
    if depth(value) > MAX_JSON_DEPTH:
        raise json.JSONDecodeError(too_deep, text, 0)
    if _ESCAPED_SURROGATE.search(text):
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as exc:
            raise json.JSONDecodeError("a string holds an unpaired surrogate (\\ud800-\\udfff)", text, 0) from exc
    return value


def object_or_none(raw: str | bytes | None) -> dict[str, Any] | None:
    """The JSON object another side wrote (an error body, a container's message), or None when
    it is not one: what it says is read defensively, never trusted to parse."""
    try:
        body = json.loads(raw or b"null")
    except (TypeError, ValueError):
        return None
    return body if isinstance(body, dict) else None


def depth(value: Any) -> int:
    """How many arrays and objects deep `value` nests (a scalar is 0), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, level)
        stack.extend((child, level + 1) for child in children if isinstance(child, dict | list))
    return deepest


def canonical(value: Any) -> str:
    """A JSON value as canonical text: equal values give equal prompts and equal hashes."""
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def as_text(value: Any) -> str:
    """A state, instruction or description as the model reads it: a string as it is, the rest canonical."""
    return value if isinstance(value, str) else canonical(value)
