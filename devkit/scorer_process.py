"""The scorer as its own process, for the benchmarks and the tests that need a real one."""

from __future__ import annotations

import os
import socket
import time

from devkit.models import ROOT


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ScorerProcess:
    """The scorer behind the local SageMaker stand-in (`python -m devkit.sagemaker_standin`), its own process."""

    def __init__(self, env: dict[str, str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = env
        self.process = None

    def __enter__(self) -> ScorerProcess:
        import subprocess
        import sys

        self.process = subprocess.Popen(
            [sys.executable, "-m", "devkit.sagemaker_standin", "--host", "127.0.0.1", "--port", str(self.port)],
            cwd=ROOT, env={**os.environ, "SM_LLAMA_CPP_THREADS": "1", **self.env},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        return self

    def wait(self, status: str, timeout_s: float = 120) -> None:
        import httpx

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"scorer exited with {self.process.returncode}")
            try:
                if httpx.get(f"{self.url}/ping", timeout=2).json().get("status") == status:
                    return
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.2)
        raise RuntimeError(f"scorer not {status} within {timeout_s} s")

    def kill(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)

    def __exit__(self, *exc) -> None:
        self.kill()
