"""Without a Docker engine the container and sam local tests are skipped with the reason,
never passed: the two halves of that path, each without an engine."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests import docker_helpers
from tests.docker_helpers import ROOT


def test_engine_sh_says_why_there_is_none_and_exits_3(tmp_path):
    status = tmp_path / "engine.txt"
    env = {**os.environ, "DOCKER": "/bin/false", "DG_NO_ENGINE_SETUP": "1", "DG_ENGINE_STATUS": str(status)}
    run = subprocess.run([str(ROOT / "scripts" / "engine.sh")], capture_output=True, text=True, env=env, timeout=60)
    assert run.returncode == 3
    assert run.stdout.startswith("no engine: ") and "DG_NO_ENGINE_SETUP=1" in run.stdout
    assert status.read_text().strip() in run.stdout


@pytest.fixture
def no_engine(monkeypatch, tmp_path):
    """No client answers; the function returned writes what engine.sh last said."""
    monkeypatch.setattr(docker_helpers, "docker_binary", lambda: "/bin/false")
    monkeypatch.setattr(docker_helpers, "ROOT", tmp_path)
    (tmp_path / "build").mkdir()
    return (tmp_path / "build" / "engine.txt").write_text


def test_the_tests_skip_quoting_that_reason(no_engine):
    no_engine("no Docker engine answers, and starting one needs root\n")
    with pytest.raises(pytest.skip.Exception, match="starting one needs root"):
        docker_helpers.require_engine()


def test_a_stale_ready_status_is_not_given_as_the_reason(no_engine):
    no_engine("ready\n")
    with pytest.raises(pytest.skip.Exception, match="does not now"):
        docker_helpers.require_engine()
