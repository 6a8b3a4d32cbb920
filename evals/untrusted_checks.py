"""The pattern checks alone (no model): their recall on the attack set's forms, and how often
they flag honest states, the labelled set's and honest text in other scripts.

Recall is what `make eval-injection` reports as `recall_patterns` (evals/attacked.py:
`x_injection.suspicion` from the checks at the policy threshold 0.5), here on every item of
the chosen split under every form (one position each), so it needs no decoding. The honest
states in other scripts (evals/data/untrusted/honest_multiscript.jsonl: support tickets,
posts, approval requests in Russian, Ukrainian, Greek, Chinese and Japanese, each with the
options a request about it could have) are outside the labelled set on purpose: they are
not decisions `make eval` scores, only text the checks must leave alone.

`python -m evals.untrusted_checks [--split heldout|dev|all]`
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from evals import injection
from evals.labelled import Item, load
from scorer_container import untrusted
from scorer_container.questions import request_answers
from scorer_container.schema import DecisionRequest, parse

THRESHOLD = 0.5  # what a policy's injection rule compares suspicion with by default (evals/attacked.py)
HONEST_MULTISCRIPT = Path(__file__).resolve().parent / "data" / "untrusted" / "honest_multiscript.jsonl"


def wordings(item: Item) -> frozenset[str]:
    """The item's option wordings, as the scorer matches them (as evals/attacked.py does)."""
    return request_answers(parse(DecisionRequest, {"model": "m", "state": item.state, "questions": {"q": item.question}}))


def suspicion(state: str, answers: frozenset[str]) -> float:
    return untrusted.patterns(untrusted.readable(state), answers)[0]


def recall_by_form(items: list[Item]) -> dict[str, float]:
    """The share of each form's attacks the checks flag, in FORMS' order."""
    flagged: dict[str, list[bool]] = defaultdict(list)
    for found in injection.attacks(items):
        flagged[found.form].append(suspicion(found.state, wordings(found.item)) >= THRESHOLD)
    return {form: sum(flagged[form]) / len(flagged[form]) for form in injection.FORMS if flagged[form]}


def honest_multiscript() -> list[dict]:
    return [json.loads(line) for line in HONEST_MULTISCRIPT.read_text(encoding="utf-8").splitlines() if line.strip()]


def honest_flags(texts: list[dict]) -> dict[str, object]:
    """On honest text: the share flagged (suspicion >= 0.5), the share any check matched at all,
    and the ids of texts the quarantine would change (none is expected)."""
    scores = {t["id"]: suspicion(t["text"], untrusted.answer_wordings(t["options"])) for t in texts}
    changed = [t["id"] for t in texts if untrusted.quarantined(t["text"], untrusted.answer_wordings(t["options"]))
               != t["text"]]
    return {"n": len(texts), "flagged": sum(s >= THRESHOLD for s in scores.values()) / len(texts),
            "any_check": sum(s > 0 for s in scores.values()) / len(texts),
            "flagged_ids": sorted(k for k, s in scores.items() if s >= THRESHOLD), "quarantine_changes": changed}


def main() -> None:
    parser = argparse.ArgumentParser(description="The pattern checks' recall and honest flag rate, no model.")
    parser.add_argument("--split", choices=("heldout", "dev", "all"), default="heldout",
                        help="which items of the labelled set are attacked (default: the held-out split)")
    args = parser.parse_args()
    labelled = load()
    chosen = [it for it in labelled if args.split == "all" or it.split == args.split]
    recall = recall_by_form(chosen)
    for split, forms in (("tuned", injection.TUNED_FORMS), ("held-out", sorted(injection.HELDOUT_FORMS))):
        print(f"recall on {split} forms ({len(chosen)} {args.split} items each):")
        for form in forms:
            print(f"  {form:18} {recall[form]:6.1%}")
    clean = sum(suspicion(it.state, wordings(it)) >= THRESHOLD for it in labelled) / len(labelled)
    print(f"clean labelled states flagged: {clean:.1%} of {len(labelled)}")
    texts = honest_multiscript()
    print(f"honest multiscript: {json.dumps(honest_flags(texts), ensure_ascii=False)}")
    for lang in sorted({t["lang"] for t in texts}):
        found = honest_flags([t for t in texts if t["lang"] == lang])
        print(f"  {lang}: flagged {found['flagged']:.1%}, any check {found['any_check']:.1%} of {found['n']}")


if __name__ == "__main__":
    main()
