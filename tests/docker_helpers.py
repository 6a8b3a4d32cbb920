"""The Docker engine for the container and `sam local` tests: found, or the reason it is not.

`make container-test`, `make sam-local-test` and `make test` run scripts/engine.sh first,
which starts an engine where the machine allows and writes why not to build/engine.txt.
Without an engine these tests are skipped with that reason, never passed.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCORER_IMAGE = "decision-gateway-scorer:cpu-local"


def docker_binary() -> str:
    # Debian's engine ships its own client; prefer it to any other on PATH (it builds
    # with the engine's BuildKit, which a newer client without buildx cannot).
    return "/usr/bin/docker" if Path("/usr/bin/docker").exists() else (shutil.which("docker") or "docker")


def docker(*args: str, check: bool = True, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([docker_binary(), *args], check=check, timeout=timeout, capture_output=True, text=True, **kwargs)


def require_engine() -> None:
    """Skip, quoting why, when no engine answers."""
    try:
        answered = docker("info", check=False, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        answered = False
    if not answered:
        status = ROOT / "build" / "engine.txt"
        reason = status.read_text().strip() if status.exists() else "no Docker engine answers (run scripts/engine.sh)"
        pytest.skip(f"no Docker engine: {reason}")


def ensure_scorer_image() -> str:
    """The CPU scorer image, built (offline bases included) when it is missing."""
    if docker("image", "inspect", SCORER_IMAGE, check=False).returncode != 0:
        subprocess.run([str(ROOT / "scripts" / "scorer_image.sh")], check=True, timeout=3600)
    return SCORER_IMAGE
