"""The local stack the end-to-end benchmarks run: a real scorer process behind the gateway's
local API Gateway runner (the authorizer, the function in worker processes), as `make up`
serves it, with tenants of their own on a fresh SQLite store."""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class Stack:
    gateway: str  # the gateway's base URL
    scorer: Any  # the scorer process (its .url, .pid)
    keys: dict[str, str]  # tenant -> API key (decide and chat scopes)


@contextmanager
def local_stack(model_dir: Path, tenants: tuple[str, ...] = ("bench",)) -> Iterator[Stack]:
    from gateway.observability import configure_logging

    quiet = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1",
             "POWERTOOLS_LOG_LEVEL": "ERROR", "POWERTOOLS_METRICS_DISABLED": "true"}
    # The stack's own settings, for as long as it runs: a test that starts one must not leave its
    # process without logs and metrics for the tests after it.
    before = {name: os.environ.get(name) for name in quiet}
    os.environ.update(quiet)
    configure_logging()
    try:
        yield from _serving(model_dir, tenants)
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        configure_logging()


def _serving(model_dir: Path, tenants: tuple[str, ...]) -> Iterator[Stack]:
    from devkit.gateway_stack import settings_for
    from devkit.local import LocalApiGateway, ProcessFunctions, make_server
    from devkit.scorer_process import ScorerProcess
    from gateway.auth.authenticate import Authenticator
    from gateway.auth.tenants import create_tenant, issue_api_key
    from gateway.functions.authorizer import Authorizer
    from gateway.stores.sqlite import open_sqlite

    stores = open_sqlite(Path(tempfile.mkdtemp(prefix="bench-stack-")) / "gateway.db")
    store = stores.tenants
    keys = {}
    for tenant in tenants:
        create_tenant(store, tenant)
        keys[tenant] = issue_api_key(store, tenant, ["decide", "chat"]).secret
    with ScorerProcess({"SM_LLAMA_CPP_MODEL_DIR": str(model_dir), "SM_LLAMA_CPP_THREADS": "2"}) as scorer:
        scorer.wait("ready")
        # The authorizer checks the keys; the function itself runs without a store (no records).
        functions = ProcessFunctions(max_instances=2, env={"GATEWAY_MODELS": settings_for(scorer.url).model_dump_json()})
        server = make_server("127.0.0.1", 0, LocalApiGateway(functions, authorizer=Authorizer(Authenticator(stores))))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        functions.prewarm(1)
        try:
            yield Stack(f"http://127.0.0.1:{server.server_address[1]}", scorer, keys)
        finally:
            server.shutdown()
            server.server_close()
            functions.close()
