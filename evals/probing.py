"""Raw probe scores for the eval, through the engine's own code, cached on disk.

A configuration (readout, ordering, averaging, prior) turns a question into the probes
the engine would evaluate (`Planner.listings`, not a copy of it), and
its distribution is combined from those probes' scores exactly as the engine combines
them. Scores are cached in a SQLite file per model, keyed by the model file's sha256, the
prompt template version and the probe's full text, so a second `make eval` decodes only
what changed, and every configuration is compared on the same model outputs: two
configurations that make the same probe (the canonical ordering of a permuted question,
say) read the same numbers, as the engine would compute the same numbers.
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from scorer_container import scoring, untrusted
from scorer_container.decision_settings import DecisionSettings
from scorer_container.engine import DecisionEngine
from scorer_container.probes import Probe
from scorer_container.prompts import CONTENT_FREE_STATE, PROMPT_VERSIONS
from scorer_container.questions import PreparedQuestion, prepare_question
from scorer_container.schema import DecisionRequest, parse


@dataclass(frozen=True)
class Config:
    readout: str
    ordering: str  # "declared" or "canonical"
    averaging: str | None  # None: one listing; "reversal" or "rotations"
    prior: bool

    @property
    def key(self) -> str:
        listing = self.ordering + (f"+{self.averaging}" if self.averaging else "")
        return f"{self.readout}/{listing}/{'prior' if self.prior else 'raw'}"

    @property
    def invariant(self) -> bool:
        """True when the caller's option order cannot change the answer (by construction)."""
        return self.ordering == "canonical"

    def settings(self, temperature: float = 1.0) -> DecisionSettings:
        return DecisionSettings(readout=self.readout, order_average=self.averaging is not None, prior=self.prior,
                                temperature=temperature, ordering=self.ordering,
                                averaging=self.averaging or "reversal")

    @classmethod
    def parse(cls, key: str) -> Config:
        readout, listing, prior = key.split("/")
        ordering, _, averaging = listing.partition("+")
        return cls(readout, ordering, averaging or None, prior == "prior")


def prepared(state: str, question: dict) -> PreparedQuestion:
    request = parse(DecisionRequest, {"model": "m", "state": state, "questions": {"q": question}})
    return prepare_question("q", request.questions["q"])


def probes_for(engine: DecisionEngine, question: PreparedQuestion, config: Config) -> list[Probe]:
    """The probes the engine evaluates for this question under this configuration."""
    out = []
    for listing in engine.planner.listings(question, config.settings()):
        if len(listing.groups) != 1:
            raise ValueError("eval items must fit one probe (at most as many options as labels)")
        out.append(listing.groups[0])
    return out


# The template each framing's scores were computed with. Template /2 plain renders what /1
# rendered for every state the key holds (the key holds the state as the model reads it,
# after untrusted.for_model), so its scores carry over; any later version starts afresh.
_SAME_TEXT = {"decision-prompt/2": "decision-prompt/1"}
_CACHE_TEMPLATE = {framing: _SAME_TEXT.get(version, version) for framing, version in PROMPT_VERSIONS.items()}


class ScoreCache:
    """Probe scores by (model, template, state as shown, probe), in one SQLite file per model."""

    def __init__(self, path: Path, model_sha256: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path)
        self._db.execute("CREATE TABLE IF NOT EXISTS scores (key TEXT PRIMARY KEY, data BLOB NOT NULL)")
        self._model = model_sha256

    def key(self, state_text: str, probe: Probe, framing: str = "plain") -> str:
        salt = f"{self._model}\x1f{_CACHE_TEMPLATE[framing]}\x1f"
        text = "\x1f".join((salt, state_text, probe.readout, probe.block, *probe.continuations))
        return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()

    def get(self, key: str) -> np.ndarray | None:
        row = self._db.execute("SELECT data FROM scores WHERE key = ?", (key,)).fetchone()
        return None if row is None else np.frombuffer(row[0], dtype=np.float64).copy()

    def put(self, key: str, scores: np.ndarray) -> None:
        self._db.execute("INSERT OR REPLACE INTO scores VALUES (?, ?)", (key, np.asarray(scores, np.float64).tobytes()))

    def commit(self) -> None:
        self._db.commit()

    def close(self) -> None:
        self._db.commit()
        self._db.close()


class Prober:
    """Scores probes with the engine (one prefix tree per state, priors alone), through the cache,
    the state shown in one framing (prompts.FRAMINGS) as the engine shows it."""

    def __init__(self, engine: DecisionEngine, cache: ScoreCache, framing: str = "plain",
                 quarantine: bool = False) -> None:
        self.engine = engine
        self.cache = cache
        self.framing = framing
        self.quarantine = quarantine
        self.decoded_tokens = 0

    def scores(self, state: str, probes: Iterable[Probe],
               answers: frozenset[str] = frozenset()) -> dict[Probe, np.ndarray]:
        """`answers`: the wordings of the request's options, which the quarantine reads."""
        state_text = untrusted.for_model(state, self.engine.control_tokens, self.framing,
                                         self.quarantine, answers).text
        unique = list(dict.fromkeys(probes))
        out: dict[Probe, np.ndarray] = {}
        missing = []
        for probe in unique:
            cached = self.cache.get(self.cache.key(state_text, probe, self.framing))
            if cached is None:
                missing.append(probe)
            else:
                out[probe] = cached
        if missing:  # all of a state's new probes in one tree, as the engine evaluates a request
            raw, evaluated = self.engine.evaluate(state_text, missing, framing=self.framing)
            self.decoded_tokens += evaluated
            for probe, scores in zip(missing, raw, strict=True):
                self.cache.put(self.cache.key(state_text, probe, self.framing), scores)
                out[probe] = scores
        return out

    def priors(self, probes: Iterable[Probe]) -> dict[Probe, np.ndarray]:
        out = {}
        for probe in dict.fromkeys(probes):
            key = self.cache.key(CONTENT_FREE_STATE, probe, self.framing)
            cached = self.cache.get(key)
            if cached is None:  # alone, as the engine computes a prior
                (cached,), evaluated = self.engine.evaluate(CONTENT_FREE_STATE, [probe], framing=self.framing)
                self.decoded_tokens += evaluated
                self.cache.put(key, cached)
            out[probe] = cached
        return out


def distribution(question: PreparedQuestion, probes: list[Probe], scores: dict[Probe, np.ndarray],
                 priors: dict[Probe, np.ndarray] | None) -> np.ndarray:
    """P(option) in declared order: the engine's combination of single-group probes (at temperature 1)."""
    per_listing = []
    for probe in probes:
        corrected = scores[probe] - priors[probe] if priors is not None else scores[probe]
        p = np.zeros(len(question.options))
        p[list(probe.shown)] = scoring.softmax(corrected)
        per_listing.append(p)
    return scoring.average(per_listing)
