"""Fuzzing: no request, valid or not, gets a 5xx.

Schemathesis generates requests (conforming and non-conforming) from the OpenAPI
document the resolver builds from the wire models, and sends them over HTTP to the
local runner; the backend is the uniform fake, because what is fuzzed is everything in
front of it. Hypothesis adds raw bodies: arbitrary JSON, bytes and encodings.
"""

from __future__ import annotations

import gzip
import json
import threading
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

from devkit.fake_backend import UniformBackend
from devkit.gateway_stack import call_installed, event, install
from devkit.local import InProcessFunction, LocalApiGateway, make_server
from gateway.api.app import build_app
from gateway.auth.credentials import Principal
from gateway.auth.store import DEFAULT_LIMITS
from gateway.functions.authorizer import Authorizer
from tests.conftest import examples
from tests.gateway_helpers import call

FUZZ_ROLE = "arn:aws:iam::123456789012:role/Fuzz"


class _AllowEveryone:
    """Every bearer credential is the principal of one real API key of tenant "fuzz": what
    is fuzzed is behind the authorizer (the function still checks the key is not revoked)."""

    def __init__(self, key_id: str) -> None:
        self.key_id = key_id

    def authenticate(self, header):
        return Principal("fuzz", frozenset({"chat", "decide", "catalogs:read", "catalogs:write"}), None, self.key_id)

    def still_valid(self, principal):
        return principal

    def limits(self, tenant_id):
        return DEFAULT_LIMITS


_authorize: list[Authorizer] = []  # the authorizer of the services last installed, which the fuzz server runs


def _install_fuzz_runtime(tmp: Path) -> None:
    """The uniform fake behind a real authenticator, so token routes run for a SigV4 caller."""
    from gateway.auth.authenticate import Authenticator
    from gateway.auth.store import PrincipalRule
    from gateway.auth.tenants import create_tenant, issue_api_key
    from gateway.auth.tokens import CachedKeyRing, new_key_document
    from gateway.stores.sqlite import open_sqlite
    from tests.gateway_helpers import unthrottled

    store = open_sqlite(tmp / "fuzz.db")
    create_tenant(store.tenants, "fuzz")
    unthrottled(store, "fuzz")  # every generated request must reach the routes it fuzzes
    store.tenants.put_principal_rule(PrincipalRule(FUZZ_ROLE, "fuzz", ("chat", "decide"), None, 0.0))
    key = issue_api_key(store.tenants, "fuzz", ["chat", "decide", "catalogs:read", "catalogs:write"])
    document = new_key_document()
    install(UniformBackend(), stores=store, authenticator=Authenticator(store, CachedKeyRing(lambda: document)))
    _authorize[:] = [Authorizer(_AllowEveryone(key.key_id))]


@pytest.fixture(scope="module")
def fuzz_url():
    gateway = LocalApiGateway(InProcessFunction(call_installed), authorizer=lambda ev, ctx: _authorize[0](ev, ctx))
    server = make_server("127.0.0.1", 0, gateway)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _operations():
    """The operations of the OpenAPI document the resolver generates from the wire models (on a
    store, so that the routes that need one, the batch APIs', are in it)."""
    import tempfile

    from gateway.stores.sqlite import open_sqlite

    services = install(UniformBackend(), stores=open_sqlite(Path(tempfile.mkdtemp(prefix="fuzz-doc-")) / "doc.db"))
    document = json.loads(build_app(services).get_openapi_json_schema(title="decision gateway", version="1"))
    return [result.ok() for result in schemathesis.openapi.from_dict(document).get_all_operations()]


def _headers(path: str) -> dict[str, str]:
    # Tokens are minted by SigV4 callers: those routes are fuzzed as one (the local runner's emulation).
    return {"X-Local-Iam-Principal": FUZZ_ROLE} if path.startswith("/v1/tokens") else {"Authorization": "Bearer fuzz"}


OPERATIONS = _operations()


def test_the_document_covers_every_route():
    assert {(op.method, op.path) for op in OPERATIONS} == {
        ("get", "/health"), ("get", "/v1/models"), ("post", "/v1/systemone"), ("post", "/v1/decisions"),
        ("post", "/v1/chat/completions"), ("post", "/v1/tokens"), ("post", "/v1/tokens/revoke"),
        ("post", "/v1/decisions/{decision_id}/outcome"), ("get", "/v1/records"), ("get", "/v1/records/{decision_id}"),
        ("get", "/v1/catalogs"), ("get", "/v1/catalogs/{name}"), ("put", "/v1/catalogs/{name}"),
        ("get", "/v1/catalogs/{name}/versions"), ("get", "/v1/catalogs/{name}/versions/{version}"),
        ("post", "/v1/catalogs/{name}/refit"),
        ("post", "/v1/files"), ("get", "/v1/files"), ("get", "/v1/files/{file_id}"), ("delete", "/v1/files/{file_id}"),
        ("get", "/v1/files/{file_id}/content"), ("post", "/v1/uploads"), ("post", "/v1/uploads/{upload_id}/parts"),
        ("post", "/v1/uploads/{upload_id}/complete"), ("post", "/v1/uploads/{upload_id}/cancel"),
        ("post", "/v1/batches"), ("get", "/v1/batches"), ("get", "/v1/batches/{batch_id}"),
        ("post", "/v1/batches/{batch_id}/cancel"), ("get", "/v1/usage"),
    }


# Operations without a body or parameters have no non-conforming requests to generate.
# POST /v1/files takes a form the document does not describe: test_arbitrary_forms_never_answer_5xx fuzzes it.
CASES = [(op, GenerationMode.POSITIVE) for op in OPERATIONS] + [
    (op, GenerationMode.NEGATIVE) for op in OPERATIONS
    if (op.method in ("post", "put") or "{" in op.path or op.path == "/v1/records") and op.path != "/v1/files"
]
# Operations that name an existing thing (a decision, a token, an entry): random names find
# nothing (404/401), so they are held to "no 5xx" only, not to a share of successes.
NAMES_SOMETHING = {"/v1/tokens/revoke", "/v1/decisions/{decision_id}/outcome", "/v1/records/{decision_id}",
                   "/v1/catalogs/{name}", "/v1/catalogs/{name}/versions", "/v1/catalogs/{name}/versions/{version}",
                   "/v1/catalogs/{name}/refit", "/v1/files/{file_id}", "/v1/files/{file_id}/content",
                   "/v1/uploads/{upload_id}/parts", "/v1/uploads/{upload_id}/complete", "/v1/uploads/{upload_id}/cancel",
                   "/v1/batches/{batch_id}", "/v1/batches/{batch_id}/cancel",
                   # a form (documented without a schema) or a file id: generated ones are refused
                   "/v1/files", "/v1/batches",
                   # a range of days the schema cannot bound (from before to, at most 92 days)
                   "/v1/usage"}


@pytest.mark.parametrize(("operation", "mode"), CASES, ids=lambda v: f"{v.method} {v.path}" if hasattr(v, "path") else v.value)
def test_openapi_operations_never_answer_5xx(fuzz_url, operation, mode, tmp_path):
    _install_fuzz_runtime(tmp_path)

    statuses: list[int] = []
    models = {"/v1/chat/completions": "chat-default", "/v1/decisions": "decision-default", "/v1/systemone": "jev-latest"}

    @given(case=operation.as_strategy(generation_mode=mode))
    # Derandomized: schemathesis cannot negate some schema branches ("a `not` whose
    # complement is not spelled out") and raises when a random run wanders there, which
    # made this test fail one run in a few for a reason unrelated to the gateway. A fixed
    # sequence of 100 cases per operation and mode is reproducible in CI.
    @settings(max_examples=examples(100), deadline=None, suppress_health_check=list(HealthCheck), database=None, derandomize=True)
    def check(case):
        if mode is GenerationMode.POSITIVE and isinstance(case.body, dict) and "model" in case.body:
            case.body["model"] = models[case.path]  # a random model name would stop every request at 404
        response = case.call(base_url=fuzz_url, headers=_headers(case.path))
        statuses.append(response.status_code)
        assert response.status_code < 500, (case.method, case.path, response.status_code, response.text[:300])
        assert "Traceback" not in response.text

    check()
    if mode is GenerationMode.POSITIVE and (operation.path not in NAMES_SOMETHING or operation.method == "put"):
        # Enough conforming requests must get through validation to reach the codecs, or the
        # fuzzing proves little (rules the schema cannot say, such as unique choice values,
        # refuse the rest with a 422).
        succeeded = sum(1 for s in statuses if 200 <= s < 300)
        assert succeeded >= len(statuses) // 10, {s: statuses.count(s) for s in set(statuses)}


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5),
    max_leaves=30,
)
question = st.fixed_dictionaries(
    {"type": st.sampled_from(["noul", "choice", "score", "box", 1])},
    optional={"instructions": json_values, "criteria": json_values},
)
system_one_like = st.fixed_dictionaries(
    {"model": st.sampled_from(["jev-latest", "", 3, None]), "state": json_values,
     "questions": st.dictionaries(st.text(max_size=8), question, max_size=4) | json_values},
)


@given(body=system_one_like | json_values, path=st.sampled_from(["/v1/systemone", "/v1/decisions", "/v1/chat/completions"]))
@settings(max_examples=examples(300), deadline=None, suppress_health_check=list(HealthCheck), database=None)
def test_arbitrary_json_bodies_never_answer_5xx(body, path):
    install(UniformBackend())
    status, _, answer = call(event("POST", path, body))
    assert status < 500, (path, body, answer)


@given(raw=st.binary(max_size=300), encoding=st.sampled_from(["", "gzip", "zstd", "identity", "deflate"]), wrap=st.booleans())
@settings(max_examples=examples(200), deadline=None, suppress_health_check=list(HealthCheck), database=None)
def test_arbitrary_bytes_never_answer_5xx(raw, encoding, wrap):
    install(UniformBackend())
    data = gzip.compress(raw) if wrap and encoding == "gzip" else raw
    status, _, _ = call(event("POST", "/v1/systemone", raw=data, headers={"Content-Encoding": encoding} if encoding else {}))
    assert status < 500


form_bodies = st.one_of(
    st.binary(max_size=400),
    st.builds(lambda head, data, tail: b"--b\r\n" + head + b"\r\n\r\n" + data + b"\r\n--b" + tail,
              st.sampled_from([b'Content-Disposition: form-data; name="file"; filename="a\xff.jsonl"',
                               b'Content-Disposition: form-data; name="purpose"', b"Content-Disposition:",
                               b'Content-Disposition: form-data; name="data"; filename="\\"x\\";;"', b"\xff\xfe"]),
              st.binary(max_size=200), st.sampled_from([b"--\r\n", b"", b"\r\n--b--"])),
)


@pytest.fixture(scope="module")
def form_store(tmp_path_factory):
    from devkit.gateway_stack import PRINCIPAL
    from tests.gateway_helpers import register_credentials, tenant_store

    store = tenant_store(tmp_path_factory.mktemp("forms") / "forms.db", PRINCIPAL["tenant_id"])
    register_credentials(store, PRINCIPAL)
    return store


@given(raw=form_bodies, content_type=st.sampled_from(["multipart/form-data; boundary=b", "multipart/form-data",
                                                     'multipart/form-data; boundary="b"', "application/json", ""]),
       path=st.sampled_from(["/v1/files", "/v1/uploads/upload_x/parts", "/v1/batches", "/v1/uploads"]))
@settings(max_examples=examples(200), deadline=None, suppress_health_check=list(HealthCheck), database=None)
def test_arbitrary_forms_never_answer_5xx(form_store, raw, content_type, path):
    install(UniformBackend(), stores=form_store)
    status, _, answer = call(event("POST", path, raw=raw, headers={"Content-Type": content_type}))
    assert status < 500, (path, raw, answer)


# Hostile shapes no schema generator tends to make: nesting past any recursion limit,
# numbers past a float or past Python's integer-string limit, and malformed tokens.
hostile_fragments = st.one_of(
    st.integers(min_value=65, max_value=200_000).map(lambda n: "[" * n + "]" * n),
    st.integers(min_value=65, max_value=5_000).map(lambda n: '{"a":' * n + "1" + "}" * n),
    st.integers(min_value=309, max_value=100_000).map(lambda e: f"1e{e}"),
    st.integers(min_value=101, max_value=50_000).map(lambda n: "9" * n),
    st.sampled_from(["NaN", "-Infinity", "1e-400", "-0", '"\\ud800"', '"\\udfff\\ud800"']),
)
principals = st.sampled_from([None, {"tenant_id": "", "reason": "invalid credentials"}, "default"])


@given(fragment=hostile_fragments, where=st.sampled_from(["state", "x_temperature", "model"]), principal=principals,
       path=st.sampled_from(["/v1/systemone", "/v1/decisions", "/v1/chat/completions", "/v1/catalogs/x", "/v1/tokens/revoke"]))
@settings(max_examples=examples(150), deadline=None, suppress_health_check=list(HealthCheck), database=None)
def test_hostile_numbers_and_nesting_never_answer_5xx(fragment, where, principal, path):
    install(UniformBackend())
    head = '{"model": "jev-latest", "state": "s", "questions": {"q": {"type": "noul", "instructions": "?"}}'
    raw = f'{head}, "{where}": {fragment}}}'.encode()
    kwargs = {} if principal == "default" else {"principal": principal}
    status, _, _ = call(event("PUT" if path.startswith("/v1/catalogs") else "POST", path, raw=raw, **kwargs))
    assert status < 500
    if principal != "default":
        assert status == 401  # anonymous: refused before the body is read


tokens = st.one_of(
    st.text(max_size=200),
    st.builds(lambda a, b: f"dgt_{a}.{b}", st.text("ABCDEFabcdef0123456789-_", max_size=300),
              st.text("ABCDEFabcdef0123456789-_=.", max_size=60)),
    st.builds(lambda a: f"dgk_{a}", st.text(max_size=80)),
    st.integers(min_value=1, max_value=20_000).map(lambda n: "dgt_" + "W" * n + ".AAAA"),
)


@given(token=tokens, scheme=st.sampled_from(["Bearer ", "bearer ", "Basic ", "", "Bearer  "]))
@settings(max_examples=examples(200), deadline=None, suppress_health_check=list(HealthCheck), database=None)
def test_the_authorizer_refuses_malformed_credentials_and_never_raises(tmp_path_factory, token, scheme):
    from gateway.auth.authenticate import Authenticator
    from gateway.auth.tenants import create_tenant
    from gateway.auth.tokens import CachedKeyRing, new_key_document
    from gateway.stores.sqlite import open_sqlite

    store = open_sqlite(tmp_path_factory.mktemp("authz") / "g.db")
    create_tenant(store.tenants, "fuzz")
    document = new_key_document()
    policy = Authorizer(Authenticator(store, CachedKeyRing(lambda: document)))(
        {"methodArn": "arn:aws:execute-api:r:1:a/s/POST/v1/systemone", "headers": {"Authorization": scheme + token}}, None)
    assert policy["context"]["tenant_id"] == "" and "unverified" not in policy["context"]
