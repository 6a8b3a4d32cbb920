"""The scorer's one model: located, verified and loaded once, in the background, with why
it is not ready when it is not (what /ping says).

Loading runs after the socket is open, so /ping answers 503 within milliseconds while
the model loads, and a model that fails its checks leaves the scorer up and unhealthy,
saying why, never serving.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from scorer_container.budget import Budget, budget_for
from scorer_container.chat import ChatGenerator
from scorer_container.engine import DecisionEngine
from scorer_container.errors import ModelNotReady, ServiceError
from scorer_container.model_files import ModelManifest, locate_model, verify_model
from scorer_container.prompts import PromptFormat
from scorer_container.scheduler import Scheduler
from scorer_container.settings import ScorerSettings

if TYPE_CHECKING:
    from scorer_container.llama import LlamaModel

log = logging.getLogger("scorer")


@dataclass
class Loaded:
    manifest: ModelManifest
    engine: DecisionEngine
    chat: ChatGenerator
    model_name: str
    budget: Budget
    scheduler: Scheduler


class ScorerService:
    """Holds the model once loaded, and why it is not when it is not."""

    def __init__(self, settings: ScorerSettings) -> None:
        self.settings = settings
        self.loaded: Loaded | None = None
        self.status = "loading"
        self.reason = "the model is loading"
        self.started = int(time.time())

    def load(self) -> None:
        """Locate, verify and load the model; on any failure stay unhealthy and say why."""
        from scorer_container.llama import LlamaModel  # llama.cpp only once loading

        try:
            path = locate_model(self.settings.model, self.settings.model_dir)
            manifest = verify_model(path, self.settings.expected_sha256, self.settings.expected_manifest_sha256)
            llama = LlamaModel(path, self.settings.llama)
            prompts = PromptFormat.for_model(llama)
            name = self.settings.alias or manifest.name
            engine = DecisionEngine.for_manifest(
                llama, prompts, manifest, model_name=name,
                # The manifest's readout and fitted temperatures unless the deployment sets them.
                readout=self.settings.readout, temperature=self.settings.temperature,
                prior_cache_size=self.settings.prior_cache_size, max_labels=self.settings.max_labels,
            )
            budget = budget_for(engine, self.settings.max_request_tokens, self.settings.budget_s,
                                self.settings.long_budget_s, self.settings.step_s)
            self.loaded = Loaded(manifest, engine, ChatGenerator(llama, prompts, name), name, budget,
                                 self.scheduler_for(llama))
            self.status, self.reason = "ready", ""
            log.info("model ready: %s (%s, readout %s); budget %s", name, manifest.sha256[:12], engine.defaults.readout,
                     budget.describe())
        except ServiceError as exc:
            self.status, self.reason = "failed", exc.message
            log.error("model refused: %s", exc.message)
        except Exception:  # a bug or an unreadable file: stay up and unhealthy, never serve
            self.status, self.reason = "failed", "the model could not be loaded (see the container log)"
            log.exception("model load failed")

    def scheduler_for(self, llama: LlamaModel) -> Scheduler:
        s = self.settings
        return Scheduler(cells=llama.cells, seqs=llama.n_seq_max, job_cells=llama.n_ctx, max_jobs=s.max_jobs,
                         max_resident=s.max_resident, tenant_share=s.tenant_share, long_share=s.long_share,
                         bulk_share=s.bulk_share, step_tokens=llama.step_tokens, model_lock=llama.lock)

    def require(self) -> Loaded:
        if self.loaded is None:
            raise ModelNotReady(self.reason)
        return self.loaded


