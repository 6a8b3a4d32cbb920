"""One plan per decision: what the model will read and evaluate, decided before it runs.

`Planner.fit` turns a validated request into a `Plan`: the settings it is answered
with, the state as the model reads it, the request's option wordings, every question
with its listings and their probes, the saved cells of the state its tenant has (held
by the plan until it runs: `state_cache.py`), and what all of that costs. The server checks the
cost against the budget before the request takes a place in line, and the engine runs
the same plan (`DecisionEngine.decide`): nothing is rebuilt between the check that
admits a request and the code that answers it.

For each question the planner renders one or more *probes*: prompts that list the
options in a given order and end with the answer cue. More options than one probe lists
(26: the letters, and for likelihood the same, so that a probe's prompt stays short):
the options are split into balanced groups, each group is probed, the group winners
are probed in a final round (built by the engine once the groups are scored), and
P(option) = P(its group wins the final) * P(option | its group).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, replace

from scorer_container import untrusted
from scorer_container.counting import Cost, Tally, TokenCounter, over_budget
from scorer_container.deadline import Deadline
from scorer_container.decision_settings import DecisionSettings, Defaults
from scorer_container.errors import OverBudget
from scorer_container.llama import LlamaModel
from scorer_container.priors import PriorCache
from scorer_container.probes import Listing, probe_for
from scorer_container.prompts import CONTENT_FREE_STATE, PROMPT_VERSIONS, PromptFormat, framed_state, render_value
from scorer_container.questions import (
    PreparedQuestion,
    canonical_order,
    injection_question,
    prepare_question,
    request_answers,
)
from scorer_container.schema import DecisionRequest
from scorer_container.state_cache import CacheKey, Hit, StateCache

# A stem shorter than this past the template's head (the state and the few tokens after it) is
# not kept, and a saved state sharing fewer with a request is not used: restoring it would save
# less time than it costs, and it would hold a place in the tenant's share.
MIN_KEPT_TOKENS = 64


@dataclass(frozen=True)
class Asked:
    """A question as the model is asked it: its settings and its listings."""

    question: PreparedQuestion
    settings: DecisionSettings
    listings: tuple[Listing, ...]


@dataclass(frozen=True)
class Reuse:
    """The tenant's state cache in a plan: `hit`, the saved cells of the longest prefix of the
    plan's stem it holds, held by the plan from planning to its run (an eviction in between
    cannot make an admitted request longer); `key`, where the stem's cells go once decoded."""

    key: CacheKey
    hit: Hit | None
    since: int  # the cache's forgets when it was looked up (StateCache.mark): a later forget refuses the save


@dataclass(frozen=True)
class Plan:
    """Everything decided about one request before it runs; `DecisionEngine.decide` runs it."""

    request: DecisionRequest
    settings: DecisionSettings
    state: untrusted.Shown  # the state as the model reads it
    wordings: untrusted.Answers  # the request's option wordings (quarantine and pattern checks)
    asked: tuple[Asked, ...]  # the request's questions, then the injection probe when it is on
    cost: Cost
    # The state's part of every prompt (prefix_tree.Stem), in tokens: decoded as pieces of its
    # own whether it is restored or not, so that a cache hit answers as a fresh evaluation does.
    stem: tuple[int, ...] = ()
    reuse: Reuse | None = None  # None: nothing read from the state cache, nothing kept in it


@dataclass
class _Request:
    """What every plan of one request shares, whatever its settings: built once."""

    request: DecisionRequest
    wordings: untrusted.Answers
    questions: list[PreparedQuestion]
    counter: TokenCounter
    shown: dict[tuple[str, bool], untrusted.Shown]
    tenant: str | None = None  # whose state cache it reads and fills (None: none)
    stems: dict[tuple[str, bool], tuple[tuple[int, ...], Reuse | None]] = field(default_factory=dict)


class Planner:
    def __init__(self, llama: LlamaModel, prompts: PromptFormat, defaults: Defaults, max_listed: int,
                 control_tokens: frozenset[str], priors: PriorCache, states: StateCache | None = None,
                 model_id: str = "") -> None:
        self.llama = llama
        self.prompts = prompts
        self.defaults = defaults
        self.max_listed = max_listed  # the most options one probe lists (the single-token letters)
        self.control_tokens = control_tokens
        self.priors = priors
        self.states = states  # None: no state is kept between requests
        self.model_id = model_id  # the model file's sha256: saved cells are that file's numbers

    def settings_for(self, request: DecisionRequest) -> DecisionSettings:
        return self.defaults.settings_for(request)

    def fit(self, request: DecisionRequest, max_units: float, row_cost: float = 0.0,
            deadline: Deadline | None = None, seconds_per_unit: float = 0.0, tenant: str | None = None) -> Plan:
        """The plan that answers `request` inside `max_units` (tokens' worth of work, a logits
        row costing `row_cost`), or OverBudget (413, with the figures: in seconds too when
        `seconds_per_unit` is given). With a `tenant`, the state's tokens that tenant's cache
        holds are restored, not evaluated, and are not counted as work.

        Debiasing the caller did not ask for explicitly is reduced when it alone breaks
        the budget (unless `x_reduce` is false): first rotations become the reversal alone,
        then the uncached priors go, then the second option order, then both; the answer's
        `x_debias` says what was applied and that it was reduced.
        """
        shared = self._shared(request, tenant)
        for candidate in self._candidates(request, self.settings_for(request)):
            plan = self.plan(request, candidate, max_units, row_cost, deadline, shared)
            if plan.cost.units(row_cost) <= max_units:
                return plan
        raise OverBudget(over_budget(plan.cost, row_cost, max_units, seconds_per_unit))

    @staticmethod
    def _candidates(request: DecisionRequest, settings: DecisionSettings) -> list[DecisionSettings]:
        reducible = request.x_reduce is not False
        drop_prior = reducible and request.x_prior is None and settings.applies(lambda s: s.prior)
        drop_order = reducible and request.x_order_average is None and settings.applies(lambda s: s.order_average)
        candidates = [settings]
        if drop_order and settings.applies(lambda s: s.averaging == "rotations"):
            settings = settings.everywhere(averaging="reversal", reduced=True)
            candidates.append(settings)
        if drop_prior:
            candidates.append(settings.everywhere(prior=False, reduced=True))
        if drop_order:
            candidates.append(settings.everywhere(order_average=False, reduced=True))
        if drop_prior and drop_order:
            candidates.append(settings.everywhere(order_average=False, prior=False, reduced=True))
        return candidates

    def plan(self, request: DecisionRequest, settings: DecisionSettings | None = None, limit: float = math.inf,
             row_cost: float = 0.0, deadline: Deadline | None = None, shared: _Request | None = None) -> Plan:
        """The plan under `settings` (default: the request's), counted as it is built.

        Counting stops once the work passes `limit` (the plan is then incomplete: refused,
        never run). Raises ContextOverflow as soon as a probe cannot fit, and
        DeadlineExceeded when `deadline` passes (checked once a question and listing:
        planning runs before admission, in a worker thread)."""
        settings = settings or self.settings_for(request)
        shared = shared or self._shared(request)
        state = self._shown(shared, settings)
        counter = shared.counter
        head, frame = counter.frame(settings.framing)
        state_tokens = head + counter(framed_state(state.text, settings.framing).rstrip())  # 413 past the context
        stem, reuse = self._stem(shared, settings, state, head)
        hit = reuse.hit if reuse is not None else None
        # A restore places the whole saved state before cutting it to the shared part: its cells count.
        tally = Tally(state_tokens, head + counter(CONTENT_FREE_STATE), counter.capacity, frame,
                      cached=hit.matched if hit else 0, restored_cells=len(hit.saved.tokens) if hit else 0)
        asked: list[Asked] = []
        for question, own in self._questions(shared, settings):
            listings = []
            for order in self.orders(question, own):
                if deadline is not None:
                    deadline.check()
                listings.append(self.listing(question, order, own.readout))
                tally.add(listings[-1], counter, own.prior, lambda p, f=own.framing: self.priors.peek(p.prior_key(f)) is None)
                if tally.cost().units(row_cost) > limit:
                    return Plan(request, settings, state, shared.wordings, tuple(asked), tally.cost(complete=False),
                                stem, reuse)
            if request.x_features:
                tally.rows += 1  # the sketch of the answer position: one more row read whole
            asked.append(Asked(question, own, tuple(listings)))
        return Plan(request, settings, state, shared.wordings, tuple(asked), tally.cost(), stem, reuse)

    def _shared(self, request: DecisionRequest, tenant: str | None = None) -> _Request:
        counter = TokenCounter(self.llama, self.prompts)
        raw = render_value(request.state)
        if len(raw) > 2 * counter.too_long:  # far beyond the context: refused before it is even cleaned
            counter(raw)
        questions = [prepare_question(qid, q) for qid, q in request.questions.items()]
        return _Request(request, request_answers(request), questions, counter, {}, tenant)

    def _stem(self, shared: _Request, settings: DecisionSettings, state: untrusted.Shown, head: int
              ) -> tuple[tuple[int, ...], Reuse | None]:
        """The stem's tokens and the state cache's part in the plan, once a request (the same for
        every budget candidate)."""
        place = (settings.framing, settings.quarantine)
        if place not in shared.stems:
            tokens = self.stem_tokens(state.text, settings.framing)
            shared.stems[place] = tokens, self._reuse(shared, settings.framing, tokens, head)
        return shared.stems[place]

    def stem_tokens(self, state_text: str, framing: str) -> tuple[int, ...]:
        """The stem (prefix_tree.Stem) of every prompt about `state_text` (as the model reads it), in tokens."""
        text = self.prompts.stem(state_text, framing)
        return tuple(self.llama.tokenize(text, add_bos=self.llama.adds_bos and not self.prompts.starts_with_bos(text)))

    def _reuse(self, shared: _Request, framing: str, stem: tuple[int, ...], head: int) -> Reuse | None:
        """The tenant's saved cells of the stem, or None where nothing is read or kept: no tenant or
        no cache, a state too short to be worth it, or `x_cache: false`, which also forgets what
        the tenant kept of it."""
        if self.states is None or shared.tenant is None:
            return None
        key = CacheKey(shared.tenant, self.model_id, PROMPT_VERSIONS[framing])
        least = head + MIN_KEPT_TOKENS  # into the state: every entry shares the template's head
        if shared.request.x_cache is False:
            self.states.forget(key, stem, least)
            return None
        if len(stem) < least:
            return None
        since = self.states.mark()
        return Reuse(key, self.states.longest(key, stem, least), since)

    def _shown(self, shared: _Request, settings: DecisionSettings) -> untrusted.Shown:
        key = (settings.framing, settings.quarantine)  # the same for every budget candidate
        if key not in shared.shown:
            shared.shown[key] = untrusted.for_model(
                shared.request.state, self.control_tokens, settings.framing, settings.quarantine, shared.wordings,
                max_chars=shared.counter.too_long)
        return shared.shown[key]

    def shown_state(self, request: DecisionRequest, settings: DecisionSettings | None = None) -> untrusted.Shown:
        """The state as the model reads it under `settings` (untrusted.py)."""
        return self._shown(self._shared(request), settings or self.settings_for(request))

    @staticmethod
    def _questions(shared: _Request, settings: DecisionSettings) -> list[tuple[PreparedQuestion, DecisionSettings]]:
        """The questions the model is asked, each with its settings: the request's, then the
        injection probe when it is on (read the model's yes/no way, without a temperature)."""
        asked = [(q, settings.for_kind(q.kind)) for q in shared.questions]
        if settings.injection_probe:
            asked.append((injection_question(), replace(settings.for_kind("noul"), temperature=1.0)))
        return asked

    # -- listings and probes -----------------------------------------------------------------

    def orders(self, question: PreparedQuestion, settings: DecisionSettings) -> list[tuple[int, ...]]:
        """The option listings a question is probed in (indices into its declared options)."""
        base = tuple(range(len(question.options)))
        if settings.ordering == "canonical" and question.kind == "choice":
            base = canonical_order(question)
        if not settings.order_average:
            return [base]
        if settings.averaging == "rotations" and question.kind == "choice" and len(base) <= self.max_listed:
            return [base[i:] + base[:i] for i in range(len(base))]
        return [base, base[::-1]]

    def listings(self, question: PreparedQuestion, settings: DecisionSettings) -> list[Listing]:
        """Every listing of a question under `settings` (what the evals score)."""
        return [self.listing(question, order, settings.readout) for order in self.orders(question, settings)]

    def listing(self, question: PreparedQuestion, order: tuple[int, ...], readout: str) -> Listing:
        # Both readouts list at most as many options as there are letters: a likelihood
        # probe listing 255 options would need more context than small models have.
        n_groups = math.ceil(len(order) / self.max_listed)
        # Balanced groups (255 options, 26 labels: ten groups of 25-26), in the given order.
        bounds = [round(i * len(order) / n_groups) for i in range(n_groups + 1)]
        return Listing(order, tuple(probe_for(question, order[a:b], readout) for a, b in itertools.pairwise(bounds)))
