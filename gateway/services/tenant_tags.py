"""The tag that tells the scorer whose work a call is (systemone.sidechannel.tenant_tag).

The scorer serves tenants in turn by their tags, so a tenant must carry one tag whichever
function instance sends its work: the tag is keyed by a key every instance shares, derived
(HMAC with a label of its own, so a tag and a record's state hash never share a key) from
the records' key ring (`GATEWAY_RECORD_KEY_SECRET_ID` or `GATEWAY_RECORD_KEYS_FILE`). The
ring is read when a tag is first needed, as the records read it: a key read in the init
phase would outlive a rotation in a SnapStart snapshot. A rotation (`admin new-record-key`)
gives every tenant a new tag as the instances' rings reload (5 minutes at most), during
which one tenant may hold two lanes. Without a ring (tests, local fakes) no tag is sent,
and the work shares the scorer's untagged lane: an unkeyed hash of the id would name the
tenant to anyone who can list tenant ids.
"""

from __future__ import annotations

import hashlib
import hmac
import logging

from gateway.auth.tokens import KeyRing
from systemone.sidechannel import tenant_tag

log = logging.getLogger("gateway.tenant_tags")

TAG_KEY_LABEL = b"scorer-tenant-tag"


class TenantTags:
    def __init__(self, ring: KeyRing | None) -> None:
        self.ring = ring
        self._derived: tuple[bytes, bytes] | None = None  # (the ring's current key, the tag key from it)

    def tag(self, tenant_id: str) -> str:
        """The tenant's tag, or "" (the shared lane) without a ring or when it cannot be read:
        a lane is a matter of fairness, not of correctness, so it never fails a request."""
        if self.ring is None:
            return ""
        try:
            _, master = self.ring.current()
        except Exception:
            log.exception("the tenant tag's key cannot be read: this call goes to the scorer's shared lane")
            return ""
        return tenant_tag(tenant_id, self._tag_key(master))

    def _tag_key(self, master: bytes) -> bytes:
        """The tag key derived from the ring's current key: once per key, not once per call (a
        rotation gives a new current key, and so a new tag key)."""
        derived = self._derived
        if derived is None or derived[0] != master:
            derived = self._derived = (master, hmac.new(master, TAG_KEY_LABEL, hashlib.sha256).digest())
        return derived[1]
