"""A catalog entry's adapter at decision time: plain Python, no numpy on the hot path.

The adapter (gateway.catalogs.model.Adapter, fitted by gateway.catalogs.fitting) maps
what the scorer read an answer from (`x_features`) to the entry's own probabilities:

    logit_k = scale * log p0_k + bias_k + w_k . clip((state - center) / spread, +-STATE_CLIP)

where p0 is the zero-shot answer (the listings' distributions averaged) and `state` the
sketch of the answer position. It applies to answers of the model file, prompt template,
readout and sketch it was fitted on, and to none other: features of another model are
other numbers.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.decisions.model import FitKey, ReadFeatures
from systemone.features import pack, unpack
from systemone.limits import STATE_FEATURE_DIMS

if TYPE_CHECKING:
    from gateway.catalogs.model import Adapter

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


def check_shapes(adapter: Adapter) -> None:
    """ValueError unless every vector has the length the options and the sketch give it."""
    k = len(adapter.options)
    if len(adapter.bias) != k or len(set(adapter.options)) != k:
        raise ValueError(f"an adapter over {k} options needs {k} distinct options and {k} biases")
    # Bounds far beyond any fit's, within which every logit stays a finite number whatever
    # the features (a sketch value is at most float16's 65504): no written adapter can make
    # a decision fail.
    for name, text, length, low, high in (("center", adapter.center, STATE_FEATURE_DIMS, -1e6, 1e6),
                                          ("spread", adapter.spread, STATE_FEATURE_DIMS, 1e-6, 1e6),
                                          ("weights", adapter.weights, k * STATE_FEATURE_DIMS, -1e4, 1e4)):
        try:
            values = decode_vector(text, length)
        except ValueError as exc:
            raise ValueError(f"adapter.{name} {exc}") from None
        if min(values) < low or max(values) > high:
            raise ValueError(f"adapter.{name} holds numbers outside [{low:g}, {high:g}]")
    if not all(math.isfinite(b) and abs(b) <= 1e4 for b in adapter.bias) or not math.isfinite(adapter.scale):
        raise ValueError("an adapter's scale and biases are finite numbers, biases within [-1e4, 1e4]")
    if adapter.id != adapter_id(adapter.model_dump(mode="json")):
        raise ValueError("adapter.id is not the hash of the adapter's content (written by a refit, never by hand)")


def fitted_on(adapter: Adapter) -> FitKey:
    return FitKey(adapter.model_sha256, adapter.prompt_version, adapter.readout)


@dataclass(frozen=True, slots=True)
class Head:
    """An adapter decoded once (a version is immutable: its head is cached by its id)."""

    scale: float
    bias: tuple[float, ...]
    center: tuple[float, ...]
    spread: tuple[float, ...]
    weights: tuple[tuple[float, ...], ...]

    @classmethod
    def of(cls, adapter: Adapter) -> Head:
        k, d = len(adapter.options), STATE_FEATURE_DIMS
        flat = decode_vector(adapter.weights, k * d)
        return cls(adapter.scale, tuple(adapter.bias), tuple(decode_vector(adapter.center, d)),
                   tuple(decode_vector(adapter.spread, d)), tuple(tuple(flat[i * d:(i + 1) * d]) for i in range(k)))

    def probabilities(self, features: ReadFeatures) -> tuple[float, ...]:
        zero_shot = _zero_shot(features.orders)
        x = [min(STATE_CLIP, max(-STATE_CLIP, (s - c) / w))
             for s, c, w in zip(features.state, self.center, self.spread, strict=True)]
        logits = [self.scale * z + b + math.fsum(wi * xi for wi, xi in zip(row, x, strict=True))
                  for z, b, row in zip(zero_shot, self.bias, self.weights, strict=True)]
        top = max(logits)
        weights = [math.exp(v - top) for v in logits]
        total = sum(weights)
        return tuple(w / total for w in weights)


def adapted(adapter: Adapter, features: ReadFeatures | None, answered: FitKey,
            listing: str | None) -> tuple[float, ...] | None:
    """The adapter's probabilities over the entry's options (declared order), or None when
    it does not apply: no features, or features of another model, prompt, readout, listing
    (gateway.catalogs.policy.listing_of) or sketch."""
    if (features is None or features.sketch != adapter.sketch or answered != fitted_on(adapter)
            or listing != adapter.listing):
        return None
    if len(features.state) != STATE_FEATURE_DIMS or any(len(o) != len(adapter.options) for o in features.orders):
        return None
    return _head(adapter).probabilities(features)


_HEADS: dict[tuple[object, ...], Head] = {}
_MAX_HEADS = 64  # decoded heads kept (about 10 KB an option each): bounded, whatever the tenants
_HEADS_LOCK = threading.Lock()  # the local runner serves requests on threads


def _head(adapter: Adapter) -> Head:
    """The decoded head, cached by the adapter's numbers themselves (compared whole, never
    by a name or a short hash that another tenant's adapter could share)."""
    key = (adapter.scale, tuple(adapter.bias), adapter.center, adapter.spread, adapter.weights)
    with _HEADS_LOCK:
        head = _HEADS.get(key)
    if head is None:
        head = Head.of(adapter)
        with _HEADS_LOCK:
            while len(_HEADS) >= _MAX_HEADS:
                _HEADS.pop(next(iter(_HEADS)))
            _HEADS[key] = head
    return head


def _zero_shot(orders: Sequence[Sequence[float]]) -> list[float]:
    n = len(orders)
    mean = [sum(math.exp(o[k]) for o in orders) / n for k in range(len(orders[0]))]
    total = sum(mean) or 1.0  # read features are distributions (backends.scorer checks): never 0
    return [math.log(max(v / total, 1e-12)) for v in mean]


def adapter_id(fields: dict[str, object]) -> str:
    """`ad-` and 16 hex digits of the SHA-256 of the adapter's other fields (its fit
    included): a name for people and records; the entry's own hash covers it whole."""
    canonical = json.dumps({k: v for k, v in fields.items() if k != "id"}, sort_keys=True, separators=(",", ":"),
                           ensure_ascii=False)
    return "ad-" + hashlib.sha256(canonical.encode()).hexdigest()[:16]
