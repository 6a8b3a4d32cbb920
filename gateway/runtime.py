"""What a warm container keeps: settings, the model registry and the services, built once
on the first request (never at import: cold start is paid by users)."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.backends.base import InferenceBackend
from gateway.decisions.routing import ModelRegistry, ModelRoute
from gateway.decisions.service import DecisionService
from gateway.settings import GatewaySettings


@dataclass
class GatewayRuntime:
    settings: GatewaySettings
    registry: ModelRegistry
    decisions: DecisionService

    @classmethod
    def build(cls, settings: GatewaySettings, backend: InferenceBackend | None = None) -> GatewayRuntime:
        if backend is None:
            from gateway.backends.sagemaker import SageMakerInvoker

            backend = SageMakerInvoker()
        registry = ModelRegistry(
            ModelRoute(
                name=m.name,
                aliases=m.aliases,
                serves=m.serves,
                description=m.description,
                release_date=m.release_date,
                endpoints=tuple(e.endpoint(settings.region) for e in m.endpoints),
            )
            for m in settings.models
        )
        return cls(settings=settings, registry=registry, decisions=DecisionService(registry, backend))
