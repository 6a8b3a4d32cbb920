"""States read once, kept for the next question about them: saved llama.cpp sequences in memory.

A request's state is the longest part of its work, and two uses ask about one state again
and again (an agent's transcript, one tool call longer at every step; a ticket triaged now
and checked later). After a request evaluates its state, the sequence that holds it is saved
(`llama_state_seq_get_data`: milliseconds, against seconds of prefill) under the tokens it
holds; the next request of the same tenant, model file and prompt that starts with those
tokens restores the longest such prefix into its own sequence and evaluates only the rest.

Why saved, and not kept in the context: the context's cells are what live jobs need, and a
kept sequence would hold them; a saved one is bytes, bounded on their own, and a save or a
restore takes milliseconds against seconds of prefill (`make bench-cache` measures both on
the shipped models).

Bounded, per tenant, forgettable:
- at most `max_bytes` in all, each tenant at most `tenant_share` of it: a tenant's stream
  of distinct states evicts its own least recently used entries, never another tenant's,
  until the whole is full, and then the largest holder's go first;
- an entry unused for `ttl_s` is gone (`sweep`, on every use and every health check); nothing
  is ever written to disk;
- `forget` drops what a tenant kept of a state (a request with `x_cache: false`), and a save
  planned before it (`mark`) is refused after it, so a request that was running then cannot
  put the state back.

Entries are keyed by the tokens themselves, never by a hash of the raw state: the state's
text depends on the request's options (the quarantine's framing), and only the evaluated
tokens say what the cells hold.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

SUPERSEDED = 16  # tokens at a saved state's end (a quarter of it at most) a longer one may differ in and still replace it
MAX_FORGETS = 4096  # tenants whose last forget is remembered; a save planned before an older one is refused


@dataclass(frozen=True, slots=True)
class CacheKey:
    """What a saved sequence belongs to: cells of another model file or prompt are other numbers."""

    tenant: str
    model_sha256: str
    prompt_version: str


@dataclass(frozen=True, eq=False, slots=True)
class Saved:
    """One saved sequence: the tokens its cells hold (positions 0..n-1) and llama.cpp's bytes."""

    tokens: np.ndarray = field(repr=False)  # int32
    data: bytes = field(repr=False)  # a state, in a log line or a traceback, only by its size

    def __repr__(self) -> str:
        return f"Saved({len(self.tokens)} tokens, {len(self.data)} bytes)"

    @property
    def size(self) -> int:
        return len(self.data) + self.tokens.nbytes


@dataclass(frozen=True, slots=True)
class Hit:
    saved: Saved
    matched: int  # how many leading tokens of the request the saved cells hold


class StateCache:
    def __init__(self, max_bytes: int, *, tenant_share: float = 0.25, ttl_s: float = 600.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if max_bytes < 0 or not 0 < tenant_share <= 1 or ttl_s <= 0:
            raise ValueError("a state cache has a size of 0 or more, a tenant share in (0, 1] and a positive TTL")
        self.max_bytes = max_bytes
        self.tenant_bytes = int(max_bytes * tenant_share)
        self.ttl_s = ttl_s
        self.clock = clock
        self._lock = threading.Lock()  # requests plan on threads of their own
        # Per tenant, least recently used first: (key, tokens as bytes) -> (entry, last use).
        self._entries: dict[str, OrderedDict[tuple[CacheKey, bytes], tuple[Saved, float]]] = {}
        self._held: dict[str, int] = {}
        self.evictions = 0
        self.hits = self.misses = 0
        # Forgets, numbered: the last of each recent tenant, and below `_forgot_floor` those no
        # longer remembered (a save marked before the floor is refused, whoever it is for).
        self._forgets = 0
        self._forgot: OrderedDict[str, int] = OrderedDict()
        self._forgot_floor = 0

    @property
    def held_bytes(self) -> int:
        return sum(self._held.values())

    def longest(self, key: CacheKey, tokens: Sequence[int], min_tokens: int = 1) -> Hit | None:
        """The saved sequence of this tenant, model and prompt that holds the longest prefix of
        `tokens` (at least `min_tokens` of them), marked as used; None when none does."""
        wanted = np.asarray(tokens, dtype=np.int32)
        best: Hit | None = None
        with self._lock:
            entries = self._live(key.tenant)
            for (entry_key, _raw), (saved, _) in entries.items():
                if entry_key != key:
                    continue
                matched = common_prefix(saved.tokens, wanted)
                if matched >= min_tokens and (best is None or matched > best.matched):
                    best = Hit(saved, matched)
            self.hits, self.misses = self.hits + (best is not None), self.misses + (best is None)
            if best is not None:
                found = (key, best.saved.tokens.tobytes())
                entries[found] = (best.saved, self.clock())
                entries.move_to_end(found)
            self._tidy(key.tenant)
        return best

    def mark(self) -> int:
        """Where the forgets stand now: a save planned now passes this to `put`."""
        with self._lock:
            return self._forgets

    def put(self, key: CacheKey, tokens: Sequence[int], data: bytes, since: int | None = None) -> bool:
        """Keep `data` (a saved sequence holding `tokens`); False when it can never fit the
        tenant's share, or when the tenant forgot a state after `since` (`mark`, taken when the
        save was planned). A saved state the new one holds all of, but for its last `SUPERSEDED`
        tokens at most, is replaced: an agent's transcript one step longer serves every request
        the shorter one served (the few tokens at the old state's end, which the tokenizer may
        have merged with what followed it, are decoded again), and a tenant keeps one entry for
        a growing transcript, not one a step."""
        saved = Saved(np.asarray(tokens, dtype=np.int32), data)
        if saved.size > self.tenant_bytes:
            return False
        with self._lock:
            if since is not None and (since < self._forgot_floor or self._forgot.get(key.tenant, 0) > since):
                return False
            entries = self._live(key.tenant)
            for entry_key, raw in list(entries):
                held = entries[(entry_key, raw)][0]
                slack = min(SUPERSEDED, len(held.tokens) // 4)
                if entry_key == key and common_prefix(held.tokens, saved.tokens) >= len(held.tokens) - slack:
                    self._remove(key.tenant, (entry_key, raw))
            entries[(key, saved.tokens.tobytes())] = (saved, self.clock())
            self._held[key.tenant] = self._held.get(key.tenant, 0) + saved.size
            while self._held.get(key.tenant, 0) > self.tenant_bytes:  # its own share first
                self._evict(key.tenant)
            while self.held_bytes > self.max_bytes:  # then the largest holder's, this tenant's on a tie
                self._evict(max(self._held, key=lambda t: (self._held[t], t == key.tenant)))
        return True

    def forget(self, key: CacheKey, tokens: Sequence[int], min_tokens: int = 1) -> int:
        """Drop what the tenant kept of this state under this model and prompt: every entry that
        shares at least `min_tokens` leading tokens with it (the template's head is everyone's:
        `min_tokens` reaches into the state); how many were dropped."""
        wanted = np.asarray(tokens, dtype=np.int32)
        with self._lock:
            self._forgets += 1
            self._forgot[key.tenant] = self._forgets
            self._forgot.move_to_end(key.tenant)
            while len(self._forgot) > MAX_FORGETS:
                self._forgot_floor = self._forgot.popitem(last=False)[1]
            entries = self._live(key.tenant)
            gone = [found for found in entries
                    if found[0] == key and common_prefix(entries[found][0].tokens, wanted) >= max(1, min_tokens)]
            for found in gone:
                self._remove(key.tenant, found)
            self._tidy(key.tenant)
        return len(gone)

    def figures(self) -> dict[str, int]:
        """What it holds and has done, for /stats and the benchmarks (no tenant named)."""
        with self._lock:
            return {"max_bytes": self.max_bytes, "held_bytes": self.held_bytes, "tenants": len(self._entries),
                    "entries": sum(len(e) for e in self._entries.values()), "hits": self.hits, "misses": self.misses,
                    "evictions": self.evictions}

    def sweep(self) -> None:
        """Drop every tenant's entries unused for the TTL (the server calls it on each health
        check, so an idle instance forgets too)."""
        with self._lock:
            self._expire()

    def _live(self, tenant: str) -> OrderedDict[tuple[CacheKey, bytes], tuple[Saved, float]]:
        """The tenant's entries, every tenant's expired ones dropped first (the caller holds the lock)."""
        self._expire()
        self._held.setdefault(tenant, 0)
        return self._entries.setdefault(tenant, OrderedDict())

    def _expire(self) -> None:
        oldest = self.clock() - self.ttl_s
        for tenant in list(self._entries):
            held = self._entries[tenant]
            while held and next(iter(held.values()))[1] < oldest:  # least recently used first
                self._remove(tenant, next(iter(held)))
            self._tidy(tenant)

    def _tidy(self, tenant: str) -> None:
        """A tenant with nothing kept is forgotten: tags are anyone's to choose."""
        if not self._entries.get(tenant):
            self._entries.pop(tenant, None)
            self._held.pop(tenant, None)

    def _evict(self, tenant: str) -> None:
        self._remove(tenant, next(iter(self._entries[tenant])))
        self.evictions += 1
        self._tidy(tenant)

    def _remove(self, tenant: str, found: tuple[CacheKey, bytes]) -> None:
        saved, _ = self._entries[tenant].pop(found)
        self._held[tenant] -= saved.size


def common_prefix(a: Sequence[int] | np.ndarray, b: Sequence[int] | np.ndarray) -> int:
    """How many leading tokens `a` and `b` share."""
    a, b = np.asarray(a), np.asarray(b)
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n
