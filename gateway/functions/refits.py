"""The scheduled refit: a function of its own, run daily by an EventBridge schedule
(template.yaml: RefitFunction).

It walks every tenant's catalog entries and refits those that ask for it
(`learning.refit: "daily"`), each on up to MAX_REFIT_RECORDS of its newest training
outcomes (gateway.services.learning). An advisory entry's adapter is written when it is
kept; an enforcing entry is never moved by the schedule: its figures are logged, and a
person moves it with `POST /v1/catalogs/{name}/refit` and `apply: true`. An entry whose
outcomes did not change since its adapter was fitted writes nothing. One entry's failure
is logged and the walk goes on.

One tenant's size never holds back another's refit: tenants and entries are found from
the entries' heads (no version is read to list them), a few names at a time; the walk
takes one entry of each tenant in turn, tenants in a new order every run and each
tenant's entries from a new starting point; and an entry's read of its records stops at
its share of the time left (the time left over the tenants still waiting), fitting on
what it read. When the time is up the run ends, naming the tenants still waiting.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import Any

from gateway.catalogs.service import CatalogService
from gateway.catalogs.store import CatalogStore
from gateway.errors import RequestError
from gateway.services.learning import MAX_REFIT_RECORDS, MAX_SCHEDULED_READ_BYTES, LearningService

log = logging.getLogger("gateway.functions.refits")

RESERVE_S = 60.0  # a fit of the largest entry takes under a minute of a core, after its read
NAMES_PAGE = 16  # the due entries' names one read of a tenant's heads brings


def refit_all(store: CatalogStore, catalogs: CatalogService, learning: LearningService,
              deadline: Callable[[], float] = lambda: float("inf")) -> dict[str, Any]:
    """Refit every entry that asks for a daily refit, one entry of each tenant in turn; stop
    before `deadline()` seconds (the function's remaining time) run out, leaving the rest
    to the next run."""
    summary: dict[str, Any] = {"tenants": 0, "entries": 0, "written": 0, "unchanged": 0, "failed": 0,
                               "listing_failed": 0, "tenants_left_for_next_run": 0}
    tenants = list(store.list_catalog_tenants())  # ids only: a few bytes a tenant
    random.shuffle(tenants)  # when a day's time runs out, it is never the same tenants that wait
    waiting = {tenant_id: _DueNames(store, tenant_id, random.choice(_FIRST)) for tenant_id in tenants}
    served: set[str] = set()
    while waiting:
        for tenant_id, names in list(waiting.items()):
            left = deadline()
            if left <= RESERVE_S:  # the rest waits for the next run, unlisted (some may have none left)
                summary["tenants_left_for_next_run"] = len(waiting)
                return {**summary, "tenants": len(served)}
            try:
                name = names.next()
            except Exception:
                summary["listing_failed"] += 1
                log.exception("a tenant's due entries could not be listed", extra={"tenant_id": tenant_id})
                name = None
            if name is None:
                del waiting[tenant_id]
                continue
            summary["entries"] += 1
            served.add(tenant_id)
            stop = left - (left - RESERVE_S) / len(waiting)  # this entry's share of the time
            _refit_one(tenant_id, name, learning, lambda stop=stop: deadline() <= stop, summary)
    return {**summary, "tenants": len(served)}


_FIRST = "0123456789abcdefghijklmnopqrstuvwxyz"  # what a catalog name may start with (NAME_PATTERN)


class _DueNames:
    """A tenant's due entries, a page of names at a time: those after `start` in name order,
    then from the first up to `start` (when a run ends early, it is not always the same
    entries of a tenant that wait)."""

    def __init__(self, store: CatalogStore, tenant_id: str, start: str) -> None:
        self.store, self.tenant_id, self.start = store, tenant_id, start
        self.page: list[str] = []
        self.after = start
        self.wrapped = False
        self.done = False

    def next(self) -> str | None:
        while not self.page and not self.done:
            page = self.store.due_refits(self.tenant_id, self.after, NAMES_PAGE)
            if self.wrapped:
                page = [name for name in page if name <= self.start]
            self.page = page
            self.after = page[-1] if page else self.after
            if len(page) < NAMES_PAGE:  # this pass is at its end
                if self.wrapped:
                    self.done = True
                else:
                    self.wrapped, self.after = True, ""
        return self.page.pop(0) if self.page else None


def _refit_one(tenant_id: str, name: str, learning: LearningService, out_of_time: Callable[[], bool],
               summary: dict[str, Any]) -> None:
    try:
        report = learning.refit(tenant_id, name, None, MAX_REFIT_RECORDS, MAX_SCHEDULED_READ_BYTES,
                                out_of_time=out_of_time)
    except RequestError as exc:
        summary["failed"] += 1
        log.warning("scheduled refit refused", extra={"tenant_id": tenant_id, "catalog": name, "reason": exc.message})
        return
    except Exception:
        summary["failed"] += 1
        log.exception("scheduled refit failed", extra={"tenant_id": tenant_id, "catalog": name})
        return
    summary["written" if report["applied"] else "unchanged"] += 1
    log.info("scheduled refit", extra={"tenant_id": tenant_id, "refit": report})


def lambda_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    from gateway.functions.composition import build_stores
    from gateway.observability import configure_logging
    from gateway.settings import AuthSettings

    configure_logging()
    settings = AuthSettings.from_env()
    stores = build_stores(settings)
    if stores is None or stores.catalogs is None or stores.records is None:
        raise RuntimeError("the scheduled refit needs the tenants, catalogs and records tables")
    from gateway.auth.store import DEFAULT_LIMITS
    from gateway.services.spending import Spending

    spending = Spending(stores.counters, lambda _: DEFAULT_LIMITS)  # what it writes is counted, never limited
    catalogs = CatalogService(stores.catalogs, keep_days=settings.record_retention_days, on_stored=spending.count_stored)
    started = time.monotonic()
    remaining = getattr(context, "get_remaining_time_in_millis", None)

    def deadline() -> float:
        return remaining() / 1000 if remaining is not None else 900 - (time.monotonic() - started)

    summary = refit_all(stores.catalogs, catalogs, LearningService(catalogs, stores.records), deadline)
    log.info("scheduled refits done", extra={"summary": summary})
    return summary
