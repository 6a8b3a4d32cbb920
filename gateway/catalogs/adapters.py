"""A catalog entry's adapter at decision time: plain Python, no numpy on the hot path.

The adapter (gateway.catalogs.model.Adapter, fitted by gateway.catalogs.fitting) maps
what the scorer read an answer from (`x_features`) to the entry's own probabilities:

    logit_k = scale * log p0_k + bias_k + clamp(w_k . clip((state - center) / spread, +-STATE_CLIP), reach_k)

where p0 is the zero-shot answer (the listings' distributions averaged), `state` the
sketch of the answer position and reach_k the range the sketch's term took over the
samples it was fitted on: the text the model reads is anyone's to write, and a crafted
state moves a logit no further than the training's own states did. It applies to answers of the model file, prompt template,
readout and sketch it was fitted on, and to none other: features of another model are
other numbers.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.catalogs.model import Adapter
from gateway.catalogs.vectors import STATE_CLIP, decode_vector
from gateway.decisions.model import FitKey, ReadFeatures
from systemone.limits import STATE_FEATURE_DIMS


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
    reach: tuple[tuple[float, float], ...]

    @classmethod
    def of(cls, adapter: Adapter) -> Head:
        k, d = len(adapter.options), STATE_FEATURE_DIMS
        flat = decode_vector(adapter.weights, k * d)
        unbounded = ((-math.inf, math.inf),) * k  # an adapter fitted before reach was kept
        return cls(adapter.scale, tuple(adapter.bias), tuple(decode_vector(adapter.center, d)),
                   tuple(decode_vector(adapter.spread, d)), tuple(tuple(flat[i * d:(i + 1) * d]) for i in range(k)),
                   tuple((low, high) for low, high in adapter.reach) if adapter.reach is not None else unbounded)

    def probabilities(self, features: ReadFeatures) -> tuple[float, ...]:
        zero_shot = _zero_shot(features.orders)
        x = [min(STATE_CLIP, max(-STATE_CLIP, (s - c) / w))
             for s, c, w in zip(features.state, self.center, self.spread, strict=True)]
        logits = [self.scale * z + b + min(high, max(low, math.fsum(wi * xi for wi, xi in zip(row, x, strict=True))))
                  for z, b, row, (low, high) in zip(zero_shot, self.bias, self.weights, self.reach, strict=True)]
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
    key = (adapter.scale, tuple(adapter.bias), adapter.center, adapter.spread, adapter.weights,
           None if adapter.reach is None else tuple(map(tuple, adapter.reach)))
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
