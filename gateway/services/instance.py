"""What a warm function instance keeps: its settings, the model registry and the services
its routes call (built by `gateway.functions.composition.build_services`, once per instance)."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.auth.authenticate import Authenticator
from gateway.backends.routing import ModelRegistry
from gateway.catalogs.service import CatalogService
from gateway.services.batches import BatchService, FileService
from gateway.services.decide import DecideService
from gateway.services.idempotency import Idempotency
from gateway.services.learning import LearningService
from gateway.services.records import RecordsService
from gateway.services.spending import Spending
from gateway.services.throttle import TenantThrottle
from gateway.settings import GatewaySettings


@dataclass(frozen=True, slots=True)
class InstanceServices:
    settings: GatewaySettings
    registry: ModelRegistry
    decide: DecideService
    records: RecordsService
    catalogs: CatalogService | None = None
    authenticator: Authenticator | None = None  # IAM callers and tokens
    throttle: TenantThrottle | None = None  # per-tenant rate and work in flight (where tenants are stored)
    idempotency: Idempotency | None = None  # Idempotency-Key on decisions (where a store keeps them)
    spending: Spending | None = None  # per-tenant spend: budgets and usage (where tenants are stored)
    learning: LearningService | None = None  # refitting catalog entries' adapters from their outcomes
    files: FileService | None = None  # OpenAI's Files and Uploads APIs (where a batch store is configured)
    batches: BatchService | None = None  # OpenAI's Batch API
