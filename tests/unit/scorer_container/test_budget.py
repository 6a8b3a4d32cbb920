"""The scorer's budget: seconds of this machine, measured at load and corrected as decisions run."""

from __future__ import annotations

import pytest

from scorer_container.budget import (
    MARGIN,
    MAX_AGE_S,
    MAX_SLOWDOWN,
    MAX_SPEEDUP,
    MIN_TO_RAISE,
    Budget,
    Prefill,
    WorkRate,
    step_tokens_for,
)

PREFILL = Prefill(tokens_per_s=300.0, row_cost=0.5)


def test_a_slower_machine_tightens_the_rate_at_once_and_a_faster_one_loosens_it_once_several_agree():
    # Given a rate measured at load of 0.002 s a unit
    rate = WorkRate(0.002)
    # When one decision runs faster, nothing moves: one decision fast for reasons of its own
    rate.observe(1000, 1.0)
    assert rate.seconds_per_unit() == 0.002
    # When one runs slower (a busier machine an hour later), the rate tightens at once
    rate.observe(1000, 5.0)
    assert rate.seconds_per_unit() == pytest.approx(3.0 / 1000)
    # And once MIN_TO_RAISE recent decisions say the machine is faster, it loosens
    for _ in range(MIN_TO_RAISE):
        rate.observe(1000, 1.0)
    assert rate.seconds_per_unit() == pytest.approx(0.001)


def test_a_scorer_started_under_load_answers_as_one_started_quiet_once_the_machine_is_quiet():
    # Given one scorer that measured its rate beside other work (24 tokens/s where the quiet
    # machine runs 80: 3.3 times slower) and one that measured it on the quiet machine
    now = [0.0]
    busy = Budget(seconds=18.7, prefill=PREFILL, rate=WorkRate(1 / 24, clock=lambda: now[0]))
    quiet = Budget(seconds=18.7, prefill=PREFILL, rate=WorkRate(1 / 80, clock=lambda: now[0]))
    assert busy.max_units() < quiet.max_units() / 3
    # When the machine is quiet and both run decisions at the quiet rate
    for _ in range(8):
        now[0] += 5
        for budget in (busy, quiet):
            budget.rate.observe(400, 400 / 80)
    # Then both allow the same work per request, and say so on /ping
    assert busy.max_units() == quiet.max_units() == int(18.7 / (400 / 80 / 400))
    assert busy.figures()["units_per_s"] == quiet.figures()["units_per_s"] == 80.0
    # And however fast decisions say it is, the rate never passes MAX_SPEEDUP times the load's
    for _ in range(16):
        busy.rate.observe(1000, 0.001)
    assert busy.rate.seconds_per_unit() == pytest.approx((1 / 24) / MAX_SPEEDUP)


def test_recent_decisions_are_read_by_their_median_and_small_ones_say_nothing():
    # A small decision's time is mostly fixed overheads, and one decision slow for reasons
    # of its own must not set the rate of all the others.
    rate = WorkRate(0.001)
    rate.observe(10, 5.0)
    assert rate.observed() is None
    for seconds in (1.2, 1.4, 60.0):
        rate.observe(1000, seconds)
    assert rate.observed() == pytest.approx(0.0014)


def test_decisions_made_slow_on_purpose_cannot_shrink_the_budget_past_a_floor():
    # Given a caller sending decisions that run slow (sixteen 64-unit ones of 20 s each),
    # the rate in use is at most twice the load measurement: the budget keeps half its units.
    budget = Budget(seconds=18.7, prefill=PREFILL, rate=WorkRate(0.002))
    full = budget.max_units()
    for _ in range(16):
        budget.rate.observe(64, 20.0)
    assert budget.rate.seconds_per_unit() == pytest.approx(MAX_SLOWDOWN * 0.002)
    assert budget.max_units() == int(18.7 / (MAX_SLOWDOWN * 0.002))
    assert budget.max_units(at_load=True) == full


def test_old_decisions_say_nothing_of_the_machine_now():
    now = [0.0]
    rate = WorkRate(0.001, clock=lambda: now[0])
    rate.observe(1000, 1.9)
    assert rate.observed() == pytest.approx(0.0019)
    now[0] += MAX_AGE_S + 1
    assert rate.observed() is None and rate.seconds_per_unit() == 0.001


def test_only_a_window_of_recent_decisions_counts():
    rate = WorkRate(0.001, window=2)
    rate.observe(1000, 10.0)
    rate.observe(1000, 1.0)
    rate.observe(1000, 1.0)
    assert rate.observed() == pytest.approx(0.001)


def test_a_request_gets_the_budgets_seconds_or_its_own_deadline_less_the_margin():
    budget = Budget(seconds=20.0 * MARGIN, prefill=PREFILL, rate=WorkRate(0.01))
    assert budget.max_units() == int(20.0 * MARGIN / 0.01)
    assert budget.max_units(seconds=5.0) == int(5.0 * MARGIN / 0.01)
    assert budget.max_units(seconds=500.0) == budget.max_units()
    assert budget.seconds_for(100) == pytest.approx(1.0)
    budget.rate.observe(1000, 20.0)  # decisions turned out twice as slow: half the units
    assert budget.max_units() == int(20.0 * MARGIN / 0.02)


def test_a_fixed_budget_is_the_operators_word_whatever_the_time():
    budget = Budget(seconds=1.0, prefill=PREFILL, rate=WorkRate(1.0), fixed_units=8000)
    assert budget.fixed and budget.max_units() == 8000 and budget.max_units(seconds=0.1) == 8000
    assert budget.figures()["max_request_tokens"] == 8000


def test_ping_figures_say_where_the_rate_comes_from():
    budget = Budget(seconds=18.7, prefill=PREFILL, rate=WorkRate(0.004))
    assert budget.figures()["units_per_s_observed"] is None
    budget.rate.observe(1000, 5.0)
    figures = budget.figures()
    assert figures["units_per_s_at_load"] == 250.0 and figures["units_per_s_observed"] == 200.0
    assert figures["units_per_s"] == 200.0 and figures["max_request_tokens"] == int(18.7 / 0.005)


def test_a_request_with_a_deadline_no_buffered_request_has_may_do_long_work():
    # Given an ordinary budget of 20 s and a long one of 50 s (both less the margin)
    budget = Budget(seconds=20.0 * MARGIN, prefill=PREFILL, rate=WorkRate(0.01), long_seconds=50.0 * MARGIN)
    # Then a buffered request (any deadline API Gateway's 29 s allows) keeps the ordinary budget
    assert budget.max_units(seconds=28.0) == int(20.0 * MARGIN / 0.01)
    # And one from the streaming routes gets its deadline's worth, up to the long budget
    assert budget.max_units(seconds=40.0) == int(40.0 * MARGIN / 0.01)
    assert budget.max_units(seconds=58.0) == int(50.0 * MARGIN / 0.01) == budget.figures()["max_long_request_tokens"]


def test_a_turn_is_about_the_step_seconds_of_prefill_in_a_power_of_two():
    # The quality model (81 tokens/s) gets 32-token turns, the fast one (300) 128: each ~0.4-0.5 s
    assert step_tokens_for(81.0, 0.5, 512) == 32
    assert step_tokens_for(300.0, 0.5, 512) == 128
    # Never past one batch, never below the floor where a decode's fixed cost dominates
    assert step_tokens_for(1e6, 0.5, 512) == 512 and step_tokens_for(1.0, 0.5, 512) == 32


def test_a_tenant_whose_decisions_run_fast_per_unit_cannot_make_the_others_look_cheaper():
    # Given one tenant sending decisions that run four times faster per unit than at load (a long
    # state, one small question), and another whose decisions run at the load's rate
    rate = WorkRate(0.004)
    for _ in range(12):
        rate.observe(1000, 1.0, tenant="fast")
    assert rate.seconds_per_unit() == pytest.approx(0.001)  # alone, its own figure counts
    for _ in range(2):
        rate.observe(1000, 4.0, tenant="branchy")
    # Then the rate in use is the slowest tenant's: the other's work is not admitted at the fast rate
    assert rate.seconds_per_unit() == pytest.approx(0.004)
    # However many more the fast tenant sends: each tenant has a window of its own
    for _ in range(100):
        rate.observe(1000, 1.0, tenant="fast")
    assert rate.seconds_per_unit() == pytest.approx(0.004)


def test_one_tenants_one_slow_decision_does_not_halve_everyones_budget():
    # Given a tenant whose decisions run at the load's rate, and another's one slow decision
    rate = WorkRate(0.01)
    for _ in range(16):
        rate.observe(1000, 10.0, tenant="a")
    rate.observe(64, 5.0, tenant="b")
    # Then the rate stays the first's: one decision, slow for reasons of its own, votes nothing
    assert rate.seconds_per_unit() == pytest.approx(0.01)
    # But once that tenant's decisions are slow as a rule, the typical rate slows
    for _ in range(2):
        rate.observe(1000, 30.0, tenant="b")
    rate.observe(1000, 30.0, tenant="c")
    for _ in range(2):
        rate.observe(1000, 30.0, tenant="c")
    assert rate.seconds_per_unit() == pytest.approx(MAX_SLOWDOWN * 0.01)
