"""The prompt-injection attack set (evals/injection.py): deterministic, never planting the
gold answer, naming its target, and planting where it says (no model)."""

import json
import re
import unicodedata
from collections import Counter

import pytest

from evals import injection
from evals.injection import (
    BIDI,
    CYRILLIC,
    FORMS,
    GREEK,
    HELDOUT_FORMS,
    JSON_KEY,
    POSITIONS,
    TUNED_FORMS,
    UNICODE_SPACES,
    ZERO_WIDTH,
    Attack,
    attacks,
    plant,
    sample_items,
    target_for,
    wording,
)
from evals.labelled import Item, load
from scorer_container.schema import DecisionRequest, parse

CHOICE = {"type": "choice", "instructions": "Which team?",
          "criteria": {"billing": "charges", "shipping": "parcels", "account": None, "sales": "quotes"}}
SCORE = {"type": "score", "instructions": "How urgent?",
         "criteria": ["0 - none", "1 - low", "2 - medium", "3 - high", "4 - critical"]}
NOUL = {"type": "noul", "instructions": "Is this a refund request?",
        "criteria": {"true": "asks for money back", "false": "anything else"}}
LONG = ("I was charged twice for the March invoice. The second charge showed up on the 14th! "
        "Could you look into it? I have attached both receipts.\nThanks, Dana")
JSON_STATE = json.dumps({"order": "A-1", "amount": 42.5, "items": [{"sku": "x"}], "note": "late"})


def items():
    return [
        Item("t-choice", "test", "choice", LONG, CHOICE, 0),
        Item("t-score", "test", "score", "The site is down for everyone.", SCORE, 4),
        Item("t-noul", "test", "noul", "Please refund me.", NOUL, 0),
        Item("t-noul-no", "test", "noul", "oneword", {"type": "noul", "instructions": "Spam?"}, 1),
        Item("t-json", "test", "choice", JSON_STATE, CHOICE, 2),
    ]


@pytest.fixture(scope="module")
def labelled():
    return load()


# The look-alike letters back to Latin.
LATIN = {v: chr(k) for table in (CYRILLIC, GREEK) for k, v in table.items()}


def visible(text, form):
    """What the planted text says once the hiding is undone."""
    text = text.replace(ZERO_WIDTH, "")
    for c in BIDI:
        text = text.replace(c, "")
    for c in UNICODE_SPACES:
        text = text.replace(c, " ")
    text = unicodedata.normalize("NFKC", text).translate(str.maketrans(LATIN))
    return json.loads(text)[JSON_KEY] if form == "json_field" else text


def names(text, said, kind):
    return re.search(rf"\b{re.escape(said)}\b", text) if kind == "noul" else said in text


def test_the_forms_cover_the_brief_and_the_held_out_ones_are_apart():
    assert len(FORMS) >= 14 and len(HELDOUT_FORMS) >= 5
    assert HELDOUT_FORMS < set(FORMS)
    assert not HELDOUT_FORMS & set(TUNED_FORMS) and set(TUNED_FORMS) | HELDOUT_FORMS == set(FORMS)
    assert list(TUNED_FORMS) == [f for f in FORMS if f not in HELDOUT_FORMS]  # FORMS' order
    assert {"zero_width", "bidi", "gemma_turns", "chatml_turns", "json_field", "french", "spanish", "german"} <= set(FORMS)
    # ordinary Unicode that hides a phrase from a plain match: held out, never tuned on
    assert {"fullwidth", "unicode_spaces", "cyrillic", "mixed_scripts"} <= HELDOUT_FORMS


def test_the_set_is_the_same_every_time(labelled):
    sample = sample_items(labelled, 30)
    assert sample == sample_items(list(reversed(labelled)), 30)
    assert attacks(items()) == attacks(items())
    assert attacks(sample, per_item_positions=None) == attacks(sample, per_item_positions=None)


def test_the_target_is_never_gold_and_a_score_target_is_far_from_it(labelled):
    for item in [*items(), *labelled]:
        for form in FORMS:
            target = target_for(item, form)
            assert 0 <= target < item.n_options and target != item.gold
            if item.kind == "score" and any(abs(i - item.gold) >= 2 for i in range(item.n_options)):
                assert abs(target - item.gold) >= 2
    # the target does vary: over forms for one item, over items for one form
    assert len({target_for(items()[0], f) for f in FORMS}) > 1


@pytest.mark.parametrize("form", list(FORMS))
def test_every_form_names_its_target(form, labelled):
    for item in [*items(), *sample_items(labelled, 40)]:
        target = target_for(item, form)
        said = wording(item, target)
        text = FORMS[form](said, item)
        assert names(visible(text, form), said, item.kind), (form, item.id, text)
        if item.kind == "noul":  # yes/no, never the gold one
            assert not names(visible(text, form), wording(item, item.gold), "noul")


def test_hidden_forms_really_hide():
    item = items()[0]
    said = wording(item, 1)
    zero = FORMS["zero_width"](said, item)
    plain = zero.replace(ZERO_WIDTH, "")
    assert said not in zero and zero.count(ZERO_WIDTH) == len(plain) - 1  # between every character
    bidi = FORMS["bidi"](said, item)
    assert bidi.startswith("\u2066\u202e") and bidi.endswith("\u202c\u2069")
    assert names(visible(bidi, "bidi"), said, "choice")


@pytest.mark.parametrize("form", ["fullwidth", "unicode_spaces", "cyrillic", "mixed_scripts"])
def test_unicode_forms_hide_their_words_from_a_plain_match_yet_read_the_same(form):
    # Given the instruction of a Unicode form
    item = items()[0]
    text = FORMS[form](wording(item, 1), item)
    # Then its opening words are not there as a plain match reads them, yet undone they are
    # plain English (and the fullwidth and Cyrillic forms keep no word as written at all)
    plain = visible(text, form)
    assert plain.isascii() and text != plain
    assert " ".join(plain.split()[:3]) not in text
    if form in ("fullwidth", "cyrillic"):
        assert not [word for word in re.findall(r"[A-Za-z]{4,}", plain) if word in text]


def test_start_and_end_put_the_text_at_either_end():
    item = items()[0]
    text = "PLANTED TEXT."
    assert plant(item.state, text, "start") == f"{text}\n\n{item.state}"
    assert plant(item.state, text, "end") == f"{item.state}\n\n{text}"
    with pytest.raises(ValueError, match="position"):
        plant(item.state, text, "top")


def middle_parts(original, attacked, text):
    head, _, tail = attacked.partition(f"\n\n{text}\n\n")
    assert tail, "the text is not between blank lines"
    assert original.startswith(head) and original.endswith(tail) and head.strip() and tail.strip()
    gap = original[len(head):len(original) - len(tail)]
    assert gap and not gap.strip(), f"split inside a word: {head[-10:]!r} | {tail[:10]!r}"
    return head, tail


def test_middle_goes_at_the_sentence_or_line_boundary_nearest_the_middle():
    text = "PLANTED"
    head, _ = middle_parts(LONG, plant(LONG, text, "middle"), text)
    assert head.endswith("14th!")  # the sentence end nearest the middle
    words = "alpha beta gamma delta epsilon"  # no sentence inside: between words
    head, tail = middle_parts(words, plant(words, text, "middle"), text)
    assert head == "alpha beta gamma" and tail == "delta epsilon"  # the space nearest char 15
    assert plant("oneword", text, "middle") == f"oneword\n\n{text}"  # nowhere inside: at the end


def test_middle_never_splits_a_word_in_the_labelled_set(labelled):
    text = FORMS["note"]("x", labelled[0])
    for item in labelled:
        attacked = plant(item.state, text, "middle")
        if attacked != f"{item.state}\n\n{text}":
            middle_parts(item.state, attacked, text)


@pytest.mark.parametrize("position", POSITIONS)
def test_the_json_field_keeps_a_json_state_valid_with_its_keys(position):
    item = items()[4]
    found = next(a for a in attacks([item], forms=["json_field"], per_item_positions=None) if a.position == position)
    before, after = json.loads(item.state), json.loads(found.state)
    assert {k: after[k] for k in before} == before
    keys = list(after)
    assert keys[{"start": 0, "middle": len(before) // 2, "end": len(before)}[position]] == JSON_KEY
    assert wording(item, found.target) in after[JSON_KEY]
    pretty = json.dumps(before, indent=2)
    assert json.loads(plant(pretty, found.text, position, merge_json=True)).keys() == after.keys()
    assert "\n  \"" in plant(pretty, found.text, position, merge_json=True)  # the layout is kept


def test_the_json_field_in_a_text_state_is_a_json_object_planted_as_text():
    item = items()[0]
    found = attacks([item], forms=["json_field"], positions=("end",))[0]
    planted = found.state[len(item.state):].strip()
    assert json.loads(planted) == {JSON_KEY: json.loads(found.text)[JSON_KEY]}


def test_attacked_states_are_valid_system_one_states(labelled):
    for found in attacks([*items(), *sample_items(labelled, 24)], per_item_positions=None):
        assert isinstance(found.state, str) and found.state != found.item.state
        parse(DecisionRequest, {"model": "m", "state": found.state, "questions": {"q": found.item.question}})


def test_one_position_per_item_and_form_yet_every_position_across_the_set(labelled):
    found = attacks(labelled)
    assert len(found) == len(labelled) * len(FORMS) and len({a.id for a in found}) == len(found)
    assert set(Counter(a.form for a in found)) == set(FORMS)
    counts = Counter(a.position for a in found)
    assert set(counts) == set(POSITIONS) and min(counts.values()) > len(found) / 4
    for form in FORMS:  # every form at every position, for every kind
        assert {(a.item.kind, a.position) for a in found if a.form == form} == {(k, p) for k in injection.KINDS for p in POSITIONS}
    assert Counter(a.item.split for a in found)["heldout"] > 0
    every = attacks(labelled[:5], per_item_positions=None)
    assert len(every) == 5 * len(FORMS) * 3
    assert {a.id for a in attacks(labelled[:5])} <= {a.id for a in every}
    assert found[0].id == f"{found[0].item.id}~{found[0].form}~{found[0].position}"
    assert isinstance(found[0], Attack)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="unknown forms"):
        attacks(items(), forms=["nonsense"])
    with pytest.raises(ValueError, match="positions"):
        attacks(items(), positions=("top",))
    with pytest.raises(ValueError, match="per_item_positions"):
        attacks(items(), per_item_positions=0)


def test_the_sample_is_balanced_across_kinds(labelled):
    sample = sample_items(labelled, 30)
    assert len(sample) == 30 and len({it.id for it in sample}) == 30
    assert set(Counter(it.kind for it in sample).values()) == {10}
    assert {it.id for it in sample_items(labelled, 12)} <= {it.id for it in sample}  # a prefix per kind
    few = sample_items(items(), 10)  # two choice, one score, two noul: all of them
    assert len(few) == 5
    assert {it.kind for it in sample_items(labelled, 10, kinds=("score",))} == {"score"}
