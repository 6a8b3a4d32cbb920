"""The scheduled refit: a function of its own, run daily by an EventBridge schedule
(template.yaml: RefitFunction).

It walks every tenant's catalog entries and refits those that ask for it
(`learning.refit: "daily"`), each on up to MAX_REFIT_RECORDS of its newest training
outcomes (gateway.services.learning). An advisory entry's adapter is written when it is
kept; an enforcing entry is never moved by the schedule: its figures are logged, and a
person moves it with `POST /v1/catalogs/{name}/refit` and `apply: true`. An entry whose
outcomes did not change since its adapter was fitted writes nothing. One entry's failure
is logged and the walk goes on.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import Any

from gateway.catalogs.model import CatalogVersion
from gateway.catalogs.service import CatalogService
from gateway.errors import RequestError
from gateway.services.learning import MAX_REFIT_RECORDS, MAX_SCHEDULED_READ_BYTES, LearningService

log = logging.getLogger("gateway.functions.refits")


def refit_all(tenant_ids: Callable[[], list[str]], catalogs: CatalogService, learning: LearningService,
              deadline: Callable[[], float] = lambda: float("inf")) -> dict[str, Any]:
    """Refit every entry that asks for a daily refit; stop before `deadline()` seconds run out
    (the function's remaining time), leaving the rest to the next run."""
    summary: dict[str, Any] = {"entries": 0, "written": 0, "unchanged": 0, "failed": 0, "left_for_next_run": 0}
    due = [(tenant_id, version) for tenant_id in tenant_ids() for version in catalogs.list(tenant_id)
           if _refits_daily(version)]
    # In a new order every run: when a day's time runs out, it is never the same tenants' entries that wait.
    random.shuffle(due)
    for tenant_id, version in due:
        if deadline() < 60:  # a refit of the largest entry takes under a minute of a core
            summary["left_for_next_run"] += 1
            continue
        summary["entries"] += 1
        try:
            report = learning.refit(tenant_id, version.name, None, MAX_REFIT_RECORDS, MAX_SCHEDULED_READ_BYTES)
        except RequestError as exc:
            summary["failed"] += 1
            log.warning("scheduled refit refused", extra={"tenant_id": tenant_id, "catalog": version.ref,
                                                          "reason": exc.message})
            continue
        except Exception:
            summary["failed"] += 1
            log.exception("scheduled refit failed", extra={"tenant_id": tenant_id, "catalog": version.ref})
            continue
        summary["written" if report["applied"] else "unchanged"] += 1
        log.info("scheduled refit", extra={"tenant_id": tenant_id, "refit": report})
    return summary


def _refits_daily(version: CatalogVersion) -> bool:
    learning = version.entry().learning
    return learning is not None and learning.refit == "daily"


def lambda_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    from gateway.functions.composition import build_stores
    from gateway.observability import configure_logging
    from gateway.settings import AuthSettings

    configure_logging()
    stores = build_stores(AuthSettings.from_env())
    if stores is None or stores.catalogs is None or stores.records is None:
        raise RuntimeError("the scheduled refit needs the tenants, catalogs and records tables")
    catalogs = CatalogService(stores.catalogs)
    started = time.monotonic()
    remaining = getattr(context, "get_remaining_time_in_millis", None)

    def deadline() -> float:
        return remaining() / 1000 if remaining is not None else 900 - (time.monotonic() - started)

    summary = refit_all(stores.catalogs.list_catalog_tenants, catalogs, LearningService(catalogs, stores.records),
                        deadline)
    log.info("scheduled refits done", extra={"summary": summary})
    return summary
