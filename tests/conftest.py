"""Shared fixtures: the embedded models (installed by `make setup`) and a real scorer server."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from devkit.models import GEMMA_DIR, SMOLLM2_DIR
from devkit.scorer_process import free_port
from tests import declared_statuses

ROOT = Path(__file__).resolve().parent.parent

# What a developer's shell may hold for the project or for AWS (the README suggests
# GATEWAY_DEV_API_KEY and DG_API_KEY; the gateway reads GATEWAY_*, the scorer SM_* and
# SCORER_*, boto3 AWS_* and ~/.aws). No test reads it: every test, and every process a test
# starts, begins from the same environment, and a test that needs one of these sets it.
DEVELOPER_PREFIXES = ("GATEWAY_", "AWS_", "DG_", "SM_", "SCORER_", "POWERTOOLS_", "LLAMA_", "OPENAI_")
# A proxy would see the tests' loopback traffic, credentials included (httpx and botocore
# honour these for 127.0.0.1 too).
PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")
NO_AWS_FILES = str(ROOT / "tests" / "no-aws-config")  # does not exist: boto3 reads no profile


def without_the_developers_environment(environ: dict[str, str]) -> None:
    for name in [n for n in environ if n.startswith(DEVELOPER_PREFIXES) or n.upper() in PROXY_VARIABLES]:
        del environ[name]
    environ["AWS_CONFIG_FILE"] = environ["AWS_SHARED_CREDENTIALS_FILE"] = NO_AWS_FILES
    environ["AWS_EC2_METADATA_DISABLED"] = "true"  # nor any instance's credentials


without_the_developers_environment(os.environ)  # before any test module is imported


@pytest.fixture(autouse=True)
def fresh_aws_session() -> Iterator[None]:
    """Each test's AWS clients read its own environment (and moto's handlers, when it mocks)."""
    from gateway import aws

    aws.reset_session()
    yield
# A well-formed API key used by tests that exercise credentials: no test output, log line,
# metric or error body may ever contain it (checked after every test, below).
CANARY_KEY = "dgk_ca11ab1eca11ab1e_" + ("Canary" * 8)[:43]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    declared_statuses.report_undeclared(item, report)
    leaked = [name for name, text in report.sections if CANARY_KEY in text or CANARY_KEY[:24] in text]
    if leaked and report.passed:
        report.outcome = "failed"
        report.longrepr = f"the canary credential appears in captured output: {', '.join(leaked)}"


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
def smollm2_llama(smollm2_path):
    from scorer_container.llama import LlamaModel, LlamaSettings

    services = LlamaModel(smollm2_path, LlamaSettings(n_ctx=4096, n_threads=2))
    yield services
    services.close()


def make_engine(services, readout: str, **kwargs):
    from scorer_container.engine import DecisionEngine
    from scorer_container.prompts import PromptFormat

    prompts = PromptFormat.for_model(services)
    return DecisionEngine(services, prompts, model_name="test-model", default_readout=readout,
                          **{"defenses_overridable": True, **kwargs})


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
    """The scorer behind the local SageMaker stand-in: the runtime API's paths and the scorer's own."""
    from devkit.sagemaker_standin import SageMakerStandIn
    from scorer_container.server import create_app
    from scorer_container.settings import ScorerSettings

    # A fixed work budget: the derived one depends on this machine's speed.
    settings = ScorerSettings.from_env({"SM_LLAMA_CPP_MODEL": str(smollm2_path), "SM_LLAMA_CPP_THREADS": "2",
                                        "SCORER_MAX_REQUEST_TOKENS": "60000"})
    with ServerThread(SageMakerStandIn(create_app(settings, load_in_background=False))) as server:
        yield server.url


class LocalStack:
    """The scorer (a real model) behind the gateway's local API Gateway runner, over HTTP."""

    ROLE = "arn:aws:iam::123456789012:role/DecisionClients"

    def __init__(self, url: str, api_key: str, function, authenticator, store) -> None:
        self.url, self.api_key, self.function, self.authenticator, self.store = url, api_key, function, authenticator, store

    def mint(self, **body) -> str:
        """A token minted over HTTP by an (emulated) SigV4 caller of the stack's IAM role."""
        import httpx

        reply = httpx.post(f"{self.url}/v1/tokens", json=body, timeout=30,
                           headers={"X-Local-Iam-Principal": "arn:aws:sts::123456789012:assumed-role/DecisionClients/ci"})
        assert reply.status_code == 201, reply.text
        return reply.json()["token"]


@pytest.fixture(scope="session")
def _local_stack(scorer_url, tmp_path_factory) -> Iterator[LocalStack]:
    from devkit.gateway_stack import settings_for
    from devkit.local import InProcessFunction, LocalApiGateway, make_server
    from gateway.auth.authenticate import Authenticator
    from gateway.auth.store import PrincipalRule
    from gateway.auth.tenants import create_tenant, issue_api_key
    from gateway.auth.tokens import file_key_ring, new_key_document
    from gateway.functions.authorizer import Authorizer
    from gateway.functions.composition import build_services
    from gateway.functions.handler import GatewayFunction
    from gateway.stores.sqlite import open_sqlite
    from tests.gateway_helpers import unthrottled

    # boto3 signs every call; the local scorer ignores the signature. Not a credential.
    for name, value in (("AWS_ACCESS_KEY_ID", "local"), ("AWS_SECRET_ACCESS_KEY", "local"), ("AWS_DEFAULT_REGION", "us-east-1")):
        os.environ.setdefault(name, value)
    folder = tmp_path_factory.mktemp("store")
    store = open_sqlite(folder / "gateway.db")
    create_tenant(store.tenants, "acme")
    unthrottled(store, "acme")  # a session of SDK tests in a row, as one tenant
    key = issue_api_key(store.tenants, "acme", ["chat", "decide", "catalogs:read", "catalogs:write"])
    store.tenants.put_principal_rule(PrincipalRule(LocalStack.ROLE, "acme", ("chat", "decide"), None, time.time()))
    (folder / "signing-keys.json").write_text(new_key_document())
    authenticator = Authenticator(store, file_key_ring(folder / "signing-keys.json"))
    (folder / "record-keys.json").write_text(new_key_document())
    services = build_services(settings_for(scorer_url), stores=store, authenticator=authenticator,
                            record_keys=file_key_ring(folder / "record-keys.json"))
    # The stack's own function and authorizer (in Lambda's terms: one warm instance of each).
    stack = LocalStack("", key.secret, GatewayFunction(services), authenticator, store)
    stack.folder, stack.settings = folder, services.settings  # what a worker process beside it is given
    gateway = LocalApiGateway(InProcessFunction(stack.function), authorizer=Authorizer(authenticator))
    server = make_server("127.0.0.1", 0, gateway)
    stack.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield stack
    server.shutdown()
    server.server_close()


@pytest.fixture
def local_stack(_local_stack) -> LocalStack:
    return _local_stack


def words(line: str) -> bool:
    """Whether a line of server-sent events carries generated text (a chat chunk's delta content)."""
    if not line.startswith("data: {"):
        return False
    choices = json.loads(line[6:]).get("choices") or [{}]
    return bool(choices[0].get("delta", {}).get("content"))


# Property-based tests draw their examples from schemas, which takes most of their time:
# make test-fast runs each on a fifth of them (at least 10), make test on all.
_thin_fuzz = False


def pytest_addoption(parser):
    parser.addoption("--statuses-answered", metavar="PATH",
                     help="append the (operation, status) pairs the gateway answered to PATH (tests/declared_statuses.py)")
    parser.addoption("--thin-fuzz", action="store_true",
                     help="run each property-based test on a fifth of its examples (make test-fast)")


def pytest_configure(config):
    global _thin_fuzz
    _thin_fuzz = config.getoption("--thin-fuzz")
    declared_statuses.install()


def pytest_deselected(items):
    declared_statuses.LEDGER.deselected = True


def pytest_sessionfinish(session, exitstatus):
    declared_statuses.check_every_status_answered(session)


def examples(n: int) -> int:
    """How many examples a property-based test draws: `n`, or a fifth of it with --thin-fuzz."""
    return max(10, n // 5) if _thin_fuzz else n
