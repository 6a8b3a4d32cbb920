"""What a warm container keeps: settings, the model registry, the stores and the
services, built once on the first request (never at import: cold start is paid by users)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.auth.tenant_cache import TenantCache
from gateway.backends.base import InferenceBackend
from gateway.catalogs.service import CatalogService
from gateway.decisions.pools import Circuits, EndpointPool, PoolEndpoint
from gateway.decisions.records import DecisionRecorder
from gateway.decisions.routing import ModelRegistry, ModelRoute
from gateway.decisions.service import DecisionService
from gateway.settings import GatewaySettings


@dataclass
class GatewayRuntime:
    settings: GatewaySettings
    registry: ModelRegistry
    decisions: DecisionService
    authenticator: Any = None  # gateway.auth.authenticate.Authenticator: IAM callers and tokens
    catalogs: CatalogService | None = None
    recorder: DecisionRecorder | None = None
    tenants: TenantCache | None = None  # catalog-only and limits, per tenant

    @classmethod
    def build(cls, settings: GatewaySettings, backend: InferenceBackend | None = None,
              authenticator: Any = None, store: Any = None, record_keys: Any = None) -> GatewayRuntime:
        """`store` (tenants, catalogs, records) defaults to the authenticator's, else the configured one."""
        if backend is None:
            from gateway.backends.sagemaker import SageMakerInvoker

            backend = SageMakerInvoker()
        # One set of circuits for every pool: an endpoint serving two models is one endpoint.
        circuits = Circuits(settings.routing.policy())
        routes = []
        for m in settings.models:
            policy = (m.routing or settings.routing).policy()
            members = tuple(
                PoolEndpoint(e.endpoint(settings.region), tier=i if e.tier is None else e.tier, weight=e.weight)
                for i, e in enumerate(m.endpoints)
            )
            routes.append(ModelRoute(m.name, m.aliases, m.serves, m.description, m.release_date,
                                     EndpointPool(members, policy, circuits), m.max_request_tokens))
        registry = ModelRegistry(routes)
        from gateway.auth.factory import build_authenticator, build_record_keys, build_store

        if store is None:
            store = authenticator.store if authenticator is not None else build_store(settings.auth)
        if authenticator is None and store is not None:
            authenticator = build_authenticator(settings.auth, store)
        catalogs = CatalogService(store) if _has(store, "insert_catalog_version", "catalogs_table") else None
        records = store if _has(store, "put_record", "records_table") else None
        if record_keys is None:
            record_keys = build_record_keys(settings.auth)
        recorder = DecisionRecorder(records, record_keys, settings.auth.record_retention_days,
                                    on_failure=_count_record_failure)
        tenants = getattr(authenticator, "tenants", None) or TenantCache(store)  # one cache for the authorizer and routes
        return cls(settings=settings, registry=registry, decisions=DecisionService(registry, backend, catalogs),
                   authenticator=authenticator, catalogs=catalogs, recorder=recorder, tenants=tenants)


def _has(store: Any, method: str, table_attribute: str) -> bool:
    """The store implements it, and (DynamoDB) its table is configured."""
    return store is not None and hasattr(store, method) and getattr(store, table_attribute, True) is not None


def _count_record_failure() -> None:
    from gateway.observability import counters

    counters().count("RecordWriteFailed")
