"""An answer's features on the wire (`x_features`, systemone.models.AnswerFeatures): both
sides read and write them here, in plain Python (the gateway runs without numpy).

The state sketch travels as little-endian float16 in base64: 256 numbers in 684
characters, the precision of a logit to three digits, which is all a linear head reads.
"""

from __future__ import annotations

import base64
import binascii
import math
import struct
from collections.abc import Sequence

from systemone.limits import STATE_FEATURE_DIMS

# The projection the scorer reads the state with: a new one gets a new name, and an adapter
# fitted on one is never applied to another.
SKETCH = f"count-sketch/1:{STATE_FEATURE_DIMS}"
_HALF_MAX = 65504.0  # the largest finite float16


def encode_state(values: Sequence[float]) -> str:
    if len(values) != STATE_FEATURE_DIMS:
        raise ValueError(f"a state sketch has {STATE_FEATURE_DIMS} numbers, not {len(values)}")
    clipped = [min(_HALF_MAX, max(-_HALF_MAX, float(v))) if math.isfinite(v) else 0.0 for v in values]
    return pack(clipped, "e")


def decode_state(text: str) -> list[float]:
    """The numbers of an encoded sketch; ValueError when it is not one."""
    try:
        return unpack(text, STATE_FEATURE_DIMS, "e")
    except ValueError as exc:
        raise ValueError(f"x_features.state {exc}") from None


def pack(values: Sequence[float], kind: str) -> str:
    """Numbers as little-endian `kind` ("e": float16, "f": float32) in base64."""
    return base64.b64encode(struct.pack(f"<{len(values)}{kind}", *values)).decode("ascii")


def unpack(text: str, length: int, kind: str) -> list[float]:
    """`length` finite numbers packed by `pack`; ValueError (saying why) for anything else."""
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("is not base64") from None
    size = struct.calcsize(f"<{kind}")
    if len(raw) != size * length:
        raise ValueError(f"holds {len(raw) // size} numbers, not {length}")
    values = list(struct.unpack(f"<{length}{kind}", raw))
    if not all(math.isfinite(v) for v in values):
        raise ValueError("holds a number that is not finite")
    return values
