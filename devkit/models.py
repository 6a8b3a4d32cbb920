"""Where the embedded models lie once `make setup` has fetched them."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SMOLLM2_DIR = ROOT / "models" / "smollm2-135m-instruct-q4_1"
GEMMA_DIR = ROOT / "models" / "gemma-3-270m-q4_k_m"
