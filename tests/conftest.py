"""Shared fixtures: the embedded models (installed by `make setup`) and a real scorer server."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SMOLLM2_DIR = ROOT / "models" / "smollm2-135m-instruct-q4_1"
GEMMA_DIR = ROOT / "models" / "gemma-3-270m-q4_k_m"


def model_file(folder: Path) -> Path:
    found = sorted(folder.glob("*.gguf"))
    if not found:
        pytest.fail(f"{folder} has no model: run `make setup` first")
    return found[0]


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    return model_file(SMOLLM2_DIR)


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    return model_file(GEMMA_DIR)


@pytest.fixture(scope="session")
def smollm2_runtime(smollm2_path):
    from scorer_container.llama_runtime import Runtime, RuntimeSettings

    runtime = Runtime(smollm2_path, RuntimeSettings(n_ctx=4096, n_threads=2))
    yield runtime
    runtime.close()


def make_engine(runtime, readout: str, **kwargs):
    from scorer_container.engine import DecisionEngine
    from scorer_container.prompts import PromptFormat

    prompts = PromptFormat.for_runtime(runtime)
    return DecisionEngine(runtime, prompts, model_name="test-model", default_readout=readout, **kwargs)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerThread:
    """A real uvicorn server on a free loopback port, in a thread of the test process."""

    def __init__(self, app) -> None:
        import uvicorn

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


@pytest.fixture(scope="session")
def scorer_url(smollm2_path) -> Iterator[str]:
    from scorer_container.server import create_app
    from scorer_container.settings import ScorerSettings

    settings = ScorerSettings.from_env({"SM_LLAMA_CPP_MODEL": str(smollm2_path), "SM_LLAMA_CPP_THREADS": "2"})
    with ServerThread(create_app(settings, load_in_background=False)) as server:
        yield server.url
