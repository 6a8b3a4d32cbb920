"""Catalog entries: the wire/storage model of one declared question, and its versions.

An entry is a noul, choice or score question with its policy, calibration and readout.
Its content is canonical JSON; its hash is the SHA-256 of that JSON. Versions
are immutable and numbered from 1; "latest" is the highest. Writing content equal to
the latest version's makes no new version, so a deploy that re-applies the same
catalog is a no-op; changing anything, a description included, makes a new version.
"""

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator

from gateway.catalogs.vectors import MIN_SCALE, adapter_id, decode_vector
from gateway.decisions.model import MAX_CHOICES, MAX_LEVELS
from systemone.limits import STATE_FEATURE_DIMS

Text = str | dict[str, Any] | list[Any]
NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,62}$"
MAX_VERSION = 1_000_000_000


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, defer_build=True)


class CatalogOption(_Strict):
    name: str = Field(min_length=1, max_length=200, pattern=r"\S")
    description: Text | None = None


class CatalogLevel(_Strict):
    label: str = Field(min_length=1, max_length=200)
    description: Text | None = None


class Rule(_Strict):
    """All conditions set must hold: the top probability, its margin over the runner-up, the confidence."""

    min_top: float | None = Field(default=None, ge=0, le=1)
    min_margin: float | None = Field(default=None, ge=0, le=1)
    min_confidence: float | None = Field(default=None, ge=0, le=1)


# An adapter's vectors: STATE_FEATURE_DIMS float32 in base64 (1,368 characters for 256).
MAX_VECTOR_CHARS = 4 * ((4 * STATE_FEATURE_DIMS + 2) // 3)
# The most options an adapter answers over: its weights (options x 256 float32) stay within
# an entry's size (gateway.catalogs.service.MAX_CONTENT_BYTES) with room for the rest.
MAX_ADAPTER_OPTIONS = 32


def adapter_bytes_bound(options: int) -> int:
    """An upper bound on an adapter's size in an entry's canonical JSON: its weights, center
    and spread, per option a bias (at most 26 characters), a reach (two such) and a name (at most 200),
    the key and the refit's figures."""
    return MAX_VECTOR_CHARS * (options + 2) + 300 * options + 3000


# Where an outcome that trains adapters came from: a person's review, an audit sample, or a
# downstream system that learned the truth.
OutcomeSource = Literal["review", "audit", "downstream"]

# The suspicion from which a state is taken to carry planted instructions, unless the
# entry says otherwise (the InjectionSuspected metric counts from it too).
INJECTION_THRESHOLD = 0.5
InjectionAction = Literal["review", "abstain", "ignore"]


class InjectionRule(_Strict):
    """What a verdict becomes when the scorer's injection suspicion reaches `threshold`:
    `review` or `abstain` (never a softer action than the rules gave), or `ignore`. No
    action: `review` for an enforcing policy, `ignore` for an advisory one.
    `require_signal`: an answer whose backend sent no suspicion at all (another backend, an
    older scorer) is treated as suspected, rather than trusted (None: false)."""

    threshold: float = Field(default=INJECTION_THRESHOLD, ge=0, le=1)
    action: InjectionAction | None = None
    # None rather than False: left out of the canonical JSON, so entries keep their hash
    # (an explicit false is stored as None: the same entry, the same hash).
    require_signal: bool | None = None

    @model_validator(mode="after")
    def _false_is_absent(self) -> Self:
        if self.require_signal is False:
            self.require_signal = None
        return self


class Policy(_Strict):
    """`auto` when its rule holds, else `review` when its rule holds, else `abstain`.
    `enforcing`: an abstained choice answers the declared abstain option."""

    mode: Literal["advisory", "enforcing"] = "advisory"
    auto: Rule = Rule(min_top=0.8)
    review: Rule = Rule(min_top=0.5)
    # Absent (None) is left out of the canonical JSON, so entries written before it keep their hash.
    injection: InjectionRule | None = None

    def injection_action(self) -> InjectionAction:
        """The action on a suspected injection; by default enforcing entries send it to a
        person (no catalog change needed) and advisory ones, which act on nothing, leave it."""
        if self.injection is not None and self.injection.action is not None:
            return self.injection.action
        return "review" if self.mode == "enforcing" else "ignore"

    @model_validator(mode="after")
    def _required_signal_acts(self) -> Self:
        if self.injection is not None and self.injection.require_signal:
            if self.injection_action() == "ignore":
                raise ValueError("injection.require_signal needs an action that does something: set"
                                 " injection.action to review or abstain (an advisory policy ignores by default)")
        return self


class Fit(_Strict):
    """What the last calibration measured, kept to report drift against."""

    fitted_at: float
    samples: int = Field(ge=1)
    accuracy: float = Field(ge=0, le=1)
    ece: float = Field(ge=0, le=1)
    brier: float = Field(ge=0)
    # What the fit was made on: the model file, the scorer's prompt template and the
    # readout. A decision answered by anything else answers uncalibrated, and an enforcing
    # policy sends it to review (gateway.catalogs.policy.fitted_here); a fit that records
    # no model (made before models were recorded) matches none.
    model_sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    prompt_version: str | None = Field(default=None, min_length=1, max_length=64)
    readout: Literal["letters", "likelihood"] | None = None


class Calibration(_Strict):
    temperature: float = Field(default=1.0, gt=0.01, le=100)
    fit: Fit | None = None


class AdapterFit(_Strict):
    """What the refit that made an adapter measured, out of fold (folds grouped by state):
    the adapter's figures and the calibrated zero-shot answer's on the same folds."""

    fitted_at: float
    samples: int = Field(ge=1)
    folds: int = Field(ge=2)
    l2: float = Field(gt=0)
    accuracy: float = Field(ge=0, le=1)
    nll: float = Field(ge=0)
    brier: float = Field(ge=0)
    zero_shot_accuracy: float = Field(ge=0, le=1)
    zero_shot_nll: float = Field(ge=0)
    zero_shot_brier: float = Field(ge=0)
    # Where its outcomes came from: {"review": 80, "audit": 20, ...}.
    sources: dict[OutcomeSource, int] = Field(default_factory=dict)
    # Which outcomes (records and labels, hashed): a refit on the same ones writes nothing.
    outcomes: str | None = Field(default=None, pattern=r"^[0-9a-f]{16}$")


class Adapter(_Strict):
    """A head learned from the entry's outcomes (gateway.catalogs.adapters): applied to every
    answer of the model file, prompt template, readout and sketch it was fitted on, to none
    other. `weights` (options x STATE_FEATURE_DIMS), `center` and `spread` travel as
    little-endian float32 in base64."""

    id: str = Field(pattern=r"^ad-[0-9a-f]{16}$")
    model_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    prompt_version: str = Field(min_length=1, max_length=64)
    readout: Literal["letters", "likelihood"]
    sketch: str = Field(min_length=1, max_length=64)
    # How the answers it learned from were listed and debiased (policy.listing_of).
    listing: str = Field(min_length=1, max_length=64)
    options: list[str] = Field(min_length=2, max_length=MAX_ADAPTER_OPTIONS)
    scale: float = Field(ge=MIN_SCALE, le=100)
    bias: list[float] = Field(min_length=2, max_length=MAX_ADAPTER_OPTIONS)
    center: str = Field(max_length=MAX_VECTOR_CHARS)
    spread: str = Field(max_length=MAX_VECTOR_CHARS)
    weights: str = Field(max_length=MAX_VECTOR_CHARS * MAX_ADAPTER_OPTIONS)
    # Per option, the least and greatest the sketch's term took over the training samples:
    # the term is held to it at decision time (gateway.catalogs.adapters). None: an adapter
    # fitted before it was kept, whose term is held by the sketch's clip alone.
    reach: list[list[float]] | None = Field(default=None, max_length=MAX_ADAPTER_OPTIONS)
    fit: AdapterFit

    @model_validator(mode="after")
    def _shapes_agree(self) -> Self:
        check_shapes(self)
        return self


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
    if adapter.reach is not None and (len(adapter.reach) != k or not all(
            len(pair) == 2 and all(map(math.isfinite, pair)) and -1e6 <= pair[0] <= pair[1] <= 1e6
            for pair in adapter.reach)):
        raise ValueError(f"adapter.reach holds {k} ranges [least, greatest] of finite numbers within [-1e6, 1e6]")
    fields = adapter.model_dump(mode="json")
    if fields["reach"] is None:
        del fields["reach"]  # an adapter from before reach was kept: its id was made without it
    if adapter.id != adapter_id(fields):
        raise ValueError("adapter.id is not the hash of the adapter's content (written by a refit, never by hand)")


class Learning(_Strict):
    """Whether the entry learns from its outcomes. `keep_features`: its records keep what the
    scorer read each answer from (a representation of the state: opt-in, counted in the
    record's size, gone when the record expires), which a refit needs.
    `refit`: "daily" refits it on a schedule as well as on demand; an enforcing entry is
    never moved by the schedule, only by an explicit refit with apply: true."""

    keep_features: bool = False
    refit: Literal["daily"] | None = None


class Readout(_Strict):
    readout: Literal["letters", "likelihood"] | None = None
    order_average: bool | None = None
    prior: bool | None = None


class _Entry(_Strict):
    instructions: Text | None = None
    policy: Policy | None = None
    calibration: Calibration = Calibration()
    readout: Readout = Readout()
    # Absent (None) is left out of the canonical JSON, so entries written before them keep their hash.
    learning: Learning | None = None
    adapter: Adapter | None = None
    # false: a decision naming the entry has its state read afresh and kept nowhere, and what
    # the scorer kept of it forgotten, whatever the request says (x_cache).
    cache: bool | None = None

    def option_keys(self) -> list[str]:
        """The keys its answers are given over, in order: what an adapter's `options` must equal."""
        raise NotImplementedError

    @property
    def enforces(self) -> bool:
        return self.policy is not None and self.policy.mode == "enforcing"

    @model_validator(mode="after")
    def _adapter_fits_options(self) -> Self:
        if self.adapter is not None and self.adapter.options != self.option_keys():
            raise ValueError(f"the adapter answers over {self.adapter.options}, the entry over {self.option_keys()}:"
                             " an adapter belongs to the options it was fitted on (refit it)")
        return self

    def canonical(self) -> str:
        return json.dumps(self.model_dump(mode="json", exclude_none=True), ensure_ascii=False, sort_keys=True,
                          separators=(",", ":"))


class NoulEntry(_Entry):
    """A yes/no question; `criteria` may describe either side."""

    type: Literal["noul"]
    criteria: dict[Literal["true", "false"], Text | None] | None = None

    def option_keys(self) -> list[str]:
        return ["true", "false"]

    @model_validator(mode="after")
    def _needs_something_to_ask(self) -> Self:
        if self.instructions is None and not any((self.criteria or {}).values()):
            raise ValueError("a noul entry needs instructions or criteria")
        return self


class ChoiceEntry(_Entry):
    """One of 2 to 255 options. `abstain` is the route an abstained decision takes under an
    enforcing policy; it is never shown to the model."""

    type: Literal["choice"]
    options: list[CatalogOption] = Field(min_length=2, max_length=MAX_CHOICES)
    abstain: CatalogOption | None = None

    def option_keys(self) -> list[str]:
        return [o.name for o in self.options]

    @model_validator(mode="after")
    def _names_unique(self) -> Self:
        names = [o.name for o in self.options] + ([self.abstain.name] if self.abstain else [])
        if len(set(names)) != len(names):
            raise ValueError("option names (the abstain option included) must be unique")
        return self


class ScoreEntry(_Entry):
    """Ordered levels, lowest first."""

    type: Literal["score"]
    levels: list[CatalogLevel] = Field(min_length=2, max_length=MAX_LEVELS)

    def option_keys(self) -> list[str]:
        return [str(i) for i in range(len(self.levels))]


CatalogContent = Annotated[NoulEntry | ChoiceEntry | ScoreEntry, Field(discriminator="type")]
_CONTENT = TypeAdapter(CatalogContent, config=ConfigDict(defer_build=True))  # built on first use, as the models


def parse_content(text: str) -> NoulEntry | ChoiceEntry | ScoreEntry:
    return _CONTENT.validate_json(text)


def content_hash(canonical: str) -> str:
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class CatalogVersion:
    tenant_id: str
    name: str
    version: int
    content_hash: str
    content: str  # canonical JSON of CatalogContent
    created_at: float
    # When this version is deleted (None while it is the latest, or while it is the version
    # that made the entry enforcing and the entry still enforces): see CatalogService.put.
    expires_at: float | None = None
    # The version whose write made the entry enforcing, while it enforces (this one, or an
    # earlier one kept for it).
    enforcing_since: int | None = None

    def entry(self) -> NoulEntry | ChoiceEntry | ScoreEntry:
        return parse_content(self.content)

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.version}"

    @property
    def enforced_since(self) -> int | None:
        """The version that made the entry enforcing, where this one enforces (a version written
        before that was kept names none: it stands in itself)."""
        if self.enforcing_since is not None:
            return self.enforcing_since
        return self.version if self.entry().enforces else None

    @property
    def refit(self) -> str | None:
        """The entry's scheduled refit ("daily"), which its head carries."""
        learning = self.entry().learning
        return learning.refit if learning is not None else None

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "hash": self.content_hash, "created_at": self.created_at,
                **json.loads(self.content)}
