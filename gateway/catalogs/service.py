"""Writing and reading catalog entries: versioning, hashing, "latest"."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from gateway.catalogs.model import CatalogVersion, ChoiceEntry, NoulEntry, ScoreEntry, content_hash
from gateway.catalogs.store import CatalogStore, VersionTaken
from gateway.errors import Conflict, InvalidRequest, NotFound, PayloadTooLarge
from systemone.json_text import depth
from systemone.limits import MAX_JSON_DEPTH

_ATTEMPTS = 5  # concurrent writers: each loser re-reads and tries the next number
# An entry's canonical content, at most: well under DynamoDB's 400 KB item (with its keys
# and hash), and far more than 255 options with descriptions need.
MAX_CONTENT_BYTES = 256 * 1024
# A question taken from an entry nests up to two levels deeper in the scorer's request than
# in the entry (under "questions" and its id): an entry leaves that room, or every decision
# that names it would be refused by the scorer.
MAX_CONTENT_DEPTH = MAX_JSON_DEPTH - 2


# A page of an entry's versions: at most this many, and this much content (a Lambda response
# holds 6 MB, JSON-escaped).
VERSIONS_PAGE = 100
MAX_VERSIONS_PAGE_BYTES = 4 * 1024 * 1024


class CatalogService:
    def __init__(self, store: CatalogStore, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.clock = clock

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
            version = CatalogVersion(tenant_id, name, 1 if latest is None else latest.version + 1, digest, canonical,
                                     self.clock())
            try:
                self.store.insert_catalog_version(version)
            except VersionTaken:
                continue
            return version, True
        raise Conflict(f"the catalog entry {name!r} is being written by others at the same time; read it and retry")

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
        page, used = [], 0
        for version in found[:limit]:
            used += len(version.content)
            if page and used > MAX_VERSIONS_PAGE_BYTES:
                break
            page.append(version)
        return page, (page[-1].version if len(page) < len(found) else None)

    def list(self, tenant_id: str) -> list[CatalogVersion]:
        return self.store.list_catalogs(tenant_id)
