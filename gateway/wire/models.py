"""`GET /v1/models`: one body that both SDKs parse.

OpenAI's client reads `{"object": "list", "data": [{"id", "object", "created", "owned_by"}]}`,
the TypeSafe client `{"models": [{"name", "description", "release_date"}]}`; each ignores
the other's key. Aliases are listed too: System One names them models ("jev-latest").
"""

from __future__ import annotations

import calendar
import time
from collections.abc import Iterable
from typing import Any

from gateway.backends.routing import ModelRoute

OWNER = "decision-gateway"


def render(routes: Iterable[ModelRoute]) -> dict[str, Any]:
    data, models = [], []
    for route in routes:
        created = _epoch(route.release_date)
        for name in (route.name, *route.aliases):
            description = route.description or route.name
            if name != route.name:
                description = f"alias of {route.name}: {description}"
            data.append({"id": name, "object": "model", "created": created, "owned_by": OWNER})
            models.append({"name": name, "description": description, "release_date": route.release_date})
    return {"object": "list", "data": data, "models": models}


def _epoch(date: str) -> int:
    try:
        return calendar.timegm(time.strptime(date, "%Y-%m-%d"))
    except ValueError:
        return 0
