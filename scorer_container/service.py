"""The scorer's one model: located, verified and loaded once, in the background, with why
it is not ready when it is not (what /ping says).

Loading runs after the socket is open, so /ping answers 503 within milliseconds while
the model loads, and a model that fails its checks leaves the scorer up and unhealthy,
saying why, never serving.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from scorer_container.budget import Budget, budget_for
from scorer_container.chat import ChatGenerator
from scorer_container.engine import DecisionEngine
from scorer_container.errors import ModelNotReady, ServiceError
from scorer_container.model_files import ModelManifest, locate_model, verify_model
from scorer_container.prompts import PromptFormat
from scorer_container.scheduler import Scheduler
from scorer_container.settings import ScorerSettings
from scorer_container.state_cache import StateCache

if TYPE_CHECKING:
    from scorer_container.llama import LlamaModel

log = logging.getLogger("scorer")
MIB = 1024 * 1024
# The state cache's default: this part of the memory the loaded model leaves, at most the cap
# (a saved state is 8 to 28 KiB a token on the shipped models: 4 GiB holds a hundred or more
# transcripts of 1,500 tokens).
STATE_CACHE_PART = 0.25
STATE_CACHE_CAP_MB = 4096


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
            states = self.state_cache(path.stat().st_size)
            engine = DecisionEngine.for_manifest(
                llama, prompts, manifest, model_name=name,
                # The manifest's readout and fitted temperatures unless the deployment sets them.
                readout=self.settings.readout, temperature=self.settings.temperature,
                prior_cache_size=self.settings.prior_cache_size, max_labels=self.settings.max_labels,
                states=states, model_id=manifest.sha256,
            )
            budget = budget_for(engine, self.settings.max_request_tokens, self.settings.budget_s,
                                self.settings.long_budget_s, self.settings.step_s)
            self.loaded = Loaded(manifest, engine, ChatGenerator(llama, prompts, name), name, budget,
                                 self.scheduler_for(llama))
            self.status, self.reason = "ready", ""
            log.info("model ready: %s (%s, readout %s); budget %s; state cache %s", name, manifest.sha256[:12],
                     engine.defaults.readout, budget.describe(),
                     f"{states.max_bytes // MIB} MiB" if states is not None else "off")
        except ServiceError as exc:
            self.status, self.reason = "failed", exc.message
            log.error("model refused: %s", exc.message)
        except Exception:  # a bug or an unreadable file: stay up and unhealthy, never serve
            self.status, self.reason = "failed", "the model could not be loaded (see the container log)"
            log.exception("model load failed")

    def state_cache(self, model_bytes: int) -> StateCache | None:
        """The states kept between requests (state_cache.py), sized once the model is loaded: the
        deployment's SCORER_STATE_CACHE_MB, else a part of the memory left (None: off). The model
        file counts whole beside what the process holds: mapped pages count once they are read."""
        s = self.settings
        used = rss() + model_bytes
        size = s.state_cache_mb * MIB if s.state_cache_mb is not None else state_cache_bytes(memory_limit(), used)
        if size <= 0:
            return None
        return StateCache(size, tenant_share=s.state_cache_share, ttl_s=s.state_cache_ttl_s)

    def scheduler_for(self, llama: LlamaModel) -> Scheduler:
        s = self.settings
        return Scheduler(cells=llama.cells, seqs=llama.n_seq_max, job_cells=llama.n_ctx, max_jobs=s.max_jobs,
                         max_resident=s.max_resident, tenant_share=s.tenant_share, long_share=s.long_share,
                         bulk_share=s.bulk_share, step_tokens=llama.step_tokens, model_lock=llama.lock)

    def require(self) -> Loaded:
        if self.loaded is None:
            raise ModelNotReady(self.reason)
        return self.loaded


def state_cache_bytes(limit: int | None, used: int) -> int:
    """A part of the memory the process may still take (its limit less what it holds, the model
    and its context included), never past the cap; 0 where the limit is unknown."""
    if not limit:
        return 0
    return min(STATE_CACHE_CAP_MB * MIB, int(max(0, limit - used) * STATE_CACHE_PART))


def memory_limit() -> int | None:
    """The memory this process may use: its cgroup's limit where it has one (a container), else
    the machine's."""
    try:
        raw = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if raw != "max":
            return int(raw)
    except (OSError, ValueError):
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return None


def rss() -> int:
    """The process's resident memory now (bytes), from /proc; 0 where there is none."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0
