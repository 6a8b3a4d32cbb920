"""`make up`: the local stack in one command.

Starts the scorer with the embedded model, creates the dev tenant in the embedded
SQLite store, starts the gateway's local API Gateway runner in front of it and the batch
worker beside it, prints a curl example, and stops them all cleanly on Ctrl-C, and on SIGTERM or SIGHUP (from
`timeout`, a supervisor, a CI runner, or make passing its own on): nothing is left
holding the ports. If this process is killed outright, the children get SIGTERM from
the kernel (Linux's parent-death signal). The dev API key comes from
GATEWAY_DEV_API_KEY when set; otherwise a new one is generated and printed once (only
its hash is stored, so it cannot be shown again: run `make up` again for a new one).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
STATE = ROOT / ".local"
DEV_ROLE = "arn:aws:iam::000000000000:role/LocalDeveloper"
DEV_SCOPES = ["chat", "decide", "catalogs:read", "catalogs:write", "outcomes:train"]


def model_pins(folder: str | Path) -> dict[str, str]:
    """The pins a deployment passes its scorer (the model file's and its manifest's sha256), for
    an embedded model, from what the project holds (its size and hash in the code, how to read
    it in evals/model_defaults.json): a manifest edited on disk is refused at load, as in AWS.
    Another folder runs unpinned."""
    from scorer_container.embedded import by_name, manifest_of

    model = by_name(Path(folder).name)
    if model is None:
        return {}
    defaults = json.loads((ROOT / "evals" / "model_defaults.json").read_text()).get(model.name, {})
    return {"SCORER_MODEL_SHA256": model.sha256,
            "SCORER_MANIFEST_SHA256": manifest_of(model, defaults).canonical_sha256()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="models/gemma-3-270m-q4_k_m", help="folder with the GGUF file and its manifest")
    parser.add_argument("--scorer-port", type=int, default=int(os.environ.get("SCORER_PORT", 8080)))
    parser.add_argument("--gateway-port", type=int, default=int(os.environ.get("GATEWAY_PORT", 3000)))
    parser.add_argument("--state-dir", type=Path, default=STATE, help="where the store, keys and model list live")
    args = parser.parse_args()
    state = args.state_dir
    for port in (args.scorer_port, args.gateway_port):
        if port_taken(port):
            print(f"up: port {port} is in use; stop what holds it or set SCORER_PORT / GATEWAY_PORT", file=sys.stderr)
            return 2
    state.mkdir(parents=True, exist_ok=True)
    models_file = state / "models.json"
    models_file.write_text(json.dumps(models_document(args.scorer_port), indent=2) + "\n")
    store_path = state / "gateway.db"

    processes: list[subprocess.Popen] = []
    for stop_signal in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(stop_signal, raise_interrupt)  # so that `finally` stops the children
    try:
        scorer = start_process("scorer", [sys.executable, "-m", "devkit.sagemaker_standin", "--host", "127.0.0.1",
                                   "--port", str(args.scorer_port)],
                        {"SM_LLAMA_CPP_MODEL_DIR": str(ROOT / args.model), **model_pins(args.model)})
        processes.append(scorer)
        wait_ready("scorer", f"http://127.0.0.1:{args.scorer_port}/ping", scorer, timeout_s=300)

        from gateway.stores.sqlite import open_sqlite

        key = dev_key(open_sqlite(store_path).tenants)
        keys_file = key_document(state / "signing-keys.json")
        record_keys_file = key_document(state / "record-keys.json")  # the records' own hash keys

        gateway_env = {
            "GATEWAY_MODELS_FILE": str(models_file),
            "GATEWAY_SQLITE_PATH": str(store_path),
            "GATEWAY_SIGNING_KEYS_FILE": str(keys_file),
            "GATEWAY_RECORD_KEYS_FILE": str(record_keys_file),
            # boto3 signs its calls to the local scorer; these are placeholders, never real
            # credentials, so a developer's own AWS identity is never used or sent.
            "AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local", "AWS_SESSION_TOKEN": "",
            "AWS_DEFAULT_REGION": "us-east-1", "AWS_PROFILE": "",
            "POWERTOOLS_METRICS_DISABLED": "true",
            # What the template sets for the functions (template.yaml, Globals): no search for
            # pydantic plugins, and one BLAS thread for a refit beside the scorer.
            "PYDANTIC_DISABLE_PLUGINS": "__all__", "OPENBLAS_NUM_THREADS": "1",
        }
        gateway = start_process("gateway", [sys.executable, "-m", "devkit.local", "--port", str(args.gateway_port)], gateway_env)
        processes.append(gateway)
        base = f"http://127.0.0.1:{args.gateway_port}"
        wait_ready("gateway", f"{base}/health", gateway, timeout_s=60)
        # The Batch API's worker, on the same code and store: it runs batches' lines at bulk priority.
        processes.append(start_process("batch worker", [sys.executable, "-m", "devkit.batch_worker"], gateway_env))

        print("\nThe local stack is up: gateway", base, "-> scorer", f"http://127.0.0.1:{args.scorer_port}")
        if key:
            print("\nDev API key for tenant 'dev' (shown once, only its hash is stored):\n")
            print(f"    {key}\n")
        else:
            print("\nDev API key: the one in GATEWAY_DEV_API_KEY.")
        print("Try it (after `export DG_API_KEY=<the key>`):\n")
        print(f"    curl -s {base}/v1/systemone -H \"Authorization: Bearer $DG_API_KEY\" \\")
        print("      -d '{\"model\": \"jev-latest\", \"state\": \"I was charged twice, refund one please.\",")
        print("           \"questions\": {\"refund\": {\"type\": \"noul\", \"instructions\": \"Is this a refund request?\"}}}'")
        print("\nMint a short-lived token as a SigV4 caller would (locally, a header names the IAM principal):\n")
        print(f"    curl -s -X POST {base}/v1/tokens -H 'X-Local-Iam-Principal: {DEV_ROLE}' -d '{{\"ttl_s\": 3600}}'")
        print(f"\nOpenAI SDK: OpenAI(base_url=\"{base}/v1\", api_key=...)   TypeSafe SDK: TYPESAFE_BASE_URL={base}")
        print(f"API reference (Swagger UI; ?format=json for the OpenAPI document): {base}/v1/openapi")
        print(f"Batches (OpenAI's Batch API, run by the batch worker): DG_URL={base} python -m devkit.batch submit"
              " FILE.jsonl --endpoint /v1/systemone --watch")
        print("Ctrl-C stops them all.\n", flush=True)
        while all(p.poll() is None for p in processes):
            time.sleep(0.5)
        failed = next(p for p in processes if p.poll() is not None)
        print(f"up: {failed.args[2]} exited with status {failed.returncode}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nstopping...", flush=True)
        return 0
    except StartupError as exc:
        print(f"up: {exc}", file=sys.stderr)
        return 1
    finally:
        stop_processes(processes)


class StartupError(Exception):
    pass


def raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when `make up` itself dies, however it dies (Linux)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: the signal handlers above still stop the children


def models_document(scorer_port: int, host: str = "127.0.0.1") -> dict:
    """The model list: both public models on one local scorer, reached as a SageMaker endpoint."""
    endpoint = {"name": "local-scorer", "endpoint_url": f"http://{host}:{scorer_port}", "read_timeout_s": 28}
    return {"models": [
        {"name": "decision-default", "aliases": ["jev-latest"], "serves": ["decisions"],
         "description": "The embedded decision model of the local stack", "endpoints": [endpoint]},
        {"name": "chat-default", "serves": ["chat"], "description": "The same model, for chat", "endpoints": [endpoint]},
    ]}


def dev_key(store: Any, issued_by: str = "make up") -> str | None:
    """Create the dev tenant; import GATEWAY_DEV_API_KEY or issue a new key (returned to print once)."""
    from gateway.auth.store import PrincipalRule
    from gateway.auth.tenants import ProvisioningError, create_tenant, issue_api_key

    create_tenant(store, "dev", "Local development")
    store.put_principal_rule(PrincipalRule(DEV_ROLE, "dev", tuple(DEV_SCOPES), None, time.time()))
    given = os.environ.get("GATEWAY_DEV_API_KEY", "").strip()
    scopes = DEV_SCOPES
    try:
        if given:
            issue_api_key(store, "dev", scopes, name=issued_by, key=given)
            return None
        return issue_api_key(store, "dev", scopes, name=issued_by).secret
    except ProvisioningError as exc:
        raise StartupError(f"GATEWAY_DEV_API_KEY: {exc}") from None


def key_document(path: Path) -> Path:
    """A local key document (in AWS: a Secrets Manager secret), created once."""
    from gateway.auth.tokens import new_key_document

    if not path.exists():
        path.touch(mode=0o600)
        path.write_text(new_key_document())
    return path


def child_env(env: dict[str, str]) -> dict[str, str]:
    """This process's environment with `env` over it; an empty value removes the variable."""
    full_env = {**os.environ, **env}
    for key in [k for k, v in env.items() if v == ""]:
        full_env.pop(key, None)
    full_env.pop("GATEWAY_DEV_API_KEY", None)  # the children never need it
    return full_env


def start_process(name: str, command: list[str], env: dict[str, str], log: Path | None = None) -> subprocess.Popen:
    """A child in its own process group (stopped as one), its output here or in `log`."""
    print(f"starting the {name}...", flush=True)
    output = log.open("ab") if log else None
    try:
        return subprocess.Popen(command, cwd=ROOT, env=child_env(env), start_new_session=True, preexec_fn=_die_with_parent,
                                stdout=output, stderr=subprocess.STDOUT if output else None)
    finally:
        if output:
            output.close()  # the child holds its own copy


def run_step(name: str, command: list[str], env: dict[str, str]) -> None:
    """One set-up command to its end; its output is shown only when it fails."""
    print(f"{name}...", flush=True)
    started = time.monotonic()
    run = subprocess.run(command, cwd=ROOT, env=child_env(env), capture_output=True, text=True)
    if run.returncode != 0:
        raise StartupError(f"{name} failed with status {run.returncode}:\n{(run.stdout + run.stderr)[-3000:]}")
    print(f"{name} done in {time.monotonic() - started:.0f} s", flush=True)


def wait_ready(name: str, url: str, process: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    shown = time.monotonic()
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise StartupError(f"the {name} exited during start-up (status {process.returncode}); its log is above")
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:  # noqa: S310 (a loopback URL we built)
                if reply.status == 200:
                    print(f"{name} ready", flush=True)
                    return
        except OSError:
            pass
        if time.monotonic() - shown > 5:
            print(f"  waiting for the {name} ({int(deadline - time.monotonic())} s left)...", flush=True)
            shown = time.monotonic()
        time.sleep(0.3)
    raise StartupError(f"the {name} was not ready within {timeout_s:.0f} s")


def stop_processes(processes: list[subprocess.Popen]) -> None:
    for process in processes:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
    for process in processes:
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def port_taken(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        return sock.connect_ex((host, port)) == 0


if __name__ == "__main__":
    sys.exit(main())
