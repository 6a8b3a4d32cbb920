"""The scorer refuses a model whose manifest is not the one the deployment pinned, and
says why on /ping, as it does for a model file that is not the pinned one."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from scorer_container.model_files import MANIFEST_NAME, model_pins
from scorer_container.server import create_app
from scorer_container.settings import ScorerSettings
from tests.conftest import ServerThread

pytestmark = pytest.mark.model  # a real model is loaded behind each pin


@pytest.fixture
def pinned_model(tmp_path, smollm2_path):
    """A copy of the small model's folder (the GGUF linked, the manifest copied), with
    quarantine on in its manifest, and the pins a deployment would set for it."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / smollm2_path.name).symlink_to(smollm2_path)
    manifest = json.loads((smollm2_path.parent / MANIFEST_NAME).read_text())
    (folder / MANIFEST_NAME).write_text(json.dumps({**manifest, "quarantine": True}))
    return folder, model_pins(folder / smollm2_path.name)


def _settled_ping(url: str) -> httpx.Response:
    deadline = time.monotonic() + 60
    while (ping := httpx.get(f"{url}/ping")).json()["status"] == "loading" and time.monotonic() < deadline:
        time.sleep(0.1)
    return ping


def _settings(folder, pins) -> ScorerSettings:
    return ScorerSettings.from_env({"SM_LLAMA_CPP_MODEL_DIR": str(folder), "SM_LLAMA_CPP_THREADS": "2",
                                    "SCORER_MODEL_SHA256": pins.sha256, "SCORER_MANIFEST_SHA256": pins.manifest_sha256})


def test_a_manifest_with_quarantine_switched_off_is_refused_with_the_reason_on_ping(pinned_model):
    # Given a deployment that pinned the model with quarantine on
    folder, pins = pinned_model
    # When the artifact's manifest is rewritten with quarantine off (the GGUF untouched)
    manifest = json.loads((folder / MANIFEST_NAME).read_text())
    (folder / MANIFEST_NAME).write_text(json.dumps({**manifest, "quarantine": False}))
    # Then the scorer stays unhealthy and says why
    with ServerThread(create_app(_settings(folder, pins))) as server:
        ping = _settled_ping(server.url)
        assert ping.status_code == 503
        assert ping.json()["status"] == "failed" and "pinned manifest hash" in ping.json()["reason"]


def test_the_pinned_model_and_manifest_load(pinned_model):
    folder, pins = pinned_model
    with ServerThread(create_app(_settings(folder, pins), load_in_background=False)) as server:
        ping = httpx.get(f"{server.url}/ping")
        assert ping.status_code == 200, ping.json()
