"""What a plan will make the model evaluate, counted from its text before any decoding.

Exact up to the few tokens a tokenizer merges across the seams between state, block and
option text; the final round of a grouped question is estimated from its groups' mean
option cost. No text longer than the context could hold is ever tokenized, so refusing
a huge request is cheap, and a probe that cannot fit the context is refused (413) as
soon as it is counted. The state's tokens a tenant's saved cells hold are restored, not
evaluated (`Cost.cached`): they take cells but are no work.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from scorer_container.errors import ContextOverflow
from scorer_container.llama import LlamaModel
from scorer_container.prefix_tree import context_capacity
from scorer_container.prompts import PromptFormat
from scorer_container.state_cache import common_prefix

if TYPE_CHECKING:
    from scorer_container.probes import Listing, Probe

# No text these tokenizers see averages more than this per token (English runs 3-5), so
# a state this many times longer than the context cannot fit whatever its tokens.
MAX_CHARS_PER_TOKEN = 32


@dataclass(frozen=True)
class Cost:
    """What a request will make the model evaluate, counted before any decoding."""

    tokens: int  # every token the prefix trees will decode, priors and final rounds included (restored ones not)
    rows: int  # logits rows read (letters: one a probe; likelihood: one per option token)
    longest_prompt: int  # the longest single probe prompt: it must fit the context
    probes: int
    complete: bool = True  # False: counting stopped once past the limit (a lower bound, already over it)
    cached: int = 0  # the state's tokens restored from the state cache, in every tree that reads the state
    restored_cells: int = 0  # the saved state's whole length: a restore holds it before cutting it

    @property
    def cells(self) -> int:
        """Tokens the request's trees hold in the context at most: evaluated, restored, and the
        rest of a saved state while it is cut to the shared part."""
        return self.tokens + self.cached + max(0, self.restored_cells - self.cached)

    def units(self, row_cost: float) -> float:
        """The work in tokens' worth: a logits row costs `row_cost` tokens (see budget.py)."""
        return self.tokens + self.rows * row_cost


class TokenCounter:
    """Token counts of one request's texts, kept across the settings `fit` tries."""

    def __init__(self, llama: LlamaModel, prompts: PromptFormat) -> None:
        self.llama = llama
        self.prompts = prompts
        self.capacity = context_capacity(llama)
        self.too_long = MAX_CHARS_PER_TOKEN * self.capacity
        self._counts: dict[str, int] = {}
        self._frames: dict[str, tuple[int, int]] = {}

    def __call__(self, text: str) -> int:
        if len(text) > self.too_long:  # cannot fit whatever its tokens: never spend seconds tokenizing it
            raise ContextOverflow(f"a probe of this request is {len(text)} characters; this model serves at most"
                                  f" {self.capacity} tokens of context: shorten the state, instructions or options")
        if text not in self._counts:
            self._counts[text] = len(self.llama.tokenize(text))
        return self._counts[text]

    def frame(self, framing: str) -> tuple[int, int]:
        """The template's tokens before the block (shared by every probe of a tree, like the
        state) and after it (once per probe)."""
        if framing not in self._frames:
            def prompt(block: str) -> list[int]:
                return self.llama.tokenize(self.prompts.decision_prompt("", block, framing),
                                             add_bos=self.llama.adds_bos)

            head = common_prefix(prompt("a"), prompt("b"))
            self._frames[framing] = head, len(prompt("")) - head
        return self._frames[framing]

    def probe(self, probe: Probe, frame: int) -> tuple[int, int]:
        """(tokens after the state, logits rows) of one probe."""
        if probe.readout == "letters":
            return frame + self(probe.block), 1
        lengths = [self(c) for c in probe.continuations]
        # One row at the answer cue (shared by every option), then one per further option token.
        return frame + self(probe.block) + sum(lengths), 1 + sum(max(0, n - 1) for n in lengths)


@dataclass
class Tally:
    """The running count of one plan: the state's tree, each probe, its prior, the final rounds."""

    state_tokens: int  # the template's head and the state: evaluated once, shared by the tree
    content_free: int  # the head and "N/A": a prior is evaluated alone, in its own tree
    capacity: int
    frame: int
    cached: int = 0  # of the state's tokens, those restored in each tree that reads the state
    restored_cells: int = 0  # the saved state's whole length (Cost.restored_cells)
    tokens: int = 0
    rows: int = 0
    longest: int = 0
    probes: int = 0
    grouped: bool = False  # a final round is a tree of its own: the state again

    def __post_init__(self) -> None:
        self.tokens = self.state_tokens

    def add(self, listing: Listing, counter: TokenCounter, prior: bool,
            uncached: Callable[[Probe], bool]) -> None:
        """One question in one listing: its groups, the final round's estimate, their priors."""
        shapes = [counter.probe(g, self.frame) for g in listing.groups]
        if len(listing.groups) > 1:
            self.grouped = True
            share = len(listing.groups) / len(listing.order)  # the final round lists one winner per group
            shapes.append((self.frame + math.ceil((sum(t for t, _ in shapes) - self.frame * len(shapes)) * share),
                           max(1, math.ceil(sum(r for _, r in shapes) * share))))
        for probe, (size, reads) in zip([*listing.groups, None], shapes, strict=False):
            if self.state_tokens + size > self.capacity:
                raise ContextOverflow(f"a probe of this request needs {self.state_tokens + size} tokens of"
                                      f" context; this model serves at most {self.capacity}: shorten the state or"
                                      " the option descriptions")
            self.longest = max(self.longest, self.state_tokens + size)
            self.tokens, self.rows = self.tokens + size, self.rows + reads
            if prior and (probe is None or uncached(probe)):
                self.tokens, self.rows = self.tokens + self.content_free + size, self.rows + reads
        self.probes += len(shapes)

    def cost(self, complete: bool = True) -> Cost:
        trees = 2 if self.grouped else 1  # a final round reads the state again
        cached = min(self.cached, self.state_tokens) * trees
        tokens = self.tokens + (self.state_tokens if self.grouped else 0) - cached
        return Cost(tokens, self.rows, self.longest, self.probes, complete, cached, self.restored_cells)


def over_budget(cost: Cost, row_cost: float, max_units: float, seconds_per_unit: float) -> str:
    """Why a request is refused, with the figures: what it needs, what a request may take here."""
    work = round(cost.units(row_cost))
    seconds = ""
    if seconds_per_unit > 0:
        seconds = f", about {work * seconds_per_unit:.1f} s on this machine against {max_units * seconds_per_unit:.1f} s"
    if cost.complete:
        need = f"about {work} tokens' worth of evaluation ({cost.tokens} tokens, {cost.rows} logits rows{seconds})"
        split = f"split its questions into {math.ceil(work / max_units)} or more requests"
    else:
        need = f"more than {work} tokens' worth of evaluation{' (' + seconds[2:] + ')' if seconds else ''}"
        split = "split its questions into smaller requests"
    return (f"this request needs {need}; this model takes at most {int(max_units)} per request here: {split},"
            " or use fewer options or shorter descriptions")
