"""Probes: prompts that list a question's options in a given order and end with the answer cue.

A `letters` probe labels its options A, B, C... and is read at the answer position; a
`likelihood` probe lists them by name and is read along each option's own text (its
`continuations`). A probe's content-free prior is keyed by its text (`prior_key`), so two
requests that make the same probe share one prior.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from scorer_container.prompts import ListedOption, question_block
from scorer_container.questions import PreparedQuestion

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
REPLY_HINTS = {
    "letters": "Reply with the letter of the correct option.",
    "likelihood": "Reply with the correct option, exactly as written.",
}


@dataclass(frozen=True)
class Probe:
    """One prompt: the options at `shown` (indices into the question's options), in that order."""

    readout: str
    block: str
    shown: tuple[int, ...]
    continuations: tuple[str, ...] = ()

    def prior_key(self, framing: str = "plain") -> str:
        """The key of this probe's content-free prior, the state framed as `framing`."""
        text = "\x1f".join((framing, self.readout, self.block, *self.continuations))
        return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class Listing:
    """One question in one option order: the probes of its first round (one per group)."""

    order: tuple[int, ...]
    groups: tuple[Probe, ...]


def probe_for(question: PreparedQuestion, shown: Sequence[int], readout: str) -> Probe:
    options = [question.options[i] for i in shown]
    if readout == "letters":
        listed = [ListedOption(LETTERS[k], f"{o.name} — {o.meaning}" if o.meaning else o.name)
                  for k, o in enumerate(options)]
        return Probe(readout, question_block(question.instructions, listed, REPLY_HINTS[readout]), tuple(shown))
    listed = [ListedOption(o.name, o.meaning) for o in options]
    block = question_block(question.instructions, listed, REPLY_HINTS[readout])
    return Probe(readout, block, tuple(shown), tuple(" " + o.name for o in options))
