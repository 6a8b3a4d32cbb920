"""The functions under the SAM CLI, as a user tests the application before deploying it:
`sam build`, then `sam local invoke` with the events/*.json files, and `sam local
start-api` with the official SDKs' end-to-end tests pointed at it. Everything AWS would
provide comes from scripts/sam_local.py's stand-ins (moto's server for DynamoDB, Secrets
Manager and SSM; a scorer process as the SageMaker endpoint)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys

import httpx
import openai
import pytest
import typesafe_sdk as ts

from tests.docker_helpers import ROOT, ensure_base_images, require_engine
from tests.e2e import test_sdks as sdk
from tests.integration.test_events import EVENTS, EXPECTED

sys.path.insert(0, str(ROOT / "scripts"))
import sam_local

pytestmark = [pytest.mark.sam_local, pytest.mark.model]


class Stack:
    """What tests/e2e/test_sdks.py needs of a local stack: its URL, an API key, a mint."""

    def __init__(self, arrangement: sam_local.SamLocal) -> None:
        self.arrangement, self.url, self.api_key = arrangement, arrangement.url, arrangement.api_key

    def mint(self, **body) -> str:
        """A token minted by the function itself: events/tokens-iam.json (a SigV4 caller,
        which `sam local` cannot authenticate) with this body, through `sam local invoke`."""
        event = json.loads((EVENTS / "tokens-iam.json").read_text())
        event["body"] = base64.b64encode(json.dumps(body).encode()).decode()
        path = sam_local.BUILD_DIR / "mint-event.json"
        path.write_text(json.dumps(event))
        reply = self.arrangement.invoke(path)
        assert reply["statusCode"] == 201, reply
        return json.loads(reply["body"])["token"]


@pytest.fixture(scope="module")
def arrangement(smollm2_path):
    require_engine()
    ensure_base_images()
    log = sam_local.BUILD_DIR / "start-api.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_bytes(b"")
    with sam_local.SamLocal(smollm2_path.parent, log=log) as running:
        yield running


@pytest.fixture
def local_stack(arrangement):
    return Stack(arrangement)


# -- sam local invoke, one event file at a time (each a fresh Lambda container) -------------

@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_sam_local_invoke_answers_every_event_as_the_handler_does(arrangement, name):
    reply = arrangement.invoke(EVENTS / f"{name}.json")
    expected = EXPECTED[name]
    assert reply["statusCode"] in (expected if isinstance(expected, tuple) else (expected,)), reply
    body = base64.b64decode(reply["body"]).decode() if reply.get("isBase64Encoded") else reply["body"]
    if name in ("systemone", "systemone-gzip"):
        answer = json.loads(body)
        assert set(answer["answers"]) == {"is_refund", "queue", "anger"}
        assert answer["model"] == "smollm2-135m-instruct-q4_1"
    if reply["statusCode"] >= 400:
        assert "Traceback" not in body


# -- sam local start-api with the official SDKs (tests/e2e/test_sdks.py, unchanged) --------

client, typesafe = sdk.client, sdk.typesafe  # the SDK fixtures, over this module's local_stack
test_openai_models_list = sdk.test_openai_models_list
test_openai_chat_without_and_with_stream = sdk.test_openai_chat_without_and_with_stream
test_openai_decisions_create = sdk.test_openai_decisions_create
test_typesafe_noul_choice_and_score = sdk.test_typesafe_noul_choice_and_score
test_curl_style_requests = sdk.test_curl_style_requests
test_the_sdks_work_with_a_token_minted_by_a_sigv4_caller = sdk.test_the_sdks_work_with_a_token_minted_by_a_sigv4_caller


def test_sdk_errors_are_typed_where_the_function_answers(local_stack, client, typesafe):
    """The function's own errors reach both SDKs typed. (A missing or refused credential is
    answered by `sam local` itself, which does not apply the template's GatewayResponses:
    its 401 body is the SAM CLI's, so that half of tests/e2e's test is not repeated here.)"""
    with pytest.raises(openai.NotFoundError):
        client.decisions.create(model="nope", input="x", questions=[{"type": "predicate", "instructions": "x"}])
    with pytest.raises(ts.TypeSafeNotFoundError):
        typesafe.system_one(state="x", questions={"q": ts.Noul(instructions="x")}, model="nope")
    bad = openai.OpenAI(base_url=f"{local_stack.url}/v1", api_key="dgk_0123456789abcdef_" + "A" * 43, max_retries=0)
    with pytest.raises((openai.AuthenticationError, openai.PermissionDeniedError)):
        bad.models.list()
    assert httpx.get(f"{local_stack.url}/v1/models", timeout=30).status_code in (401, 403)


def test_the_api_key_never_appears_in_what_the_functions_write(arrangement, client, typesafe):
    """The canary of tests/e2e, on the Lambda containers' own output (start-api's log)."""
    client.models.list()
    typesafe.system_one(state="Refund?", questions={"r": ts.Noul(instructions="Refund?")})
    leaked = openai.OpenAI(base_url=f"{arrangement.url}/v1", api_key=arrangement.api_key[:-1] + "Z", max_retries=0)
    with pytest.raises((openai.AuthenticationError, openai.PermissionDeniedError)):
        leaked.models.list()
    output = arrangement.log.read_text(errors="replace")
    assert output.count('"message":"request"') >= 2
    assert arrangement.api_key not in output and arrangement.api_key[:-1] not in output


def test_the_sigv4_routes_refuse_what_sam_local_lets_through_unsigned(local_stack):
    """`sam local` does not emulate AWS_IAM authorization ("requests will not be authorized"):
    the function itself must still refuse an unsigned call to a SigV4 route."""
    minted = httpx.post(f"{local_stack.url}/v1/tokens", json={"scopes": ["decide"]}, timeout=60)
    assert minted.status_code in (401, 403), minted.text
    assert "token" not in minted.json()
    decided = httpx.post(f"{local_stack.url}/iam/v1/systemone", timeout=60, json={
        "model": "jev-latest", "state": "x", "questions": {"q": {"type": "noul", "instructions": "x"}}})
    assert decided.status_code in (401, 403), decided.text


def test_make_smoke_passes_under_sam_local_start_api(arrangement):
    """`make smoke` (devkit/smoke.py) against the functions as `sam local start-api` serves them:
    the same steps a deployed stack is checked with, the streamed chat included."""
    done = subprocess.run([sys.executable, "-m", "devkit.smoke"], cwd=ROOT, capture_output=True, text=True,
                          timeout=900, env={**os.environ, "DG_URL": arrangement.url, "DG_API_KEY": arrangement.api_key})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "smoke: passed (7 steps)" in done.stdout, done.stdout
    assert arrangement.api_key not in done.stdout + done.stderr
