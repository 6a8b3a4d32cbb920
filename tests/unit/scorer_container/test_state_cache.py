"""The scorer's cache of saved states: longest prefix, per tenant, bounded, forgettable."""

from __future__ import annotations

import pytest

from scorer_container.state_cache import CacheKey, StateCache

ACME = CacheKey("acme", "ab" * 32, "p1")
GLOBEX = CacheKey("globex", "ab" * 32, "p1")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def state(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


def test_the_longest_saved_prefix_of_the_tokens_is_found_for_its_tenant_model_and_prompt_only():
    cache = StateCache(10_000_000)
    cache.put(ACME, state(100), b"x" * 1000)
    transcript = state(150)  # the same transcript, one step longer
    hit = cache.longest(ACME, transcript)
    assert hit is not None and hit.matched == 100 and hit.saved.data == b"x" * 1000
    assert cache.longest(GLOBEX, transcript) is None  # another tenant's identical state: evaluated fresh
    assert cache.longest(CacheKey("acme", "cd" * 32, "p1"), transcript) is None  # another model file
    assert cache.longest(CacheKey("acme", "ab" * 32, "p2"), transcript) is None  # another prompt
    assert cache.longest(ACME, state(50, start=1)) is None  # nothing in common from the first token
    partial = cache.longest(ACME, [*state(60), 999])  # a state that differs after 60 tokens
    assert partial is not None and partial.matched == 60
    assert cache.longest(ACME, [*state(60), 999], min_tokens=61) is None


def test_a_longer_state_replaces_its_prefix_and_the_bytes_are_counted():
    cache = StateCache(10_000_000)
    cache.put(ACME, state(100), b"x" * 1000)
    cache.put(ACME, state(150), b"y" * 1500)  # the next step: the longer one serves both
    assert cache.longest(ACME, state(100)).saved.data == b"y" * 1500
    assert cache.held_bytes == 1500 + 150 * 4
    cache.put(ACME, [7, 7, 7], b"z")
    assert cache.held_bytes == 1500 + 150 * 4 + 1 + 3 * 4


def test_one_tenants_stream_of_states_evicts_its_own_never_anothers_until_the_whole_is_full():
    cache = StateCache(40_000, tenant_share=0.25)  # 10,000 bytes a tenant
    cache.put(GLOBEX, state(10), b"g" * 4000)
    for i in range(50):  # acme floods with distinct states
        cache.put(ACME, state(10, start=1000 * (i + 1)), b"a" * 4000)
    assert cache.longest(GLOBEX, state(10)) is not None  # untouched
    assert cache.evictions >= 48 and cache.held_bytes <= 40_000
    assert cache.longest(ACME, state(10, start=50_000)) is not None  # its newest stays
    assert not cache.put(ACME, state(10), b"a" * 20_000)  # past a tenant's share: never kept
    tiny = StateCache(10_000, tenant_share=1.0)
    tiny.put(GLOBEX, state(10), b"g" * 4000)
    tiny.put(ACME, state(10, start=5), b"a" * 5000)
    tiny.put(ACME, state(10, start=9), b"a" * 5000)  # the whole is full: the largest holder's go first
    assert tiny.longest(GLOBEX, state(10)) is not None and tiny.held_bytes <= 10_000


def test_an_entry_unused_past_its_ttl_is_gone_and_a_use_keeps_it():
    clock = Clock()
    cache = StateCache(10_000_000, ttl_s=60, clock=clock)
    cache.put(ACME, state(100), b"x")
    cache.put(ACME, state(10, start=500), b"y")
    clock.now = 50
    assert cache.longest(ACME, state(100)) is not None  # used at 50: lives to 110
    clock.now = 100
    assert cache.longest(ACME, state(10, start=500)) is None  # unused since 0
    assert cache.longest(ACME, state(100)) is not None
    clock.now = 1000
    assert cache.longest(ACME, state(100)) is None and cache.held_bytes == 0


def test_forgetting_a_state_drops_what_the_tenant_kept_of_it_only():
    cache = StateCache(10_000_000)
    cache.put(ACME, state(100), b"x")
    cache.put(ACME, state(10, start=500), b"y")
    cache.put(GLOBEX, state(100), b"g")
    assert cache.forget(ACME, state(120)) == 1
    assert cache.longest(ACME, state(100)) is None
    assert cache.longest(ACME, state(10, start=500)) is not None and cache.longest(GLOBEX, state(100)) is not None


def test_lookups_of_tenants_with_nothing_kept_leave_nothing_behind():
    cache = StateCache(1_000_000)
    for i in range(1000):  # tags are anyone's to choose
        assert cache.longest(CacheKey(f"t{i}", "ab" * 32, "p1"), state(5)) is None
    assert cache._entries == {} and cache._held == {}


@pytest.mark.parametrize("bad", [{"max_bytes": -1}, {"tenant_share": 0}, {"tenant_share": 1.5}, {"ttl_s": 0}])
def test_a_cache_is_built_with_sensible_bounds(bad):
    with pytest.raises(ValueError):
        StateCache(**{"max_bytes": 1000, **bad})


def test_a_transcript_one_step_longer_replaces_the_shorter_despite_a_seam_at_its_end():
    # The saved state ends with the few tokens after the state ("\n\n" before the question), which
    # the next step's text replaces: within SUPERSEDED tokens of its end, the longer one replaces it.
    cache = StateCache(10_000_000)
    cache.put(ACME, [*state(100), 901, 902], b"x" * 1000)
    cache.put(ACME, [*state(170), 901, 902], b"y" * 1700)
    assert cache.figures()["entries"] == 1 and cache.longest(ACME, state(100)).saved.data == b"y" * 1700
    cache.put(ACME, [*state(50), 777, *state(60, start=50)], b"z")  # differs half way: another state, both kept
    assert cache.figures()["entries"] == 2


def test_forgetting_reaches_only_states_that_share_at_least_the_given_tokens():
    # Every state shares the template's head: forgetting one state must not drop the others.
    cache = StateCache(10_000_000)
    head = state(30, start=1000)
    cache.put(ACME, [*head, *state(80)], b"x")
    cache.put(ACME, [*head, *state(80, start=500)], b"y")
    assert cache.forget(ACME, [*head, *state(90)], min_tokens=len(head) + 64) == 1
    assert cache.longest(ACME, [*head, *state(80, start=500)]) is not None


def test_an_expired_entry_is_gone_even_if_its_tenant_never_comes_back():
    clock = Clock()
    cache = StateCache(10_000_000, ttl_s=60, clock=clock)
    cache.put(GLOBEX, state(100), b"g" * 100)
    clock.now = 61
    cache.longest(ACME, state(5))  # anyone's use sweeps every tenant's expired entries
    assert cache.held_bytes == 0 and cache.figures()["tenants"] == 0


def test_when_the_whole_is_full_a_tie_evicts_the_tenant_that_is_adding():
    cache = StateCache(10_000, tenant_share=0.6)  # 6,000 bytes a tenant: two of them overfill the whole
    cache.put(GLOBEX, state(10), b"g" * 5000)  # 5,040 bytes with its tokens
    cache.put(ACME, state(10, start=100), b"a" * 4900)  # 4,940
    cache.put(ACME, state(10, start=200), b"a" * 60)  # 100 more: 5,040 each, 10,080 in all
    assert cache.longest(GLOBEX, state(10)) is not None and cache.longest(ACME, state(10, start=100)) is None
    figures = cache.figures()
    assert figures["evictions"] == 1 and figures["held_bytes"] <= 10_000 and figures["hits"] == 1


def test_a_save_planned_before_a_forget_is_refused_after_it():
    # A request running when its tenant said x_cache: false must not put the state back.
    cache = StateCache(10_000_000)
    planned = cache.mark()
    cache.forget(ACME, state(100))
    assert cache.put(ACME, state(100), b"x", since=planned) is False and cache.held_bytes == 0
    assert cache.put(GLOBEX, state(100), b"g", since=planned) is True  # another tenant's forget is not its
    assert cache.put(ACME, state(100), b"x", since=cache.mark()) is True  # planned after it


def test_forgets_too_old_to_be_remembered_refuse_every_save_planned_before_them(monkeypatch):
    monkeypatch.setattr("scorer_container.state_cache.MAX_FORGETS", 2)
    cache = StateCache(10_000_000)
    planned = cache.mark()
    for tenant in ("a", "b", "c"):  # "a"'s forget is no longer remembered by name
        cache.forget(CacheKey(tenant, "ab" * 32, "p1"), state(10))
    assert cache.put(CacheKey("a", "ab" * 32, "p1"), state(10), b"x", since=planned) is False
    assert cache.put(GLOBEX, state(10), b"g", since=planned) is False  # conservative: anyone's, before the floor


def test_an_idle_cache_forgets_at_its_ttl_when_swept():
    clock = Clock()
    cache = StateCache(10_000_000, ttl_s=60, clock=clock)
    cache.put(ACME, state(100), b"x")
    clock.now = 59
    cache.sweep()
    assert cache.held_bytes > 0
    clock.now = 61
    cache.sweep()
    assert cache.held_bytes == 0 and cache.figures()["entries"] == 0
