"""`make up` stops what it started, whoever stops it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.model
ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def batch_workers(state_dir: Path) -> list[int]:
    """The batch worker processes on this state folder's store (found by their environment)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and b"devkit.batch_worker" in (entry / "cmdline").read_bytes() \
                    and str(state_dir).encode() in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue  # ended meanwhile, or not ours
    return found


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL])
def test_stopping_make_up_stops_the_scorer_the_gateway_and_the_batch_worker(tmp_path, stop):
    # Given the local stack up, when its runner gets SIGTERM (timeout, a supervisor) or is
    # killed outright, then the scorer, the gateway and the batch worker stop too and free their ports.
    scorer_port, gateway_port = free_port(), free_port()
    up = subprocess.Popen([sys.executable, "scripts/up.py", "--model", "models/smollm2-135m-instruct-q4_1",
                           "--scorer-port", str(scorer_port), "--gateway-port", str(gateway_port),
                           "--state-dir", str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, env={**os.environ, "GATEWAY_DEV_API_KEY": ""})
    lines = []
    for line in up.stdout:
        lines.append(line)
        if "The local stack is up" in line:
            break
    assert listening(scorer_port) and listening(gateway_port), "".join(lines)
    assert len(batch_workers(tmp_path)) == 1
    up.send_signal(stop)
    up.wait(timeout=60)
    deadline = time.monotonic() + 30
    while (listening(scorer_port) or listening(gateway_port) or batch_workers(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not listening(scorer_port) and not listening(gateway_port) and not batch_workers(tmp_path)


def test_make_up_pins_an_embedded_model_and_its_manifest_as_a_deployment_does():
    # Given the embedded models `make setup` installed, the pins `make up` passes its scorer
    # are the project's own figures (the code's sha256, the manifest evals chose), so they
    # verify what setup wrote; another folder runs unpinned.
    import json

    sys.path.insert(0, str(ROOT / "scripts"))
    import up

    from scorer_container.model_files import manifest_sha256

    for name in ("gemma-3-270m-q4_k_m", "smollm2-135m-instruct-q4_1"):
        pins = up.model_pins(ROOT / "models" / name)
        on_disk = json.loads((ROOT / "models" / name / "model-manifest.json").read_text())
        assert pins["SCORER_MODEL_SHA256"] == on_disk["sha256"]
        assert pins["SCORER_MANIFEST_SHA256"] == manifest_sha256(on_disk)
    assert up.model_pins(ROOT / "models" / "somewhere-else") == {}
