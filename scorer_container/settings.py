"""Settings of the scorer, read once from the environment.

`SM_LLAMA_CPP_*` follow the AWS llama.cpp container: `SM_LLAMA_CPP_FOO_BAR=v` is the
server option `--foo-bar v` (`true` a bare flag, `false` dropped). The options this
engine understands map to its settings; others are reported (by name only) and ignored.
`SCORER_*` variables configure the server itself.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from scorer_container.llama import LlamaSettings
from scorer_container.model_files import TEMPERATURE_RANGE

PREFIX = "SM_LLAMA_CPP_"
# llama-server option (long and short names) -> LlamaSettings field.
_LLAMA_OPTIONS = {
    "ctx-size": "n_ctx", "c": "n_ctx",
    "batch-size": "n_batch", "b": "n_batch",
    "ubatch-size": "n_ubatch", "ub": "n_ubatch",
    "threads": "n_threads", "t": "n_threads",
    "threads-batch": "n_threads_batch", "tb": "n_threads_batch",
    "n-gpu-layers": "n_gpu_layers", "ngl": "n_gpu_layers", "gpu-layers": "n_gpu_layers",
    "parallel": "n_seq_max", "np": "n_seq_max",
    "flash-attn": "flash_attn", "fa": "flash_attn",
    "no-mmap": "use_mmap",
    "seed": "seed", "s": "seed",
}
_NOT_OPTIONS = {"model", "model-dir"}
MAX_SEQUENCES = 128  # the llama.cpp this image pins fails its decodes past it


@dataclass(frozen=True)
class ScorerSettings:
    model: str | None = None
    model_dir: str | None = None
    llama: LlamaSettings = field(default_factory=LlamaSettings)
    readout: str | None = None  # overrides the manifest's readout
    alias: str | None = None  # the model name reported to callers
    # The line (scheduler.py): requests admitted at once (planning, waiting, running), more get 503;
    # one tenant at most `tenant_share` of them (429 tenant_share); at most `max_resident` in the
    # model's memory at once, taking turns a step (about `step_s` seconds of work) at a time; long
    # work gets `long_share` of the model while ordinary work waits, bulk work `bulk_share`.
    max_jobs: int = 8
    max_resident: int = 4
    tenant_share: float = 0.5
    long_share: float = 0.25
    bulk_share: float = 0.05
    step_s: float = 1.0
    prior_cache_size: int = 4096
    # The states read for each tenant, kept in memory for its next question about them
    # (state_cache.py): at most this many MiB in all (None: a quarter of the memory the model
    # leaves, service.state_cache_bytes; 0: nothing is kept, as on the Serverless pool, which
    # has no affinity), each tenant at most `state_cache_share` of it, each entry for
    # `state_cache_ttl_s` after its last use.
    state_cache_mb: int | None = None
    state_cache_share: float = 0.25
    state_cache_ttl_s: float = 600.0
    max_body_bytes: int = 6 * 1024 * 1024
    max_labels: int = 26
    temperature: float | None = None  # overrides the manifest's fitted temperatures
    # Work per request: a fixed token budget, or None to derive it from the measured
    # prefill rate x budget_s (see budget.py).
    max_request_tokens: int | None = None
    budget_s: float = 22.0
    # A request with a deadline past any buffered API Gateway request's (the gateway's
    # streaming routes): up to this much work, run as long work (at long work's share).
    long_budget_s: float = 55.0
    # The longest any job may run: SageMaker allows 60 s per invocation; a caller's own
    # deadline (custom attribute timeout_ms) can only shorten it.
    deadline_s: float = 58.0
    ignored_options: tuple[str, ...] = ()
    image_digest: str | None = None  # the image this runs in (set by the deployment), reported with each decision
    expected_sha256: str | None = None  # the model file's sha256 the deployment pins (SCORER_MODEL_SHA256)
    # The manifest's canonical hash the deployment pins (SCORER_MANIFEST_SHA256; see
    # model_files.manifest_sha256). A file pinned without its manifest is refused at load.
    expected_manifest_sha256: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ScorerSettings:
        env = os.environ if env is None else env
        llama: dict[str, object] = {}
        ignored = []
        for key, raw in sorted(env.items()):
            if not key.startswith(PREFIX):
                continue
            option = key[len(PREFIX):].lower().replace("_", "-")
            if option in _NOT_OPTIONS or option in ("readout", "alias"):
                continue
            target = _LLAMA_OPTIONS.get(option)
            if target is None:
                ignored.append(option)
                continue
            if target == "use_mmap":
                llama[target] = not _flag(raw)
            elif target == "flash_attn":
                llama[target] = raw.strip().lower() in ("true", "on", "1", "enabled", "yes")
            else:
                llama[target] = _int(key, raw)
        if env.get("SCORER_CONTEXT_JOBS"):
            llama["context_jobs"] = _at_least("SCORER_CONTEXT_JOBS", env["SCORER_CONTEXT_JOBS"], 1)
        settings = LlamaSettings(**llama)  # type: ignore[arg-type]
        if not 1 <= settings.n_seq_max <= min(MAX_SEQUENCES, settings.n_batch):
            # llama.cpp aborts the process on a decode when its sequences outnumber its batch,
            # and refuses more than MAX_SEQUENCES: say so at start instead.
            raise ValueError(f"{PREFIX}PARALLEL must be between 1 and {MAX_SEQUENCES}, and at most"
                             f" {PREFIX}BATCH_SIZE ({settings.n_batch})")
        readout = env.get(PREFIX + "READOUT") or env.get("SCORER_READOUT")
        if readout and readout not in ("letters", "likelihood"):
            raise ValueError(f"{PREFIX}READOUT must be 'letters' or 'likelihood'")
        return cls(
            model=env.get(PREFIX + "MODEL") or None,
            model_dir=env.get(PREFIX + "MODEL_DIR") or None,
            llama=settings,
            readout=readout or None,
            alias=env.get(PREFIX + "ALIAS") or None,
            max_jobs=_at_least("SCORER_MAX_JOBS", env.get("SCORER_MAX_JOBS", "8"), 1),
            max_resident=_at_least("SCORER_MAX_RESIDENT", env.get("SCORER_MAX_RESIDENT", "4"), 1),
            tenant_share=_fraction("SCORER_TENANT_SHARE", env.get("SCORER_TENANT_SHARE", "0.5"), inclusive=True),
            long_share=_fraction("SCORER_LONG_SHARE", env.get("SCORER_LONG_SHARE", "0.25")),
            bulk_share=_fraction("SCORER_BULK_SHARE", env.get("SCORER_BULK_SHARE", "0.05")),
            step_s=_seconds("SCORER_STEP_S", env.get("SCORER_STEP_S", "1")),
            prior_cache_size=_int("SCORER_PRIOR_CACHE_SIZE", env.get("SCORER_PRIOR_CACHE_SIZE", "4096")),
            state_cache_mb=_at_least_or_none("SCORER_STATE_CACHE_MB", env.get("SCORER_STATE_CACHE_MB"), 0),
            state_cache_share=_fraction("SCORER_STATE_CACHE_SHARE", env.get("SCORER_STATE_CACHE_SHARE", "0.25"),
                                        inclusive=True),
            state_cache_ttl_s=_seconds("SCORER_STATE_CACHE_TTL_S", env.get("SCORER_STATE_CACHE_TTL_S", "600")),
            max_body_bytes=_int("SCORER_MAX_BODY_BYTES", env.get("SCORER_MAX_BODY_BYTES", str(6 * 1024 * 1024))),
            max_labels=min(26, _int("SCORER_MAX_LABELS", env.get("SCORER_MAX_LABELS", "26"))),
            temperature=_temperature(env.get("SCORER_TEMPERATURE")),
            max_request_tokens=_positive("SCORER_MAX_REQUEST_TOKENS", env.get("SCORER_MAX_REQUEST_TOKENS")),
            budget_s=_seconds("SCORER_BUDGET_S", env.get("SCORER_BUDGET_S", "22")),
            long_budget_s=_seconds("SCORER_LONG_BUDGET_S", env.get("SCORER_LONG_BUDGET_S", "55")),
            deadline_s=_seconds("SCORER_DEADLINE_S", env.get("SCORER_DEADLINE_S", "58")),
            image_digest=env.get("SCORER_IMAGE_DIGEST") or None,
            expected_sha256=_sha256("SCORER_MODEL_SHA256", env.get("SCORER_MODEL_SHA256")),
            expected_manifest_sha256=_sha256("SCORER_MANIFEST_SHA256", env.get("SCORER_MANIFEST_SHA256")),
            ignored_options=tuple(ignored),
        )


def _sha256(name: str, raw: str | None) -> str | None:
    if raw is None or not raw.strip():
        return None
    value = raw.strip().lower()
    if len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
        raise ValueError(f"{name} must be 64 hex digits")
    return value


def _positive(name: str, raw: str | None) -> int | None:
    if raw is None or not raw.strip():
        return None
    value = _int(name, raw)
    if value < 1:
        raise ValueError(f"{name} must be a positive integer")
    return value


def _seconds(name: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name} must be a number of seconds") from None
    if not 0 < value <= 3600:
        raise ValueError(f"{name} must be between 0 and 3600 seconds")
    return value


def _temperature(raw: str | None) -> float | None:
    if raw is None or not raw.strip():
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ValueError("SCORER_TEMPERATURE must be a number") from None
    low, high = TEMPERATURE_RANGE
    if not low <= value <= high:  # also refuses nan and inf
        raise ValueError(f"SCORER_TEMPERATURE must be between {low} and {high:g}")
    return value


def _at_least_or_none(name: str, raw: str | None, low: int) -> int | None:
    return None if raw is None or not raw.strip() else _at_least(name, raw, low)


def _at_least(name: str, raw: str, low: int) -> int:
    value = _int(name, raw)
    if value < low:
        raise ValueError(f"{name} must be at least {low}")
    return value


def _fraction(name: str, raw: str, inclusive: bool = False) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name} must be a number") from None
    if not (0 < value < 1 or (inclusive and value == 1)):
        raise ValueError(f"{name} must be a fraction between 0 and 1")
    return value


def _flag(raw: str) -> bool:
    return raw.strip().lower() not in ("false", "0", "no", "off", "")


def _int(name: str, raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer") from None
