"""The counters every function instance shares, in the keys table: counters
(`COUNTER` / `<name>`), tallies (`COUNTER` / `tally:<name>`), places in flight
(`COUNTER` / `places:<name>`), all expired by TTL, and each tenant's usage by day and
entry (`USAGE#<tenant>` / `<day>#<entry>`, read by a Query on one tenant's partition).
Every change is one conditional write, so two instances never both take the last unit.
"""

from __future__ import annotations

import math
import time
from typing import Any

from gateway.auth.store import USAGE_FIGURES, UsageRow
from gateway.stores.dynamodb.items import Table, item, typed


class DynamoDBCounters:
    def __init__(self, client: Any, keys_table: str) -> None:
        self.keys = Table(client, keys_table)

    def count_within(self, name: str, limit: int, expires_at: float) -> bool:
        try:
            self.keys.update(
                {"pk": "COUNTER", "sk": name}, UpdateExpression="ADD #count :one SET #ttl = if_not_exists(#ttl, :ttl)",
                ConditionExpression="attribute_not_exists(#count) OR #count < :limit",
                ExpressionAttributeNames={"#count": "count", "#ttl": "ttl"},
                ExpressionAttributeValues={":one": typed(1), ":limit": typed(limit), ":ttl": typed(int(expires_at))})
        except self.keys.refused:
            return False
        return True

    def add_within(self, name: str, amount: int, limit: int | None, expires_at: float) -> bool:
        condition = {} if limit is None else {"ConditionExpression": "attribute_not_exists(#amount) OR #amount < :limit"}
        try:
            self.keys.update(
                {"pk": "COUNTER", "sk": f"tally:{name}"},
                UpdateExpression="ADD #amount :amount SET #ttl = if_not_exists(#ttl, :ttl)", **condition,
                ExpressionAttributeNames={"#amount": "amount", "#ttl": "ttl"},
                ExpressionAttributeValues={":amount": typed(amount), ":ttl": typed(int(expires_at)),
                                           **({} if limit is None else {":limit": typed(limit)})})
        except self.keys.refused:
            return False
        return True

    def tally(self, name: str) -> int:
        found = self.keys.get({"pk": "COUNTER", "sk": f"tally:{name}"})
        return 0 if found is None or found["ttl"] < time.time() else int(found["amount"])

    def add_usage(self, tenant_id: str, row: UsageRow, expires_at: float) -> None:
        self.keys.update(
            {"pk": f"USAGE#{tenant_id}", "sk": f"{row.day}#{row.entry}"},
            UpdateExpression=f"ADD {', '.join(f'{name} :{name}' for name in USAGE_FIGURES)} SET #ttl = :ttl",
            ExpressionAttributeNames={"#ttl": "ttl"},
            ExpressionAttributeValues={**{f":{name}": typed(getattr(row, name)) for name in USAGE_FIGURES},
                                       ":ttl": typed(int(expires_at))})

    def usage(self, tenant_id: str, first_day: str, last_day: str) -> list[UsageRow]:
        # "<day>#<entry>": from the first day's first entry to past the last day's last ("$" > "#")
        found = self.keys.query_pages(
            KeyConditionExpression="pk = :pk AND sk BETWEEN :first AND :last",
            ExpressionAttributeValues=item({":pk": f"USAGE#{tenant_id}", ":first": f"{first_day}#", ":last": f"{last_day}$"}),
            ConsistentRead=True, Select="SPECIFIC_ATTRIBUTES",
            ProjectionExpression=f"pk, sk, {', '.join(USAGE_FIGURES)}")
        rows = []
        for one in found:
            day, _, entry = one["sk"].partition("#")  # a figure added since the item was written is 0
            rows.append(UsageRow(day, entry, **{name: int(one.get(name, 0)) for name in USAGE_FIGURES}))
        return rows

    def hold(self, name: str, holder: str, limit: int, expires_at: float, now: float) -> bool:
        """One conditional write: the place joins the string set `held` ("<expiry>|<holder>")
        while it has fewer than `limit` members. When it is full, its expired members (a
        function that died holding one) are removed and the write is tried once more."""
        member = f"{math.ceil(expires_at)}|{holder}"
        for attempt in range(2):
            try:
                self.keys.update(
                    {"pk": "COUNTER", "sk": f"places:{name}"}, UpdateExpression="ADD #held :member SET #ttl = :ttl",
                    ConditionExpression="attribute_not_exists(#held) OR size(#held) < :limit",
                    ExpressionAttributeNames={"#held": "held", "#ttl": "ttl"},
                    ExpressionAttributeValues={":member": {"SS": [member]}, ":limit": typed(limit),
                                               ":ttl": typed(int(expires_at) + 3600)})
                return True
            except self.keys.refused:
                if attempt or not self._drop_held(name, lambda m: float(m.partition("|")[0]) <= now):
                    return False
        return False

    def release(self, name: str, holder: str) -> None:
        self._drop_held(name, lambda m: m.partition("|")[2] == holder)

    def _drop_held(self, name: str, which: Any) -> bool:
        """Remove the members of `name`'s places that `which` picks; False when it picks none."""
        found = self.keys.get({"pk": "COUNTER", "sk": f"places:{name}"}) or {}
        dropped = [m for m in found.get("held", ()) if which(m)]
        if not dropped:
            return False
        self.keys.update({"pk": "COUNTER", "sk": f"places:{name}"}, UpdateExpression="DELETE #held :dropped",
                         ExpressionAttributeNames={"#held": "held"}, ExpressionAttributeValues={":dropped": {"SS": dropped}})
        return True
