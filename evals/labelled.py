"""The labelled decision set `make eval` measures on: evals/data/*.jsonl.

One JSON object per line:

    {"id": "support-017", "domain": "support", "state": "...",
     "question": {"type": "choice", "instructions": "...", "criteria": {"billing": "...", ...}},
     "gold": "billing",
     "synonyms": {"billing": "payments", ...}}

- `question` is a System One question exactly as a caller sends it;
- `gold` is `true`/`false` for noul, an option name for choice, a level index for score;
- `synonyms` (choice only) gives every option an equivalent name, used to measure
  whether renaming an option moves the answer, and whether duplicating it splits it.

The split is fixed by the id alone (a hash), so adding items never moves an old one
between splits: about a third is `heldout`, which no default is ever chosen on.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scorer_container.errors import InvalidRequest
from scorer_container.schema import DecisionRequest, parse

DATA = Path(__file__).resolve().parent / "data"
HELDOUT_SHARE = 1 / 3
LONG_STATE_WORDS = 80


@dataclass(frozen=True)
class Item:
    id: str
    domain: str
    kind: str
    state: str
    question: dict[str, Any]
    gold: int  # index of the gold option, in the question's declared order
    synonyms: dict[str, str] = field(default_factory=dict)

    @property
    def n_options(self) -> int:
        if self.kind == "noul":
            return 2
        return len(self.question["criteria"])

    @property
    def split(self) -> str:
        digest = hashlib.sha256(self.id.encode()).digest()
        return "heldout" if int.from_bytes(digest[:8], "big") / 2**64 < HELDOUT_SHARE else "dev"


def _item(raw: dict[str, Any], where: str) -> Item:
    for key in ("id", "domain", "state", "question", "gold"):
        if key not in raw:
            raise ValueError(f"{where}: missing {key!r}")
    question = raw["question"]
    # The question must be one a caller could send: the scorer's own model validates it.
    try:
        parse(DecisionRequest, {"model": "m", "state": raw["state"], "questions": {"q": question}})
    except InvalidRequest as exc:
        problems = "; ".join(f"{'.'.join(map(str, d.get('loc', ())))}: {d.get('msg')}" for d in exc.details)
        raise ValueError(f"{where}: not a valid System One question ({problems})") from None
    kind = question["type"]
    gold = raw["gold"]
    synonyms = raw.get("synonyms") or {}
    if kind == "noul":
        if not isinstance(gold, bool):
            raise ValueError(f"{where}: a noul gold is true or false")
        index = 0 if gold else 1
    elif kind == "choice":
        names = list(question["criteria"])
        if gold not in names:
            raise ValueError(f"{where}: gold {gold!r} is not an option")
        index = names.index(gold)
        if set(synonyms) != set(names):
            raise ValueError(f"{where}: synonyms must name every option exactly once")
        clash = set(synonyms.values()) & set(names)
        if clash or len(set(synonyms.values())) != len(names) or any(not s.strip() for s in synonyms.values()):
            raise ValueError(f"{where}: synonyms must be distinct new names ({sorted(clash)} are options)")
    else:
        levels = question["criteria"]
        if not isinstance(gold, int) or isinstance(gold, bool) or not 0 <= gold < len(levels):
            raise ValueError(f"{where}: a score gold is a level index in 0..{len(levels) - 1}")
        if not 3 <= len(levels) <= 10:
            raise ValueError(f"{where}: score scales here have 3 to 10 levels")
        index = gold
    return Item(raw["id"], raw["domain"], kind, raw["state"], question, index, dict(synonyms))


def load(paths: list[Path] | None = None) -> list[Item]:
    """Every item, validated; ids are unique across files."""
    out: list[Item] = []
    for path in paths or sorted(DATA.glob("*.jsonl")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                out.append(_item(json.loads(line), f"{path.name}:{number}"))
    dupes = [k for k, v in Counter(it.id for it in out).items() if v > 1]
    if dupes:
        raise ValueError(f"duplicate ids: {dupes[:5]}")
    return out


def summary(items: list[Item]) -> str:
    kinds = Counter(it.kind for it in items)
    noul_yes = sum(it.kind == "noul" and it.gold == 0 for it in items)
    long = sum(len(it.state.split()) >= LONG_STATE_WORDS for it in items)
    sizes = Counter(it.n_options for it in items if it.kind != "noul")
    positions = Counter(it.gold for it in items if it.kind == "choice")
    return (f"{len(items)} items ({dict(kinds)}), noul yes {noul_yes}/{kinds['noul']}, long states {long},"
            f" option counts {dict(sorted(sizes.items()))}, choice gold positions {dict(sorted(positions.items()))},"
            f" splits {dict(Counter(it.split for it in items))}, domains {dict(Counter(it.domain for it in items))}")


if __name__ == "__main__":
    paths = [Path(p) for p in sys.argv[1:]] or None
    print(summary(load(paths)))
