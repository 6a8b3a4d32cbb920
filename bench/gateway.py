"""`make bench-gateway`: what the gateway adds to a request, what its cold start costs,
how much memory it holds, and the same requests through LiteLLM's proxy, in one run.

1. Handler overhead, in process: `lambda_handler` on REST proxy events, with the
   backend an in-process fake that answers instantly, against calling that fake
   directly. The difference is the gateway's own time (validation, codecs, routing,
   rendering, logging, metrics).
2. Cold start, in fresh processes, of the function's artifact as `sam build` makes it
   (`make build-GatewayFunction`, for this machine's architecture): importing
   `gateway.functions.handler` (which builds the function, as in Lambda's init phase), then the
   first request through the real botocore SageMaker client to an instant HTTP backend;
   and the RSS after that first request and after a burst (the function runs in a 256 MB
   Lambda). The same artifact without its bytecode runs beside it, as a read-only code
   folder without it would compile every module at every cold start.
3. Over HTTP, against an instant HTTP backend: direct, through the gateway's local
   runner (the stand-in for API Gateway, with the authorizer on every call), and
   through LiteLLM's proxy (OpenAI provider, no auth), for the same chat request.

Writes reports/bench_gateway.json and reports/bench_gateway.png.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REPORTS = ROOT / "reports"
LITELLM_PYTHON = ROOT / ".cache" / "bench-litellm" / "bin" / "python"

SYSTEM_ONE = {
    "model": "jev-latest",
    "state": "Customer wrote: I was charged twice for order 4411, refund one please. " * 4,
    "questions": {
        "is_refund": {"type": "noul", "instructions": "Is the customer asking for a refund?"},
        "queue": {"type": "choice", "instructions": "Which queue?",
                  "criteria": {"billing": "payments and refunds", "delivery": "shipping", "account": None, "other": None}},
        "anger": {"type": "score", "instructions": "How frustrated?", "criteria": ["calm", "annoyed", "angry"]},
    },
}
DECISIONS = {
    "model": "decision-default",
    "input": [{"role": "user", "content": "I was charged twice for order 4411, refund one please."}],
    "questions": [
        {"type": "predicate", "name": "refund", "instructions": "The customer asks for a refund."},
        {"type": "choice", "name": "queue", "instructions": "Which queue?", "choices": [{"value": "billing"}, {"value": "delivery"}]},
        {"type": "score", "name": "anger", "instructions": "How frustrated?", "levels": [{"label": "calm"}, {"label": "angry"}]},
    ],
}
CHAT = {"model": "chat-default", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8}
# What template.yaml's Globals give every function's environment besides its resources
# (tests/infra/test_template.py holds the three copies equal).
TEMPLATE_ENVIRONMENT = {"PYDANTIC_DISABLE_PLUGINS": "__all__", "OPENBLAS_NUM_THREADS": "1"}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# -- 1. in-process overhead ----------------------------------------------------------------


def handler_overhead(requests: int) -> dict:
    from devkit.fake_backend import UniformBackend
    from devkit.gateway_stack import call_installed, event, install
    from gateway.observability import configure_logging

    configure_logging()
    backend = UniformBackend()
    install(backend)
    cases = {
        "systemone 3q": event("POST", "/v1/systemone", SYSTEM_ONE),
        "decisions 3q": event("POST", "/v1/decisions", DECISIONS),
        "chat": event("POST", "/v1/chat/completions", CHAT),
        "models": event("GET", "/v1/models"),
    }
    results = {}
    devnull = open(os.devnull, "w")  # log lines are part of the cost, not of the report
    for name, ev in cases.items():
        progress(f"  handler overhead: {name}")
        stdout = sys.stdout
        sys.stdout = devnull
        try:
            for _ in range(50):  # warm
                call_installed(ev, None)
            handler_times, backend_times = [], []
            for _ in range(requests):
                started = time.perf_counter()
                call_installed(ev, None)
                handler_times.append(time.perf_counter() - started)
            if backend.calls:
                # The fake, alone, on exactly the payload the handler sent it.
                from gateway.backends.base import Endpoint

                endpoint, payload, route = backend.calls[-1]
                sent = json.dumps(payload).encode()
                for _ in range(requests):
                    started = time.perf_counter()
                    backend.invoke(Endpoint(endpoint), sent, route)
                    backend_times.append(time.perf_counter() - started)
        finally:
            sys.stdout = stdout
        backend.calls.clear()
        fake = statistics.median(backend_times) if backend_times else 0.0
        results[name] = {
            "handler_p50_ms": statistics.median(handler_times) * 1000,
            "handler_p95_ms": percentile(handler_times, 0.95) * 1000,
            "fake_backend_p50_ms": fake * 1000,
            "added_p50_ms": (statistics.median(handler_times) - fake) * 1000,
        }
    return results


# -- 2. cold start and memory ----------------------------------------------------------------

_COLD_CHILD = r"""
import json, resource, sys, time, os, io
# Loaded by Lambda's Python runtime client (awslambdaric's bootstrap) before it loads the
# function's module: not the function's cost.
import decimal, logging, threading, traceback
started = time.perf_counter()
import gateway.functions.handler as handler  # in Lambda's init phase: the module loads, then builds the function
loaded = time.perf_counter() - started
init = getattr(handler, "INIT_SECONDS", 0.0)  # what building took (0: built on the first request)
imported = loaded - init
events = json.loads(sys.stdin.read())
real_stdout, sys.stdout = sys.stdout, io.StringIO()
t = time.perf_counter()
first = handler.lambda_handler(events["first"], None)
first_s = time.perf_counter() - t
def peak_mb():
    # The process's own peak (VmHWM): ru_maxrss keeps the parent's across fork and exec.
    try:
        with open("/proc/self/status") as status:
            return next(int(l.split()[1]) for l in status if l.startswith("VmHWM:")) / 1024
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1024 * 1024 if sys.platform == "darwin" else 1024)
rss_cold = peak_mb()
for i in range(int(os.environ["BURST"])):
    sys.stdout = io.StringIO()
    result = handler.lambda_handler(events["burst"][i % len(events["burst"])], None)
    assert result["statusCode"] == 200, result
rss_burst = peak_mb()
sys.stdout = real_stdout
print(json.dumps({"import_s": imported, "init_s": init, "first_request_s": first_s, "status": first["statusCode"],
                  "rss_cold_mb": rss_cold, "rss_burst_mb": rss_burst}))
"""


# The authorizer's cold start as deployed (its stores in DynamoDB, its keys in Secrets
# Manager): the module loads and builds it (Lambda's init phase, which SnapStart snapshots),
# then the first bearer credential is checked (the key's record read, its last use written).
_AUTHORIZER_CHILD = r"""
import json, sys, time, os
import decimal, logging, threading, traceback
started = time.perf_counter()
import gateway.functions.authorizer as authorizer
loaded = time.perf_counter() - started
event = {"type": "REQUEST", "headers": {"Authorization": "Bearer " + os.environ["BENCH_API_KEY"]},
         "methodArn": "arn:aws:execute-api:us-east-1:123456789012:api/live/POST/v1/systemone"}
t = time.perf_counter()
policy = authorizer.lambda_handler(event, None)
first_s = time.perf_counter() - t
allowed = policy["policyDocument"]["Statement"][0]["Effect"] == "Allow" and policy["context"]["tenant_id"] != ""
print(json.dumps({"load_s": loaded, "first_request_s": first_s, "allowed": allowed}))
"""


# The least a function on this stack pays: pydantic, and Powertools' REST resolver with
# validation, one route with a model body, one request; in the same artifact, timed the same way.
_FLOOR_CHILD = r"""
import json, sys, time
import decimal, logging, threading, traceback
event = json.loads(sys.stdin.read())["first"]
started = time.perf_counter()
from pydantic import BaseModel
from aws_lambda_powertools.event_handler import APIGatewayRestResolver
class Ask(BaseModel):
    state: str
    questions: dict[str, dict]
app = APIGatewayRestResolver(enable_validation=True)
@app.post("/v1/systemone")
def decide(ask: Ask) -> dict:
    return {"questions": len(ask.questions)}
result = app.resolve(event, None)
print(json.dumps({"total_s": time.perf_counter() - started, "status": result["statusCode"]}))
"""


def artifacts() -> dict[str, Path]:
    """The function's artifact as `sam build` makes it, and a copy without its bytecode."""
    base = ROOT / "build" / "bench-gateway"
    shipped, bare = base / "artifact", base / "artifact-without-bytecode"
    shutil.rmtree(base, ignore_errors=True)
    arch = "arm64" if platform.machine() in ("aarch64", "arm64") else "x86_64"
    progress(f"  building the function's artifact ({arch}) in {shipped.relative_to(ROOT)}")
    # For the Python that runs this benchmark (the runtime's own may not be on this machine):
    # its packages and bytecode as `sam build` would make them for that version.
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    subprocess.run(["make", "-s", "build-GatewayFunction", f"ARTIFACTS_DIR={shipped}", f"LAMBDA_ARCH={arch}",
                    f"LAMBDA_PYTHON={version}", f"PYTHON={sys.executable}", f"BYTECODE_PYTHON={sys.executable}"],
                   cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    shutil.copytree(shipped, bare, ignore=shutil.ignore_patterns("__pycache__"))
    return {"shipped": shipped, "without_bytecode": bare}


def artifact_for(python: str) -> Path:
    """The artifact as `sam build` makes it for another Python (the template's runtime, when
    this machine has it): its wheels and bytecode for that version."""
    version = _version_of(python)
    folder = ROOT / "build" / "bench-gateway" / f"artifact-python{version}"
    arch = "arm64" if platform.machine() in ("aarch64", "arm64") else "x86_64"
    progress(f"  building the function's artifact for Python {version} in {folder.relative_to(ROOT)}")
    subprocess.run(["make", "-s", "build-GatewayFunction", f"ARTIFACTS_DIR={folder}", f"LAMBDA_ARCH={arch}",
                    f"LAMBDA_PYTHON={version}", f"PYTHON={sys.executable}", f"BYTECODE_PYTHON={python}"],
                   cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    return folder


def _version_of(python: str) -> str:
    return subprocess.run([python, "-c", "import sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}')"],
                          capture_output=True, text=True, check=True).stdout.strip()


def cold_start(runs: int, burst: int, backend_url: str, runtime_python: str | None = None) -> dict:
    """Each artifact's cold start, runs interleaved (so a busy moment hurts all alike)."""
    from devkit.gateway_stack import event

    models = {"models": [
        {"name": "decision-default", "aliases": ["jev-latest"], "serves": ["decisions"],
         "endpoints": [{"name": "bench", "endpoint_url": backend_url}]},
        {"name": "chat-default", "serves": ["chat"], "endpoints": [{"name": "bench", "endpoint_url": backend_url}]},
    ]}
    # As in Lambda: the function is built in the init phase, and nothing writes bytecode.
    env = {**os.environ, "GATEWAY_MODELS": json.dumps(models), "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
           "AWS_DEFAULT_REGION": "us-east-1", "BURST": str(burst), "AWS_LAMBDA_FUNCTION_NAME": "bench-gateway",
           "PYTHONDONTWRITEBYTECODE": "1", **TEMPLATE_ENVIRONMENT}
    env.pop("AWS_PROFILE", None)
    events = {"first": event("POST", "/v1/systemone", SYSTEM_ONE),
              "burst": [event("POST", "/v1/systemone", SYSTEM_ONE), event("POST", "/v1/decisions", DECISIONS),
                        event("POST", "/v1/chat/completions", CHAT), event("GET", "/v1/models")]}
    folders = artifacts()
    built = {name: (folder, sys.executable, {}) for name, folder in folders.items()}
    if runtime_python:
        built["runtime_python"] = (artifact_for(runtime_python), runtime_python, {})
    samples: dict[str, list[dict]] = {name: [] for name in ["with_dynamodb", *built]}
    floor: list[float] = []
    authorizer: list[dict] = []
    with stack_in_moto() as stores:  # as deployed: the credential, catalog and record stores in DynamoDB
        # As deployed first: the stores' clients and secrets in the init phase, on the template's
        # Python when this machine has it.
        deployed_python = runtime_python or sys.executable
        deployed_folder = built["runtime_python"][0] if runtime_python else folders["shipped"]
        built = {"with_dynamodb": (deployed_folder, deployed_python, stores), **built}
        for i in range(runs):
            progress(f"  cold start {i + 1}/{runs}")
            for name, (folder, python, extra) in built.items():  # the code folder: its packages shadow the checkout's
                out = subprocess.run([python, "-c", _COLD_CHILD], input=json.dumps(events), capture_output=True, text=True,
                                     env={**env, **extra, "PYTHONPATH": str(folder)}, cwd=folder, timeout=300)
                if out.returncode:
                    raise RuntimeError(f"the cold start of {name} failed: {out.stderr[-2000:]}")
                samples[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
            out = subprocess.run([deployed_python, "-c", _AUTHORIZER_CHILD], capture_output=True, text=True,
                                 env={**env, **stores, "PYTHONPATH": str(deployed_folder),
                                      "AWS_LAMBDA_FUNCTION_NAME": "bench-authorizer"},
                                 cwd=deployed_folder, timeout=300, check=True)
            authorized = json.loads(out.stdout.strip().splitlines()[-1])
            assert authorized["allowed"], authorized
            authorizer.append(authorized)
            out = subprocess.run([sys.executable, "-c", _FLOOR_CHILD], input=json.dumps(events), capture_output=True,
                                 text=True, env={**env, "PYTHONPATH": str(folders["shipped"])}, cwd=folders["shipped"],
                                 timeout=300, check=True)
            answered = json.loads(out.stdout.strip().splitlines()[-1])
            assert answered["status"] == 200, answered
            floor.append(answered["total_s"])
    summaries = {name: summary(found, burst) for name, found in samples.items()}
    summaries["shipped"]["framework_floor_p50_ms"] = statistics.median(floor) * 1000
    summaries["with_dynamodb"]["python"] = _version_of(deployed_python)
    if runtime_python:
        summaries["runtime_python"]["python"] = _version_of(runtime_python)
    summaries["authorizer"] = {
        "load_p50_ms": statistics.median(a["load_s"] for a in authorizer) * 1000,
        "first_request_p50_ms": statistics.median(a["first_request_s"] for a in authorizer) * 1000,
        "cold_total_p50_ms": statistics.median(a["load_s"] + a["first_request_s"] for a in authorizer) * 1000,
        "runs": len(authorizer), "python": summaries["with_dynamodb"]["python"]}
    return summaries


@contextlib.contextmanager
def stack_in_moto() -> Iterator[dict[str, str]]:
    """moto's server with the four tables, the events' tenant and its key, and the two
    secrets: the function's environment for stores as deployed (their clients built in the
    init phase, read and written by requests)."""
    import botocore.session
    from moto.server import ThreadedMotoServer

    from devkit.gateway_stack import PRINCIPAL
    from devkit.scorer_process import free_port
    from gateway.auth.store import ApiKeyRecord
    from gateway.auth.tenants import create_tenant, issue_api_key, set_limits
    from gateway.auth.tokens import new_key_document
    from gateway.stores.dynamodb import DynamoDBTables, create_tables, dynamodb_stores

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's server logs every request otherwise
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        url = f"http://127.0.0.1:{port}"
        tables = {"GATEWAY_TENANTS_TABLE": "bench-tenants", "GATEWAY_KEYS_TABLE": "bench-keys",
                  "GATEWAY_CATALOGS_TABLE": "bench-catalogs", "GATEWAY_RECORDS_TABLE": "bench-records"}
        client = botocore.session.get_session().create_client(  # moto takes any credentials: placeholders
            "dynamodb", endpoint_url=url, region_name="us-east-1", aws_access_key_id="bench", aws_secret_access_key="bench")
        names = DynamoDBTables(tables["GATEWAY_TENANTS_TABLE"], tables["GATEWAY_KEYS_TABLE"],
                               tables["GATEWAY_CATALOGS_TABLE"], tables["GATEWAY_RECORDS_TABLE"])
        create_tables(client, names)
        store = dynamodb_stores(client, names).tenants
        create_tenant(store, PRINCIPAL["tenant_id"])
        set_limits(store, PRINCIPAL["tenant_id"], rate_per_s=1000.0, burst=2000)  # the burst measures memory, not the limit
        store.put_api_key(ApiKeyRecord(PRINCIPAL["credential_id"], PRINCIPAL["tenant_id"], "unused",
                                       tuple(PRINCIPAL["scopes"].split()), None, 0.0))
        api_key = issue_api_key(store, PRINCIPAL["tenant_id"], ["decide"]).secret  # the authorizer's caller
        # The template's two secrets: the signing keys and the records' keys (read on first use).
        secrets = {"GATEWAY_SIGNING_SECRET_ID": "bench-signing", "GATEWAY_RECORD_KEY_SECRET_ID": "bench-record-keys"}
        manager = botocore.session.get_session().create_client(
            "secretsmanager", endpoint_url=url, region_name="us-east-1", aws_access_key_id="bench",
            aws_secret_access_key="bench")
        for name in secrets.values():
            manager.create_secret(Name=name, SecretString=new_key_document())
        yield {**tables, **secrets, "GATEWAY_AWS_ENDPOINT_URL": url, "BENCH_API_KEY": api_key}
    finally:
        server.stop()


def summary(samples: list[dict], burst: int) -> dict:
    assert all(s["status"] == 200 for s in samples)
    return {
        "import_p50_ms": statistics.median(s["import_s"] for s in samples) * 1000,
        "init_p50_ms": statistics.median(s["init_s"] for s in samples) * 1000,
        "first_request_p50_ms": statistics.median(s["first_request_s"] for s in samples) * 1000,
        "cold_total_p50_ms": statistics.median(s["import_s"] + s["init_s"] + s["first_request_s"] for s in samples) * 1000,
        "rss_after_first_request_mb": max(s["rss_cold_mb"] for s in samples),
        "rss_after_burst_mb": max(s["rss_burst_mb"] for s in samples),
        "burst_requests": burst,
        "runs": len(samples),
    }


# -- 3. over HTTP, against LiteLLM -------------------------------------------------------------


def over_http(requests: int, backend_url: str, with_litellm: bool) -> dict:
    import httpx

    from devkit.gateway_stack import settings_for
    from devkit.local import InProcessFunction, LocalApiGateway, make_server
    from gateway.auth.authenticate import Authenticator
    from gateway.auth.tenants import create_tenant, issue_api_key
    from gateway.functions.authorizer import Authorizer
    from gateway.functions.composition import build_services
    from gateway.functions.handler import GatewayFunction
    from gateway.stores.sqlite import open_sqlite

    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1")
    tmp = Path(tempfile.mkdtemp(prefix="bench-gateway-"))
    stores = open_sqlite(tmp / "gateway.db")
    store = stores.tenants
    create_tenant(store, "bench")
    key = issue_api_key(store, "bench", ["chat", "decide"]).secret
    function = InProcessFunction(GatewayFunction(build_services(settings_for(backend_url))))
    server = make_server("127.0.0.1", 0, LocalApiGateway(function, authorizer=Authorizer(Authenticator(stores))))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    gateway_url = f"http://127.0.0.1:{server.server_address[1]}"

    targets = {"direct": f"{backend_url}/v1/chat/completions", "gateway": f"{gateway_url}/v1/chat/completions"}
    litellm = None
    if with_litellm:
        litellm, litellm_url = start_litellm(backend_url, tmp)
        if litellm_url:
            targets["litellm"] = f"{litellm_url}/v1/chat/completions"
    results = {}
    headers = {"Authorization": f"Bearer {key}"}
    devnull = open(os.devnull, "w")
    try:
        with httpx.Client(timeout=30) as client:
            for name, url in targets.items():
                progress(f"  over HTTP: {name}")
                stdout, sys.stdout = sys.stdout, devnull
                try:
                    for _ in range(30):
                        assert client.post(url, json=CHAT, headers=headers).status_code == 200
                    times = []
                    for _ in range(requests):
                        started = time.perf_counter()
                        reply = client.post(url, json=CHAT, headers=headers)
                        times.append(time.perf_counter() - started)
                        assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"] == "hello"
                finally:
                    sys.stdout = stdout
                results[name] = {"p50_ms": statistics.median(times) * 1000, "p95_ms": percentile(times, 0.95) * 1000}
    finally:
        server.shutdown()
        if litellm is not None:
            litellm.terminate()
            litellm.wait(timeout=30)
    direct = results["direct"]["p50_ms"]
    for name in results:
        results[name]["added_p50_ms"] = results[name]["p50_ms"] - direct
    return results


def start_litellm(backend_url: str, tmp: Path):
    import httpx

    from devkit.scorer_process import free_port

    if not LITELLM_PYTHON.exists():
        progress(f"  LiteLLM is not installed at {LITELLM_PYTHON}: run `make bench-litellm-env` to include it")
        return None, None
    config = tmp / "litellm.yaml"
    config.write_text(
        "model_list:\n"
        "  - model_name: chat-default\n"
        "    litellm_params:\n"
        "      model: openai/chat-default\n"
        f"      api_base: {backend_url}/v1\n"
        "      api_key: none\n"
    )
    port = free_port()
    env = {**os.environ, "LITELLM_LOG": "ERROR", "DISABLE_SCHEMA_UPDATE": "true", "LITELLM_TELEMETRY": "False"}
    process = subprocess.Popen([str(LITELLM_PYTHON), "-m", "litellm.proxy.proxy_cli", "--config", str(config), "--port", str(port),
                                "--num_workers", "1"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if process.poll() is not None:
            progress("  LiteLLM's proxy exited during start-up; leaving it out")
            return None, None
        try:
            if httpx.get(f"{url}/health/liveliness", timeout=2).status_code == 200:
                return process, url
        except httpx.HTTPError:
            pass
        time.sleep(1)
    process.terminate()
    progress("  LiteLLM's proxy did not start within 180 s; leaving it out")
    return None, None


# -- report ---------------------------------------------------------------------------------------


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    overhead = report["handler_overhead"]
    names = list(overhead)
    left.barh(names, [overhead[n]["added_p50_ms"] for n in names], color="#4c72b0")
    left.set_xlabel("ms added by the handler (p50, in process)")
    left.set_title("Gateway handler overhead")
    http = report["over_http"]
    names = list(http)
    right.barh(names, [http[n]["p50_ms"] for n in names], color=["#999999", "#4c72b0", "#dd8452"][: len(names)])
    right.set_xlabel("ms per chat request over HTTP (p50), instant backend")
    right.set_title("Direct vs gateway vs LiteLLM proxy")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--cold-runs", type=int, default=5)
    parser.add_argument("--burst", type=int, default=500)
    parser.add_argument("--no-litellm", action="store_true")
    parser.add_argument("--runtime-python", help="also measure the cold start with this interpreter (the template's"
                                                 " runtime version, e.g. a python3.13), its own artifact built for it")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from devkit.fake_backend import FakeBackendServer

    REPORTS.mkdir(exist_ok=True)
    report: dict = {"requests": args.requests}
    progress("1/3 handler overhead (in process)")
    report["handler_overhead"] = handler_overhead(args.requests)
    with FakeBackendServer() as backend:
        progress("2/3 cold start and memory (fresh processes)")
        cold = cold_start(args.cold_runs, args.burst, backend.url, args.runtime_python)
        report["cold_start"], report["cold_start_without_bytecode"] = cold["shipped"], cold["without_bytecode"]
        report["cold_start_with_dynamodb"], report["authorizer_cold_start"] = cold["with_dynamodb"], cold["authorizer"]
        if "runtime_python" in cold:
            report["cold_start_runtime_python"] = cold["runtime_python"]
        progress("3/3 over HTTP")
        report["over_http"] = over_http(args.requests, backend.url, not args.no_litellm)
    (REPORTS / "bench_gateway.json").write_text(json.dumps(report, indent=2) + "\n")
    plot(report, REPORTS / "bench_gateway.png")

    print("\nHandler overhead, in process (instant in-process backend)")
    print(f"{'route':<14} {'handler p50':>12} {'p95':>8} {'added p50':>10}")
    for name, row in report["handler_overhead"].items():
        print(f"{name:<14} {row['handler_p50_ms']:>10.3f}ms {row['handler_p95_ms']:>6.3f}ms {row['added_p50_ms']:>8.3f}ms")
    stores, authorizer = report["cold_start_with_dynamodb"], report["authorizer_cold_start"]
    print(f"\nCold start as deployed (median of {stores['runs']} fresh processes, Python {stores['python']}, stores in"
          f" DynamoDB and secrets in Secrets Manager, both moto's): import {stores['import_p50_ms']:.0f} ms, init"
          f" {stores['init_p50_ms']:.0f} ms, first request {stores['first_request_p50_ms']:.0f} ms, total"
          f" {stores['cold_total_p50_ms']:.0f} ms")
    print(f"The authorizer as deployed: load and init {authorizer['load_p50_ms']:.0f} ms, first credential"
          f" {authorizer['first_request_p50_ms']:.0f} ms, total {authorizer['cold_total_p50_ms']:.0f} ms")
    print("In AWS both functions resume from a SnapStart snapshot of their init phase instead: a restore is"
          " untested here (it needs AWS).")
    cold = report["cold_start"]
    print(f"Without stores (median of {cold['runs']}): import {cold['import_p50_ms']:.0f} ms, init"
          f" {cold['init_p50_ms']:.0f} ms, first request {cold['first_request_p50_ms']:.0f} ms, total"
          f" {cold['cold_total_p50_ms']:.0f} ms; pydantic and Powertools' resolver alone, one route and one request:"
          f" {cold['framework_floor_p50_ms']:.0f} ms")
    bare = report["cold_start_without_bytecode"]
    print(f"Without its bytecode: import {bare['import_p50_ms']:.0f} ms, init {bare['init_p50_ms']:.0f} ms, first request"
          f" {bare['first_request_p50_ms']:.0f} ms, total {bare['cold_total_p50_ms']:.0f} ms"
          f" (with / without: {cold['cold_total_p50_ms'] / bare['cold_total_p50_ms']:.2f}x)")
    if services := report.get("cold_start_runtime_python"):
        print(f"With Python {services['python']}: import {services['import_p50_ms']:.0f} ms, init {services['init_p50_ms']:.0f}"
              f" ms, first request {services['first_request_p50_ms']:.0f} ms, total {services['cold_total_p50_ms']:.0f} ms")
    print(f"RSS: {cold['rss_after_first_request_mb']:.0f} MB after the first request, "
          f"{cold['rss_after_burst_mb']:.0f} MB after {cold['burst_requests']} more (Lambda: 256 MB)")
    http = report["over_http"]
    print("\nOver HTTP, chat request, instant backend")
    for name, row in http.items():
        print(f"{name:<8} p50 {row['p50_ms']:.2f} ms  p95 {row['p95_ms']:.2f} ms  added p50 {row['added_p50_ms']:.2f} ms")
    if "litellm" in http:
        ratio = http["gateway"]["added_p50_ms"] / http["litellm"]["added_p50_ms"]
        print(f"gateway added / LiteLLM added: {ratio:.2f}x")
    print(f"\nwrote {REPORTS / 'bench_gateway.json'} and {REPORTS / 'bench_gateway.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
