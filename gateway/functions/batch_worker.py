"""The batch worker's wiring: a `BatchWorker` on a gateway function's own services, so that each
line runs through the routes and services its synchronous twin runs through.

`build_worker` is what any host of the worker calls: the local stack's loop
(`devkit.batch_worker`, beside `make up`'s gateway) and, in AWS, the function its queue invokes.
`work_once` is one pass over the open batches, each given a slice in turn, oldest first, so that
one tenant's long batch does not keep another's waiting.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from gateway.auth.credentials import Principal
from gateway.batches.model import Batch, BatchStore
from gateway.batches.worker import AsyncLines, BatchWorker
from gateway.errors import Forbidden, NotFound
from gateway.functions.composition import longest_request_s
from gateway.functions.handler import GatewayFunction

log = logging.getLogger("gateway.functions.batch_worker")
SLICE_S = 1.0  # a batch's turn before the next open batch has one
LEASE_MARGIN_S = 30.0  # a lease outlasts the longest line by this much


def build_worker(function: GatewayFunction, owner: str, *, lease_s: float | None = None,
                 clock: Callable[[], float] = time.time, async_lines: AsyncLines | None = None) -> BatchWorker:
    """A worker on the function's services; with `async_lines`, on the asynchronous pool whose
    answer book the function's services were built on (composition.build_async_lines)."""
    services = function.services
    store = batch_store(function)
    authenticator = services.authenticator
    records = services.decide.recorder.store
    registry = services.registry

    def check_principal(principal: Principal) -> Principal:
        """The batch's creator as it stands now: an IAM caller's mapping read again, a key's or
        token's revocation asked (Unauthenticated or Forbidden when it no longer stands)."""
        if authenticator is None:
            return principal
        if principal.kind != "iam":
            return authenticator.still_valid(principal)
        now = authenticator.authenticate_iam(principal.credential_id)
        if now.tenant_id != principal.tenant_id:  # mapped to another tenant since: not this batch's creator
            raise Forbidden("the IAM principal that created this batch now acts for another tenant")
        return now

    def model_allowed(principal: Principal, model: str, endpoint: str) -> str | None:
        if not principal.may_use(model):
            return f"the model {model!r} does not exist for this credential; GET /v1/models lists the available models"
        try:
            registry.route_for(model, "chat" if endpoint == "/v1/chat/completions" else "decisions")
        except NotFound as exc:
            return exc.message
        return None

    spending = services.spending
    # A batch stays with a worker longer than any line can take, so no other takes it mid-line.
    lease = lease_s if lease_s is not None else longest_request_s(services.settings) + LEASE_MARGIN_S
    return BatchWorker(store, function.run_line, check_principal=check_principal,
                       recorded=lambda tenant_id, record_id: records is not None
                       and records.get_record(tenant_id, record_id) is not None,
                       new_decision_id=services.decide.recorder.new_id, model_allowed=model_allowed, owner=owner,
                       count_stored=spending.count_stored if spending is not None else None, clock=clock,
                       lease_s=lease, async_lines=async_lines)


def batch_store(function: GatewayFunction) -> BatchStore:
    files = function.services.files
    if files is None:
        raise RuntimeError("this deployment has no batch store (GATEWAY_SQLITE_PATH locally; in AWS"
                           " GATEWAY_BATCHES_TABLE and GATEWAY_BATCH_BUCKET)")
    return files.store


def work_once(worker: BatchWorker, store: BatchStore, slice_s: float = SLICE_S) -> bool:
    """Each open batch works for up to `slice_s`, tenant by tenant: every tenant's oldest, then
    every tenant's next, so a tenant's many batches take no more turns than another's one.
    True when any has more to do now."""
    busy = False
    for batch in by_tenant_in_turn(store.open_batches()):
        if worker.stopping.is_set():
            break
        try:
            more = worker.run(batch.id, batch.tenant_id, worker.clock() + slice_s)
        except Exception:
            log.exception("batch worker step failed; the batch is taken again later", extra={"batch_id": batch.id})
            continue
        busy = busy or more
    return busy


def by_tenant_in_turn(batches: list[Batch]) -> list[Batch]:
    """Oldest first within a tenant; the tenants' first batches, then their seconds, and so on."""
    place: dict[str, int] = {}
    ranked = []
    for order, batch in enumerate(batches):
        place[batch.tenant_id] = place.get(batch.tenant_id, -1) + 1
        ranked.append((place[batch.tenant_id], order, batch))
    return [batch for _, _, batch in sorted(ranked, key=lambda r: (r[0], r[1]))]
