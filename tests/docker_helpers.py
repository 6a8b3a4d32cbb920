"""The Docker engine for the container and `sam local` tests: found, or the reason it is not.

`make container-test`, `make sam-local-test` and `make test` run scripts/engine.sh first,
which starts an engine where the machine allows and writes why not to build/engine.txt.
Without an engine these tests are skipped with that reason, never passed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from sam_local import docker_binary  # noqa: E402  (one choice of client for the scripts and the tests)


def docker(*args: str, check: bool = True, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([docker_binary(), *args], check=check, timeout=timeout, capture_output=True, text=True, **kwargs)


def require_engine() -> None:
    """Skip, quoting why, when no engine answers."""
    try:
        answered = docker("info", check=False, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        answered = False
    if answered:
        return
    status = ROOT / "build" / "engine.txt"
    reason = status.read_text().strip() if status.exists() else "scripts/engine.sh has not run"
    if reason == "ready":
        reason = "the engine answered when scripts/engine.sh ran, but does not now"
    pytest.skip(f"no Docker engine: {reason}")


def ensure_base_images() -> None:
    """The bases, pulled or built from Debian packages (a no-op once they are present)."""
    subprocess.run([str(ROOT / "scripts" / "base_images.sh")], check=True, timeout=1800)


def ensure_scorer_image() -> str:
    """The CPU scorer image of this checkout: scripts/scorer_image.sh runs every time (it
    takes a second when nothing changed), so the tests never run a stale image. The script
    names the image it built on its last line."""
    run = subprocess.run([str(ROOT / "scripts" / "scorer_image.sh")], check=True, timeout=3600,
                         stdout=subprocess.PIPE, text=True)
    return run.stdout.strip().splitlines()[-1]
