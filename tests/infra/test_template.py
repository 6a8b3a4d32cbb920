"""The infrastructure, tested like code: lint, validate, build, and what the template grants."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

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
    found = []
    for policy in policies:
        if isinstance(policy, dict) and "Statement" in policy:
            found.extend(policy["Statement"])
        elif isinstance(policy, dict) and "PolicyDocument" in policy:
            found.extend(policy["PolicyDocument"]["Statement"])
        else:
            pytest.fail(f"a policy that is not an inline statement list: {policy!r} (managed policies grant too much)")
    return found


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
    roles = {name: statements(r["Properties"]["Policies"]) for name, r in resources(template, "AWS::Serverless::Function").items()}
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
                assert "dynamodb:Query" not in as_list(statement["Action"]) or "Keys" not in json.dumps(statement["Resource"])
    assert not any("by_tenant" in json.dumps(s["Resource"]) and "KeysTable" in json.dumps(s["Resource"])
                   for r in ("GatewayFunction", "AuthorizerFunction") for s in roles[r])
    # ECR pull rights name the scorer's repositories, never repository/*.
    pull = [s for s in roles["ScorerExecutionRole"] if "ecr:BatchGetImage" in as_list(s["Action"])]
    assert len(pull) == 1 and "repository/*" not in json.dumps(pull[0]["Resource"])


def test_the_secrets_are_readable_by_the_functions_only(template):
    policies = resources(template, "AWS::SecretsManager::ResourcePolicy")
    assert {p["Properties"]["SecretId"]["Ref"] for p in policies.values()} == {"SigningSecret", "RecordHashSecret"}
    for policy in policies.values():
        [deny] = policy["Properties"]["ResourcePolicy"]["Statement"]
        assert deny["Effect"] == "Deny" and deny["Action"] == "secretsmanager:GetSecretValue"
        allowed = json.dumps(deny["Condition"]["StringNotEquals"]["aws:PrincipalArn"])
        assert "GatewayFunctionRole" in allowed


def test_the_models_are_network_isolated_and_pin_the_model_and_its_manifest(template):
    for name in ("CpuModel", "GpuModel"):
        model = template["Resources"][name]["Properties"]
        assert model["EnableNetworkIsolation"] is True
        env = model["PrimaryContainer"]["Environment"]
        assert env["SCORER_MODEL_SHA256"] == {"Ref": "ModelSha256"}
        assert env["SCORER_MANIFEST_SHA256"] == {"Ref": "ModelManifestSha256"}
    for parameter in ("ModelSha256", "ModelManifestSha256"):
        assert template["Parameters"][parameter]["AllowedPattern"] == "^$|^[0-9a-f]{64}$"


def test_every_endpoint_requires_both_pins_together(template):
    # A stack that pins the file but not its manifest would leave the model's defenses
    # (quarantine, framing) to whoever can write the artifact: the rules refuse it.
    for rule in ("ImagesForEndpoints", "GpuImage"):
        asserted = [json.dumps(a["Assert"]) for a in template["Rules"][rule]["Assertions"]]
        for parameter in ("ModelSha256", "ModelManifestSha256"):
            assert json.dumps({"Fn::Not": [{"Fn::Equals": [{"Ref": parameter}, ""]}]}) in asserted, (rule, parameter)


def test_bearer_routes_are_throttled_per_tenant_by_usage_plans(template):
    api = template["Resources"]["Api"]["Properties"]
    assert api["ApiKeySourceType"] == "AUTHORIZER"
    bearer = template["Resources"]["GatewayFunction"]["Properties"]["Events"]["Bearer"]["Properties"]["Auth"]
    assert bearer["ApiKeyRequired"] is True
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
    assert set(tables) == {"TenantsTable", "KeysTable", "CatalogsTable", "RecordsTable"}
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
        policy = template["Resources"][f"{flavor}ScalingPolicy"]["Properties"]["TargetTrackingScalingPolicyConfiguration"]
        assert policy["PredefinedMetricSpecification"]["PredefinedMetricType"] == "SageMakerVariantInvocationsPerInstance"
        image = template["Parameters"][f"{flavor}ImageUri"]["AllowedPattern"]
        assert "@sha256:[0-9a-f]{64}" in image  # images are pinned by digest
    gpu = template["Resources"]["GpuEndpointConfig"]["Properties"]["ProductionVariants"][0]
    assert gpu["ContainerStartupHealthCheckTimeoutInSeconds"] == {"Ref": "GpuStartupHealthCheckTimeout"}
    assert template["Parameters"]["GpuStartupHealthCheckTimeout"]["MinValue"] >= 600
    assert gpu["InferenceAmiVersion"] == {"Ref": "GpuInferenceAmiVersion"}
    env = template["Resources"]["GpuModel"]["Properties"]["PrimaryContainer"]["Environment"]
    assert env["SM_LLAMA_CPP_N_GPU_LAYERS"] == "999" and "SCORER_IMAGE_DIGEST" in env


def test_alarms_cover_5xx_fallbacks_and_p99(template):
    alarms = resources(template, "AWS::CloudWatch::Alarm")
    assert alarms["Api5xxAlarm"]["Properties"]["MetricName"] == "5XXError"
    assert alarms["LatencyP99Alarm"]["Properties"]["ExtendedStatistic"] == "p99"
    names = [m.get("MetricStat", {}).get("Metric", {}).get("MetricName") for m in alarms["FallbackRateAlarm"]["Properties"]["Metrics"]]
    assert {"Fallback", "Requests"} <= set(names)


def test_sam_build_makes_an_artifact_whose_root_imports_the_handler(tmp_path):
    """The artifact is built for this machine's architecture here, so that it can be imported here."""
    arch = {"x86_64": "x86_64", "aarch64": "arm64"}[os.uname().machine]
    build = tmp_path / "build"
    run = subprocess.run([str(TOOLS / "sam"), "build", "--build-in-source", "--build-dir", str(build), "-t", str(TEMPLATE)],
                         capture_output=True, text=True, env={**ENV, "LAMBDA_ARCH": arch}, timeout=600, cwd=ROOT)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    artifact = build / "GatewayFunction"
    assert (artifact / "gateway" / "handler.py").exists() and not (artifact / "scorer_container").exists()
    # The local runner, the admin CLI and the calibration tool are not part of the function.
    assert not any((artifact / "gateway" / tool).exists() for tool in ("local.py", "admin.py", "calibrate.py"))
    probe = (
        "import json, sys\n"
        f"sys.path.insert(0, {str(artifact)!r})\n"
        "import gateway.handler, gateway.authorizer, gateway.rotation\n"
        f"event = json.load(open({str(ROOT / 'events' / 'health.json')!r}))\n"
        "print(json.dumps(gateway.handler.lambda_handler(event, None)['statusCode']))\n"
    )
    models = json.dumps({"models": [{"name": "m", "endpoints": [{"name": "e"}]}]})
    result = subprocess.run([sys.executable, "-I", "-c", probe], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                            env={"PATH": os.environ["PATH"], "GATEWAY_MODELS": models, "AWS_DEFAULT_REGION": "us-east-1",
                                 "POWERTOOLS_METRICS_DISABLED": "true"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "200"
