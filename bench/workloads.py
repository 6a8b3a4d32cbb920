"""Requests the benchmarks send: many-option decisions written as people write them.

Option names and descriptions are words, not numbered placeholders (digits cost a token
each in these tokenizers, which would overstate the cost of real option lists), and
descriptions are about 40 characters.
"""

from __future__ import annotations

import itertools

AREAS = ["billing", "shipping", "returns", "accounts", "security", "payments", "mobile", "desktop",
         "printing", "warranty", "pricing", "privacy", "hardware", "network", "storage", "training"]
TEAMS = ["desk", "team", "unit", "crew", "office", "group", "squad", "cell", "hub", "line", "bench", "room",
         "corner", "station", "center", "panel"]
TOPICS = ["refunds", "invoices", "parcels", "logins", "passwords", "cards", "apps", "updates", "labels",
          "repairs", "quotes", "consent", "devices", "outages", "backups", "courses"]
AUDIENCES = ["new customers", "business clients", "partners", "resellers", "students", "families"]

STATE = ("Customer wrote: since the last update the mobile app logs me out every few minutes and my saved cards "
         "are gone. I was also charged twice for the March invoice. Please fix the login first, then refund the "
         "second charge.")


def options(n: int) -> dict[str, str]:
    """`n` distinct options (n <= 256), each with a description of about 40 characters."""
    names = [f"{area} {team}" for team, area in itertools.product(TEAMS, AREAS)][:n]
    return {name: f"questions on {TOPICS[i % len(TOPICS)]} from {AUDIENCES[i % len(AUDIENCES)]}"
            for i, name in enumerate(names)}


def many_options(n: int, **extra: object) -> dict:
    """One System One choice question over `n` options."""
    return {"model": "jev-latest", "state": STATE,
            "questions": {"queue": {"type": "choice", "instructions": "Which support queue should handle this ticket?",
                                    "criteria": options(n)}}, **extra}
