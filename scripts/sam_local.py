"""`make sam-local`: the functions under `sam local start-api`, the way a user tries a SAM
application before deploying it, with nothing in AWS.

The SAM CLI runs each function in a Lambda container (built from Debian packages by
scripts/base_images.sh where public.ecr.aws cannot be reached). What the functions read
in AWS comes from stand-ins on this machine:
- DynamoDB and Secrets Manager: moto's server, at GATEWAY_AWS_ENDPOINT_URL;
- the SageMaker endpoint: a scorer process, the `endpoint_url` of GATEWAY_MODELS.
Both listen only on the address at which containers reach this machine (the gateway of
the engine's bridge network), never on an outside interface. The functions' settings
come from sam-local/env.json (samconfig.toml's `local` environment names it); the
Architecture parameter follows this machine (x86_64 or arm64), so no emulation runs.
The functions get placeholder AWS credentials, never the developer's own.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))
import up

ROOT = up.ROOT
ENV_FILE = ROOT / "sam-local" / "env.json"
BUILD_DIR = ROOT / "build" / "sam-local"
SAM = ROOT / ".cache" / "tools" / "bin" / "sam"
# Placeholders for the SAM CLI and the functions (moto accepts any); never real credentials.
PLACEHOLDER_AWS = {"AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local", "AWS_SESSION_TOKEN": "",
                   "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1", "AWS_PROFILE": "",
                   "SAM_CLI_TELEMETRY": "0"}
EVENTS = ROOT / "events"


def lambda_architecture() -> str:
    return {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "arm64", "arm64": "arm64"}[platform.machine().lower()]


def docker_binary() -> str:
    # Debian's engine ships its own client; prefer it to any other on PATH (it builds
    # with the engine's BuildKit, which a newer client without buildx cannot).
    return "/usr/bin/docker" if Path("/usr/bin/docker").exists() else (shutil.which("docker") or "docker")


def host_address() -> str:
    """Where a Lambda container reaches this machine: the bridge network's gateway.
    On Docker Desktop, set DG_SAM_HOST_ADDRESS=host.docker.internal and
    DG_SAM_BIND_ADDRESS=127.0.0.1 (what the stand-ins listen on; untested here)."""
    if os.environ.get("DG_SAM_HOST_ADDRESS"):
        return os.environ["DG_SAM_HOST_ADDRESS"]
    reply = subprocess.run([docker_binary(), "network", "inspect", "bridge", "-f", "{{json .IPAM.Config}}"],
                           capture_output=True, text=True, timeout=30)
    if reply.returncode != 0 or not json.loads(reply.stdout or "null"):
        raise up.StartupError("the engine has no bridge network for the Lambda containers (scripts/engine.sh starts one)")
    config = json.loads(reply.stdout)[0]
    # The engine leaves Gateway out of the default bridge's IPAM when it picked the first address itself.
    return config.get("Gateway") or str(ipaddress.ip_network(config["Subnet"])[1])


def settings_for(host: str, models: dict) -> tuple[dict[str, dict[str, str]], Path]:
    """sam-local/env.json with the stand-ins' host set to `host` and the gateway's models (in
    AWS, the models parameter's value), written to the build folder."""
    document = json.loads(ENV_FILE.read_text())
    shared = document["Parameters"]
    url = urlsplit(shared["GATEWAY_AWS_ENDPOINT_URL"])
    shared["GATEWAY_AWS_ENDPOINT_URL"] = f"{url.scheme}://{host}:{url.port}"
    queue = urlsplit(document["GatewayFunction"]["GATEWAY_BATCH_QUEUE_URL"])
    document["GatewayFunction"]["GATEWAY_BATCH_QUEUE_URL"] = f"{queue.scheme}://{host}:{queue.port}{queue.path}"
    document["GatewayFunction"]["GATEWAY_MODELS"] = json.dumps(models)
    # The streaming routes' function runs the same code with the same settings. `sam local` runs
    # functions buffered (it has no InvokeWithResponseStream), so it runs its handler as
    # written, without the exec wrapper that starts the streaming runtime loop in AWS.
    document["StreamingFunction"] = {**document["GatewayFunction"], "AWS_LAMBDA_EXEC_WRAPPER": ""}
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    path = BUILD_DIR / "env.json"
    path.write_text(json.dumps(document, indent=2) + "\n")
    return document, path


class AwsStandIn:
    """moto's server with what the template would have created: the five tables, the batch
    bucket and queue, and the two secrets. In memory: it holds this run's dev data only."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.url = f"http://{host}:{port}"
        self.server: Any = None

    def __enter__(self) -> AwsStandIn:
        import socket

        from moto.server import ThreadedMotoServer

        with socket.socket() as probe:  # moto's own start waits forever on an address it cannot bind
            try:
                probe.bind((self.host, self.port))
            except OSError as exc:
                raise up.StartupError(f"the AWS stand-in cannot listen on {self.host}:{self.port}: {exc.strerror}") from None
        self.server = ThreadedMotoServer(ip_address=self.host, port=self.port, verbose=False)
        self.server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    def client(self, service: str) -> Any:
        import boto3

        placeholder = PLACEHOLDER_AWS["AWS_SECRET_ACCESS_KEY"]  # moto accepts any; never a real credential
        return boto3.client(service, endpoint_url=self.url, region_name="us-east-1",
                            aws_access_key_id=PLACEHOLDER_AWS["AWS_ACCESS_KEY_ID"], aws_secret_access_key=placeholder)

    def provision(self, settings: dict[str, dict[str, str]]) -> Any:
        from gateway.auth.tokens import new_key_document
        from gateway.stores.dynamodb import DynamoDBTables, create_tables, dynamodb_stores

        shared, function = settings["Parameters"], settings["GatewayFunction"]
        tables = DynamoDBTables(shared["GATEWAY_TENANTS_TABLE"], shared["GATEWAY_KEYS_TABLE"],
                                function["GATEWAY_CATALOGS_TABLE"], function["GATEWAY_RECORDS_TABLE"],
                                function["GATEWAY_BATCHES_TABLE"], function["GATEWAY_BATCH_BUCKET"])
        create_tables(self.client("dynamodb"), tables)
        self.client("s3").create_bucket(Bucket=tables.batch_bucket)
        queue = function["GATEWAY_BATCH_QUEUE_URL"].rsplit("/", 1)[-1]
        self.client("sqs").create_queue(QueueName=queue, Attributes={"FifoQueue": "true", "VisibilityTimeout": "360"})
        store = dynamodb_stores(self.client("dynamodb"), tables).tenants
        secrets = self.client("secretsmanager")
        for name in (shared["GATEWAY_SIGNING_SECRET_ID"], function["GATEWAY_RECORD_KEY_SECRET_ID"]):
            secrets.create_secret(Name=name, SecretString=new_key_document())
        return store


def provision_event_fixtures(store: Any) -> None:
    """What events/*.json name, so that `sam local invoke -e events/NAME.json` is answered
    as tests/integration/test_events.py expects: tenant acme, the role of the IAM events,
    and a record for each authorizer context's API key id (its hash matches no secret, so
    it lets no one in over start-api)."""
    from gateway.auth.authenticate import normalise_principal
    from gateway.auth.store import ApiKeyRecord, PrincipalRule
    from gateway.auth.tenants import create_tenant

    create_tenant(store, "acme")
    for path in sorted(EVENTS.glob("*.json")):
        context = json.loads(path.read_text())["requestContext"]
        caller = context.get("authorizer") or {}
        if caller.get("tenant_id") and store.get_api_key(caller["credential_id"]) is None:
            store.put_api_key(ApiKeyRecord(caller["credential_id"], caller["tenant_id"], "unused",
                                           tuple(caller["scopes"].split()), None, 0.0))
        if arn := (context.get("identity") or {}).get("userArn"):
            store.put_principal_rule(PrincipalRule(normalise_principal(arn), "acme", ("chat", "decide"), None, 0.0))


def sam_build(architecture: str) -> Path:
    """The functions' artifact for this machine's architecture, in build/sam-local/build."""
    build = BUILD_DIR / "build"
    up.run_step("sam build", [str(SAM), "build", "--build-in-source", "--build-dir", str(build),
                              "-t", str(ROOT / "template.yaml"), "--parameter-overrides", f"Architecture={architecture}"],
                {**PLACEHOLDER_AWS, "LAMBDA_ARCH": architecture})
    built = build / "template.yaml"
    built.write_text(authorizer_without_alias(built.read_text()))
    return built


# In AWS the API calls the authorizer's published alias (its SnapStart snapshot). The SAM CLI
# finds a local authorizer by parsing its ARN and cannot resolve an alias reference, so it
# would skip the authorizer and let every bearer request through unauthenticated; locally
# there are no versions, so the function itself is the same code.
AUTHORIZER_ALIAS = "Ref: AuthorizerFunction.Alias"
AUTHORIZER_FUNCTION = "Fn::GetAtt: [AuthorizerFunction, Arn]"


def authorizer_without_alias(template: str) -> str:
    if template.count(AUTHORIZER_ALIAS) != 1:
        raise up.StartupError(f"the built template should name the authorizer's alias once ({AUTHORIZER_ALIAS})")
    return template.replace(AUTHORIZER_ALIAS, AUTHORIZER_FUNCTION)


class SamLocal:
    """The whole arrangement: stand-ins, scorer, a dev tenant, and `sam local start-api`."""

    def __init__(self, model: Path, api_port: int = 3001, aws_port: int | None = None, scorer_port: int = 8090,
                 log: Path | None = None) -> None:
        self.model, self.api_port, self.scorer_port = model, api_port, scorer_port
        self.architecture = lambda_architecture()
        self.host = host_address()  # what the containers are told
        self.bind = os.environ.get("DG_SAM_BIND_ADDRESS") or self.host  # what the stand-ins listen on
        self.settings, self.env_file = settings_for(self.host, up.models_document(self.scorer_port, host=self.host))
        port = urlsplit(self.settings["Parameters"]["GATEWAY_AWS_ENDPOINT_URL"]).port
        self.aws = AwsStandIn(self.bind, aws_port or port)
        self.url = f"http://127.0.0.1:{api_port}"
        self.processes: list[subprocess.Popen] = []
        self.api_key: str | None = None
        self.store: Any = None
        self.template: Path | None = None
        self.log = log  # where start-api and the functions' output go (else this terminal)

    def __enter__(self) -> SamLocal:
        for host, port in (("127.0.0.1", self.api_port), (self.bind, self.scorer_port), (self.bind, self.aws.port)):
            if up.port_taken(port, host):
                raise up.StartupError(f"{host}:{port} is in use; stop what holds it (another make sam-local?)")
        try:
            self.template = sam_build(self.architecture)
            self.aws.__enter__()
            self.store = self.aws.provision(self.settings)
            provision_event_fixtures(self.store)
            self.api_key = up.dev_key(self.store, issued_by="make sam-local")
            self._start_scorer()
            self._start_api()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        up.stop_processes(self.processes)
        self.aws.__exit__()

    def _start_scorer(self) -> None:
        scorer = up.start_process("scorer", [sys.executable, "-m", "devkit.sagemaker_standin", "--host", self.bind,
                                             "--port", str(self.scorer_port)],
                                  {"SM_LLAMA_CPP_MODEL_DIR": str(self.model)})
        self.processes.append(scorer)
        up.wait_ready("scorer", f"http://{self.bind}:{self.scorer_port}/ping", scorer, timeout_s=300)

    def _start_api(self) -> None:
        api = up.start_process("sam local start-api", [str(SAM), "local", "start-api", *self.common_flags(),
                                                       "--host", "127.0.0.1", "--port", str(self.api_port)],
                               PLACEHOLDER_AWS, log=self.log)
        self.processes.append(api)
        up.wait_ready("sam local start-api", f"{self.url}/health", api, timeout_s=180)

    def common_flags(self) -> list[str]:
        """samconfig.toml's `local` environment, with the built template, this run's env
        file and this machine's architecture over it."""
        # An absolute --config-file: the SAM CLI looks for samconfig.toml beside the template.
        return ["--config-file", str(ROOT / "samconfig.toml"), "--config-env", "local", "-t", str(self.template),
                "--env-vars", str(self.env_file),
                "--parameter-overrides", f"Architecture={self.architecture}"]

    def invoke(self, event: Path, function: str = "GatewayFunction") -> dict:
        """`sam local invoke` with one event file; the function's return value."""
        run = subprocess.run([str(SAM), "local", "invoke", function, "-e", str(event), *self.common_flags()],
                             capture_output=True, text=True, timeout=300, cwd=ROOT, env=up.child_env(PLACEHOLDER_AWS))
        lines = [line for line in run.stdout.splitlines() if line.startswith("{")]
        if run.returncode != 0 or not lines:
            raise RuntimeError(f"sam local invoke {event.name} failed ({run.returncode}): {run.stderr[-2000:]}")
        return json.loads(lines[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=ROOT / "models" / "gemma-3-270m-q4_k_m")
    parser.add_argument("--port", type=int, default=int(os.environ.get("SAM_LOCAL_PORT", 3001)))
    args = parser.parse_args()
    for stop_signal in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(stop_signal, up.raise_interrupt)
    try:
        with SamLocal(args.model.resolve(), api_port=args.port) as stack:
            print(f"\nsam local start-api is up: {stack.url} (functions in Lambda containers, {stack.architecture})")
            print(f"AWS stand-in (moto) at {stack.aws.url}; scorer at http://{stack.host}:{stack.scorer_port}")
            print("\nDev API key for tenant 'dev' (shown once, only its hash is stored):\n")
            print(f"    {stack.api_key}\n")
            print("One event through `sam local invoke` (placeholder credentials, never yours):\n")
            flags = " ".join(stack.common_flags())
            print(f"    env -u AWS_PROFILE -u AWS_SESSION_TOKEN AWS_ACCESS_KEY_ID=local AWS_SECRET_ACCESS_KEY=local \\\n"
                  f"      {SAM.relative_to(ROOT)} local invoke GatewayFunction -e events/systemone.json {flags}\n")
            print("Ctrl-C stops it.\n", flush=True)
            while all(process.poll() is None for process in stack.processes):
                time.sleep(1)
            print("sam-local: a process exited", file=sys.stderr)
            return 1
    except up.StartupError as exc:
        print(f"sam-local: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nstopping...", flush=True)
        return 0


if __name__ == "__main__":
    sys.exit(main())
