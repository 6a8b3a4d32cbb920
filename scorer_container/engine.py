"""The decision engine: a probability for every declared option, read from logits.

A request is planned once (`planning.Planner.fit`: settings, the state as the model
reads it, probes, cost, the state's saved cells its tenant has) and the engine runs that
plan (`decide`). Every probe of a request shares the state's tokens: they are evaluated
once, in a prefix tree (`prefix_tree.py`), or restored from the cells an earlier request
of the tenant saved, and saved for the next (`state_cache.py`); a probe's content-free
prior is evaluated alone, in a tree of its own, and cached (`priors.py`). A question with
more options than one probe lists is answered in two rounds: its groups, then a final
round of the group winners, which starts from the state's cells the first round saved.

The `Deadline` is checked between decodes, so a job nobody waits for stops.

    server -> engine -> planning (questions, decision_settings, counting, priors, state_cache)
                     -> prefix_tree -> llama
                     -> answers
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from scorer_container import answers, scoring
from scorer_container.deadline import Deadline
from scorer_container.decision_settings import READOUTS, DecisionSettings, Defaults
from scorer_container.llama import LlamaModel, ModelShare
from scorer_container.planning import Asked, Plan, Planner
from scorer_container.prefix_tree import Branch, Read, Sketch, Stem, evaluate
from scorer_container.priors import PriorCache
from scorer_container.probes import LETTERS, Listing, Probe, probe_for
from scorer_container.prompts import ANSWER_CUE, CONTENT_FREE_STATE, PromptFormat
from scorer_container.schema import DecisionRequest
from scorer_container.state_cache import StateCache, common_prefix
from systemone.limits import STATE_FEATURE_DIMS

Scores = dict[Probe, np.ndarray]


@dataclass(frozen=True)
class TokensRead:
    """What the model read for a request: tokens decoded, and the state's tokens restored instead."""

    decoded: int
    restored: int = 0

    def __add__(self, other: TokensRead) -> TokensRead:
        return TokensRead(self.decoded + other.decoded, self.restored + other.restored)


class DecisionEngine:
    def __init__(
        self,
        llama: LlamaModel,
        prompt_format: PromptFormat,
        *,
        model_name: str,
        default_readout: str,
        default_order_average: bool = True,
        default_prior: bool = True,
        default_ordering: str = "canonical",
        default_averaging: str = "reversal",
        prior_cache_size: int = 4096,
        max_labels: int = 26,
        temperature: float | Mapping[str, float] | None = None,
        by_type: Mapping[str, Mapping[str, Any]] | None = None,
        default_framing: str = "plain",
        default_injection_probe: bool = False,
        default_quarantine: bool = False,
        defenses_overridable: bool = False,
        states: StateCache | None = None,
        model_id: str = "",
    ) -> None:
        self.llama = llama
        self.prompts = prompt_format
        self.model_name = model_name
        self.control_tokens = llama.control_tokens()
        # A number applies to both readouts and to every question type (a deployment's
        # override); a mapping is per readout; the manifest's per-type settings may differ.
        fixed = isinstance(temperature, (int, float))
        temperatures = {r: float(temperature) for r in READOUTS} if fixed else dict(temperature or {})
        types = {kind: dict(over) for kind, over in (by_type or {}).items()}
        if fixed:
            for over in types.values():
                over.pop("temperatures", None)
        self.defaults = Defaults(default_readout, default_order_average, default_prior, default_ordering,
                                 default_averaging, temperatures, types, default_framing, default_quarantine,
                                 default_injection_probe, defenses_overridable)
        self.priors = PriorCache(prior_cache_size)
        self.labels = self._single_token_labels(max_labels)
        if len(self.labels) < 2:
            raise ValueError("the model's vocabulary has fewer than two single-token letter labels")
        self.states = states  # the states read for each tenant, kept for its next question about them
        self.planner = Planner(llama, prompt_format, self.defaults, len(self.labels), self.control_tokens,
                               self.priors, states, model_id)
        self._sketch: Sketch | None = None

    @classmethod
    def for_manifest(cls, llama: LlamaModel, prompt_format: PromptFormat, manifest: Any, *, model_name: str,
                     readout: str | None = None, temperature: float | None = None,
                     **options: Any) -> DecisionEngine:
        """The engine with a model manifest's defaults (what `make eval` chose), as the scorer
        serves it; `readout` and `temperature` are a deployment's overrides (None: the manifest's)."""
        return cls(llama, prompt_format, model_name=model_name, default_readout=readout or manifest.readout,
                   default_order_average=manifest.order_average, default_prior=manifest.prior,
                   default_ordering=manifest.ordering, default_averaging=manifest.averaging,
                   temperature=manifest.temperatures if temperature is None else temperature,
                   by_type=manifest.by_type, default_framing=manifest.framing,
                   default_injection_probe=manifest.injection_probe, default_quarantine=manifest.quarantine,
                   **options)

    def _single_token_labels(self, limit: int) -> list[int]:
        """Token ids of " A", " B"... that stay single tokens right after the answer cue."""
        labels = []
        cue = self.llama.tokenize(ANSWER_CUE)
        for letter in LETTERS[:limit]:
            alone = self.llama.tokenize(" " + letter)
            after_cue = self.llama.tokenize(ANSWER_CUE + " " + letter)
            if len(alone) != 1 or after_cue != [*cue, alone[0]]:
                break  # labels must stay contiguous: A, B, C...
            labels.append(alone[0])
        return labels

    # -- public ----------------------------------------------------------------------

    def settings_for(self, request: DecisionRequest) -> DecisionSettings:
        """The model's defaults (per question type where the manifest says so), what the request asks winning."""
        return self.defaults.settings_for(request)

    def fit(self, request: DecisionRequest, max_units: float, row_cost: float = 0.0,
            deadline: Deadline | None = None, seconds_per_unit: float = 0.0, tenant: str | None = None) -> Plan:
        """The plan that answers `request` inside `max_units`, or OverBudget (planning.Planner.fit);
        with a `tenant`, from what that tenant's state cache holds of its state."""
        return self.planner.fit(request, max_units, row_cost, deadline, seconds_per_unit, tenant)

    def decide(self, plan: Plan, deadline: Deadline | None = None, share: ModelShare | None = None) -> dict[str, Any]:
        """Run a plan in `share`'s sequences and turns (the whole model when None; the caller holds
        no lock). Raises DeadlineExceeded (its sequences freed) when `deadline` passes."""
        if not plan.cost.complete:
            raise ValueError("a plan counted only up to its limit is over it: it is refused, never run")
        distributions, read, features = self._distributions(plan, deadline, share)
        return answers.response(plan, distributions, read.decoded, self.model_name, features, read.restored)

    def answer(self, request: DecisionRequest, settings: DecisionSettings | None = None,
               deadline: Deadline | None = None) -> dict[str, Any]:
        """Plan (without a budget) and run one request: for tools and tests, which own their machine."""
        return self.decide(self.planner.plan(request, settings), deadline)

    def evaluate(self, state_text: str, probes: Sequence[Probe], deadline: Deadline | None = None,
                 framing: str = "plain", share: ModelShare | None = None) -> tuple[list[np.ndarray], int]:
        """Raw scores over each probe's listed options with `state_text` as the state, in one
        prefix tree, and the tokens decoded (the evals score probes through this)."""
        # The stem decoded in pieces of its own, as a decision's is: the evals score what is served.
        stem = Stem(self.planner.stem_tokens(state_text, framing))
        scores, _, read = self._tree(state_text, probes, deadline, framing, share=share, stem=stem)
        return scores, read.decoded

    @property
    def sketch(self) -> Sketch:
        """The projection `x_features.state` is read with (built once: 2 arrays of n_vocab)."""
        if self._sketch is None:
            self._sketch = Sketch.for_vocabulary(self.llama.n_vocab, STATE_FEATURE_DIMS)
        return self._sketch

    def _tree(self, state_text: str, probes: Sequence[Probe], deadline: Deadline | None, framing: str,
              sketched: frozenset[Probe] = frozenset(), share: ModelShare | None = None, stem: Stem | None = None
              ) -> tuple[list[np.ndarray], dict[Probe, np.ndarray], TokensRead]:
        """(raw scores of each probe, the sketch of the answer position of those in `sketched`,
        the tokens it read): one prefix tree. A sketch is read from the row the
        probe's first read uses (a branch ending there joins the tree on the same tokens: no token
        is decoded twice)."""
        branches: list[Branch] = []
        spans: list[tuple[int, int]] = []
        sketch_at: dict[Probe, int] = {}
        for key, probe in enumerate(probes):
            start = len(branches)
            own = self.branches(state_text, probe, key, framing)
            branches.extend(own)
            spans.append((start, len(branches)))
            if probe in sketched:
                at = own[0].reads[0].position  # the answer position: where the first option is read
                sketch_at[probe] = len(branches)
                branches.append(Branch(own[0].tokens[: at + 1], (Read(at, self.sketch),)))
        result = evaluate(self.llama, branches, deadline, share, stem)
        sketches = {probe: result.results[index][0] for probe, index in sketch_at.items()}
        scores = []
        for probe, (start, end) in zip(probes, spans, strict=True):
            reads = result.results[start:end]
            if probe.readout == "letters":
                scores.append(scoring.log_normalize(reads[0][0]))
            else:
                # Per-token mean log-probability of each option's text: length-aware, so
                # a long option is not punished for having more tokens to predict.
                scores.append(np.array([np.concatenate(r).mean() for r in reads]))
        return scores, sketches, TokensRead(result.evaluated_tokens, result.cached_tokens)

    # -- rounds ------------------------------------------------------------------------

    def _distributions(self, plan: Plan, deadline: Deadline | None, share: ModelShare | None = None
                       ) -> tuple[list[np.ndarray], TokensRead, list[answers.Features] | None]:
        """Each question's distribution over its declared options: the first round of every
        listing in one tree, then the final rounds of grouped questions in another; the tokens
        they read; and, when the request asks for them (`x_features`), what each
        question's answer was read from. Both trees start from the state's saved cells where the
        plan holds them; the first keeps its own, which the final round starts from."""
        state_text, framing = plan.state.text, plan.settings.framing
        stems = _Stems(plan, self.states)
        with_prior = {p for a in plan.asked if a.settings.prior for listing in a.listings for p in listing.groups}
        first_round = [p for a in plan.asked for listing in a.listings for p in listing.groups]
        sketched = frozenset(a.listings[0].groups[0] for a in plan.asked) if plan.request.x_features else frozenset()
        raw, priors, sketches, read = self._score(state_text, first_round, with_prior, framing, deadline, share,
                                                  sketched, stems.first())
        finals: dict[tuple[int, int], Probe] = {}
        for i, a in enumerate(plan.asked):
            for j, listing in enumerate(a.listings):
                if len(listing.groups) > 1:
                    winners = tuple(g.shown[int(np.argmax(_corrected(raw, priors, g, a.settings.prior)))]
                                    for g in listing.groups)
                    finals[i, j] = probe_for(a.question, winners, a.settings.readout)
                    if a.settings.prior:
                        with_prior.add(finals[i, j])
        if finals:
            final_raw, final_priors, _, more = self._score(state_text, list(finals.values()), with_prior, framing,
                                                           deadline, share, stem=stems.again())
            raw.update(final_raw)
            priors.update(final_priors)
            read += more
        per_order = [self._per_order(a, i, raw, priors, finals) for i, a in enumerate(plan.asked)]
        distributions = [scoring.with_temperature(scoring.average(orders), a.settings.temperature)
                         for a, orders in zip(plan.asked, per_order, strict=True)]
        features = None
        if sketched:
            features = [answers.Features(orders, _declared_prior(a, priors), sketches[a.listings[0].groups[0]])
                        for a, orders in zip(plan.asked, per_order, strict=True)]
        return distributions, read, features

    @staticmethod
    def _per_order(asked: Asked, i: int, raw: Scores, priors: Scores,
                   finals: Mapping[tuple[int, int], Probe]) -> list[np.ndarray]:
        """One question's distribution in each of its listings (averaged, at its temperature,
        they are its answer)."""
        prior = asked.settings.prior
        return [_combine(len(asked.question.options), listing, [_corrected(raw, priors, g, prior) for g in listing.groups],
                         _corrected(raw, priors, finals[i, j], prior) if (i, j) in finals else None)
                for j, listing in enumerate(asked.listings)]

    def _score(self, state_text: str, probes: Sequence[Probe], with_prior: set[Probe], framing: str,
               deadline: Deadline | None, share: ModelShare | None, sketched: frozenset[Probe] = frozenset(),
               stem: Stem | None = None) -> tuple[Scores, Scores, dict[Probe, np.ndarray], TokensRead]:
        """Raw scores over each probe's shown options, the priors of those in `with_prior`, the
        sketches of those in `sketched`, the tokens read."""
        unique = list(dict.fromkeys(probes))
        raw, sketches, read = self._tree(state_text, unique, deadline, framing, sketched, share, stem)
        priors = {}
        for probe in unique:
            if probe in with_prior:
                priors[probe], cost = self._prior(probe, deadline, framing, share)
                read += TokensRead(cost)
        return dict(zip(unique, raw, strict=True)), priors, sketches, read

    def _prior(self, probe: Probe, deadline: Deadline | None, framing: str,
               share: ModelShare | None = None) -> tuple[np.ndarray, int]:
        """The probe's content-free scores and the tokens computing them cost (0 when cached)."""
        key = probe.prior_key(framing)
        cached = self.priors.get(key)
        if cached is not None:
            return cached, 0
        # Alone, so the value never depends on what else was in the batch.
        (scores,), evaluated = self.evaluate(CONTENT_FREE_STATE, [probe], deadline, framing, share)
        self.priors.put(key, scores)
        return scores, evaluated

    def branches(self, state_text: str, probe: Probe, batch_key: int | None = None,
                  framing: str = "plain") -> list[Branch]:
        """The probe's branches; a likelihood probe's continuations share `batch_key` (one decode)."""
        prompt = self.prompts.decision_prompt(state_text, probe.block, framing)
        add_bos = self.llama.adds_bos and not self.prompts.starts_with_bos(prompt)
        tokens = self.llama.tokenize(prompt, add_bos=add_bos)
        if probe.readout == "letters":
            labels = tuple(self.labels[: len(probe.shown)])
            return [Branch(tuple(tokens), (Read(len(tokens) - 1, labels),))]
        branches = []
        for continuation in probe.continuations:
            full = self.llama.tokenize(prompt + continuation, add_bos=add_bos)
            # Where the option's tokens start: the tokenizer may merge across the seam.
            start = min(common_prefix(tokens, full), len(full) - 1)
            reads = tuple(Read(p - 1, (full[p],)) for p in range(max(start, 1), len(full)))
            branches.append(Branch(tuple(full), reads, batch_key))
        return branches


class _Stems:
    """The stems of one plan's trees (prefix_tree.Stem): the first starts from the saved cells the
    plan holds and keeps its own in the state cache; a final round starts from those. Without a
    cache the stem is still decoded as pieces of its own: a request answers the same numbers
    whether its state was restored or not."""

    def __init__(self, plan: Plan, states: StateCache | None) -> None:
        self.plan, self.states = plan, states
        self.kept: tuple[tuple[int, ...], bytes] | None = None

    def first(self) -> Stem | None:
        reuse = self.plan.reuse
        if not self.plan.stem:
            return None
        if reuse is None or self.states is None:
            return Stem(self.plan.stem)
        hit = reuse.hit
        return Stem(self.plan.stem, hit.saved.data if hit else None, hit.matched if hit else 0, self._keep,
                    self.states.tenant_bytes)

    def again(self) -> Stem | None:
        if self.kept is None:
            return self.first()
        tokens, data = self.kept
        return Stem(self.plan.stem, data, len(tokens))

    def _keep(self, tokens: tuple[int, ...], data: bytes) -> None:
        self.kept = tokens, data
        self.states.put(self.plan.reuse.key, tokens, data, self.plan.reuse.since)


def _declared_prior(asked: Asked, priors: Scores) -> np.ndarray | None:
    """A question's content-free log-scores in its declared option order, averaged over its
    listings; None where no prior ran, or where the options are listed in groups (each group
    has a prior of its own: no one number per option)."""
    if not asked.settings.prior or any(len(listing.groups) > 1 for listing in asked.listings):
        return None
    n = len(asked.question.options)
    per_listing = []
    for listing in asked.listings:
        (probe,) = listing.groups
        declared = np.empty(n)
        declared[list(probe.shown)] = scoring.log_normalize(priors[probe])
        per_listing.append(declared)
    return np.mean(per_listing, axis=0)


def _corrected(raw: Scores, priors: Scores, probe: Probe, prior: bool) -> np.ndarray:
    return raw[probe] - priors[probe] if prior else raw[probe]


def _combine(n: int, listing: Listing, group_scores: list[np.ndarray], final_scores: np.ndarray | None) -> np.ndarray:
    """P(option) over a question's `n` options from one listing: P(its group wins the final)
    times P(option | its group)."""
    probabilities = np.zeros(n)
    group_weights = scoring.softmax(final_scores) if final_scores is not None else np.ones(1)
    for weight, probe, scores in zip(group_weights, listing.groups, group_scores, strict=True):
        probabilities[list(probe.shown)] = weight * scoring.softmax(scores)
    return probabilities / probabilities.sum()

