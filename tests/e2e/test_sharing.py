"""Refusals of one request never look like the endpoint failing, against the real scorer's refusal:
the gateway's pool and circuit in front of a scorer process that refuses long work past its share
(429 `long_share`), over HTTP through the local API Gateway runner."""

from __future__ import annotations

import os
import threading
import time

import httpx
import pytest

from systemone.sidechannel import CUSTOM_ATTRIBUTES, attributes, tenant_tag
from tests.conftest import words

pytestmark = pytest.mark.model

DECISION = {"model": "jev-latest", "state": "I was charged twice for order 4411, refund one please.",
            "questions": {"refund": {"type": "noul", "instructions": "Is this a refund request?"}}}
LONG_CHAT = {"model": "chat-default", "messages": [{"role": "user", "content": "Tell a very long story about a lighthouse."}],
             "max_tokens": 1000, "temperature": 0.8, "seed": 3, "stream": True}
WAIT = {"Prefer": "wait=58"}


@pytest.fixture(scope="module")
def stack(smollm2_path, tmp_path_factory):
    """A scorer with two resident places (so long work may have one) behind the gateway, whose
    record keys give each tenant a tag of its own; tenants `late` and `steady`."""
    from devkit.gateway_stack import settings_for
    from devkit.local import InProcessFunction, LocalApiGateway, make_server
    from devkit.scorer_process import ScorerProcess
    from gateway.auth.authenticate import Authenticator
    from gateway.auth.tenants import create_tenant, issue_api_key
    from gateway.auth.tokens import file_key_ring, new_key_document
    from gateway.functions.authorizer import Authorizer
    from gateway.functions.composition import build_services
    from gateway.functions.handler import GatewayFunction
    from gateway.stores.sqlite import open_sqlite

    for name, value in (("AWS_ACCESS_KEY_ID", "local"), ("AWS_SECRET_ACCESS_KEY", "local"), ("AWS_DEFAULT_REGION", "us-east-1")):
        os.environ.setdefault(name, value)
    folder = tmp_path_factory.mktemp("sharing")
    store = open_sqlite(folder / "gateway.db")
    keys = {}
    for tenant in ("late", "steady"):
        create_tenant(store.tenants, tenant)
        keys[tenant] = issue_api_key(store.tenants, tenant, ["chat", "decide"]).secret
    (folder / "signing-keys.json").write_text(new_key_document())
    (folder / "record-keys.json").write_text(new_key_document())
    authenticator = Authenticator(store, file_key_ring(folder / "signing-keys.json"))
    with ScorerProcess({"SM_LLAMA_CPP_MODEL": str(smollm2_path), "SM_LLAMA_CPP_THREADS": "2",
                        "SCORER_MAX_REQUEST_TOKENS": "60000", "SCORER_MAX_RESIDENT": "2"}) as scorer:
        scorer.wait("ready")
        services = build_services(settings_for(scorer.url), stores=store, authenticator=authenticator,
                                record_keys=file_key_ring(folder / "record-keys.json"))
        gateway = LocalApiGateway(InProcessFunction(GatewayFunction(services)), authorizer=Authorizer(authenticator))
        server = make_server("127.0.0.1", 0, gateway)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}", keys, scorer.url
        finally:
            server.shutdown()
            server.server_close()


def test_refused_long_requests_never_shut_the_endpoint_for_another_tenants_ordinary_work(stack):
    url, keys, scorer = stack
    # Given another gateway instance's tenant streaming a long chat (sent to the scorer as that
    # instance sends it: this stack's function is one instance, serving one request at a time):
    # it holds long work's one place on the scorer
    held: dict = {}

    def stream():
        tag = attributes("chat", 58_000, tenant=tenant_tag("holder", b"another instance's key"), work="long")
        with httpx.stream("POST", f"{scorer}/invocations", json={**LONG_CHAT, "model": "m"}, timeout=90,
                          headers={CUSTOM_ATTRIBUTES: tag}) as reply:
            held["status"] = reply.status_code
            for line in reply.iter_lines():
                if words(line):
                    generating.set()

    generating = threading.Event()
    worker = threading.Thread(target=stream)
    worker.start()
    assert generating.wait(60)
    # When tenant late sends three long requests, each refused by the scorer (429 long_share)
    refusals = [httpx.post(f"{url}/v1/chat/completions", json={**LONG_CHAT, "stream": False}, timeout=60,
                           headers={"Authorization": f"Bearer {keys['late']}", **WAIT}) for _ in range(3)]
    # Then each is a 429 with a Retry-After, and tenant steady's ordinary decision still reaches the
    # scorer: the refusals concerned those requests, not the endpoint, so its circuit stayed shut
    started = time.monotonic()
    decided = httpx.post(f"{url}/v1/systemone", json=DECISION, timeout=60,
                         headers={"Authorization": f"Bearer {keys['steady']}"})
    worker.join()
    assert [r.status_code for r in refusals] == [429, 429, 429]
    assert all(int(r.headers["retry-after"]) >= 1 for r in refusals)
    assert decided.status_code == 200, decided.text
    assert decided.headers["x-attempts"] == "1" and decided.headers["x-endpoint"] == "dg-cpu"
    assert time.monotonic() - started < 30 and held["status"] == 200
