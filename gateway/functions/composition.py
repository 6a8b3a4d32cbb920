"""The composition root: every adapter and service of a deployment is chosen and wired
here, once, from settings, for the gateway function (`build_services`), the authorizer
and the admin CLI (`build_stores`, `build_authenticator`, `build_record_keys`).

Nothing is built at import of this module; in Lambda, gateway.functions.handler builds the services
while the function initialises (the init phase), SageMaker clients included.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from gateway import aws
from gateway.auth.authenticate import Authenticator
from gateway.auth.revocation import RevocationCheck
from gateway.auth.tokens import KeyRing, file_key_ring, secrets_manager_key_ring
from gateway.backends.base import Endpoint, InferenceBackend
from gateway.backends.pools import Circuits, EndpointPool, PoolEndpoint, PoolPolicy
from gateway.backends.routing import ModelRegistry, ModelRoute
from gateway.batches.model import BatchStore
from gateway.catalogs.service import CatalogService
from gateway.decisions.cost import endpoint_usd_per_second
from gateway.decisions.records import DecisionRecorder
from gateway.observability import counters
from gateway.services.batches import BatchService, FileService
from gateway.services.decide import DecideService
from gateway.services.idempotency import Idempotency
from gateway.services.instance import InstanceServices
from gateway.services.learning import LearningService
from gateway.services.records import RecordsService
from gateway.services.spending import Spending
from gateway.services.tenant_tags import TenantTags
from gateway.services.throttle import TenantThrottle
from gateway.settings import AuthSettings, EndpointSettings, GatewaySettings, RoutingSettings
from gateway.stores import Stores
from gateway.stores.sqs import BatchQueue
from systemone.limits import SERVERLESS_MAX_PAYLOAD_BYTES

if TYPE_CHECKING:  # the batch worker's alone, imported where it is built
    from gateway.backends.async_pool import AsyncPool
    from gateway.batches.worker import AsyncLines

# Connections kept per SageMaker client (botocore's default is 10): a function instance has
# one request at a time, but the local runner serves many from one process (make bench-load
# runs 16 at once), and a call past the pool's size connects anew and drops it after.
MAX_SAGEMAKER_CONNECTIONS = 16


def build_services(settings: GatewaySettings, backend: InferenceBackend | None = None, stores: Stores | None = None,
                  authenticator: Authenticator | None = None, record_keys: KeyRing | None = None,
                  registry: ModelRegistry | None = None) -> InstanceServices:
    """The function's services, on the given stores (else the configured ones) and authenticator
    (else one on those stores), and the given models (else the configured ones)."""
    registry = registry if registry is not None else build_registry(settings)
    if backend is None:
        from gateway.backends.sagemaker import SageMakerInvoker

        backend = SageMakerInvoker(sagemaker_client)
        backend.prepare(registry.first_attempts())  # the clients built now (Lambda's init phase), not on a first call
    if authenticator is not None and stores is None:
        raise ValueError("an authenticator is given with the stores it checks against (stores=)")
    stores = stores if stores is not None else build_stores(settings.auth)
    if authenticator is None and stores is not None:
        authenticator = build_authenticator(settings.auth, stores)
    # One tenant cache for the authorizer's checks, the routes' policy and the throttle.
    tenants = authenticator.tenants if authenticator is not None else None
    throttle = (TenantThrottle(stores.counters, tenants.limits, hold_s=longest_request_s(settings))
                if stores is not None and tenants is not None else None)
    spending = Spending(stores.counters, tenants.limits) if stores is not None and tenants is not None else None
    catalogs = (CatalogService(stores.catalogs, keep_days=settings.auth.record_retention_days,
                               on_stored=spending.count_stored if spending is not None else None)
                if stores is not None and stores.catalogs is not None else None)
    records = stores.records if stores is not None else None
    # One ring for the records' hashes and the scorer's tenant tags (a key of its own derived
    # from it): a key every function instance shares, read on first use.
    record_keys = record_keys or build_record_keys(settings.auth)
    recorder = DecisionRecorder(records, record_keys, settings.auth.record_retention_days,
                                on_failure=_count_record_failure)
    idempotency = Idempotency(stores.idempotency, hold_s=longest_request_s(settings)) if stores is not None else None
    batch_store = stores.batches if stores is not None else None
    return InstanceServices(
        settings=settings, registry=registry,
        decide=DecideService(registry, backend, recorder, catalogs=catalogs, tenants=tenants, throttle=throttle,
                             spending=spending, tags=TenantTags(record_keys),
                             bulk_price_factor=settings.batches.price_factor),
        records=RecordsService(records, stores.catalogs if stores is not None else None),
        catalogs=catalogs, authenticator=authenticator, throttle=throttle, idempotency=idempotency, spending=spending,
        learning=LearningService(catalogs, records, throttle=throttle),
        files=None if batch_store is None else FileService(
            batch_store, settings.batches,
            count_stored=spending.count_stored if spending is not None else None),
        batches=None if batch_store is None else BatchService(batch_store, registry, settings.batches,
                                                              announce=_announcer(settings.auth, batch_store)))


def build_async_lines(settings: GatewaySettings, **options: Any) -> tuple[InstanceServices, AsyncLines]:
    """The services a batch worker runs lines through on the asynchronous pool
    (GATEWAY_ASYNC_ENDPOINT), and that pool's side of the worker: every model's lines go to
    it, answered by its answer book (gateway.backends.deferred) and charged at its price.
    `options`: build_services's (stores, authenticator, record keys). Its modules are imported
    here: the gateway function never loads them."""
    from gateway.backends.deferred import AnswerBook
    from gateway.batches.worker import MAX_RETRY_WAIT_S, AsyncLines

    pool = build_async_pool(settings.auth, settings.region)
    name = pool.endpoint_name
    book = AnswerBook(wait_s=round(MAX_RETRY_WAIT_S))
    price = endpoint_usd_per_second(None, None, instance_type=settings.auth.async_instance_type)
    registry = build_registry(settings, clock=book.clock,
                              only=lambda first: replace(first, name=name, usd_per_second=price, max_body_bytes=None,
                                                         billed_by_duration=False))
    return build_services(settings, book, registry=registry, **options), AsyncLines(book, pool)


def build_async_pool(settings: AuthSettings, region: str | None = None) -> AsyncPool:
    """The asynchronous pool's invocations and their objects in the batch bucket (no call made)."""
    from gateway.backends.async_pool import AsyncPool

    if not settings.async_endpoint or not settings.batch_bucket:
        raise ValueError("an asynchronous pool needs GATEWAY_ASYNC_ENDPOINT and GATEWAY_BATCH_BUCKET")
    return AsyncPool(aws.client("sagemaker-runtime", region_name=region), aws.client("s3"), settings.batch_bucket,
                     settings.async_endpoint)


def build_batch_queue(settings: AuthSettings, store: BatchStore) -> BatchQueue | None:
    """The queue of the batch worker's turns in AWS (None locally: the local worker polls the store)."""
    if not settings.batch_queue_url:
        return None
    return BatchQueue(aws.client("sqs"), settings.batch_queue_url, store)  # built now (Lambda's init phase); no call made


def _announcer(settings: AuthSettings, store: BatchStore) -> Callable[[str, str], None] | None:
    queue = build_batch_queue(settings, store)
    return None if queue is None else queue.announce


def longest_request_s(settings: GatewaySettings) -> float:
    """The longest any request may run, on any model and route: a place in flight or an
    idempotency claim is held that long at most when its function dies mid-request."""
    policies = [settings.routing] + [m.routing for m in settings.models if m.routing is not None]
    return max(max(p.deadline_s, p.stream_deadline_s) for p in policies)


def pool_policy(routing: RoutingSettings) -> PoolPolicy:
    return PoolPolicy(**routing.model_dump())


def endpoint(settings: EndpointSettings, default_region: str | None) -> Endpoint:
    return Endpoint(name=settings.name, region=settings.region or default_region, endpoint_url=settings.endpoint_url,
                    connect_timeout_s=settings.connect_timeout_s, read_timeout_s=settings.read_timeout_s,
                    max_body_bytes=SERVERLESS_MAX_PAYLOAD_BYTES if settings.serverless else None,
                    usd_per_second=endpoint_usd_per_second(
                        settings.usd_per_hour,
                        settings.memory_gb or (settings.memory_mib / 1024 if settings.memory_mib else None),
                        instance_type=settings.instance_type),
                    billed_by_duration=settings.serverless)


def sagemaker_client(endpoint: Endpoint) -> Any:
    """botocore's `sagemaker-runtime` client for one endpoint's region, URL and timeouts,
    with retries off: the endpoint pool is the one retry loop, and a second attempt here
    would spend the time the pool keeps for another endpoint."""
    from botocore.config import Config
    from botocore.exceptions import NoCredentialsError

    # botocore builds a client without a credential when it finds none, and that client never
    # looks again: refused here instead, so the next call resolves the chain anew.
    if aws.session().get_credentials() is None:
        raise NoCredentialsError()
    region = endpoint.region
    if not region:
        if not (endpoint.endpoint_url or os.environ.get("AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME")):
            raise ValueError(f"endpoint {endpoint.name!r}: no region (set it, or AWS_REGION) and no endpoint_url")
        region = "us-east-1"  # a local stand-in: only the signature names it
    config = Config(connect_timeout=endpoint.connect_timeout_s, read_timeout=endpoint.read_timeout_s,
                    retries={"total_max_attempts": 1}, max_pool_connections=MAX_SAGEMAKER_CONNECTIONS,
                    user_agent_appid="decision-gateway")
    return aws.client("sagemaker-runtime", region_name=region, endpoint_url=endpoint.endpoint_url, config=config)


def build_registry(settings: GatewaySettings, clock: Callable[[], float] = time.monotonic,
                   only: Callable[[Endpoint], Endpoint] | None = None) -> ModelRegistry:
    """The models and their pools; with `only`, each model's pool is the one endpoint it makes
    of the model's first (an asynchronous pool's, with the model's timeouts)."""
    # One set of circuits for every pool: an endpoint serving two models is one endpoint. An
    # asynchronous pool's answers were given long before they are read: none says the endpoint
    # is failing now, so its circuit never opens.
    policy = pool_policy(settings.routing)
    circuits = Circuits(policy if only is None else replace(policy, failure_threshold=sys.maxsize))
    routes = []
    for m in settings.models:
        members = tuple(PoolEndpoint(endpoint(e, settings.region), tier=tier, weight=e.weight)
                        for e, tier in zip(m.endpoints, m.tiers(), strict=True))
        if only is not None:
            members = (PoolEndpoint(only(members[0].endpoint), tier=0),)
        policy = replace(pool_policy(m.routing or settings.routing), line=m.line, min_instances=m.min_instances)
        pool = EndpointPool(members, policy, circuits, clock=clock)
        routes.append(ModelRoute(m.name, m.aliases, m.serves, m.description, m.release_date, pool,
                                 m.max_request_tokens))
    return ModelRegistry(routes)


def build_stores(settings: AuthSettings) -> Stores | None:
    if settings.sqlite_path:
        from gateway.stores.sqlite import open_sqlite

        return open_sqlite(settings.sqlite_path)
    if settings.tenants_table and settings.keys_table:
        from gateway.stores.dynamodb import DynamoDBTables, dynamodb_stores

        # The clients are built now (Lambda's init phase): pure set-up, no call is made. Batches
        # have clients of their own: their calls (a page of 25 writes, a file's parts) are not
        # the request path's, whose client gives up after 2 s.
        tables = DynamoDBTables(settings.tenants_table, settings.keys_table, settings.catalogs_table,
                                settings.records_table, settings.batches_table, settings.batch_bucket)
        batches = (aws.client("dynamodb"), aws.client("s3")) if settings.batch_bucket else (None, None)
        return dynamodb_stores(aws.client("dynamodb", hot_path=True), tables, *batches)
    return None


def build_batch_store(settings: AuthSettings) -> BatchStore | None:
    """The batch store alone, from its own variables: what the sweep and notice functions use
    (no client built for the tables they never read)."""
    if settings.sqlite_path:
        from gateway.stores.sqlite import open_sqlite

        return open_sqlite(settings.sqlite_path).batches
    if settings.batches_table and settings.batch_bucket:
        from gateway.stores.dynamodb.batches import DynamoDBBatches

        return DynamoDBBatches(aws.client("dynamodb"), aws.client("s3"), settings.batches_table, settings.batch_bucket)
    return None


def build_authenticator(settings: AuthSettings, stores: Stores | None = None) -> Authenticator | None:
    stores = stores or build_stores(settings)
    if stores is None:
        return None
    keys = None
    if settings.signing_secret_id:
        # The client now, the secret on first use: a key read in the init phase would outlive rotation in a snapshot.
        keys = secrets_manager_key_ring(settings.signing_secret_id, aws.client("secretsmanager", hot_path=True))
    elif settings.signing_keys_file:
        keys = file_key_ring(settings.signing_keys_file)
    return Authenticator(stores, keys, revocations=RevocationCheck(stores.tenants, check_s=settings.revocation_check_s))


def build_record_keys(settings: AuthSettings) -> KeyRing | None:
    """The records' state-hash keys (never the signing keys: those rotate out in a day)."""
    if settings.record_key_secret_id:
        return secrets_manager_key_ring(settings.record_key_secret_id, aws.client("secretsmanager", hot_path=True))
    if settings.record_keys_file:
        return file_key_ring(settings.record_keys_file)
    return None


def _count_record_failure() -> None:
    counters().count("RecordWriteFailed")
