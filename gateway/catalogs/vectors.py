"""The numbers an adapter is made of: the bounds its head keeps to, the encoding of its
vectors (little-endian float32 in base64) and its id. The model (catalogs.model), the fit
(catalogs.fitting) and the head at decision time (catalogs.adapters) share them."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

from systemone.features import pack, unpack

# The standardised state is clipped to this many spreads, in the fit and at decision time
# alike: a state written to push the sketch far along a head's weights (anyone writes the
# state, and sees the probabilities) moves a logit no further than the states it learned
# from did.
STATE_CLIP = 4.0
# The zero-shot answer's least weight in a head (a temperature of at most 20): a head never
# reads its model backwards. The fit keeps to it; an adapter written by hand is held to it.
MIN_SCALE = 1 / 20


def encode_vector(values: Sequence[float]) -> str:
    return pack(values, "f")


def decode_vector(text: str, length: int) -> list[float]:
    return unpack(text, length, "f")


def adapter_id(fields: dict[str, object]) -> str:
    """`ad-` and 16 hex digits of the SHA-256 of the adapter's other fields (its fit
    included): a name for people and records; the entry's own hash covers it whole."""
    canonical = json.dumps({k: v for k, v in fields.items() if k != "id"}, sort_keys=True, separators=(",", ":"),
                           ensure_ascii=False)
    return "ad-" + hashlib.sha256(canonical.encode()).hexdigest()[:16]
