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
  and are measured there (precision and recall on held-out attack forms). One of them
  reads the request's own options (`names_an_answer`): planted text has to name the
  answer it wants, and the scorer knows every answer a question allows. The checks read
  the text folded (`checked_text`: compatibility forms, every kind of space, accents and
  letters of other scripts drawn like Latin ones), so "ｉｇｎｏｒｅ", "ignore\\u00a0all" and
  "іgnоrе" in Cyrillic are read as "ignore"; the model still reads the text as it was.

All of this runs before the engine knows whether the request fits, so its work is linear
in the state, and a JSON state is walked without recursion under caps checked as it is
built (`MAX_JSON_DEPTH`, the keys and values that could fit `max_chars`, and an output
that does not outgrow its input): a state past one is refused (413) as soon as it is met.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass
from itertools import repeat
from typing import Any

from scorer_container.errors import ContextOverflow, PayloadTooLarge
from systemone.json_text import as_text
from systemone.limits import MAX_JSON_DEPTH

# Fence characters of the spotlight framing (prompts.py); a state never contains them.
FENCE_OPEN, FENCE_CLOSE = "⟦", "⟧"
_FENCE_LOOKALIKES = str.maketrans({FENCE_OPEN: "[", FENCE_CLOSE: "]"})
# The datamark framing joins the state's words with this mark; a state's own marks are
# replaced, so the model can trust that every mark it sees was put there by the scorer.
DATAMARK = "ˆ"
_DATAMARK_LOOKALIKE = str.maketrans({DATAMARK: "^"})

# A control token as text: tags in angle or square brackets (the shapes every chat
# template in use has), checked against the model's own list.
_TOKEN_SHAPE = re.compile(r"<[^<>\s]{1,48}>|\[[^\[\]\s]{1,48}\]")


@dataclass(frozen=True)
class Shown:
    """The state as the model reads it, and what was changed to make it so."""

    text: str
    neutralised: tuple[str, ...]


def for_model(state: Any, control_tokens: Collection[str] = (), framing: str = "plain",
              quarantine: bool = False, answers: frozenset[str] = frozenset(),
              max_chars: int | None = None) -> Shown:
    """The text the model reads of `state` (see the module docstring): a string, or a JSON
    value rendered as canonical JSON. With `quarantine`, the passages the pattern checks flag
    (given the request's option wordings, `answers`) are removed (`quarantined`);
    in a JSON value each string (key or value) is quarantined on its own, before rendering,
    where its lines and quotes are still what they say. `max_chars`: the longest state text
    the model could read (characters a token at most, times its context); a JSON state with
    more keys and values than fit in it is refused while it is walked (`_cleaned_json`).

    The order matters: characters are removed first (a control token split by a zero-width
    space is whole again after), the fence look-alikes go in before control tokens are
    broken (a look-alike must not complete one: "⟦INST⟧" becomes "[INST]"), and control
    tokens are broken last but for the quarantine, which only removes text."""
    changed = set()
    answers = as_answers(answers)
    structured = not isinstance(state, str)
    if structured:
        walk = _Walk(answers, quarantine, _max_nodes(max_chars))
        state = as_text(_cleaned_json(state, walk))
        if walk.changed:
            changed.add("quarantined_passages")
    cleaned, removed = visible_text(state)
    if removed:
        changed.add("invisible_characters")
    if framing != "plain":
        fenced = cleaned.translate(_FENCE_LOOKALIKES).translate(_DATAMARK_LOOKALIKE)
        if fenced != cleaned:
            changed.add("fence_characters")
        cleaned = fenced
    neutral = without_control_tokens(cleaned, control_tokens)
    if neutral != cleaned:
        changed.add("control_tokens")
    cleaned = neutral
    if quarantine and not structured:
        kept_text = quarantined(cleaned, answers)
        if kept_text != cleaned:
            changed.add("quarantined_passages")
        cleaned = kept_text
    return Shown(cleaned, tuple(c for c in NEUTRALISED if c in changed))


# What `Shown.neutralised` can say, in this order.
NEUTRALISED = ("invisible_characters", "fence_characters", "control_tokens", "quarantined_passages")


# -- a JSON state, walked under caps --------------------------------------------------------
# The engine cleans the state to count its tokens, so this runs before the request is
# admitted: the work is linear in the state and stops at the first cap it passes.
#
# Every key and value takes at least two characters of canonical JSON whatever the framing
# (itself, or its quotes or brackets, and a comma or colon; the datamark only joins spaces
# inside strings), so a state of more than max_chars // 2 + 1 of them renders longer than
# max_chars and could never fit. When the caller does not say, max_chars is that of the
# longest context in use (131,072 tokens) at 32 characters a token.
_DEFAULT_MAX_CHARS = 32 * 131_072
# A renamed key gets " (n)" (`_KeyNames`): the output may pass the input by this much a key
# (n below 10^8), never more; a renaming that grows the output faster is refused at once.
_SUFFIX_ROOM = 12


def _max_nodes(max_chars: int | None) -> int:
    return (_DEFAULT_MAX_CHARS if max_chars is None else max_chars) // 2 + 1


def _cleaned_json(state: Any, walk: _Walk) -> Any:
    """A copy of the JSON value `state` with every string in it (keys too) as `walk.text` makes
    it, built without recursion (each frame of the stack is an object or array being filled:
    the items it has still to read, its copy, and its keys' names), under `walk`'s caps."""
    top: list[Any] = []
    stack: list[tuple[Iterator[tuple[Any, Any]], Any, _KeyNames | None]] = [(iter([(None, state)]), top, None)]
    while stack:
        items, copy, names = stack[-1]
        step = next(items, None)
        if step is None:
            stack.pop()
            continue
        key, value = step
        walk.node()
        item, children = _opened(value, walk)
        if names is None:
            copy.append(item)
        else:
            copy[walk.key(key, names)] = item
        if children is not None:
            walk.nested(len(stack))
            stack.append((children, item, _KeyNames(item) if isinstance(item, dict) else None))
    return top[0]


def _opened(value: Any, walk: _Walk) -> tuple[Any, Iterator[tuple[Any, Any]] | None]:
    """(`value`'s copy, its items still to read): an empty object or array and its items, a
    string as the model reads it, any other value as it is."""
    if isinstance(value, dict):
        return {}, iter(value.items())
    if isinstance(value, list):
        return [], zip(repeat(None), value)
    if isinstance(value, str):
        return walk.text(value), None
    return value, None


@dataclass
class _Walk:
    """What the walk of one JSON state has met so far, against its caps (`_cleaned_json`)."""

    answers: Answers
    quarantine: bool
    max_nodes: int
    nodes: int = 0
    keys: int = 0
    chars_in: int = 0
    chars_out: int = 0
    changed: bool = False

    def node(self) -> None:
        self.nodes += 1
        if self.nodes > self.max_nodes:
            raise ContextOverflow(f"the state holds more than {self.max_nodes} keys and values, more than this"
                                  " model's context could hold: shorten the state")

    def nested(self, depth: int) -> None:
        if depth > MAX_JSON_DEPTH:
            raise PayloadTooLarge(f"the state nests arrays and objects {depth} levels deep; at most"
                                  f" {MAX_JSON_DEPTH} are accepted")

    def text(self, value: str) -> str:
        """A string of the state (a key or a value) as the model reads it."""
        kept = _quarantined_string(value, self.answers) if self.quarantine else value
        self.chars_in += len(value)
        self._wrote(len(kept), kept != value)
        return kept

    def key(self, key: Any, names: _KeyNames) -> Any:
        """A key as it is written: as the model reads it, then unique in its object."""
        if not isinstance(key, str):
            return key
        self.node()
        self.keys += 1
        kept = self.text(key)
        name = names.unique(kept)
        if len(name) != len(kept):
            self._wrote(len(name) - len(kept), True)
        return name

    def _wrote(self, chars: int, changed: bool) -> None:
        self.chars_out += chars
        self.changed = self.changed or changed
        if self.chars_out > self.chars_in + _SUFFIX_ROOM * self.keys:
            raise PayloadTooLarge(f"the state's text came out {self.chars_out} characters long from"
                                  f" {self.chars_in}; at most {_SUFFIX_ROOM} more a key are allowed")


class _KeyNames:
    """The keys of one object as they are written. A key that comes out the same as one written
    before (two keys quarantined alike, or a key that is already another's new name) gets the
    first free " (n)" after it; n counts up per name, and a candidate is passed over only when
    a key really has it (a key has one name and number at most), so the renaming is linear in
    the object. Appending spaces until the name was free was cubic: 8,700 keys, 35 s."""

    def __init__(self, written: dict[str, Any]) -> None:
        self.written = written
        self.next_number: dict[str, int] = {}

    def unique(self, name: str) -> str:
        if name not in self.written:
            return name
        number = self.next_number.get(name, 2)
        while f"{name} ({number})" in self.written:
            number += 1
        self.next_number[name] = number + 1
        return f"{name} ({number})"


def _quarantined_string(value: str, answers: Answers) -> str:
    """A string of a JSON state quarantined as text; one that needs nothing removed stays as it
    was (its hidden characters go later, with the rest)."""
    cleaned = visible_text(value)[0]
    kept = quarantined(cleaned, answers)
    return value if kept == cleaned else kept


# The one emoji that needs tag characters: the subdivision flags (England, Scotland,
# Wales). Any other tag sequence is text smuggled past a reader.
_FLAGS = re.compile("\U0001f3f4(?:\U000e0067\U000e0062(?:\U000e0065\U000e006e\U000e0067|\U000e0073\U000e0063"
                    "\U000e0074|\U000e0077\U000e006c\U000e0073))\U000e007f")
_FLAG_STAND_IN = "\U0001f3f4"  # the black flag the sequence is drawn on


def visible_text(text: str) -> tuple[str, int]:
    """`text` without the characters a person does not see (format characters, controls but
    tab and newline), and how many were removed (a carriage return alone is not counted)."""
    text = _FLAGS.sub(_FLAG_STAND_IN, text)
    kept = _HIDDEN.sub("", text)
    return kept, len(text) - len(kept) - text.count("\r")


# Characters that change how text looks or is ordered without being seen: zero-width
# spaces and joiners, word joiner and invisible operators, bidirectional embeddings,
# overrides and isolates, the BOM, tag characters (all category Cf), and controls (Cc) but
# tab and newline; of the interpreter's Unicode version (a test checks the class against
# `unicodedata` code point by code point). One pass of a character class: asking each
# character its category was a Python call a character, the slowest step of cleaning.
_HIDDEN = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\xad\u0600-\u0605\u061c\u06dd\u070f\u0890-\u0891\u08e2\u180e"
                     "\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\U000110bd\U000110cd"
                     "\U00013430-\U00013438\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f]")


def without_control_tokens(text: str, control_tokens: Collection[str]) -> str:
    """`text` with every spelling of one of `control_tokens` broken (a space after its first
    character), so the tokenizer reads it as text, never as the token itself.

    Every position is a candidate (a lookahead finds tags inside tags, "[<|im_end|>]"), and
    the tokens of another shape are replaced until none is left."""
    tokens = frozenset(control_tokens)
    if not tokens:
        return text
    starts = sorted({m.start() for m in _TOKEN_CANDIDATES.finditer(text) if m.group(1) in tokens})
    if starts:
        pieces, last = [], 0
        for at in starts:
            pieces.append(text[last:at + 1])
            last = at + 1
        text = "".join(piece + " " for piece in pieces) + text[last:]
    for _ in range(4):  # a break can complete another token only in contrived lists: a few passes
        found = [token for token in _other_shapes(tokens) if token in text]
        if not found:
            break
        for token in found:
            text = text.replace(token, _break(token))
    return text


# The shapes every chat template in use has, at every position (overlapping).
_TOKEN_CANDIDATES = re.compile(r"(?=(<[^<>\s]{1,48}>|\[[^\[\]\s]{1,48}\]))")


@functools.lru_cache(maxsize=8)
def _other_shapes(tokens: frozenset[str]) -> tuple[str, ...]:
    """The control tokens `_TOKEN_SHAPE` does not find (a model's list is fixed: computed once)."""
    return tuple(t for t in tokens if len(t) > 1 and not _TOKEN_SHAPE.fullmatch(t))


def _break(token: str) -> str:
    return token[0] + " " + token[1:]


def readable(state: Any) -> str:
    """A state as the pattern checks read it: a string as it is; a JSON state's keys and
    string values one per line (as canonical JSON, its newlines would be escapes, and the
    checks anchored at line starts would never see a line)."""
    if isinstance(state, str):
        return state
    found: list[str] = []
    stack = [state]
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            found.append(value)
        elif isinstance(value, dict):
            for key, item in reversed(list(value.items())):
                stack.extend((item, key))
        elif isinstance(value, list):
            stack.extend(reversed(value))
    return "\n".join(found)


# -- pattern checks -------------------------------------------------------------------
# Every quantifier is bounded and no two adjacent ones can match the same characters, so
# a check is linear in the text (a state can be 100k+ characters of whitespace).

# The checks read the text folded (`checked_text`), so that ordinary Unicode does not hide
# from them a phrase that a person and the model read plainly: compatibility forms
# (fullwidth "ｉｇｎｏｒｅ", mathematical bold, ligatures) by NFKC, accents dropped
# ("ignoré"), every space (and the blank braille cell) a space and a line or paragraph
# separator a newline (the checks match spaces, tabs and newlines), and the Cyrillic, Greek
# and other letters drawn like Latin ones (the common ones of Unicode's confusables) Latin:
# "іgnоrе" in Cyrillic. Honest Russian or Greek text folds to a mix of Latin and its own
# letters that spells no phrase the checks look for: those need letters no look-alike
# stands for (g, n, r...), and a whole English phrase besides.
_LOOKALIKES = str.maketrans(
    "аеорсухіјѕԁԛԝһӏү" "АВЕКМНОРСТУХІЈЅԀԚԜҺӀҮ"  # Cyrillic
    "αεικνορτυχγω" "ΑΒΕΖΗΙΚΜΝΟΡΤΥΧ"  # Greek
    "ıɩɑօսոհ",  # Latin and Armenian
    "aeopcyxijsdqwhly" "ABEKMHOPCTYXIJSDQWHIY"
    "aeikvoptuxyw" "ABEZHIKMNOPTYX"
    "iiaounh")
_SPACES_FOLDED = {ord(c): " " for c in "\t\u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009"
                  "\u200a\u202f\u205f\u3000\u2800"} | {0x2028: "\n", 0x2029: "\n"}
_CHECK_FOLDS = _LOOKALIKES | _SPACES_FOLDED
_ACCENTS = re.compile("[\u0300-\u036f]")  # the combining diacritical marks


def checked_text(text: str) -> str:
    """`text` as the pattern checks read it (see `_CHECK_FOLDS`). Never what the model reads:
    lengths and positions differ, so a check folds the passage it decides on (the quarantine
    decides per paragraph and sentence, and removes the passage as it was written)."""
    bare = _ACCENTS.sub("", unicodedata.normalize("NFKD", text))
    return unicodedata.normalize("NFC", bare).translate(_CHECK_FOLDS)


# Who planted text speaks to. Broad after an explicit address ("note to the model"); the
# strict list alone, so that "the model will arrive" or "your assistant should call" pass.
_STRICT_WHO = (r"(?:ai|a\.i\.|llm|(?:large )?language model|chat ?bot|ai assistant|ai model|classifier|"
               r"automated (?:system|reader|reviewer|review|moderator|classifier|process|agent|triage|grader)|"
               r"(?:system|model|program) (?:that|which) reads? this|whoever (?:is )?read(?:s|ing) this)")
_WHO = rf"(?:{_STRICT_WHO}|assistant|bot|model|moderator|grader|evaluator|reviewer system)"
_ORDER = (r"(?:must|should|have to|need to|are to|are required to|shall|answer|respond|reply|output|return|"
          r"choose|select|pick|classify|label|rate|score|approve|ignore)")
_LABEL = r"(?:answer|label|option|choice|classification|category|verdict)"
# The same order in French, Spanish and German: "ignorez les consignes précédentes".
_FOREIGN_VERB = r"(?:ignorez|ignore[sz]?|ignora|ignoriere|ignorieren|olvida|olvide|oubliez|oublie|vergiss|vergessen sie)"
_FOREIGN_ARTICLE = r"(?:toutes|tous|todas|todos|alle|les|las|los|die|tus|vos|deine|ihre|sus|ses)"
_FOREIGN_QUALIFIER = (r"(?:pr[ée]c[ée]dentes?|anteriores?|previas?|vorherigen|bisherigen|obigen|ci-dessus|"
                      r"originales?|urspr[üu]nglichen)")
_FOREIGN_NOUN = r"(?:instructions?|instrucciones|indicaciones|anweisungen|vorgaben|consignes|r[eè]gles|reglas|regeln)"
_FAMILIES: tuple[tuple[str, float, re.Pattern[str]], ...] = (
    # "Ignore all previous instructions" and its cousins, in the languages attacks use most:
    # the instructions someone else gave ("previous", "your", "system"...), not "ignore the
    # instructions I sent yesterday".
    ("ignore_instructions", 0.9, re.compile(
        rf"\b(?:ignore|disregard|forget|override|do not follow|don't follow)(?:[ \t]{{1,4}}(?:all|any|the))?[ \t]{{1,4}}"
        rf"(?:previous|prior|above|earlier|preceding|foregoing|original|system|your|other|existing|given)\b"
        rf"(?:[ \t]{{1,4}}[\w'’-]{{1,20}}){{0,2}}?[ \t]{{1,4}}"
        rf"(?:instructions?|rules?|prompts?|directions?|guidelines?|questions?|tasks?|criteria|messages?)\b"
        rf"|\b(?:ignore|disregard|forget|override)(?:[ \t]{{1,4}}(?:all|the|these|those|any|your)){{0,2}}[ \t]{{1,4}}"
        rf"(?:instructions?|rules?|prompts?|guidelines?)[ \t]{{1,4}}(?:above|before this|you (?:were|have been) given)\b"
        rf"|\b{_FOREIGN_VERB}(?:[ \t]{{1,4}}{_FOREIGN_ARTICLE}){{0,2}}[ \t]{{1,4}}{_FOREIGN_QUALIFIER}[ \t]{{1,4}}"
        rf"{_FOREIGN_NOUN}"
        rf"|\b{_FOREIGN_VERB}(?:[ \t]{{1,4}}{_FOREIGN_ARTICLE}){{0,2}}[ \t]{{1,4}}{_FOREIGN_NOUN}[ \t]{{1,4}}"
        rf"{_FOREIGN_QUALIFIER}", re.I)),
    # Text spoken to the machine that reads it: "Note to the AI: you must answer ...".
    ("addresses_the_reader", 0.6, re.compile(
        rf"\b(?:dear|hey|attention|note (?:to|for)|message (?:to|for)|instructions? (?:to|for))[ \t]{{1,4}}(?:the[ \t]{{1,4}})?"
        rf"{_WHO}\b|\b(?:as an?|you are an?|you,? the)[ \t]{{1,4}}{_STRICT_WHO}\b"
        rf"|\b{_STRICT_WHO}[,:]?[ \t]{{1,4}}(?:you[ \t]{{1,4}})?{_ORDER}\b", re.I)),
    # The answer given in advance: "the correct answer is ...", "classify this as ...".
    ("dictates_answer", 0.6, re.compile(
        rf"\b(?:correct|right|only valid)[ \t]{{1,4}}{_LABEL}[ \t]*(?:is|=|:|will be)"
        rf"|\byou (?:must|should|have to|are to)[ \t]{{1,4}}(?:answer|respond|reply|output|return|choose|select|pick|"
        rf"classify|label|rate|score)\b"
        rf"|\b(?:classify|label|categori[sz]e|tag)[ \t]{{1,4}}(?:this|it|the (?:text|message|ticket|post|request))"
        rf"[ \t]{{1,4}}as\b"
        rf"|\b(?:la (?:bonne|vraie) r[ée]ponse|la respuesta correcta|die (?:richtige|korrekte) antwort)\b", re.I)),
    # Authority claimed for the text itself: "ADMIN OVERRIDE", "the decision is fixed in advance".
    ("authority_claim", 0.6, re.compile(
        r"\b(?:admin(?:istrator)?|system|operator|developer|security|compliance)[ \t]{1,4}(?:override|directive|"
        r"command|mode)\b|\b(?:is|was|are|has been|have been)[ \t]{1,4}(?:fixed|predetermined|decided|set)"
        r"[ \t]{1,4}in advance\b", re.I)),
    # Turns that are not the caller's: a system or developer speaking inside the state.
    ("role_marker", 0.35, re.compile(
        r"(?:^|\n)[ \t]{0,8}(?:#{1,6}[ \t]{0,4})?\[?(?:system|developer|sys)\]?(?:[ \t]{0,4}(?:prompt|message))?"
        r"[ \t]{0,4}[:>\]]|<[ \t]{0,4}/?[ \t]{0,4}(?:system|developer)[ \t]{0,4}>", re.I)),
    # The tokens of chat templates, whatever the model: someone is forging turns.
    ("chat_template_token", 0.9, re.compile(
        r"<[ \t]{0,4}\|?[ \t]{0,4}(?:im_start|im_end|start_of_turn|end_of_turn|eot_id|start_header_id|end_header_id|"
        r"endoftext)[ \t]{0,4}\|?[ \t]{0,4}>|<\|(?:system|user|assistant)\|>|\[/?INST\]|<<[ \t]{0,4}/?SYS[ \t]{0,4}>>",
        re.I)),
    # Markup that frames instructions: <instructions>, "### Instructions for the classifier".
    ("instruction_markup", 0.5, re.compile(
        r"<[ \t]{0,4}/?[ \t]{0,4}(?:instructions?|prompt|admin|override|directive)[ \t]{0,4}>"
        rf"|(?:^|\n)[ \t]{{0,8}}#{{1,6}}[^\n]{{0,30}}\b(?:instructions?|override|directive)\b[^\n]{{0,30}}"
        rf"\b(?:{_WHO})\b", re.I)),
)
_HIDDEN_WEIGHT = 0.5
_NAMES_AN_ANSWER_WEIGHT = 0.6


# The answer named in advance, in the words of the request's own options: "the answer is
# 'billing'.", "choose 'billing'." A fixed list cannot know the options; the scorer does.
# Each shape is narrow on purpose, because honest text mentions options all the time:
# - the named option ends its clause ("choose 'billing' in Settings" is a how-to, "the
#   answer is no for refunds" a policy), and a quoted one is closed right after;
# - a statement names the answer itself: "the risk level is high" is content, "the
#   correct level is high." is not; a bare "the answer is" takes yes or no only quoted
#   ("the short answer is no, sorry" is a person talking);
# - an order always quotes the option ("give a refund." is a customer's request).
_SPACE = r"[^\S\n]"
_ANSWER_NOUN = r"(?:answer|outcome|verdict|label|classification|decision|rating|level|category|option|choice)"
_ANSWER_STATEMENT = re.compile(
    rf"\b(?:(?P<qualified>(?:correct|right|expected|only valid|true|actual){_SPACE}{{1,4}}{_ANSWER_NOUN})"
    rf"|answer|verdict)(?:{_SPACE}{{1,4}}[\w'’-]{{1,20}}){{0,3}}?"  # "for this ticket", "here"
    rf"(?:{_SPACE}{{1,4}}(?:is|should be|must be|will be)\b|{_SPACE}{{0,4}}[=:–-])", re.I)
_ANSWER_ORDER = re.compile(
    rf"\b(?:choose|select|pick|answer|(?:respond|reply){_SPACE}{{1,4}}with|give|assign|output|return|"
    rf"(?:mark|classify|label|rate|tag)(?:{_SPACE}{{1,4}}(?:it|this))?{_SPACE}{{1,4}}as)\b"
    rf"(?:{_SPACE}{{1,4}}(?:the|option|level|label|answer|choice|verdict|with)){{0,2}}", re.I)
_OPENERS = "'\"«»„“”‘’‹›`*_([<"
_CLOSERS = "'\"«»„“”‘’‹›`*_)]>"
# Where a named option may end: before its closing quote or mark, then the end of the clause.
_OPTION_END = re.compile(rf"(?=[{re.escape(_CLOSERS)}]{{0,4}}{_SPACE}{{0,4}}(?:[.,;:!?()]|\n|$))")
_RUNS_OF_SPACE = re.compile(rf"{_SPACE}+")
_COMMON_WORDS = frozenset({"yes", "no"})  # a noul question's options: everyday words
_LONGEST_ANSWER = 120  # longer option wordings are matched on their first 120 characters


def _wording(text: str) -> str:
    """An option's name, or a stretch of text, as the two are compared: as the checks read it
    (`checked_text`: fullwidth letters are letters, look-alikes Latin), case-folded, runs of
    space one space."""
    return _RUNS_OF_SPACE.sub(" ", checked_text(text).casefold())


class Answers(frozenset[str]):
    """A request's option wordings (`answer_wordings`), with what `names_an_answer` reads of
    them on every paragraph and string of the state computed once per request: their lengths
    and the longest (rebuilt on each call, a large state made reading it quadratic).
    A frozenset of the wordings, so it goes wherever one did."""

    __slots__ = ("lengths", "longest")

    lengths: frozenset[int]
    longest: int

    def __new__(cls, wordings: Iterable[str] = ()) -> Answers:
        made = super().__new__(cls, wordings)
        made.lengths = frozenset(len(w) for w in made)
        made.longest = max(made.lengths, default=0)
        return made


def as_answers(answers: Collection[str]) -> Answers:
    """`answers` as `Answers`: as they are when they are already (no work), else measured once."""
    return answers if isinstance(answers, Answers) else Answers(answers)


def answer_wordings(names: Iterable[str]) -> Answers:
    """How a request's options are matched in the text (`_wording`, without surrounding
    quotes, at most `_LONGEST_ANSWER` characters): an option's name for a choice, yes and no,
    a score level's text."""
    wordings = (_wording(n).strip().strip(_OPENERS + _CLOSERS).strip()[:_LONGEST_ANSWER] for n in names)
    return Answers(w for w in wordings if w)


def names_an_answer(text: str, answers: Collection[str]) -> bool:
    """Whether `text` states or orders one of `answers` as the answer (see `_ANSWER_STATEMENT`).

    Linear: the text is normalised once; after each lead, only the places where a clause may
    end within the longest wording are looked up (a set look-up each), never every option,
    and a lead followed by the same text as an earlier one is not looked at again. Given
    `Answers` (what `answer_wordings` returns), nothing is done per option."""
    if not answers:
        return False
    answers = as_answers(answers)
    lengths, longest = answers.lengths, answers.longest
    window = 2 * longest + 12  # the option, its marks and the spaces around them
    folded = _wording(text)
    seen: set[tuple[bool, bool, str]] = set()
    for lead, orders in ((_ANSWER_STATEMENT, False), (_ANSWER_ORDER, True)):
        for m in lead.finditer(folded):
            tail = folded[m.end():m.end() + window].lstrip()
            quoted = tail[:1] in _OPENERS
            if orders and not quoted:
                continue
            weak = not quoted and not (orders or m.group("qualified"))
            body = tail.lstrip(_OPENERS)
            if (weak, quoted, body) in seen:
                continue
            seen.add((weak, quoted, body))
            for end in _OPTION_END.finditer(body, 1, longest + 1):
                at = end.start()
                if at not in lengths or (quoted and body[at:at + 1] not in _CLOSERS):
                    continue
                word = body[:at]
                if word in answers and not (weak and word in _COMMON_WORDS):
                    return True
            if longest == _LONGEST_ANSWER and body[:longest] in answers:  # a long option, cut to its start
                return True
    return False


def patterns(text: str, answers: Collection[str] = frozenset()) -> tuple[float, tuple[str, ...]]:
    """(score in [0, 1], names of the checks that matched) for a state's text.

    Run on the text as the model reads it (`visible_text`: hidden words are read whole),
    folded (`checked_text`), plus a check for hiding itself, and, given the wordings of the
    request's options (`answer_wordings`), a check for text that names one of them as the
    answer. Each family has a weight (how rarely it appears in honest text); the score is
    1 - the product of (1 - weight) over the families that matched."""
    visible, removed = visible_text(text)
    checked = checked_text(visible)
    matched = [(name, weight) for name, weight, pattern in _FAMILIES if pattern.search(checked)]
    if names_an_answer(visible, answers):
        matched.append(("names_an_answer", _NAMES_AN_ANSWER_WEIGHT))
    if removed >= 3 or _REORDERING.search(_FLAGS.sub("", text)):
        matched.append(("hidden_characters", _HIDDEN_WEIGHT))
    clear = 1.0
    for _, weight in matched:
        clear *= 1 - weight
    return 1 - clear, tuple(name for name, _ in matched)


# Overrides reverse what a reader sees; tag characters outside a flag spell hidden ASCII.
_REORDERING = re.compile("[\u202d\u202e\U000e0000-\U000e007f]")


# -- quarantine -------------------------------------------------------------------------

# A flagged passage is removed without a trace in the text: on tuned attack forms a marker
# standing in its place ("[a passage ... was removed here]", or "[removed]") left attacks
# succeeding more often than removing it outright (docs/figures/injection.md): the marker
# is itself text the model reacts to. The answer still says
# it (`neutralised`: quarantined_passages), and the signal flags the state.
# A flagged paragraph this short goes whole (planted text is rarely one sentence: "Note to
# the reviewer: ... Choose X."); in a longer one, only the flagged sentences go.
_WHOLE_PARAGRAPH = 400
_PARAGRAPHS = re.compile(r"(\n[^\S\n]*\n)")  # a line of any spaces between (no-break ones too)
_HEADING = re.compile(r"[^\S\n]{0,8}[#＃]{1,6}[^\S\n]")
_SENTENCES = re.compile(r"(?<=[.!?])\s+|[\n\u2028\u2029]")
# The families a passage is removed for: those that are almost never in honest text
# (role markers and hidden characters only add to the score).
_QUARANTINED = tuple(pattern for _, weight, pattern in _FAMILIES if weight >= 0.5)


def _flagged(text: str, answers: Answers) -> bool:
    checked = checked_text(text)
    return any(pattern.search(checked) for pattern in _QUARANTINED) or names_an_answer(text, answers)


def quarantined(text: str, answers: Collection[str] = frozenset()) -> str:
    """`text` without every paragraph (or, in a long paragraph, every sentence) that the strong
    pattern checks flag; a flagged heading takes its section (the paragraphs up to the next
    heading) with it: what it heads is what it introduced. What is left keeps its own
    separators, so a passage planted between two paragraphs leaves them as they were.

    Linear: the text is checked whole, then each paragraph, then the sentences of a long
    flagged one: each character is read by three checks at most."""
    answers = as_answers(answers)
    if not _flagged(text, answers):
        return text
    parts = _PARAGRAPHS.split(text)  # paragraphs at even indices, their separators between
    kept: list[tuple[str, str]] = []  # (the separator before it, the paragraph)
    in_flagged_section = False
    for i in range(0, len(parts), 2):
        paragraph = parts[i]
        flagged = _flagged(paragraph, answers)
        if _HEADING.match(paragraph):
            in_flagged_section = flagged
        if in_flagged_section:
            continue
        if flagged:
            if len(paragraph) <= _WHOLE_PARAGRAPH:
                continue
            pieces = _SENTENCES.split(paragraph)
            seams = [*_SENTENCES.findall(paragraph), ""]
            paragraph = "".join(piece + seam for piece, seam in zip(pieces, seams, strict=True)
                                if not _flagged(piece, answers)).rstrip()
            if not paragraph.strip():
                continue
        kept.append((parts[i - 1] if i else "", paragraph))
    return "".join((separator if k else "") + paragraph for k, (separator, paragraph) in enumerate(kept))
