"""The state is untrusted text: what the model is shown of it, and what it looks like.

Anyone can write a decision's state (a customer's message, a post, an agent's
transcript), so whoever writes it writes to the model. Two things happen here, before
any prompt is rendered, on every request:

- `for_model` makes the text the model reads: characters a person cannot see (zero-width
  and bidirectional controls, tag characters, other format characters, C0/C1 controls
  but tab and newline) are removed; text that spells one of the model's control tokens
  (`<start_of_turn>`, `<|im_start|>`: the tokenizer would read them as the real turn
  markers, so a state could close the user turn and open a fake one) gets a space after
  its first character; the framing's fence characters are replaced by look-alikes, so a
  state cannot close its fence. The caller's state itself is never changed: the gateway
  hashes the original, and the answer lists what was neutralised.
- `patterns` are cheap checks for the usual shapes of planted instructions (orders to
  ignore instructions, text that addresses the automated reader or dictates the answer,
  fake turns, chat-template tokens, hidden characters). They were written from the
  shapes attacks take in the literature, before the attack set of `make eval` existed,
  and are measured there (precision and recall on held-out attack forms).
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Collection
from dataclasses import dataclass

# Fence characters of the spotlight framing (prompts.py); a state never contains them.
FENCE_OPEN, FENCE_CLOSE = "⟦", "⟧"
_FENCE_LOOKALIKES = str.maketrans({FENCE_OPEN: "[", FENCE_CLOSE: "]"})
# The datamark framing joins the state's words with this mark; a state's own marks are
# replaced, so the model can trust that every mark it sees was put there by the scorer.
DATAMARK = "ˆ"
_DATAMARK_LOOKALIKE = str.maketrans({DATAMARK: "^"})

# Characters that change how text looks or is ordered without being seen: zero-width
# spaces and joiners, word joiner and invisible operators, bidirectional embeddings,
# overrides and isolates, the BOM, tag characters (all category Cf), and controls.
_KEPT_CONTROLS = {"\n", "\t"}
# The ones whose presence alone is suspicious: hiding text, or reordering it.
_HIDING = re.compile("[\u200b\u2060-\u2064\ufeff\u202a-\u202e\u2066-\u2069\U000e0000-\U000e007f]")
# A control token as text: tags in angle or square brackets (the shapes every chat
# template in use has), checked against the model's own list.
_TOKEN_SHAPE = re.compile(r"<[^<>\s]{1,48}>|\[[^\[\]\s]{1,48}\]")


@dataclass(frozen=True)
class Shown:
    """The state as the model reads it, and what was changed to make it so."""

    text: str
    neutralised: tuple[str, ...]


def for_model(text: str, control_tokens: Collection[str] = (), framing: str = "plain",
              quarantine: bool = False) -> Shown:
    """The text the model reads of `text` (see the module docstring); with `quarantine`, the
    passages the pattern checks flag are replaced by a marker (`quarantined`)."""
    changed = []
    kept = [ch in _KEPT_CONTROLS or unicodedata.category(ch) not in ("Cf", "Cc") for ch in text]
    cleaned = "".join(ch for ch, keep in zip(text, kept, strict=True) if keep)
    if any(not keep and ch != "\r" for ch, keep in zip(text, kept, strict=True)):  # a CR alone hides nothing
        changed.append("invisible_characters")
    neutral = without_control_tokens(cleaned, control_tokens)
    if neutral != cleaned:
        changed.append("control_tokens")
    cleaned = neutral
    if quarantine:
        kept_text = quarantined(cleaned)
        if kept_text != cleaned:
            changed.append("quarantined_passages")
        cleaned = kept_text
    if framing != "plain":
        fenced = cleaned.translate(_FENCE_LOOKALIKES).translate(_DATAMARK_LOOKALIKE)
        if fenced != cleaned:
            changed.append("fence_characters")
        cleaned = fenced
    return Shown(cleaned, tuple(changed))


def without_control_tokens(text: str, control_tokens: Collection[str]) -> str:
    """`text` with every spelling of one of `control_tokens` broken (a space after its first
    character), so the tokenizer reads it as text, never as the token itself."""
    tokens = frozenset(control_tokens)
    if not tokens:
        return text
    text = _TOKEN_SHAPE.sub(lambda m: _break(m.group()) if m.group() in tokens else m.group(), text)
    for token in _other_shapes(tokens):  # the rare control token of another shape
        if token in text:
            text = text.replace(token, _break(token))
    return text


@functools.lru_cache(maxsize=8)
def _other_shapes(tokens: frozenset[str]) -> tuple[str, ...]:
    """The control tokens `_TOKEN_SHAPE` does not find (a model's list is fixed: computed once)."""
    return tuple(t for t in tokens if len(t) > 1 and not _TOKEN_SHAPE.fullmatch(t))


def _break(token: str) -> str:
    return token[0] + " " + token[1:]


# -- pattern checks -------------------------------------------------------------------

_WHO = (r"(?:ai|a\.i\.|assistant|chat ?bot|bot|(?:large )?language model|llm|gpt|model|classifier|moderator|grader|"
        r"evaluator|automated (?:system|reader|reviewer|review|moderator|classifier|process|agent|triage)|"
        r"system (?:that|which) reads?|whoever (?:is )?read(?:s|ing) this)")
_ORDER = (r"(?:must|should|have to|need to|are to|are required to|will|shall|answer|respond|reply|output|return|"
          r"choose|select|pick|classify|label|mark|rate|score|set|flag|approve|route)")
_LABEL = r"(?:answer|label|option|choice|classification|category|decision|output|response|verdict|result|rating|score)"
_FAMILIES: tuple[tuple[str, float, re.Pattern[str]], ...] = (
    # "Ignore all previous instructions" and its cousins, in the languages attacks use most.
    ("ignore_instructions", 0.9, re.compile(
        r"\b(?:ignore|disregard|forget|override|bypass|skip|do not follow|don't follow)\b[^.\n]{0,40}?"
        r"\b(?:instructions?|rules?|prompts?|directions?|guidelines?|task|criteria|system message|policy)\b"
        r"|\b(?:ignor(?:ez|e|a|iere|ieren)|olvida|oublie[zr]?|vergiss)\b[^.\n]{0,40}?"
        r"\b(?:instructions?|instrucciones|anweisungen|r[eè]gles|reglas|regeln|consignes)\b", re.I)),
    # Text spoken to the machine that reads it: "Note to the AI: you must answer ...".
    ("addresses_the_reader", 0.6, re.compile(
        rf"\b(?:dear|hey|attention|note (?:to|for)|message (?:to|for)|instructions? (?:to|for)|to the|for the)\s+"
        rf"(?:the\s+)?{_WHO}\b|\b(?:as an?|you are an?|you,? the)\s+{_WHO}\b|\b{_WHO}[,:]?\s+(?:you\s+)?{_ORDER}\b",
        re.I)),
    # The answer given in advance: "the correct answer is ...", "classify this as ...".
    ("dictates_answer", 0.6, re.compile(
        rf"\b(?:the\s+)?(?:correct|right|true|real|only valid|expected|required)\s+{_LABEL}\s*(?:is|=|:|will be)"
        rf"|\b(?:you must|you should|always|only)\s+(?:answer|respond|reply|output|return|choose|select|pick|"
        rf"classify|label|mark|rate|score)\b"
        rf"|\b(?:classify|label|mark|rate|score|route|flag)\s+(?:this|it|the (?:text|message|ticket|post|request))"
        rf"\s+(?:as|with|to)\b"
        rf"|\b(?:la (?:bonne|vraie) r[ée]ponse|la respuesta correcta|die (?:richtige|korrekte) antwort)\b", re.I)),
    # Turns that are not the caller's: a system or assistant speaking inside the state.
    ("role_marker", 0.35, re.compile(
        r"(?:^|\n)\s*(?:#+\s*)?\[?(?:system|developer|sys)\]?\s*(?:prompt|message)?\s*[:>\]]"
        r"|<\s*/?\s*(?:system|assistant|developer)\s*>", re.I)),
    # The tokens of chat templates, whatever the model: someone is forging turns.
    ("chat_template_token", 0.9, re.compile(
        r"<\s*\|?\s*(?:im_start|im_end|start_of_turn|end_of_turn|eot_id|start_header_id|end_header_id|"
        r"endoftext|system|user|assistant)\s*\|?\s*>|\[/?INST\]|<<\s*/?SYS\s*>>", re.I)),
    # Markup that frames instructions: <instructions>, "### Instructions for the classifier".
    ("instruction_markup", 0.5, re.compile(
        r"<\s*/?\s*(?:instructions?|prompt|admin|override|directive|rules?)\s*>"
        rf"|(?:^|\n)\s*#+\s*[^\n]{{0,30}}\b(?:instructions?|override|directive)\b[^\n]{{0,30}}{_WHO}?", re.I)),
)
_HIDDEN_WEIGHT = 0.5


def patterns(text: str) -> tuple[float, tuple[str, ...]]:
    """(score in [0, 1], names of the checks that matched) for a state's text.

    Run on the text with its invisible characters removed (so hidden words are read as
    the model would read them), plus a check for hiding itself. Each family has a weight
    (how rarely it appears in honest text, as measured on the clean labelled set); the
    score is 1 - the product of (1 - weight) over the families that matched."""
    visible = "".join(ch for ch in text if unicodedata.category(ch) not in ("Cf",))
    matched = [(name, weight) for name, weight, pattern in _FAMILIES if pattern.search(visible)]
    if len(_HIDING.findall(text)) >= 3 or re.search("[\u202d\u202e\U000e0000-\U000e007f]", text):
        matched.append(("hidden_characters", _HIDDEN_WEIGHT))
    clear = 1.0
    for _, weight in matched:
        clear *= 1 - weight
    return 1 - clear, tuple(name for name, _ in matched)


# -- quarantine -------------------------------------------------------------------------

# What stands where a flagged passage was: the model reads that something was there.
QUARANTINE_MARK = "[a passage addressed to the automated reader was removed here]"
# A flagged paragraph this short goes whole (planted text is rarely one sentence: "Note to
# the reviewer: ... Choose X."); in a longer one, only the flagged sentences go.
_WHOLE_PARAGRAPH = 400
_PARAGRAPHS = re.compile(r"(\n[ \t]*\n)")
_SENTENCES = re.compile(r"(?<=[.!?])\s+|\n")
# The families a passage is removed for: those that are almost never in honest text
# (role markers and hidden characters only add to the score).
_QUARANTINED = tuple(pattern for _, weight, pattern in _FAMILIES if weight >= 0.5)


def _flagged(text: str) -> bool:
    return any(pattern.search(text) for pattern in _QUARANTINED)


def quarantined(text: str) -> str:
    """`text` with every paragraph (or, in a long paragraph, every sentence) that the strong
    pattern checks flag replaced by `QUARANTINE_MARK`."""
    if not _flagged(text):
        return text
    parts = _PARAGRAPHS.split(text)  # paragraphs at even indices, their separators between
    for i in range(0, len(parts), 2):
        paragraph = parts[i]
        if not _flagged(paragraph):
            continue
        if len(paragraph) <= _WHOLE_PARAGRAPH:
            parts[i] = QUARANTINE_MARK
            continue
        pieces = _SENTENCES.split(paragraph)
        seams = _SENTENCES.findall(paragraph)
        kept = [QUARANTINE_MARK if _flagged(piece) else piece for piece in pieces]
        parts[i] = "".join(piece + (seams[k] if k < len(seams) else "") for k, piece in enumerate(kept))
    return "".join(parts)
