"""How a decision is read: readout, debiasing and how the state is shown, per question type.

Two readouts turn a probe into scores over the options it lists:

- `letters`: options are labelled A, B, C...; the log-probabilities of the label
  tokens at the answer position are the scores (what decision-tuned and larger
  instruct models do best);
- `likelihood`: each option's own text is the continuation; its per-token
  log-probability is the score (what measured best on the tiny embedded models).

Debiasing, both on by default and switchable per request:
- order averaging: each question is probed in more than one listing and the
  distributions are averaged (small models prefer the first listed option): the
  canonical order and its reversal (`averaging="reversal"`), or, for a choice question
  that fits one probe, every cyclic rotation of it, so that each option is listed once
  in each position (`averaging="rotations"`, one probe per option);
- content-free prior (priors.py).

A model's defaults are what `make eval` chose for it (its manifest, per question type);
a request may change how its questions are read, and may add a defense of the state
(framing, quarantine, the injection probe), never remove one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from scorer_container.prompts import FRAMINGS
from scorer_container.schema import DecisionRequest

READOUTS = ("letters", "likelihood")
ORDERINGS = ("declared", "canonical")
AVERAGINGS = ("reversal", "rotations")


@dataclass(frozen=True)
class DecisionSettings:
    readout: str
    order_average: bool = True
    prior: bool = True
    temperature: float = 1.0
    ordering: str = "canonical"  # how a choice question's options are listed (see ORDERINGS)
    averaging: str = "reversal"  # which listings order averaging uses (see AVERAGINGS)
    reduced: bool = False  # debiasing was cut to fit the work budget
    framing: str = "plain"  # how the state is shown (prompts.FRAMINGS); one per request: the state is shared
    quarantine: bool = False  # flagged passages of the state removed (untrusted.quarantined)
    injection_probe: bool = False  # ask the injection probe of the state too
    # The settings of a question type that differs from these (the manifest's `by_type`).
    kinds: Mapping[str, DecisionSettings] = field(default_factory=dict)

    def for_kind(self, kind: str) -> DecisionSettings:
        return self.kinds.get(kind, self)

    def everywhere(self, **changes: Any) -> DecisionSettings:
        """These settings changed for every question type alike (how the budget reduces them)."""
        return replace(self, **changes, kinds={k: replace(v, **changes) for k, v in self.kinds.items()})

    def applies(self, predicate: Callable[[DecisionSettings], bool]) -> bool:
        return predicate(self) or any(predicate(v) for v in self.kinds.values())

    def describe(self) -> dict[str, Any]:
        return {"order_average": self.order_average, "prior": self.prior, "ordering": self.ordering,
                **({"averaging": self.averaging} if self.order_average else {}),
                **({"temperature": self.temperature} if self.temperature != 1.0 else {})}


@dataclass(frozen=True)
class Defaults:
    """A model's own settings (its manifest's, or a deployment's overrides)."""

    readout: str
    order_average: bool = True
    prior: bool = True
    ordering: str = "canonical"
    averaging: str = "reversal"
    # Per readout (a model's scores are on a different scale in each); None wherever unset: 1.0.
    temperatures: Mapping[str, float] = field(default_factory=dict)
    # Per question type, what differs from the above: a model can read a yes/no question
    # best one way and a choice another (measured by `make eval`).
    by_type: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    framing: str = "plain"
    quarantine: bool = False
    injection_probe: bool = False
    # A request may strengthen how the state is shown, never weaken it, unless this is an
    # engine that measures the defenses against each other (`make eval`, benchmarks).
    defenses_overridable: bool = False

    def __post_init__(self) -> None:
        if self.ordering not in ORDERINGS or self.averaging not in AVERAGINGS:
            raise ValueError(f"ordering must be one of {ORDERINGS} and averaging one of {AVERAGINGS}")
        if self.framing not in FRAMINGS:
            raise ValueError(f"framing must be one of {FRAMINGS}")

    def settings_for(self, request: DecisionRequest) -> DecisionSettings:
        """These defaults (per question type where they say so), what the request asks winning."""
        defaults = {"readout": self.readout, "order_average": self.order_average, "prior": self.prior,
                    "averaging": self.averaging, "temperatures": self.temperatures}

        def settings(d: Mapping[str, Any]) -> DecisionSettings:
            readout = request.x_readout or d["readout"]
            return DecisionSettings(
                readout=readout,
                order_average=d["order_average"] if request.x_order_average is None else request.x_order_average,
                prior=d["prior"] if request.x_prior is None else request.x_prior,
                temperature=float(d["temperatures"].get(readout, 1.0)),
                ordering=self.ordering,
                averaging=d["averaging"],
            )

        shown = self._shown(request)
        base = replace(settings(defaults), **shown)
        kinds = {kind: replace(settings({**defaults, **over}), **shown) for kind, over in self.by_type.items()}
        return replace(base, kinds={k: v for k, v in kinds.items() if v != base})

    def _shown(self, request: DecisionRequest) -> dict[str, Any]:
        """How the state is shown: one choice per request (every question reads the same state)."""
        asked = {"framing": request.x_framing, "quarantine": request.x_quarantine,
                 "injection_probe": request.x_injection_probe}
        if self.defenses_overridable:
            ours = {"framing": self.framing, "quarantine": self.quarantine, "injection_probe": self.injection_probe}
            return {k: ours[k] if v is None else v for k, v in asked.items()}
        # Whoever can reach the endpoint may add a defense, never remove one.
        return {"framing": self.framing if self.framing != "plain" else asked["framing"] or "plain",
                "quarantine": self.quarantine or bool(asked["quarantine"]),
                "injection_probe": self.injection_probe or bool(asked["injection_probe"])}
