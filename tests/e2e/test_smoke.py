"""`make smoke` (devkit/smoke.py) against real gateways: `make up`'s processes, and the
in-process local stack with keys of every kind. Under `sam local start-api`:
tests/sam_local/test_sam_local.py."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from devkit import smoke
from devkit.scorer_process import free_port

pytestmark = pytest.mark.model
ROOT = Path(__file__).resolve().parents[2]
STEPS = ("health", "models", "decision (OpenAI format)", "decision (System One format)", "chat (streamed)",
         "outcome", "refusal")


def run_smoke(url: str, key: str, *args: str) -> tuple[int, str]:
    out = io.StringIO()
    code = smoke.main(list(args), environ={"DG_URL": url, "DG_API_KEY": key}, out=out)
    return code, out.getvalue()


def line_of(output: str, step: str) -> str:
    """The line smoke printed for `step` (two spaces, the status in 7, a space, the step in 29)."""
    return next(line for line in output.splitlines() if line.startswith("  ") and line[10:39].rstrip() == step)


def test_smoke_passes_against_make_up_and_names_the_step_when_its_scorer_stops(tmp_path):
    # Given `make up`'s processes (scorer and gateway) and the key it printed,
    scorer_port, gateway_port = free_port(), free_port()
    up = subprocess.Popen([sys.executable, "scripts/up.py", "--model", "models/smollm2-135m-instruct-q4_1",
                           "--scorer-port", str(scorer_port), "--gateway-port", str(gateway_port),
                           "--state-dir", str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, env={**os.environ, "GATEWAY_DEV_API_KEY": ""})
    try:
        lines = []
        for line in up.stdout:
            lines.append(line)
            if "Ctrl-C stops them all" in line:
                break
        printed = "".join(lines)
        key = next(word for word in printed.split() if word.startswith("dgk_"))
        env = {**os.environ, "DG_URL": f"http://127.0.0.1:{gateway_port}", "DG_API_KEY": key}
        # when smoke runs as `make smoke` runs it, then every step passes;
        done = subprocess.run([sys.executable, "-m", "devkit.smoke"], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, done.stdout + done.stderr
        for step in STEPS:
            assert line_of(done.stdout, step).split()[0] == "ok", done.stdout
        assert "smoke: passed (7 steps)" in done.stdout
        # and with the scorer stopped (SIGSTOP: it holds its port and answers nothing), the
        # gateway still answers, and smoke fails naming the steps that need the model.
        scorer = scorer_pid(scorer_port)
        os.kill(scorer, signal.SIGSTOP)
        try:
            stopped = subprocess.run([sys.executable, "-m", "devkit.smoke", "--timeout", "90"], cwd=ROOT, env=env,
                                     capture_output=True, text=True, timeout=600)
        finally:
            os.kill(scorer, signal.SIGCONT)
        assert stopped.returncode == 1, stopped.stdout
        assert line_of(stopped.stdout, "health").split()[0] == "ok"
        assert line_of(stopped.stdout, "models").split()[0] == "ok"
        assert line_of(stopped.stdout, "decision (OpenAI format)").split()[0] == "FAILED"
        assert "503" in line_of(stopped.stdout, "decision (System One format)")
        assert "smoke: FAILED at decision (OpenAI format), decision (System One format), chat (streamed)" \
            in stopped.stdout
        assert key not in done.stdout + done.stderr + stopped.stdout + stopped.stderr
    finally:
        up.send_signal(signal.SIGTERM)
        up.wait(timeout=60)


def scorer_pid(port: int) -> int:
    """The scorer process `make up` started on `port` (its command line names the port)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                command = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"devkit.sagemaker_standin" in command and str(port).encode() in command:
                return int(entry.name)
    raise AssertionError(f"no scorer process on port {port}")


def test_a_key_without_a_scope_skips_its_steps_with_the_reason_and_passes(local_stack):
    from gateway.auth.tenants import issue_api_key

    chat_only = issue_api_key(local_stack.store.tenants, "acme", ["chat"]).secret
    code, output = run_smoke(local_stack.url, chat_only)
    assert code == 0, output
    for step in ("decision (OpenAI format)", "decision (System One format)"):
        line = line_of(output, step)
        assert line.split()[0] == "skipped" and "no scope for it" in line and "'decide'" in line, output
    assert "no decision answered" in line_of(output, "outcome")
    assert line_of(output, "chat (streamed)").split()[0] == "ok"
    assert "smoke: passed (4 steps, 3 skipped)" in output
    assert chat_only not in output


def test_a_model_the_key_may_not_use_is_skipped_not_failed(local_stack):
    from gateway.auth.tenants import issue_api_key

    decisions_only = issue_api_key(local_stack.store.tenants, "acme", ["chat", "decide"], models=["decision-default"]).secret
    code, output = run_smoke(local_stack.url, decisions_only)
    assert code == 0, output
    assert "chat-default is not among the models this key sees" in line_of(output, "chat (streamed)")
    assert line_of(output, "outcome").split()[0] == "ok"


def test_a_refused_key_fails_at_the_model_list_and_is_never_printed(local_stack):
    canary = local_stack.api_key[:-4] + "Zzz9"
    code, output = run_smoke(local_stack.url, canary)
    assert code == 1
    assert line_of(output, "health").split()[0] == "ok"
    assert "the key was refused (401)" in line_of(output, "models")
    assert all(line_of(output, s).split()[0] == "skipped" for s in STEPS[2:])
    assert canary not in output and canary[:20] not in output


def test_a_gateway_that_is_not_there_fails_at_health_within_the_bound():
    code, output = run_smoke(f"http://127.0.0.1:{free_port()}", "dgk_0123456789abcdef_" + "B" * 43, "--timeout", "5")
    assert code == 1
    assert line_of(output, "health").split()[0] == "FAILED" and "ConnectError" in line_of(output, "health")
    assert "B" * 43 not in output


@pytest.mark.parametrize("environ", [{}, {"DG_URL": "http://127.0.0.1:1"}, {"DG_API_KEY": "dgk_x"},
                                     {"DG_URL": "ftp://x", "DG_API_KEY": "dgk_x"}])
def test_without_a_url_and_a_key_it_says_what_to_set(environ, capsys):
    assert smoke.main([], environ=environ, out=io.StringIO()) == 2
    assert "set DG_URL" in capsys.readouterr().err


def test_the_url_is_taken_as_the_readme_sets_it_or_with_v1():
    assert smoke.base_url("https://abc.execute-api.eu-west-1.amazonaws.com/dev/v1/") \
        == "https://abc.execute-api.eu-west-1.amazonaws.com/dev"
    assert smoke.base_url(" http://127.0.0.1:3000 ") == "http://127.0.0.1:3000"


def test_whatever_is_printed_hides_credentials():
    check = smoke.Smoke("http://x", "dgk_abcdef0123456789_" + "Q" * 43)
    assert "Q" * 43 not in check.redact(f"echo {check.key} and dgk_other_key_123 and eyJhbGciOi.eyJzdWIi.sig")
    assert check.redact("plain words") == "plain words"


class Hostile(BaseHTTPRequestHandler):
    """A 'gateway' that drips its answer a byte at a time, or floods it without end."""

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        try:
            if self.path == "/health" and self.server.mode == "drip":
                while True:
                    self.wfile.write(b" ")
                    self.wfile.flush()
                    time.sleep(0.2)
            while True:
                self.wfile.write(b" " * 65536)
        except OSError:
            return

    def log_message(self, *args):
        pass


@pytest.mark.parametrize(("mode", "said"), [("drip", "within 2 s"), ("flood", "more than 8388608 bytes")])
def test_a_gateway_that_never_stops_answering_fails_the_step_within_its_bound(mode, said):
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hostile)
    server.mode, server.daemon_threads = mode, True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        started = time.monotonic()
        code, output = run_smoke(f"http://127.0.0.1:{server.server_address[1]}", "dgk_x", "--timeout", "2")
        assert code == 1
        assert said in line_of(output, "health"), output
        assert time.monotonic() - started < 30  # every step bounded, none waiting on the server's good will
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("bound", ["abc", "-5", "0", "1e9"])
def test_a_bound_that_is_not_seconds_is_a_usage_error(bound, capsys):
    environ = {"DG_URL": "http://127.0.0.1:1", "DG_API_KEY": "dgk_x", "DG_SMOKE_TIMEOUT_S": bound}
    with pytest.raises(SystemExit) if bound == "abc" else contextlib.nullcontext():
        assert smoke.main([], environ=environ, out=io.StringIO()) == 2
    assert "timeout" in capsys.readouterr().err
