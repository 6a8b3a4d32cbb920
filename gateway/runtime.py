"""What a warm container keeps: settings, the model registry and the services, built once
on the first request (never at import: cold start is paid by users)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.backends.base import InferenceBackend
from gateway.decisions.pools import Circuits, EndpointPool, PoolEndpoint
from gateway.decisions.routing import ModelRegistry, ModelRoute
from gateway.decisions.service import DecisionService
from gateway.settings import GatewaySettings


@dataclass
class GatewayRuntime:
    settings: GatewaySettings
    registry: ModelRegistry
    decisions: DecisionService
    authenticator: Any = None  # gateway.auth.authenticate.Authenticator: IAM callers and tokens

    @classmethod
    def build(cls, settings: GatewaySettings, backend: InferenceBackend | None = None,
              authenticator: Any = None) -> GatewayRuntime:
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
                                     EndpointPool(members, policy, circuits)))
        registry = ModelRegistry(routes)
        if authenticator is None:
            from gateway.auth.factory import build_authenticator

            authenticator = build_authenticator(settings.auth)
        return cls(settings=settings, registry=registry, decisions=DecisionService(registry, backend),
                   authenticator=authenticator)
