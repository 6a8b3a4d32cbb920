"""The scorer image, run as SageMaker runs it: `docker run IMAGE serve`, the unpacked
`model.tar.gz` read-only at /opt/ml/model, port 8080, and no network at all (the
template's `EnableNetworkIsolation`), so the checks speak to it from inside with
`docker exec`. Figures go to reports/container.json (make container-test prints them).
"""

from __future__ import annotations

import json
import tarfile
import time
from pathlib import Path

import pytest

from tests.docker_helpers import ROOT, docker, ensure_scorer_image, require_engine

pytestmark = [pytest.mark.container, pytest.mark.model]

STARTUP_S = 120  # well inside SageMaker's default container startup health check
GRACE_S = 30  # SageMaker sends SIGKILL 30 s after SIGTERM
REPORT = ROOT / "reports" / "container.json"

# Runs inside the container: one HTTP request to the scorer on 127.0.0.1:8080.
REQUEST = """
import json, sys, urllib.request, urllib.error
method, path, body = sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None
kind = sys.argv[4] if len(sys.argv) > 4 else "application/json"
req = urllib.request.Request("http://127.0.0.1:8080" + path, method=method, data=body.encode() if body else None,
                             headers={"Content-Type": kind})
try:
    with urllib.request.urlopen(req, timeout=60) as reply:
        print(json.dumps({"status": reply.status, "body": reply.read().decode()}))
except urllib.error.HTTPError as exc:
    print(json.dumps({"status": exc.code, "body": exc.read().decode()}))
except OSError as exc:
    print(json.dumps({"status": 0, "body": str(exc)}))
"""


# A streamed answer read as it arrives, piece by piece (http.client undoes the chunking).
STREAM_REQUEST = """
import http.client, json, sys
connection = http.client.HTTPConnection("127.0.0.1", 8080, timeout=60)
connection.request("POST", "/invocations", body=sys.argv[1], headers={"Content-Type": "application/json",
                   "X-Amzn-SageMaker-Custom-Attributes": "route=chat"})
reply = connection.getresponse()
pieces, data = 0, b""
while piece := reply.read1(65536):
    pieces, data = pieces + 1, data + piece
print(json.dumps({"status": reply.status, "transfer_encoding": reply.getheader("transfer-encoding"), "pieces": pieces,
                  "tail": data[-40:].decode()}))
"""


@pytest.fixture(scope="module")
def image() -> str:
    require_engine()
    return ensure_scorer_image()


@pytest.fixture(scope="module")
def model_dir(smollm2_path, tmp_path_factory) -> Path:
    """What SageMaker puts at /opt/ml/model: the packed artifact, unpacked, read-only."""
    from scorer_container.model_files import pack_model

    folder = tmp_path_factory.mktemp("sagemaker")
    artifact = pack_model(smollm2_path, folder / "model.tar.gz")
    unpacked = folder / "model"
    with tarfile.open(artifact) as tar:
        tar.extractall(unpacked, filter="data")
    for path in (*unpacked.iterdir(), unpacked):
        path.chmod(0o555 if path.is_dir() else 0o444)
    return unpacked


@pytest.fixture(scope="module")
def report():
    REPORT.unlink(missing_ok=True)  # never a figure from an earlier run
    figures: dict[str, object] = {}
    yield figures
    REPORT.parent.mkdir(exist_ok=True)
    REPORT.write_text(json.dumps(figures, indent=2) + "\n")  # this run's figures only


class Served:
    """One container started the way SageMaker starts it."""

    def __init__(self, image: str, model_dir: Path, *env: str) -> None:
        flags = [item for pair in (("-e", e) for e in env) for item in pair]
        self.started = time.monotonic()
        self.id = docker("run", "-d", "--network", "none", "-v", f"{model_dir}:/opt/ml/model:ro", *flags,
                         image, "serve").stdout.strip()

    def request(self, method: str, path: str, body: object = None, lines: list | None = None) -> tuple[int, dict]:
        """One request; `lines`: a body of JSON lines (an asynchronous invocation's), answered as text."""
        args = [method, path] + ([json.dumps(body)] if body is not None else [])
        if lines is not None:
            args = [method, path, "\n".join(json.dumps(line) for line in lines) + "\n", "application/jsonlines"]
        out = docker("exec", self.id, "python", "-c", REQUEST, *args, timeout=90).stdout
        reply = json.loads(out)
        try:
            return reply["status"], json.loads(reply["body"])
        except ValueError:
            return reply["status"], {"text": reply["body"]}

    def wait_for(self, status: int) -> tuple[float, dict]:
        while time.monotonic() - self.started < STARTUP_S:
            if docker("inspect", "-f", "{{.State.Running}}", self.id).stdout.strip() != "true":
                pytest.fail(f"the container exited: {self.logs()}")
            code, body = self.request("GET", "/ping")
            if code == status:
                return time.monotonic() - self.started, body
            time.sleep(0.25)
        pytest.fail(f"/ping never answered {status} within {STARTUP_S} s: {self.logs()}")

    def proc_status(self) -> dict[str, str]:
        lines = docker("exec", self.id, "cat", "/proc/1/status").stdout.splitlines()
        return dict(line.split(":\t", 1) for line in lines if ":\t" in line)

    def logs(self) -> str:
        result = docker("logs", "--tail", "20", self.id, check=False)
        return (result.stdout + result.stderr)[-2000:]

    def remove(self) -> None:
        docker("rm", "-f", self.id, check=False)


@pytest.fixture(scope="module")
def served(image, model_dir):
    container = Served(image, model_dir)
    yield container
    container.remove()


def test_healthy_as_a_non_root_process_within_the_startup_time(served, report):
    elapsed, ping = served.wait_for(200)
    assert ping["status"] == "ready" and ping["model"] == "smollm2-135m-instruct-q4_1"
    status = served.proc_status()
    assert status["Uid"].split()[0] != "0" and status["Uid"].split()[0] == "10001"
    report["time_to_healthy_s"] = round(elapsed, 2)
    report["rss_after_load_mib"] = round(int(status["VmRSS"].split()[0]) / 1024, 1)


def test_invocations_answer_a_decision_and_a_chat(served, report):
    served.wait_for(200)
    decision = {"model": "m", "state": "I was charged twice for order 4411. Please refund one charge.",
                "questions": {"refund": {"type": "noul", "instructions": "Is this a refund request?"},
                              "team": {"type": "choice", "instructions": "Which team handles it?",
                                       "criteria": {"billing": "payments", "shipping": "deliveries"}}}}
    code, body = served.request("POST", "/invocations", decision)
    assert code == 200, body
    team = body["answers"]["team"]
    assert set(body["answers"]) == {"refund", "team"}
    assert set(team["probabilities"]) == {"billing", "shipping"}
    assert abs(sum(team["probabilities"].values()) - 1) < 1e-6
    chat = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8, "temperature": 0}
    code, body = served.request("POST", "/invocations", chat)
    assert code == 200, body
    assert body["object"] == "chat.completion" and body["choices"][0]["message"]["content"]
    assert body["usage"]["completion_tokens"] <= 8
    report["rss_after_requests_mib"] = round(int(served.proc_status()["VmRSS"].split()[0]) / 1024, 1)


def test_an_asynchronous_invocations_lines_are_each_answered(served):
    served.wait_for(200)
    decision = {"model": "m", "state": "Where is my parcel?",
                "questions": {"late": {"type": "noul", "instructions": "Is the delivery late?"}}}
    chat = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 4, "temperature": 0}
    code, body = served.request("POST", "/invocations", lines=[{"id": "d", "body": decision},
                                                               {"id": "c", "route": "chat", "body": chat}])
    answers = [json.loads(line) for line in body["text"].splitlines()]
    assert code == 200 and [(a["id"], a["status"]) for a in answers] == [("d", 200), ("c", 200)]
    assert set(answers[0]["body"]["answers"]) == {"late"} and answers[1]["body"]["choices"]


def test_a_chat_stream_is_chunked_as_sagemaker_streams_it(served):
    # Given a streamed chat, sent inside the container as SageMaker forwards one (POST /invocations)
    served.wait_for(200)
    body = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 12, "temperature": 0, "stream": True}
    out = docker("exec", served.id, "python", "-c", STREAM_REQUEST, json.dumps(body), timeout=90).stdout
    reply = json.loads(out)
    # Then it comes back chunked, in many pieces, ending the stream properly
    assert reply["status"] == 200 and reply["transfer_encoding"] == "chunked"
    assert reply["pieces"] > 3 and reply["tail"].endswith("data: [DONE]\n\n")


def test_docker_stop_ends_it_cleanly_within_the_grace_period(image, model_dir, report):
    container = Served(image, model_dir)
    try:
        container.wait_for(200)
        start = time.monotonic()
        docker("stop", "-t", str(GRACE_S), container.id, timeout=GRACE_S + 30)
        stopped_s = time.monotonic() - start
        exit_code = int(docker("inspect", "-f", "{{.State.ExitCode}}", container.id).stdout)
    finally:
        container.remove()
    assert exit_code == 0, "SIGTERM must end the server, not the SIGKILL after the grace period"
    assert stopped_s < GRACE_S
    report["stop_s"] = round(stopped_s, 2)


@pytest.mark.parametrize("tamper", ["pinned sha256", "manifest"])
def test_a_model_that_is_not_the_pinned_one_is_refused_with_the_reason_on_ping(image, model_dir, tmp_path, tamper):
    if tamper == "pinned sha256":
        container = Served(image, model_dir, "SCORER_MODEL_SHA256=" + "0" * 64)
        expected = "pinned"
    else:
        altered = tmp_path / "model"
        altered.mkdir()
        for path in model_dir.iterdir():
            (altered / path.name).write_bytes(path.read_bytes())
        manifest = json.loads((altered / "model-manifest.json").read_text())
        manifest["sha256"] = "f" * 64
        (altered / "model-manifest.json").write_text(json.dumps(manifest))
        container = Served(image, altered)
        expected = "differs from the manifest"
    try:
        _, ping = container.wait_for(503)
        deadline = time.monotonic() + STARTUP_S
        while ping.get("status") == "loading" and time.monotonic() < deadline:  # the digest takes a moment
            time.sleep(0.25)
            _, ping = container.request("GET", "/ping")
        assert ping["status"] != "ready" and expected in ping["reason"], ping
        code, _ = container.request("POST", "/invocations", {"messages": [{"role": "user", "content": "hi"}]})
        assert code == 503
    finally:
        container.remove()


def test_the_runtime_image_carries_no_compiler_and_reports_its_size(image, report):
    found = docker("run", "--rm", "--network", "none", "--entrypoint", "sh", image, "-c",
                   "for tool in gcc cc g++ c++ cmake make; do command -v $tool; done; true").stdout.split()
    assert found == [], f"build tools left in the runtime image: {found}"
    size = int(docker("image", "inspect", "-f", "{{.Size}}", image).stdout)
    report["image_mb"] = round(size / 1e6)
    assert size < 700e6
