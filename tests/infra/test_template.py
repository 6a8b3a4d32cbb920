"""The infrastructure, tested like code: lint, validate, build, and what the template grants."""

from __future__ import annotations

import fnmatch
import itertools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gateway.auth.store import UsageRow
from gateway.batches.model import COMPLETION_WINDOWS, FILE_TTL_S, UPLOAD_TTL_S
from gateway.stores.dynamodb.batches import LINE_TTL_S

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / ".cache" / "tools" / "bin"
TEMPLATE = ROOT / "template.yaml"
ENV = {**os.environ, "AWS_DEFAULT_REGION": "us-east-1", "SAM_CLI_TELEMETRY": "0"}
# Actions on data and on SageMaker: never on "*".
GUARDED = re.compile(r"^(dynamodb|sagemaker|secretsmanager|ssm|s3|kms|lambda):")


class CfnLoader(yaml.SafeLoader):
    """YAML with CloudFormation's short tags (!Ref, !Sub, !If...) read as their long forms."""


def _tag(loader: CfnLoader, suffix: str, node: yaml.Node):
    value = (loader.construct_sequence(node, deep=True) if isinstance(node, yaml.SequenceNode)
             else loader.construct_mapping(node, deep=True) if isinstance(node, yaml.MappingNode)
             else loader.construct_scalar(node))
    if suffix == "Ref":
        return {"Ref": value}
    if suffix == "GetAtt" and isinstance(value, str):
        value = value.split(".", 1)
    return {f"Fn::{suffix}" if suffix != "Condition" else "Condition": value}


CfnLoader.add_multi_constructor("!", _tag)


@pytest.fixture(scope="module")
def template() -> dict:
    return yaml.load(TEMPLATE.read_text(), Loader=CfnLoader)


def resources(template: dict, kind: str) -> dict[str, dict]:
    return {name: r for name, r in template["Resources"].items() if r["Type"] == kind}


def statements(policies: list) -> list[dict]:
    """The policies' statements, a conditional one (an optional part's: Fn::If) as it is where that
    part is deployed."""
    found = []
    for policy in policies:
        if isinstance(policy, dict) and "Statement" in policy:
            found.extend(policy["Statement"])
        elif isinstance(policy, dict) and "PolicyDocument" in policy:
            found.extend(policy["PolicyDocument"]["Statement"])
        else:
            pytest.fail(f"a policy that is not an inline statement list: {policy!r} (managed policies grant too much)")
    return [s["Fn::If"][1] if isinstance(s, dict) and "Fn::If" in s else s for s in found]


def as_list(value) -> list:
    return value if isinstance(value, list) else [value]


def test_cfn_lint_passes():
    run = subprocess.run([str(TOOLS / "cfn-lint"), str(TEMPLATE)], capture_output=True, text=True, env=ENV, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr


def test_sam_validate_lint_passes():
    run = subprocess.run([str(TOOLS / "sam"), "validate", "--lint", "-t", str(TEMPLATE)], capture_output=True, text=True,
                         env=ENV, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stdout + run.stderr


def test_every_role_is_least_privilege(template):
    functions = resources(template, "AWS::Serverless::Function")
    # A function without policies of its own runs with the gateway function's role (checked below).
    assert {name for name, f in functions.items() if "Policies" not in f["Properties"]} == {"StreamingFunction"}
    assert functions["StreamingFunction"]["Properties"]["Role"] == {"Fn::GetAtt": ["GatewayFunctionRole", "Arn"]}
    roles = {name: statements(r["Properties"]["Policies"]) for name, r in functions.items() if "Policies" in r["Properties"]}
    roles.update({name: statements(r["Properties"]["Policies"]) for name, r in resources(template, "AWS::IAM::Role").items()})
    assert set(roles) >= {"GatewayFunction", "AuthorizerFunction", "RotationFunction", "ScorerExecutionRole"}
    for role, granted in roles.items():
        for statement in granted:
            actions = as_list(statement["Action"])
            assert all(a != "*" and not a.endswith(":*") for a in actions), (role, actions)
            if any(GUARDED.match(a) for a in actions):
                assert "*" not in as_list(statement["Resource"]), (role, statement)
    invoke = [s for s in roles["GatewayFunction"] if "sagemaker:InvokeEndpoint" in as_list(s["Action"])]
    assert len(invoke) == 1 and all("endpoint/" in json.dumps(r) for r in as_list(invoke[0]["Resource"]))
    assert not any("sagemaker" in json.dumps(s["Action"]) for s in roles["AuthorizerFunction"])
    secret = [s for r in ("GatewayFunction", "AuthorizerFunction") for s in roles[r] if "secretsmanager:GetSecretValue" in as_list(s["Action"])]
    assert sorted(json.dumps(s["Resource"]) for s in secret) == sorted(
        ['{"Ref": "SigningSecret"}', '{"Ref": "SigningSecret"}', '{"Ref": "RecordHashSecret"}'])
    # The keys table holds every tenant's key records: each function reaches only the item
    # kinds it needs, and neither lists keys (the by_tenant index is the admin CLI's).
    for role in ("GatewayFunction", "AuthorizerFunction"):
        for statement in roles[role]:
            if "dynamodb" in json.dumps(statement["Action"]) and re.search(r"KeysTable|TenantsTable", json.dumps(statement["Resource"])):
                leading = statement["Condition"]["ForAllValues:StringLike"]["dynamodb:LeadingKeys"]
                assert leading and "*" not in leading, (role, statement)
                # A Query on the keys table reads one tenant's usage partition, never key items.
                assert ("dynamodb:Query" not in as_list(statement["Action"]) or "Keys" not in json.dumps(statement["Resource"])
                        or leading == ["USAGE#*"]), (role, statement)
    assert not any("by_tenant" in json.dumps(s["Resource"]) and "KeysTable" in json.dumps(s["Resource"])
                   for r in ("GatewayFunction", "AuthorizerFunction") for s in roles[r])
    # Whoever writes a tenant's usage may write every figure the code adds up (one list: a figure
    # the IAM list lacked would be denied at run time, and settling never fails a request).
    from gateway.auth.store import USAGE_FIGURES

    usage = [s for r in roles for s in roles[r] if s.get("Condition", {}).get("ForAllValues:StringLike", {})
             .get("dynamodb:LeadingKeys") == ["USAGE#*"]]
    assert usage and all(set(USAGE_FIGURES) | {"pk", "sk", "ttl"} == set(
        s["Condition"]["ForAllValues:StringEquals"]["dynamodb:Attributes"]) for s in usage)
    # ECR pull rights name the scorer's repositories, never repository/*.
    pull = [s for s in roles["ScorerExecutionRole"] if "ecr:BatchGetImage" in as_list(s["Action"])]
    assert len(pull) == 1 and "repository/*" not in json.dumps(pull[0]["Resource"])


# -- a small policy evaluator, enough for the conditions this template uses -----------------
#
# A request is a dict: "action", and the context keys it carries (a missing key is absent
# from the request context). Values of multivalued keys are lists. Conditions are read as
# AWS documents them: every operator of a statement must hold; a ForAllValues operator holds
# when every value of the key matches (and so when the key is absent); StringNotEquals
# holds when the key is absent; StringEquals does not.

def resolve(value, conditions: dict[str, bool]):
    """The template value for one set of conditions: Fn::If taken, AWS::NoValue dropped,
    references kept as readable names ("Ref:X", "X.Arn")."""
    if isinstance(value, dict):
        if "Fn::If" in value:
            name, yes, no = value["Fn::If"]
            return resolve(yes if conditions[name] else no, conditions)
        if value == {"Ref": "AWS::NoValue"}:
            return None
        if set(value) == {"Ref"}:
            return f"Ref:{value['Ref']}"
        if set(value) == {"Fn::GetAtt"}:
            return ".".join(value["Fn::GetAtt"])
        return {k: v for k, v in ((k, resolve(v, conditions)) for k, v in value.items()) if v is not None}
    if isinstance(value, list):
        return [v for v in (resolve(v, conditions) for v in value) if v is not None]
    return value


def _holds(operator: str, wanted, found) -> bool:
    wanted = as_list(wanted)
    absent = found is None
    values = as_list(found) if not absent else []
    base = operator.split(":")[-1]
    if_exists = base.endswith("IfExists")
    base = base.removesuffix("IfExists")
    match = {"StringEquals": lambda v: v in wanted, "StringNotEquals": lambda v: v not in wanted,
             "StringLike": lambda v: any(fnmatch.fnmatchcase(v, w) for w in wanted),
             "StringNotLike": lambda v: not any(fnmatch.fnmatchcase(v, w) for w in wanted)}[base]
    if operator.startswith("ForAllValues:"):
        return all(match(v) for v in values)
    if absent:
        return if_exists or base in ("StringNotEquals", "StringNotLike")
    return all(match(v) for v in values)


def applies(statement: dict, request: dict) -> bool:
    actions = as_list(statement.get("Action", []))
    if not any(fnmatch.fnmatchcase(request["action"], a) for a in actions):
        return False
    return all(_holds(operator, wanted, request.get(key))
               for operator, keys in (statement.get("Condition") or {}).items() for key, wanted in keys.items())


def allowed_by(granted: list[dict], request: dict) -> bool:
    return any(s["Effect"] == "Allow" and applies(s, request) for s in granted)


def denied_by(policy: list[dict], request: dict) -> bool:
    return any(s["Effect"] == "Deny" and applies(s, request) for s in policy)


def test_the_evaluator_reads_conditions_as_aws_documents_them():
    deny = {"Effect": "Deny", "Action": "x:Put", "Condition": {
        "StringNotEquals": {"aws:PrincipalArn": ["me"]},
        "ForAllValues:StringNotEquals": {"aws:CalledVia": ["cloudformation.amazonaws.com"]}}}
    assert denied_by([deny], {"action": "x:Put", "aws:PrincipalArn": "you"})
    assert not denied_by([deny], {"action": "x:Put", "aws:PrincipalArn": "me"})
    assert not denied_by([deny], {"action": "x:Put", "aws:PrincipalArn": "you",
                                  "aws:CalledVia": ["cloudformation.amazonaws.com"]})
    assert denied_by([deny], {"action": "x:Put", "aws:PrincipalArn": "you", "aws:CalledVia": ["athena.amazonaws.com"]})
    assert not denied_by([deny], {"action": "x:Get", "aws:PrincipalArn": "you"})
    allow = {"Effect": "Allow", "Action": "x:Put", "Condition": {"StringEquals": {"k": ["a"]}}}
    assert allowed_by([allow], {"action": "x:Put", "k": "a"}) and not allowed_by([allow], {"action": "x:Put"})


# -- the keys table: which function may write what --------------------------------------------

class RecordingClient:
    """A DynamoDB client that records the requests the store makes and answers nothing."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict]] = []

    def __getattr__(self, operation: str):
        def call(**kwargs):
            self.requests.append((operation, kwargs))
            return {}
        return call


_KEYWORDS = {"SET", "ADD", "REMOVE", "DELETE", "AND", "OR", "NOT", "BETWEEN", "IN", "attribute_exists",
             "attribute_not_exists", "attribute_type", "if_not_exists", "size", "begins_with", "contains",
             "list_append"}


def dynamodb_request(operation: str, kwargs: dict) -> dict:
    """The request context IAM sees for one DynamoDB call: its action, the partition key
    (dynamodb:LeadingKeys), the attribute names it names (dynamodb:Attributes: the key, the
    item, the expressions) and ReturnValues."""
    names = dict(kwargs.get("ExpressionAttributeNames", {}))
    attributes = set(kwargs.get("Key", {})) | set(kwargs.get("Item", {}))
    for expression in ("UpdateExpression", "ConditionExpression", "ProjectionExpression"):
        for token in re.findall(r"[#A-Za-z_][A-Za-z0-9_]*", re.sub(r":[A-Za-z0-9_]+", " ", kwargs.get(expression, ""))):
            if token not in _KEYWORDS:
                attributes.add(names.get(token, token))
    key = kwargs.get("Key") or kwargs.get("Item")
    leading = key["pk"]["S"] if key else kwargs["ExpressionAttributeValues"][":pk"]["S"]  # a Query names its partition
    if not key:
        attributes |= {"pk", "sk"}
    action = "dynamodb:" + "".join(part.capitalize() for part in operation.split("_"))
    request = {"action": action, "dynamodb:LeadingKeys": [leading], "dynamodb:Attributes": sorted(attributes)}
    if action in ("dynamodb:UpdateItem", "dynamodb:PutItem", "dynamodb:DeleteItem"):
        request["dynamodb:ReturnValues"] = kwargs.get("ReturnValues", "NONE")
    return request


def keys_table_grants(template: dict, function: str) -> list[dict]:
    policies = template["Resources"][function]["Properties"]["Policies"]
    return [s for s in statements(policies) if "KeysTable" in json.dumps(s["Resource"])]


def store_writes(call) -> list[dict]:
    """The requests one store method sends to DynamoDB, as IAM sees them."""
    from gateway.stores.dynamodb import DynamoDBTables, dynamodb_stores

    client = RecordingClient()
    call(dynamodb_stores(client, DynamoDBTables("tenants", "keys")))
    return [dynamodb_request(operation, kwargs) for operation, kwargs in client.requests]


TOUCH = [lambda store: store.tenants.touch_api_key("0123456789abcdef", 1.7e9)]
GATEWAY_WRITES = [
    *TOUCH,
    lambda store: store.tenants.revoke_token("t0k3n", "acme", 1.7e9),
    lambda store: store.tenants.set_not_before("tenant:acme", 1.7e9),
    lambda store: store.counters.count_within("mints:acme:1", 600, 1.7e9),
    lambda store: store.counters.hold("inflight:acme", "holder", 8, 1.7e9, 1.6e9),
    lambda store: store.counters.release("inflight:acme", "holder"),
    lambda store: store.idempotency.claim_request("acme", "0f" * 32, "fp", 1.7e9, 1.6e9),
    lambda store: store.idempotency.finish_request("acme", "0f" * 32, "fp", b"reply", 1.7e9),
    lambda store: store.idempotency.drop_request("acme", "0f" * 32, "fp"),
    lambda store: store.counters.add_within("spend:acme:2026-12", 2_000, 10_000, 1.7e9),
    lambda store: store.counters.add_within("spend:acme:2026-12", -1_000, None, 1.7e9),
    lambda store: store.counters.add_usage("acme", UsageRow("2026-12-03", "routing", 1, 1_000, 20), 1.7e9),
]
READS = [lambda store: store.tenants.get_api_key("0123456789abcdef"), lambda store: store.tenants.token_revoked("acme", "t0k3n", 1.7e9),
         lambda store: store.tenants.not_before("tenant:acme")]
GATEWAY_READS = [*READS, lambda store: store.counters.tally("spend:acme:2026-12"),
                 lambda store: store.counters.usage("acme", "2026-12-01", "2026-12-31")]


def forged(action: str, pk: str, *attributes: str, returns: str = "NONE") -> dict:
    request = {"action": f"dynamodb:{action}", "dynamodb:LeadingKeys": [pk], "dynamodb:Attributes": ["pk", "sk", *attributes]}
    if action != "GetItem":
        request["dynamodb:ReturnValues"] = returns
    return request


# What a compromised function would try: mint a key, widen or un-revoke one, drop or
# expire a revocation, read a key's other attributes back through an update.
ATTACKS = {
    "mint a key": forged("PutItem", "KEY#0123456789abcdef", "key_id", "tenant_id", "key_hash", "scopes"),
    "mint a key by update": forged("UpdateItem", "KEY#0123456789abcdef", "tenant_id", "key_hash", "scopes"),
    "un-revoke a key": forged("UpdateItem", "KEY#0123456789abcdef", "revoked_at"),
    "extend a key": forged("UpdateItem", "KEY#0123456789abcdef", "expires_at"),
    "widen a key": forged("UpdateItem", "KEY#0123456789abcdef", "scopes"),
    "read a key back": forged("UpdateItem", "KEY#0123456789abcdef", "last_used_at", returns="ALL_OLD"),
    "delete a key": forged("DeleteItem", "KEY#0123456789abcdef"),
    "delete a revocation": forged("DeleteItem", "REVOKED"),
    "edit a revocation": forged("UpdateItem", "REVOKED", "expires_at"),
    "add to a revocation": forged("PutItem", "REVOKED", "tenant_id", "expires_at", "ttl", "created_at", "key_hash"),
    "delete a not-before": forged("DeleteItem", "NOTBEFORE"),
    "expire a not-before by TTL": forged("PutItem", "NOTBEFORE", "at", "ttl"),
    "edit a not-before": forged("UpdateItem", "NOTBEFORE", "at"),
    "write another item kind": forged("PutItem", "TENANT#acme", "limits"),
    "a key through an idempotency entry": forged("PutItem", "IDEMPOTENCY#acme", "key_hash", "scopes"),
    "read a key by query": forged("Query", "KEY#0123456789abcdef", "key_hash"),
    # A Scan names no partition: a LeadingKeys condition (ForAllValues over nothing) cannot stop it.
    "scan every key": {"action": "dynamodb:Scan", "dynamodb:LeadingKeys": [], "dynamodb:Attributes": ["key_hash"]},
    "a key through a usage row": forged("UpdateItem", "USAGE#acme", "key_hash", "scopes"),
    "batch write": {**forged("BatchWriteItem", "KEY#0123456789abcdef", "key_hash"), "action": "dynamodb:BatchWriteItem"},
}


def test_every_keys_table_write_the_gateway_function_makes_is_allowed_and_no_attack_is(template):
    # Given the gateway function's grants on the keys table
    granted = keys_table_grants(template, "GatewayFunction")
    # When its code writes (a key's last use, a revocation, a "not before", a counter) and reads
    # Then each request is allowed
    for call in GATEWAY_WRITES + GATEWAY_READS:
        for request in store_writes(call):
            assert allowed_by(granted, request), request
    # And none of what a compromised function would try is
    for attack, request in ATTACKS.items():
        assert not allowed_by(granted, request), attack


def test_the_authorizer_writes_a_keys_last_use_and_nothing_else(template):
    granted = keys_table_grants(template, "AuthorizerFunction")
    for call in TOUCH + READS:
        for request in store_writes(call):
            assert allowed_by(granted, request), request
    # No revocation, "not before" or counter write: it never makes them.
    for call in GATEWAY_WRITES[1:]:
        for request in store_writes(call):
            assert not allowed_by(granted, request), request
    for attack, request in ATTACKS.items():
        assert not allowed_by(granted, request), attack


def test_no_function_may_put_or_delete_a_key_item(template):
    for function in ("GatewayFunction", "AuthorizerFunction"):
        for statement in keys_table_grants(template, function):
            actions = set(as_list(statement["Action"]))
            assert not actions & {"dynamodb:DeleteItem", "dynamodb:BatchWriteItem", "dynamodb:TransactWriteItems"}
            leading = statement["Condition"]["ForAllValues:StringLike"]["dynamodb:LeadingKeys"]
            if "dynamodb:PutItem" in actions:
                assert not any(k.startswith("KEY") for k in leading), (function, statement)
            if "dynamodb:UpdateItem" in actions and any(k.startswith("KEY") for k in leading):
                assert leading == ["KEY#*"], (function, statement)  # never with another kind's looser grant
                condition = statement["Condition"]
                assert condition["ForAllValues:StringEquals"]["dynamodb:Attributes"] == ["pk", "sk", "last_used_at"]
                assert set(condition["StringEquals"]["dynamodb:ReturnValues"]) <= {"NONE", "UPDATED_OLD", "UPDATED_NEW"}


# -- the secrets' resource policies -------------------------------------------------------------

ROLES = {"gateway": "GatewayFunctionRole.Arn", "authorizer": "AuthorizerFunctionRole.Arn",
         "rotation": "RotationFunctionRole.Arn", "operator": "Ref:OperatorRoleArn",
         "deployer": "Ref:DeploymentRoleArn", "stranger": "arn:aws:iam::123456789012:role/admin"}
VALUE_WRITES = ["secretsmanager:PutSecretValue", "secretsmanager:UpdateSecretVersionStage", "secretsmanager:RotateSecret"]
# Every Secrets Manager action that changes an existing secret (the service authorization
# reference's Write, Permissions management and Tagging actions, less CreateSecret).
CHANGES = ["secretsmanager:UpdateSecret", "secretsmanager:DeleteSecret", "secretsmanager:RestoreSecret",
           "secretsmanager:CancelRotateSecret", "secretsmanager:PutResourcePolicy", "secretsmanager:DeleteResourcePolicy",
           "secretsmanager:TagResource", "secretsmanager:UntagResource", "secretsmanager:ReplicateSecretToRegions",
           "secretsmanager:RemoveRegionsFromReplication", "secretsmanager:StopReplicationToReplica"]
VIA_CLOUDFORMATION = ["cloudformation.amazonaws.com"]


def secret_policy(template: dict, secret: str, conditions: dict[str, bool]) -> list[dict]:
    [policy] = [p for p in resources(template, "AWS::SecretsManager::ResourcePolicy").values()
                if p["Properties"]["SecretId"] == {"Ref": secret}]
    assert policy["Properties"]["BlockPublicPolicy"] is True
    return resolve(policy["Properties"]["ResourcePolicy"]["Statement"], conditions)


def refused(policy: list[dict], who: str, action: str, via: list[str] | None = None) -> bool:
    request = {"action": action, "aws:PrincipalArn": ROLES[who]}
    if via:
        request["aws:CalledVia"] = via
    return denied_by(policy, request)


@pytest.mark.parametrize(("operator", "deployer"), list(itertools.product([True, False], repeat=2)))
def test_only_the_functions_read_the_signing_secret_and_only_rotation_writes_it(template, operator, deployer):
    conditions = {"HasOperator": operator, "HasDeploymentRole": deployer,
                  "HasOperatorOrDeploymentRole": operator or deployer}
    policy = secret_policy(template, "SigningSecret", conditions)
    # Reads: the three functions (and the operator role, when named)
    for who in ("gateway", "authorizer", "rotation"):
        assert not refused(policy, who, "secretsmanager:GetSecretValue"), who
    assert refused(policy, "stranger", "secretsmanager:GetSecretValue")
    assert refused(policy, "operator", "secretsmanager:GetSecretValue") is not operator
    # New values: the rotation function (and the operator role), never the other functions
    for action in VALUE_WRITES:
        assert not refused(policy, "rotation", action)
        for who in ("gateway", "authorizer", "stranger"):
            assert refused(policy, who, action), (who, action)
        assert refused(policy, "operator", action) is not operator
        assert refused(policy, "deployer", action) is not deployer
    # The secret itself (its value through UpdateSecret, its policy, its life): the stack only
    for action in CHANGES:
        for who in ("gateway", "authorizer", "rotation", "operator", "stranger"):
            assert refused(policy, who, action), (who, action)
        assert refused(policy, "deployer", action) is not deployer
    # CloudFormation acting with the deployer's credentials may update and delete the stack
    for action in VALUE_WRITES + CHANGES:
        assert not refused(policy, "stranger", action, VIA_CLOUDFORMATION), action
        assert refused(policy, "stranger", action, ["athena.amazonaws.com"]), action


@pytest.mark.parametrize(("operator", "deployer"), list(itertools.product([True, False], repeat=2)))
def test_only_the_gateway_function_reads_the_record_hash_secret_and_only_the_operator_writes_it(template, operator,
                                                                                                deployer):
    conditions = {"HasOperator": operator, "HasDeploymentRole": deployer,
                  "HasOperatorOrDeploymentRole": operator or deployer}
    policy = secret_policy(template, "RecordHashSecret", conditions)
    assert not refused(policy, "gateway", "secretsmanager:GetSecretValue")
    for who in ("authorizer", "rotation", "stranger"):
        assert refused(policy, who, "secretsmanager:GetSecretValue"), who
    for action in VALUE_WRITES:
        for who in ("gateway", "authorizer", "rotation", "stranger"):
            assert refused(policy, who, action), (who, action)
        assert refused(policy, "operator", action) is not operator
        assert not refused(policy, "stranger", action, VIA_CLOUDFORMATION)
    for action in CHANGES:
        for who in ("gateway", "rotation", "operator", "stranger"):
            assert refused(policy, who, action), (who, action)
        assert not refused(policy, "stranger", action, VIA_CLOUDFORMATION)


def test_the_models_are_network_isolated_and_pin_the_model_and_its_manifest(template):
    for name in ("CpuModel", "GpuModel", "ServerlessModel"):
        model = template["Resources"][name]["Properties"]
        # Serverless Inference refuses network isolation: the instance pools have it, it cannot.
        assert model.get("EnableNetworkIsolation") is (None if name == "ServerlessModel" else True)
        env = model["PrimaryContainer"]["Environment"]
        assert env["SCORER_MODEL_SHA256"] == {"Ref": "ModelSha256"}
        assert env["SCORER_MANIFEST_SHA256"] == {"Ref": "ModelManifestSha256"}
    for parameter in ("ModelSha256", "ModelManifestSha256"):
        assert template["Parameters"][parameter]["AllowedPattern"] == "^$|^[0-9a-f]{64}$"


def test_every_endpoint_requires_both_pins_together(template):
    # A stack that pins the file but not its manifest would leave the model's defenses
    # (quarantine, framing) to whoever can write the artifact: the rules refuse it.
    for rule in ("ImagesForEndpoints", "GpuImage", "ServerlessImage"):
        asserted = [json.dumps(a["Assert"]) for a in template["Rules"][rule]["Assertions"]]
        for parameter in ("ModelSha256", "ModelManifestSha256"):
            assert json.dumps({"Fn::Not": [{"Fn::Equals": [{"Ref": parameter}, ""]}]}) in asserted, (rule, parameter)


def test_bearer_routes_require_the_usage_key_the_authorizer_names(template):
    api = template["Resources"]["Api"]["Properties"]
    assert api["ApiKeySourceType"] == "AUTHORIZER"
    events = {**template["Resources"]["GatewayFunction"]["Properties"]["Events"],
              **template["Resources"]["StreamingFunction"]["Properties"]["Events"]}
    for name, event in events.items():
        auth = event["Properties"]["Auth"]
        # Only where the bearer authorizer runs can a key be named; elsewhere a required key
        # would refuse every call.
        assert auth.get("ApiKeyRequired", False) is (auth["Authorizer"] == "BearerAuthorizer"), name
    plans = resources(template, "AWS::ApiGateway::UsagePlan")
    assert set(plans) == {"TenantsUsagePlan", "RefusedUsagePlan"}
    env = template["Globals"]["Function"]["Environment"]["Variables"]
    keys = resources(template, "AWS::ApiGateway::ApiKey")
    assert env["GATEWAY_DEFAULT_USAGE_KEY"] == keys["TenantsUsageKey"]["Properties"]["Value"]
    assert env["GATEWAY_REFUSED_USAGE_KEY"] == keys["RefusedUsageKey"]["Properties"]["Value"]


def test_iam_is_the_default_and_bearer_only_where_routes_allow_it(template):
    api = template["Resources"]["Api"]["Properties"]
    assert api["Auth"]["DefaultAuthorizer"] == "AWS_IAM"
    assert api["Auth"]["Authorizers"]["BearerAuthorizer"]["Identity"]["Headers"] == ["Authorization"]
    events = template["Resources"]["GatewayFunction"]["Properties"]["Events"]
    auth = {e["Properties"]["Path"] + " " + e["Properties"]["Method"]: e["Properties"]["Auth"]["Authorizer"] for e in events.values()}
    assert auth == {"/v1/{proxy+} ANY": "BearerAuthorizer", "/iam/v1/{proxy+} ANY": "AWS_IAM", "/v1/tokens POST": "AWS_IAM",
                    "/health GET": "NONE"}


def test_access_logs_and_traces_never_carry_a_credential(template):
    api = template["Resources"]["Api"]["Properties"]
    log_format = api["AccessLogSetting"]["Format"]
    assert "$context" in log_format
    assert not re.search(r"authorization|header|apiKey|\$input", log_format, re.IGNORECASE)
    assert all(setting["DataTraceEnabled"] is False for setting in api["MethodSettings"])


def test_tables_are_encrypted_recoverable_and_retained(template):
    tables = resources(template, "AWS::DynamoDB::Table")
    assert set(tables) == {"TenantsTable", "KeysTable", "CatalogsTable", "RecordsTable", "BatchesTable"}
    for name, table in tables.items():
        properties = table["Properties"]
        assert properties["SSESpecification"]["SSEEnabled"] is True, name
        assert properties["PointInTimeRecoverySpecification"]["PointInTimeRecoveryEnabled"] is True, name
        assert table["DeletionPolicy"] == "Retain", name
    assert tables["RecordsTable"]["Properties"]["TimeToLiveSpecification"] == {"AttributeName": "ttl", "Enabled": True}


def test_both_endpoints_and_their_autoscaling_exist_behind_their_parameters(template):
    conditions = template["Conditions"]
    assert conditions["HasCpu"] == {"Fn::Equals": [{"Ref": "DeployCpuEndpoint"}, "true"]}
    assert conditions["HasGpu"] == {"Fn::Equals": [{"Ref": "DeployGpuEndpoint"}, "true"]}
    for flavor, condition in (("Cpu", "HasCpu"), ("Gpu", "HasGpu")):
        for suffix in ("Model", "EndpointConfig", "Endpoint", "ScalableTarget", "ScalingPolicy"):
            assert template["Resources"][f"{flavor}{suffix}"]["Condition"] == condition
        # Scaled on requests in flight, which a few long requests reach, not on invocations a
        # minute, which they never do; and each request sent to the least busy instance
        policy = template["Resources"][f"{flavor}ScalingPolicy"]["Properties"]["TargetTrackingScalingPolicyConfiguration"]
        assert (policy["PredefinedMetricSpecification"]["PredefinedMetricType"]
                == "SageMakerVariantConcurrentRequestsPerModelHighResolution")
        assert policy["TargetValue"] == {"Ref": "TargetConcurrentRequestsPerInstance"}
        (variant,) = template["Resources"][f"{flavor}EndpointConfig"]["Properties"]["ProductionVariants"]
        # by the state's first bytes, to the instance that keeps it, until it runs all it can at once
        assert variant["RoutingConfig"] == {"RoutingStrategy": "PREFIX_AWARE", "PrefixAwareRoutingConfig": {
            "PrefixLength": 4096, "ConcurrencyThreshold": {"Ref": "RoutingConcurrencyThreshold"}}}
        image = template["Parameters"][f"{flavor}ImageUri"]["AllowedPattern"]
        assert "@sha256:[0-9a-f]{64}" in image  # images are pinned by digest
    gpu = template["Resources"]["GpuEndpointConfig"]["Properties"]["ProductionVariants"][0]
    assert gpu["ContainerStartupHealthCheckTimeoutInSeconds"] == {"Ref": "GpuStartupHealthCheckTimeout"}
    assert template["Parameters"]["GpuStartupHealthCheckTimeout"]["MinValue"] >= 600
    assert gpu["InferenceAmiVersion"] == {"Ref": "GpuInferenceAmiVersion"}
    env = template["Resources"]["GpuModel"]["Properties"]["PrimaryContainer"]["Environment"]
    assert env["SM_LLAMA_CPP_N_GPU_LAYERS"] == "999" and "SCORER_IMAGE_DIGEST" in env
    # The target keeps an instance under a scorer's line (8): the rest takes a burst while a
    # new instance loads; the Serverless variant has neither a routing nor a scaling policy
    target = template["Parameters"]["TargetConcurrentRequestsPerInstance"]
    assert 1 <= target["MinValue"] <= target["Default"] < 8
    # prefix routing keeps its affinity at the target, and spills before the line is full
    threshold = template["Parameters"]["RoutingConcurrencyThreshold"]
    assert target["Default"] < threshold["Default"] < 8
    (quiet,) = template["Resources"]["ServerlessEndpointConfig"]["Properties"]["ProductionVariants"]
    assert "RoutingConfig" not in quiet and "ServerlessConfig" in quiet
    serverless = template["Resources"]["ServerlessModel"]["Properties"]["PrimaryContainer"]["Environment"]
    assert serverless["SCORER_STATE_CACHE_MB"] == "0"  # no affinity: a kept state would serve nobody


def test_alarms_cover_5xx_fallbacks_and_p99(template):
    alarms = resources(template, "AWS::CloudWatch::Alarm")
    assert alarms["Api5xxAlarm"]["Properties"]["MetricName"] == "5XXError"
    assert alarms["LatencyP99Alarm"]["Properties"]["ExtendedStatistic"] == "p99"
    names = [m.get("MetricStat", {}).get("Metric", {}).get("MetricName") for m in alarms["FallbackRateAlarm"]["Properties"]["Metrics"]]
    assert {"Fallback", "Requests"} <= set(names)


def test_the_artifact_pip_runs_under_the_interpreter_not_a_shim(tmp_path):
    """A version manager's shim (pyenv's) rehashes after `pip install` and fails the build where
    its shims folder is read-only: the rule resolves PYTHON to the interpreter it runs."""
    shim = tmp_path / "python3"
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    shim.chmod(0o755)
    dry = subprocess.run(["make", "-n", "build-GatewayFunction", f"ARTIFACTS_DIR={tmp_path / 'a'}", f"PYTHON={shim}"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT, check=True).stdout
    [pip] = [line for line in dry.splitlines() if " -m pip install " in line]
    assert pip.split()[0] == sys.executable and str(shim) not in pip


@pytest.mark.slow  # a whole `sam build`
def test_sam_build_makes_an_artifact_whose_root_imports_the_handler(tmp_path):
    """The artifact is built for this machine's architecture and Python here (the runtime's may
    not be installed), so that it can be imported here."""
    arch = {"x86_64": "x86_64", "aarch64": "arm64"}[os.uname().machine]
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    build = tmp_path / "build"
    run = subprocess.run([str(TOOLS / "sam"), "build", "--build-in-source", "--build-dir", str(build), "-t", str(TEMPLATE)],
                         capture_output=True, text=True, timeout=600, cwd=ROOT,
                         env={**ENV, "LAMBDA_ARCH": arch, "LAMBDA_PYTHON": version, "BYTECODE_PYTHON": sys.executable})
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    artifact = build / "GatewayFunction"
    assert (artifact / "gateway" / "functions" / "handler.py").exists() and (artifact / "systemone").is_dir()
    # With its bytecode, for the Python it was built for: a read-only code folder cannot cache it.
    tag = sys.implementation.cache_tag
    assert (artifact / "gateway" / "functions" / "__pycache__" / f"handler.{tag}.pyc").exists()
    assert (artifact / "pydantic" / "__pycache__" / f"main.{tag}.pyc").exists()
    # Built from what the function needs: the tools beside it (devkit: the local runner, the admin
    # CLI, the calibration tool), the scorer and the benchmarks are never copied in.
    assert not any((artifact / name).exists() for name in ("devkit", "scorer_container", "bench", "evals", "scripts", "tests"))
    probe = (
        "import json, sys\n"
        f"sys.path.insert(0, {str(artifact)!r})\n"
        "import gateway.functions.handler, gateway.functions.authorizer, gateway.functions.rotation\n"
        "import gateway.functions.batch_queue, gateway.functions.refits\n"
        f"event = json.load(open({str(ROOT / 'events' / 'health.json')!r}))\n"
        "print(json.dumps(gateway.functions.handler.lambda_handler(event, None)['statusCode']))\n"
    )
    models = json.dumps({"models": [{"name": "m", "endpoints": [{"name": "e"}]}]})
    result = subprocess.run([sys.executable, "-I", "-c", probe], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                            env={"PATH": os.environ["PATH"], "GATEWAY_MODELS": models, "AWS_DEFAULT_REGION": "us-east-1",
                                 "POWERTOOLS_METRICS_DISABLED": "true"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "200"


def test_every_route_has_a_stage_throttle_the_sigv4_ones_included(template):
    # Given the stage's method settings (applied to each method, whatever authorizes it)
    settings = template["Resources"]["Api"]["Properties"]["MethodSettings"]
    default = [m for m in settings if m["ResourcePath"] == "/*" and m["HttpMethod"] == "*"]
    # Then one setting covers every method, with the stage's throttle parameters
    assert len(default) == 1
    assert default[0]["ThrottlingRateLimit"] == {"Ref": "ThrottlingRateLimit"}
    assert default[0]["ThrottlingBurstLimit"] == {"Ref": "ThrottlingBurstLimit"}
    # And no method has a setting of its own that lifts it (an override may only be lower)
    defaults = {name: template["Parameters"][name]["Default"] for name in ("ThrottlingRateLimit", "ThrottlingBurstLimit")}
    for setting in settings:
        if setting is default[0]:
            continue
        assert setting["ThrottlingRateLimit"] <= defaults["ThrottlingRateLimit"], setting
        assert setting["ThrottlingBurstLimit"] <= defaults["ThrottlingBurstLimit"], setting
    # The unauthenticated health check gets less than any authenticated route
    [health] = [m for m in settings if m["ResourcePath"] == "/~1health"]
    assert health["HttpMethod"] == "GET" and health["ThrottlingRateLimit"] < defaults["ThrottlingRateLimit"]


def test_the_shared_usage_plans_are_coarse_guards_below_the_stage_throttle(template):
    parameters = template["Parameters"]
    plans = resources(template, "AWS::ApiGateway::UsagePlan")
    assert plans["TenantsUsagePlan"]["Properties"]["Throttle"] == {"RateLimit": {"Ref": "TenantRateLimit"},
                                                                   "BurstLimit": {"Ref": "TenantBurstLimit"}}
    for shared in ("Tenant", "Refused"):
        # Below the bearer route's own stage limit, so that what the plan lets through the
        # stage still has room for tenants on plans of their own.
        assert parameters[f"{shared}RateLimit"]["Default"] < parameters["ThrottlingRateLimit"]["Default"]
        assert parameters[f"{shared}BurstLimit"]["Default"] < parameters["ThrottlingBurstLimit"]["Default"]
        assert parameters[f"{shared}BurstLimit"]["Default"] >= parameters[f"{shared}RateLimit"]["Default"]
    # Two shared plans only: a plan per tenant cannot scale (300 per Region by default)
    assert set(plans) == {"TenantsUsagePlan", "RefusedUsagePlan"}


def _resolved(value, conditions: dict[str, bool], parameters: dict[str, str]):
    """The models parameter's value under these conditions (Fn::Join, Fn::If and Fn::Sub only),
    template parameters at their defaults, an endpoint's name its logical id in lower case."""
    if isinstance(value, dict) and "Fn::Join" in value:
        separator, parts = value["Fn::Join"]
        return separator.join(_resolved(p, conditions, parameters) for p in parts)
    if isinstance(value, dict) and "Fn::If" in value:
        condition, then, otherwise = value["Fn::If"]
        return _resolved(then if conditions[condition] else otherwise, conditions, parameters)
    if isinstance(value, dict) and "Fn::Sub" in value:
        text, variables = (value["Fn::Sub"], {}) if isinstance(value["Fn::Sub"], str) else value["Fn::Sub"]
        names = {**parameters, **{k: _resolved(v, conditions, parameters) for k, v in variables.items()}}
        return re.sub(r"\$\{([A-Za-z]+)(?:\.EndpointName)?\}", lambda m: names.get(m[1], m[1].lower()), text)
    return value


@pytest.mark.parametrize(("cpu", "gpu"), [(True, False), (False, True), (True, True)])  # a rule requires one
@pytest.mark.parametrize("serverless", [True, False])
@pytest.mark.parametrize("provisioned", [True, False])
def test_the_models_parameter_is_settings_the_gateway_accepts_for_every_deployment(template, cpu, gpu, serverless,
                                                                                  provisioned):
    # Whatever pools a stack deploys (one instance pool at least: a rule says so), the models
    # parameter is valid gateway settings; the Serverless pool is a model of its own.
    from gateway.settings import GatewaySettings

    conditions = {"HasCpu": cpu, "HasGpu": gpu, "HasBoth": cpu and gpu, "HasServerless": serverless,
                  "HasProvisioned": provisioned}
    parameters = {name: str(p["Default"]) for name, p in template["Parameters"].items() if "Default" in p}
    parameters.update(GpuMinInstances="2", CpuMinInstances="3")  # told apart
    value = _resolved(template["Resources"]["ModelsParameter"]["Properties"]["Value"], conditions, parameters)
    settings = GatewaySettings.from_env({"GATEWAY_MODELS": value})
    names = [m.name for m in settings.models]
    assert names == ["decision-default", "chat-default", *(["decision-quiet"] if serverless else [])]
    # Every pool is priced: each instance at its type's price in the one price file, the
    # Serverless pool by its memory.
    from gateway.decisions.cost import PRICES
    from gateway.functions.composition import endpoint as built

    for endpoint in settings.models[0].endpoints:
        kind = "GpuInstanceType" if endpoint.name == "gpuendpoint" else "CpuInstanceType"
        hourly = PRICES["sagemaker_realtime_usd_per_hour"][parameters[kind]]
        assert built(endpoint, "us-east-1").usd_per_second == pytest.approx(hourly / 3600)
    # A tenant may have in flight on a pool what its scorers let one tenant hold: half the line
    # on each of the first tier's least instances (the Serverless pool's line is 2)
    first_tier = "GpuMinInstances" if gpu else "CpuMinInstances"
    scorer_line = {name: int(template["Resources"][name]["Properties"]["PrimaryContainer"]["Environment"]["SCORER_MAX_JOBS"])
                   for name in ("CpuModel", "GpuModel", "ServerlessModel")}
    for model in settings.models[:2]:
        # the gateway's `line` is what the pool's scorers admit (one contract, two copies: held equal)
        assert (model.line, model.min_instances) == (8, int(parameters[first_tier]))
        assert model.line == scorer_line["GpuModel" if gpu else "CpuModel"]
    if serverless:
        (quiet,) = settings.models[2].endpoints
        assert settings.models[2].line == 2 == scorer_line["ServerlessModel"]
        assert quiet.name == "serverlessendpoint" and quiet.serverless and quiet.provisioned == provisioned
        gb = int(parameters["ServerlessMemoryMiB"]) / 1024
        assert built(quiet, "us-east-1").usd_per_second == pytest.approx(gb * PRICES["sagemaker_serverless_usd_per_gb_second"])


def test_the_gateway_resumes_from_a_snapshot_on_the_runtime_every_build_targets(template):
    # SnapStart needs Python 3.12 or later and a published version; the API invokes the alias
    # SAM publishes. The artifact (Makefile) and the `sam local` base image are built for the
    # template's runtime: three statements of one fact, held equal here.
    function = template["Resources"]["GatewayFunction"]["Properties"]
    assert function["SnapStart"] == {"ApplyOn": "PublishedVersions"} and function["AutoPublishAlias"]
    # The routing is part of the function's configuration, and any change to that publishes a
    # version: a snapshot never outlives the pools it was taken with. Nothing reads SSM at init.
    assert function["AutoPublishAliasAllProperties"] is True
    assert function["Environment"]["Variables"]["GATEWAY_MODELS"] == {"Fn::GetAtt": ["ModelsParameter", "Value"]}
    assert "ssm:" not in json.dumps(function["Policies"])
    runtime = template["Globals"]["Function"]["Runtime"]
    version = runtime.removeprefix("python")
    assert tuple(map(int, version.split("."))) >= (3, 12)
    assert re.search(rf"^LAMBDA_PYTHON \?= {re.escape(version)}$", (ROOT / "Makefile").read_text(), re.M)
    assert re.search(rf'^lambda_python="{re.escape(version)}"', (ROOT / "scripts" / "base_images.sh").read_text(), re.M)


def test_the_streaming_routes_are_the_streaming_functions_and_stream(template):
    from devkit.local import STREAM_TIMEOUT_S
    from gateway.api.paths import IAM_PREFIX, STREAMING_ROUTES
    from gateway.settings import MAX_STREAM_DEADLINE_S

    streaming = template["Resources"]["StreamingFunction"]["Properties"]
    gateway = template["Resources"]["GatewayFunction"]["Properties"]
    # Every streaming route, for bearer and SigV4 callers, and nothing else, streams through it
    routes = {(e["Properties"]["Path"], e["Properties"]["Method"], e["Properties"]["Auth"]["Authorizer"])
              for e in streaming["Events"].values()}
    assert routes == ({(path, method, "BearerAuthorizer") for method, path in STREAMING_ROUTES}
                      | {(IAM_PREFIX + path, method, "AWS_IAM") for method, path in STREAMING_ROUTES})
    for event in streaming["Events"].values():
        assert event["Properties"]["ResponseTransferMode"] == "RESPONSE_STREAM"
        # The integration bounds a stream from outside: longer than the function may run,
        # and what the local runner applies
        assert event["Properties"]["TimeoutInMillis"] == STREAM_TIMEOUT_S * 1000 > streaming["Timeout"] * 1000
    assert streaming["Timeout"] >= MAX_STREAM_DEADLINE_S + 2
    # The same code and settings as the gateway function, started by the exec wrapper that runs the loop
    variables = dict(streaming["Environment"]["Variables"])
    wrapper = variables.pop("AWS_LAMBDA_EXEC_WRAPPER")
    assert variables == gateway["Environment"]["Variables"]
    script = ROOT / wrapper.removeprefix("/var/task/")
    assert wrapper.startswith("/var/task/") and script.is_file() and os.access(script, os.X_OK)
    assert "gateway.functions.runtime_loop" in script.read_text()
    assert {k: streaming[k] for k in ("SnapStart", "AutoPublishAlias", "AutoPublishAliasAllProperties", "CodeUri")} == {
        k: gateway[k] for k in ("SnapStart", "AutoPublishAlias", "AutoPublishAliasAllProperties", "CodeUri")}


# SAM's own transform of the template (as CloudFormation runs it): the API's OpenAPI body.
_TRANSFORM = """
import json, sys
from samtranslator.translator.transform import transform
from samtranslator.yaml_helper import yaml_parse
class NoManagedPolicies:
    def load(self):
        return {}
template = yaml_parse(open(sys.argv[1]).read())
for resource in template["Resources"].values():
    if resource["Type"] == "AWS::Serverless::Function":
        resource["Properties"]["CodeUri"] = "s3://bucket/key"  # what `sam package` puts there
template["Resources"]["Api"]["Properties"].pop("Domain", None)  # a condition the transform cannot read offline
body = transform(template, {}, NoManagedPolicies())["Resources"]["Api"]["Properties"]["Body"]
print(json.dumps(body["paths"]))
"""


def test_sams_transform_makes_the_streaming_routes_stream_integrations_of_the_streaming_alias():
    from gateway.api.paths import IAM_PREFIX, STREAMING_ROUTES

    run = subprocess.run([str(TOOLS / "python"), "-c", _TRANSFORM, str(TEMPLATE)], capture_output=True, text=True,
                         env=ENV, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    paths = json.loads(run.stdout)
    for method, path in STREAMING_ROUTES:
        for route in (path, IAM_PREFIX + path):
            integration = paths[route][method.lower()]["x-amazon-apigateway-integration"]
            assert integration["responseTransferMode"] == "STREAM", route
            assert integration["uri"] == {"Fn::Sub": "arn:aws:apigateway:${AWS::Region}:lambda:path/2021-11-15/functions/"
                                                     "${StreamingFunctionAliaslive}/response-streaming-invocations"}
    buffered = paths["/v1/{proxy+}"]["x-amazon-apigateway-any-method"]["x-amazon-apigateway-integration"]
    assert "responseTransferMode" not in buffered and buffered["uri"]["Fn::Sub"].endswith("${GatewayFunctionAliaslive}/invocations")


def test_the_scheduled_refit_lists_tenant_ids_from_heads_and_writes_catalog_versions_and_their_usage_only(template):
    refit = resources(template, "AWS::Serverless::Function")["RefitFunction"]["Properties"]
    assert refit["Handler"] == "gateway.functions.refits.lambda_handler"
    assert refit["Events"]["Daily"] == {"Type": "Schedule", "Properties": {
        "Schedule": "rate(1 day)", "Description": refit["Events"]["Daily"]["Properties"]["Description"]}}
    assert refit["EventInvokeConfig"] == {"MaximumRetryAttempts": 0}
    granted = statements(refit["Policies"])
    catalogs = "CatalogsTable.Arn"

    def may(action: str, resource_name: str, **context) -> bool:
        return any(s["Effect"] == "Allow" and resource_name in json.dumps(resolve(s["Resource"], {}))
                   and applies(s, {"action": action, **context}) for s in granted)

    ids_only = {"dynamodb:Select": "SPECIFIC_ATTRIBUTES", "dynamodb:Attributes": ["tenant_id"]}
    assert may("dynamodb:Scan", catalogs, **ids_only)
    # The heads' index only: a Scan of the table would read every version.
    assert all(json.dumps(s["Resource"]).endswith('/index/by_tenant"}') for s in granted if "dynamodb:Scan" in s["Action"])
    assert not may("dynamodb:Scan", catalogs, **{**ids_only, "dynamodb:Attributes": ["tenant_id", "content"]})
    assert not may("dynamodb:Scan", catalogs, **{"dynamodb:Select": "ALL_ATTRIBUTES"})
    assert not may("dynamodb:Scan", "RecordsTable.Arn", **ids_only)
    # The keys table for its usage rows alone (what a refit writes is counted), never a key or a counter.
    usage = {"dynamodb:Attributes": ["pk", "sk", "stored_bytes", "ttl"]}
    assert may("dynamodb:UpdateItem", "KeysTable.Arn", **{"dynamodb:LeadingKeys": ["USAGE#acme"]}, **usage)
    for other in ("KEY#k1", "COUNTER", "REVOKED", "IDEMPOTENCY#x"):
        assert not may("dynamodb:UpdateItem", "KeysTable.Arn", **{"dynamodb:LeadingKeys": [other]}, **usage)
    assert not may("dynamodb:UpdateItem", "KeysTable.Arn", **{"dynamodb:LeadingKeys": ["USAGE#acme"]},
                   **{"dynamodb:Attributes": ["pk", "sk", "scopes"]})
    assert not any(re.search("TenantsTable", json.dumps(s["Resource"])) or "secretsmanager" in json.dumps(s["Action"])
                   or "sagemaker" in json.dumps(s["Action"]) for s in granted)
    assert not any(may(action, "KeysTable.Arn", **{"dynamodb:LeadingKeys": ["USAGE#acme"]}, **usage)
                   for action in ("dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:DeleteItem", "dynamodb:Query"))
    assert may("dynamodb:PutItem", "CatalogsTable.Arn") and may("dynamodb:Query", "RecordsTable.Arn")
    assert may("dynamodb:DeleteItem", "CatalogsTable.Arn")  # versions past an entry's count
    assert not may("dynamodb:PutItem", "RecordsTable.Arn") and not may("dynamodb:UpdateItem", "RecordsTable.Arn")


def test_the_process_settings_are_the_templates_and_make_ups_never_a_module_write(template):
    # No module writes the environment (tests/unit/test_house_rules.py): what the functions
    # need there is declared here, and `make up` gives its gateway the same.
    variables = template["Globals"]["Function"]["Environment"]["Variables"]
    wanted = {"PYDANTIC_DISABLE_PLUGINS": "__all__", "OPENBLAS_NUM_THREADS": "1"}
    assert {k: variables.get(k) for k in wanted} == wanted
    up = (Path(__file__).resolve().parents[2] / "scripts" / "up.py").read_text()
    assert all(f'"{k}": "{v}"' in up for k, v in wanted.items())
    from bench.gateway import TEMPLATE_ENVIRONMENT  # the cold start measured as deployed

    assert TEMPLATE_ENVIRONMENT == wanted


def test_the_authorizer_resumes_from_a_snapshot_and_the_api_calls_its_published_alias(template):
    function = template["Resources"]["AuthorizerFunction"]["Properties"]
    assert function["SnapStart"] == {"ApplyOn": "PublishedVersions"}
    assert function["AutoPublishAlias"] and function["AutoPublishAliasAllProperties"] is True
    bearer = template["Resources"]["Api"]["Properties"]["Auth"]["Authorizers"]["BearerAuthorizer"]
    assert bearer["FunctionArn"] == {"Ref": "AuthorizerFunction.Alias"}


# -- batches in AWS -----------------------------------------------------------------------------


def test_the_batch_tables_indexes_and_ttl_are_the_stores(template):
    from gateway.stores.dynamodb.batches import BATCH_INDEXES, PROJECTIONS

    table = template["Resources"]["BatchesTable"]["Properties"]
    indexes = {(i["IndexName"], *(k["AttributeName"] for k in i["KeySchema"])) for i in table["GlobalSecondaryIndexes"]}
    assert indexes == set(BATCH_INDEXES) and table["TimeToLiveSpecification"] == {"AttributeName": "ttl", "Enabled": True}
    assert {i["IndexName"]: i["Projection"] for i in table["GlobalSecondaryIndexes"]} == PROJECTIONS


def _batch_grants(template: dict, function: str) -> dict[str, dict]:
    return {s["Sid"]: s for s in statements(template["Resources"][function]["Properties"]["Policies"])}


def test_the_batch_worker_serves_lines_with_the_gateways_grants_and_reaches_only_its_own_prefixes(template):
    gateway, worker = _batch_grants(template, "GatewayFunction"), _batch_grants(template, "BatchWorkerFunction")
    sweep = _batch_grants(template, "BatchSweepFunction")
    # What serving a line needs is the gateway's own statement, word for word (nothing to drift)
    shared = set(worker) & set(gateway) - {"BatchItems"}
    assert shared == {"InvokeTheStacksEndpointsOnly", "ReadTenantsAndPrincipalRules", "CheckKeysRevocationsAndCounters",
                      "CountRequestsAndWorkInFlight", "TenantUsage", "DecisionRecords", "SigningKeys", "RecordHashKeys"}
    assert all(worker[sid] == gateway[sid] for sid in shared)
    # None of the API's own writes: tokens, keys' last use, idempotency, catalog versions
    assert not {"RevokeTokens", "RevokeAllTokens", "KeyLastUsedOnly", "IdempotentDecisions", "CatalogVersions"} & set(worker)
    assert set(as_list(worker["ReadCatalogs"]["Action"])) == {"dynamodb:GetItem", "dynamodb:Query"}

    def prefixes(grants: dict[str, dict]) -> set[str]:
        return {json.dumps(r).split("/")[1] for s in grants.values() if "s3:" in json.dumps(s["Action"])
                for r in as_list(s["Resource"])}

    assert prefixes(worker) == {"files", "ledger", "async"} and prefixes(gateway) == {"files", "parts"}
    assert prefixes(sweep) == {"files", "parts"} and {a for s in sweep.values() for a in as_list(s["Action"])
                                                       if a.startswith("s3:")} == {"s3:DeleteObject"}
    for grants in (gateway, worker, sweep):
        assert all("BatchFilesBucket.Arn}/" in json.dumps(s["Resource"]) for s in grants.values()
                   if "s3:" in json.dumps(s["Action"]))  # objects under a prefix, never the bucket's listing


def test_the_batch_bucket_is_private_encrypted_tls_only_and_expires_what_the_sweep_misses(template):
    bucket = template["Resources"]["BatchFilesBucket"]
    properties = bucket["Properties"]
    assert bucket["DeletionPolicy"] == "Retain" and all(properties["PublicAccessBlockConfiguration"].values())
    assert properties["BucketEncryption"]["ServerSideEncryptionConfiguration"][0]["ServerSideEncryptionByDefault"]
    rules = {r["Id"]: r for r in properties["LifecycleConfiguration"]["Rules"]}
    assert {rules[p]["Prefix"] for p in ("files", "parts", "ledger")} == {"files/", "parts/", "ledger/"}
    assert rules["files"]["ExpirationInDays"] * 86400 > FILE_TTL_S and rules["parts"]["ExpirationInDays"] * 86400 > UPLOAD_TTL_S
    assert rules["ledger"]["ExpirationInDays"] * 86400 > max(COMPLETION_WINDOWS.values()) + LINE_TTL_S
    assert "AbortIncompleteMultipartUpload" in rules["unfinished-uploads"]
    [deny] = template["Resources"]["BatchFilesBucketPolicy"]["Properties"]["PolicyDocument"]["Statement"]
    assert deny["Effect"] == "Deny" and deny["Condition"] == {"Bool": {"aws:SecureTransport": False}}


def test_the_worker_takes_one_turn_a_message_from_a_fifo_queue_and_stuck_batches_raise_alarms(template):
    from gateway.functions import batch_queue

    resources_ = template["Resources"]
    queue = resources_["BatchQueue"]["Properties"]
    worker = resources_["BatchWorkerFunction"]["Properties"]
    [turns] = worker["Events"].values()
    assert turns["Type"] == "SQS" and turns["Properties"]["BatchSize"] == 1
    assert turns["Properties"]["FunctionResponseTypes"] == ["ReportBatchItemFailures"]  # a waiting turn comes back
    assert turns["Properties"]["ScalingConfig"]["MaximumConcurrency"] >= 2 and "ReservedConcurrentExecutions" not in worker
    assert queue["FifoQueue"] is True and queue["VisibilityTimeout"] >= worker["Timeout"]
    assert queue["RedrivePolicy"]["maxReceiveCount"] == batch_queue.MAX_RECEIVES
    from gateway.batches.worker import LEASE_S

    assert worker["Timeout"] >= batch_queue.TURN_S + LEASE_S  # a turn, and its last line (a lease's length)
    schedule = resources_["BatchSweepFunction"]["Properties"]["Events"]["Every10Minutes"]["Properties"]["Schedule"]
    assert schedule == f"rate({batch_queue.SWEEP_MINUTES} minutes)"
    alarms = resources(template, "AWS::CloudWatch::Alarm")
    assert alarms["BatchesPastWindowAlarm"]["Properties"]["MetricName"] == "BatchesPastWindow"
    assert "BatchDeadLetterQueue" in json.dumps(alarms["BatchDeadLettersAlarm"]["Properties"]["Dimensions"])
    for function in ("GatewayFunction", "StreamingFunction", "BatchWorkerFunction", "BatchSweepFunction"):
        variables = resources_[function]["Properties"]["Environment"]["Variables"]
        assert {"GATEWAY_BATCHES_TABLE", "GATEWAY_BATCH_BUCKET", "GATEWAY_BATCH_QUEUE_URL"} <= set(variables), function


def test_the_asynchronous_pool_is_opt_in_scales_to_zero_and_each_side_reaches_only_its_own_prefixes(template):
    from gateway.backends import async_pool

    resources_ = template["Resources"]
    parameter = template["Parameters"]["DeployAsyncEndpoint"]
    assert parameter["Default"] == "false" and "untested" in parameter["Description"]
    optional = [name for name, r in resources_.items() if r.get("Condition") == "HasAsync"]
    assert {"AsyncEndpoint", "AsyncEndpointConfig", "AsyncModel", "AsyncExecutionRole", "AsyncSuccessTopic",
            "AsyncErrorTopic", "AsyncScalableTarget", "AsyncBacklogScalingPolicy", "AsyncFromZeroPolicy",
            "BatchNoticeFunction"} <= set(optional)
    config = resources_["AsyncEndpointConfig"]["Properties"]["AsyncInferenceConfig"]
    output = config["OutputConfig"]
    assert output["S3OutputPath"] == {"Fn::Sub": f"s3://${{BatchFilesBucket}}/{async_pool.OUTPUT_PREFIX}"}
    assert output["S3FailurePath"] == {"Fn::Sub": f"s3://${{BatchFilesBucket}}/{async_pool.FAILURE_PREFIX}"}
    assert set(output["NotificationConfig"]) == {"SuccessTopic", "ErrorTopic"}
    assert "IncludeInferenceResponseIn" not in output["NotificationConfig"]  # a notice never carries an answer
    assert resources_["AsyncScalableTarget"]["Properties"]["MinCapacity"] == 0
    backlog = resources_["AsyncBacklogScalingPolicy"]["Properties"]["TargetTrackingScalingPolicyConfiguration"]
    assert backlog["CustomizedMetricSpecification"]["MetricName"] == "ApproximateBacklogSizePerInstance"
    from_zero = resources_["AsyncBacklogWithoutCapacityAlarm"]["Properties"]
    assert from_zero["MetricName"] == "HasBacklogWithoutCapacity"
    assert from_zero["AlarmActions"] == [{"Ref": "AsyncFromZeroPolicy"}]
    notices = resources_["BatchNoticeFunction"]["Properties"]
    assert {e["Properties"]["Topic"]["Ref"] for e in notices["Events"].values()} == {"AsyncSuccessTopic", "AsyncErrorTopic"}
    assert notices["Handler"] == "gateway.functions.batch_queue.notice_handler"

    def objects(grants: list[dict], action: str) -> set[str]:
        return {r["Fn::Sub"].split("}/")[1] for s in grants if action in as_list(s["Action"])
                for r in as_list(s["Resource"]) if "BatchFilesBucket" in json.dumps(r)}

    inputs, outputs = f"{async_pool.INPUT_PREFIX}*", {f"{async_pool.OUTPUT_PREFIX}*", f"{async_pool.FAILURE_PREFIX}*"}
    pool = statements(resources_["AsyncExecutionRole"]["Properties"]["Policies"])
    assert objects(pool, "s3:GetObject") == {inputs} and objects(pool, "s3:PutObject") == outputs
    worker = statements(resources_["BatchWorkerFunction"]["Properties"]["Policies"])
    assert {o for o in objects(worker, "s3:GetObject") if o.startswith("async/")} == outputs | {inputs}
    # it never writes an answer
    assert {o for o in objects(worker, "s3:PutObject") if o.startswith("async/")} == {inputs}
    assert objects(statements(notices["Policies"]), "s3:GetObject") == {inputs}
    [invoke] = [s for s in worker if "sagemaker:InvokeEndpointAsync" in as_list(s["Action"])]
    assert "AsyncEndpoint.EndpointName" in json.dumps(invoke["Resource"])
    from gateway.decisions.cost import PRICES

    # Every type it may run on is priced (a line's scorer time is charged at it)
    assert set(template["Parameters"]["AsyncInstanceType"]["AllowedValues"]) <= set(PRICES["sagemaker_realtime_usd_per_hour"])
    failed = resources_["AsyncInvocationsFailedAlarm"]["Properties"]
    assert failed["Dimensions"][0]["Value"] == {"Fn::GetAtt": ["AsyncErrorTopic", "TopicName"]}
    rules = {r["Id"]: r for r in resources_["BatchFilesBucket"]["Properties"]["LifecycleConfiguration"]["Rules"]}
    assert rules["async"]["Prefix"] == "async/" and rules["async"]["ExpirationInDays"] * 86400 > (
        async_pool.REQUEST_TTL_S + async_pool.INVOCATION_TIMEOUT_S)
