"""Writing and reading catalog entries: versioning, hashing, "latest", and what is kept.

What a tenant stores is bounded: at most MAX_ENTRIES entries, each of at most
MAX_CONTENT_BYTES. A version that is no longer the latest expires once the records that
could name it have (the record retention, from when it was replaced, or from the last
decision that named it by number); the version that made the entry enforcing is kept
while the entry enforces; and past MAX_KEPT_VERSIONS an entry's oldest versions are
deleted as new ones are written, so a daily refit never fails for the count.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable, Iterator

from gateway.catalogs.model import CatalogVersion, ChoiceEntry, NoulEntry, ScoreEntry, content_hash
from gateway.catalogs.store import CatalogStore, TooManyEntries, VersionTaken
from gateway.errors import Conflict, InvalidRequest, NotFound, PayloadTooLarge
from systemone.json_text import depth
from systemone.limits import MAX_JSON_DEPTH

log = logging.getLogger("gateway.catalogs")

_ATTEMPTS = 5  # concurrent writers: each loser re-reads and tries the next number
# An entry's canonical content, at most: well under DynamoDB's 400 KB item (with its keys
# and hash), and far more than 255 options with descriptions need.
MAX_CONTENT_BYTES = 256 * 1024
# A question taken from an entry nests up to two levels deeper in the scorer's request than
# in the entry (under "questions" and its id): an entry leaves that room, or every decision
# that names it would be refused by the scorer.
MAX_CONTENT_DEPTH = MAX_JSON_DEPTH - 2


# The entries a tenant may have, and the versions an entry keeps (a daily refit writes at
# most one a day: about three months of them), beside the one that made it enforcing.
MAX_ENTRIES = 256
MAX_KEPT_VERSIONS = 100
DAY_S = 86400.0

# A page of an entry's versions: at most this many, and this much content (a Lambda response
# holds 6 MB, JSON-escaped).
VERSIONS_PAGE = 100
MAX_VERSIONS_PAGE_BYTES = 4 * 1024 * 1024


class CatalogService:
    def __init__(self, store: CatalogStore, clock: Callable[[], float] = time.time, *,
                 keep_days: float = 90, on_stored: Callable[[str, int, str], None] | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.store = store
        self.sleep = sleep
        self.clock = clock
        self.on_stored = on_stored  # (tenant, bytes, entry): the tenant's usage counts its catalog writes
        self.keep_s = keep_days * DAY_S  # the record retention: what a record names outlives it

    def put(self, tenant_id: str, name: str, content: NoulEntry | ChoiceEntry | ScoreEntry,
            based_on: int | None = None) -> tuple[CatalogVersion, bool]:
        """The new version, or the latest one when its content is the same; True when created.
        `based_on`: the version the content was derived from; if another was written since,
        Conflict (409) and nothing is written (a refit never undoes an edit made meanwhile)."""
        canonical = content.canonical()
        size = len(canonical.encode("utf-8"))
        if size > MAX_CONTENT_BYTES:
            raise PayloadTooLarge(f"this entry is {size} bytes once canonical; an entry holds at most {MAX_CONTENT_BYTES}:"
                                  " shorten its descriptions")
        if depth(json.loads(canonical)) > MAX_CONTENT_DEPTH:
            raise InvalidRequest.at([], f"this entry nests arrays and objects deeper than {MAX_CONTENT_DEPTH} levels"
                                    " (a question from it must fit the scorer's request)", "json_invalid")
        digest = content_hash(canonical)
        for _ in range(_ATTEMPTS):
            latest = self.store.latest_catalog_version(tenant_id, name)
            if based_on is not None and (latest is None or latest.version != based_on):
                raise Conflict(f"the catalog entry {name!r} changed while this was computed from version {based_on}:"
                               " nothing was written; run it again on the latest version")
            if latest is not None and latest.content_hash == digest:
                return latest, False
            number = 1 if latest is None else latest.version + 1
            since = latest.enforced_since if latest is not None else None
            made_enforcing = (since or number) if content.enforces else None
            # The replaced version expires, and the one that made the entry enforcing once it stops.
            now = self.clock()
            expire = {old: now + self.keep_s for old in {latest.version if latest else None, since} - {None, made_enforcing}}
            version = CatalogVersion(tenant_id, name, number, digest, canonical, now, enforcing_since=made_enforcing)
            try:
                self.store.insert_catalog_version(version, replaces=latest.version if latest else 0,
                                                  expire=expire, max_entries=MAX_ENTRIES)  # type: ignore[arg-type]
            except VersionTaken:
                self.sleep(random.uniform(0, 0.02))  # writers at once: apart, then each re-reads
                continue
            except TooManyEntries as exc:
                raise Conflict(f"this tenant has {exc.count} catalog entries, the most it may have is {MAX_ENTRIES}:"
                               " nothing was written; write a new version of an entry instead") from None
            self._make_room(version)
            if self.on_stored is not None:
                self.on_stored(tenant_id, size, name)
            return version, True
        raise Conflict(f"the catalog entry {name!r} is being written by others at the same time; read it and retry")

    def _make_room(self, version: CatalogVersion) -> None:
        """Delete the versions past MAX_KEPT_VERSIONS (and, where the store has no TTL of its
        own, the expired ones). The new version stands whatever happens here: a failure is
        logged, and the next write deletes what this one left."""
        try:
            self.store.delete_catalog_versions(version.tenant_id, version.name, version.version - MAX_KEPT_VERSIONS + 1,
                                               keep={version.enforcing_since} - {None})  # type: ignore[arg-type]
        except Exception:
            log.exception("old catalog versions not deleted", extra={"tenant_id": version.tenant_id,
                                                                     "catalog": version.ref})

    def named(self, tenant_id: str, name: str, version: int | None) -> CatalogVersion:
        """The version a decision names: a version asked for by number lives at least as long
        as the record that names it (moved at most once a day)."""
        found = self.get(tenant_id, name, version)
        now = self.clock()
        if found.expires_at is not None and found.expires_at < now + self.keep_s - DAY_S:
            self.store.extend_catalog_version(tenant_id, name, found.version, now + self.keep_s)
        return found

    def get(self, tenant_id: str, name: str, version: int | None = None) -> CatalogVersion:
        found = (self.store.latest_catalog_version(tenant_id, name) if version is None
                 else self.store.get_catalog_version(tenant_id, name, version))
        if found is None:
            what = name if version is None else f"{name}@{version}"
            raise NotFound(f"the catalog entry {what!r} does not exist")
        return found

    def versions(self, tenant_id: str, name: str, after: int = 0, limit: int = VERSIONS_PAGE
                 ) -> tuple[list[CatalogVersion], int | None]:
        """A page of the entry's versions numbered above `after`, oldest first, and the
        number to pass as `after` for the next page (None at the end). A page ends at `limit`
        versions or at MAX_VERSIONS_PAGE_BYTES of content, whichever comes first: an entry
        refitted daily gains a version a day, each up to the item limit."""
        found = self.store.list_catalog_versions(tenant_id, name, after, limit + 1)
        if not found and (after == 0 or self.store.latest_catalog_version(tenant_id, name) is None):
            raise NotFound(f"the catalog entry {name!r} does not exist")
        page, more = _page(iter(found), limit)
        return page, (page[-1].version if more else None)

    def list(self, tenant_id: str, after: str = "", limit: int = VERSIONS_PAGE) -> tuple[list[CatalogVersion], str | None]:
        """A page of the tenant's entries (latest versions) named after `after`, by name, and
        the name to pass as `after` for the next page (None at the end). A page ends at
        `limit` entries or MAX_VERSIONS_PAGE_BYTES of content: 256 entries of up to 256 KiB
        are far more than one Lambda response holds."""
        page, more = _page(iter(self.store.list_catalogs(tenant_id, after, limit + 1)), limit)
        return page, (page[-1].name if more else None)


def _page(found: Iterator[CatalogVersion], limit: int) -> tuple[list[CatalogVersion], bool]:
    """The first `limit` of `found`, ending before MAX_VERSIONS_PAGE_BYTES of content (one at
    least), and whether another follows; read no further than that one."""
    page: list[CatalogVersion] = []
    used = 0
    for version in found:
        used += len(version.content)
        if len(page) == limit or (page and used > MAX_VERSIONS_PAGE_BYTES):
            return page, True
        page.append(version)
    return page, False

