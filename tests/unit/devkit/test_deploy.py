"""`make deploy DRY_RUN=1` and `make teardown DRY_RUN=1` (devkit/deploy.py): run without AWS
credentials, every AWS call they print is valid against botocore's model of its service
(checked here, independently of the run), no secret is printed, and the deploy page's
step-by-step blocks are the commands `make deploy` runs."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import botocore.session
import pytest
from botocore.exceptions import ParamValidationError
from botocore.validate import validate_parameters

from devkit import deploy

pytestmark = pytest.mark.model  # the dry run reads an embedded model's folder
ROOT = Path(__file__).resolve().parents[3]
MODEL = "models/smollm2-135m-instruct-q4_1"
CANARIES = {"DG_API_KEY": "dgk_0123456789abcdef_CANARYcanaryCANARYcanaryCANARYcanaryCANARYc",
            "GATEWAY_DEV_API_KEY": "dgk_fedcba9876543210_CANARYcanaryCANARYcanaryCANARYcanaryCANARYd",
            "AWS_ACCESS_KEY_ID": "AKIACANARYCANARY0001", "AWS_SECRET_ACCESS_KEY": "canary/Secret/Access/Key/0123456789abcd",
            "AWS_SESSION_TOKEN": "CanarySessionTokenCanarySessionToken"}


def dry_run(command: str, **environ: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "DG_", "GATEWAY_"))}
    env.update(environ, AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull)
    return subprocess.run([sys.executable, "-m", "devkit.deploy", command, "--dry-run", "--model", MODEL,
                           "--config-env", "no-such-env"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="module")
def deployed() -> subprocess.CompletedProcess:
    done = dry_run("deploy")
    assert done.returncode == 0, done.stdout + done.stderr
    return done


@pytest.fixture(scope="module")
def torn_down() -> subprocess.CompletedProcess:
    done = dry_run("teardown")
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def printed_calls(output: str) -> list[tuple[str, str, dict]]:
    calls = []
    for line in output.splitlines():
        if match := re.fullmatch(r"aws ([a-z0-9-]+)\.([A-Za-z0-9]+) (\{.*\})", line):
            calls.append((match[1], match[2], json.loads(match[3])))
    return calls


def invalid(service: str, operation: str, params: dict) -> str | None:
    """Why botocore's model of `service` refuses this call, or None when it takes it."""
    model = botocore.session.get_session().get_service_model(service)
    if operation not in model.operation_names:
        return f"{service} has no operation {operation}"
    try:
        validate_parameters(params, model.operation_model(operation).input_shape)
    except ParamValidationError as exc:
        return str(exc)
    return None


@pytest.mark.parametrize("run", ["deployed", "torn_down"])
def test_every_printed_call_is_valid_against_botocores_model(run, request):
    calls = printed_calls(request.getfixturevalue(run).stdout)
    assert len(calls) >= 10
    for service, operation, params in calls:
        assert invalid(service, operation, params) is None, (service, operation, params)


def test_the_check_refuses_a_misspelt_operation_or_parameter():
    assert invalid("ecr", "CreateRepository", {"repositoryName": "xy"}) is None
    assert "no operation" in invalid("ecr", "CreateRepositry", {"repositoryName": "xy"})
    assert "Unknown parameter" in invalid("ecr", "CreateRepository", {"repositoryNme": "xy"})
    assert "Missing required" in invalid("secretsmanager", "DeleteSecret", {"RecoveryWindowInDays": 30})


def test_deploy_makes_the_calls_of_a_first_deployment_in_order(deployed):
    operations = [f"{s}.{o}" for s, o, _ in printed_calls(deployed.stdout)]
    expected = ["sts.GetCallerIdentity", "ecr.DescribeImages", "ecr.CreateRepository", "ecr.GetAuthorizationToken",
                "s3.HeadObject", "s3.HeadBucket", "s3.CreateBucket", "s3.PutPublicAccessBlock", "s3.PutObject",
                "cloudformation.DescribeStacks", "dynamodb.PutItem"]
    positions = [operations.index(op) for op in expected]
    assert positions == sorted(positions), operations
    upload = next(p for s, o, p in printed_calls(deployed.stdout) if o == "PutObject")
    assert upload["ChecksumAlgorithm"] == "SHA256" and upload["Key"].endswith("/model.tar.gz")


def test_sam_deploy_states_every_parameter_it_sets_and_each_is_the_templates(deployed):
    line = next(line for line in deployed.stdout.splitlines() if line.startswith("$ sam deploy "))
    words = line.split()
    overrides = words[words.index("--parameter-overrides") + 1:words.index("--save-params")]
    stated = dict(word.split("=", 1) for word in overrides)
    template = (ROOT / "template.yaml").read_text()
    parameters = set(re.findall(r"^  (\w+):\n    Type:", template.split("\nParameters:\n")[1].split("\nRules:")[0], re.M))
    assert set(stated) <= parameters
    for required in ("CpuImageUri", "ModelDataUrl", "ModelSha256", "ModelManifestSha256", "CpuInstanceType"):
        assert stated[required], required
    assert "@sha256:" in stated["CpuImageUri"]
    manifest = json.loads((ROOT / MODEL / "model-manifest.json").read_text())
    assert stated["ModelSha256"] == manifest["sha256"]


def test_teardown_deletes_the_stack_then_each_leftover_keeping_secrets_recoverable(torn_down):
    calls = printed_calls(torn_down.stdout)
    operations = [f"{s}.{o}" for s, o, _ in calls]
    assert operations.index("cloudformation.DeleteStack") < operations.index("dynamodb.DeleteTable")
    assert operations.count("dynamodb.DeleteTable") == 5
    for operation in ("logs.DeleteLogGroup", "s3.DeleteObject", "ecr.BatchDeleteImage", "s3.DeleteObjects", "s3.DeleteBucket"):
        assert operation in operations
    secrets = [p for s, o, p in calls if o == "DeleteSecret"]
    assert len(secrets) == 2 and all(p["RecoveryWindowInDays"] == 30 and "ForceDeleteWithoutRecovery" not in p
                                     for p in secrets)
    assert torn_down.stdout.count("would ask to type") == 12  # the stack, then each of 11 leftovers


@pytest.mark.parametrize("command", ["deploy", "teardown"])
def test_no_secret_is_printed_and_no_credential_is_needed(command):
    done = dry_run(command, **CANARIES)
    assert done.returncode == 0, done.stderr
    output = done.stdout + done.stderr
    for value in CANARIES.values():
        assert value not in output
    assert "dgk_" not in output  # the key the dry run's admin CLI issued is not shown either
    assert "password" not in output.lower().replace("--password-stdin", "")


def test_what_is_printed_hides_secret_parameters():
    shown = deploy.printable({"SecretString": "s3cret", "Item": {"key_hash": {"S": "abc"}}, "Name": "dgk_1234_abcd",
                              "Body": b"bytes"})
    assert shown == {"SecretString": "<hidden>", "Item": {"key_hash": {"S": "<hidden>"}}, "Name": "<a credential>",
                     "Body": "<the file's bytes>"}


def test_the_endpoints_platform_follows_its_instance_type():
    plan = deploy.Deployment("default", "s", "eu-west-1", Path(MODEL))
    for instance, platform in (("ml.c7i.xlarge", "linux/amd64"), ("ml.g5.xlarge", "linux/amd64"),
                               ("ml.c7g.2xlarge", "linux/arm64"), ("ml.m6gd.large", "linux/arm64")):
        plan.instance_type = instance
        assert plan.platform == platform, instance


def test_saved_parameters_are_read_from_samconfig(tmp_path):
    config = tmp_path / "samconfig.toml"
    config.write_text('version = 0.1\n[mine.global.parameters]\nstack_name = "dg-mine"\n'
                      '[mine.deploy.parameters]\nregion = "eu-west-1"\n'
                      'parameter_overrides = "CpuImageUri=\\"r/x@sha256:ab\\" ModelDataUrl=s3://b/k AlarmTopicArn="\n')
    saved = deploy.saved_parameters("mine", config)
    assert saved == {"stack_name": "dg-mine", "region": "eu-west-1", "CpuImageUri": "r/x@sha256:ab",
                     "ModelDataUrl": "s3://b/k", "AlarmTopicArn": ""}
    assert deploy.saved_parameters("other", config) == {}


# -- the deploy page's blocks are the commands make deploy runs ------------------------------

PAGE = ROOT / "docs" / "operations" / "deploy.md"


def page_commands() -> list[str]:
    text = PAGE.read_text()
    section = text.split("## What `make deploy` runs, step by step")[1].split("\n## ")[0]
    commands = []
    for block in re.findall(r"^```sh\n(.*?)^```", section, re.S | re.M):
        for line in block.replace("\\\n", "").splitlines():
            line = " ".join(line.split())
            if line and not line.startswith("#"):
                commands.append(line.split(" | ")[-1])  # what reads the pipe is the command run
    return commands


def run_commands(output: str) -> list[str]:
    """The `$ ...` lines of a dry run, its values replaced by the page's variables."""
    # The runs here use a config env of their own (samconfig.toml's `default` may hold a deployment).
    lines = [line[2:].replace("--config-env no-such-env", "--config-env default") for line in output.splitlines()
             if line.startswith("$ ")]
    text = "\n".join(lines)
    values = {
        "IMAGE": re.search(r" -t (\S+)", text)[1], "BASE": re.search(r"CPU_IMAGE=(\S+)", text)[1],
        "IMAGE_DIGEST": re.search(r"CpuImageUri=(\S+)", text)[1], "MODEL_URL": re.search(r"ModelDataUrl=(\S+)", text)[1],
        "MODEL_SHA256": re.search(r"ModelSha256=(\S+)", text)[1],
        "MANIFEST_SHA256": re.search(r"ModelManifestSha256=(\S+)", text)[1],
        "STACK": re.search(r"--stack-name (\S+)", text)[1], "REGION": re.search(r"--region (\S+)", text)[1],
        "TENANTS_TABLE": re.search(r"--dynamodb (\S+) \S+", text)[1], "KEYS_TABLE": re.search(r"--dynamodb \S+ (\S+)", text)[1],
        "API_URL": re.search(r"DG_URL=(\S+)", text)[1], "GGUF": re.search(r" pack (\S+)", text)[1],
    }
    values["REGISTRY"] = values["IMAGE"].split("/")[0]
    for name, value in sorted(values.items(), key=lambda item: -len(item[1])):
        text = text.replace(value, f"${name}")
    return text.splitlines()


def test_the_deploy_pages_blocks_are_the_commands_make_deploy_runs(deployed):
    assert page_commands() == run_commands(deployed.stdout)


def test_the_comparison_fails_when_the_page_drifts(deployed):
    drifted = [line.replace("--save-params", "") for line in run_commands(deployed.stdout)]
    assert page_commands() != drifted


# -- the first key, as a real (not dry) run writes it ------------------------------------------

def test_the_first_key_goes_to_a_0600_file_once_and_a_later_deploy_issues_none(tmp_path, monkeypatch):
    # Given the stack's tables (moto's DynamoDB) and no terminal,
    import boto3
    from moto import mock_aws

    from gateway.stores.dynamodb import DynamoDBTables, create_tables, dynamodb_stores

    for name, value in (("AWS_ACCESS_KEY_ID", "x"), ("AWS_SECRET_ACCESS_KEY", "x"), ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(name, value)
    with mock_aws():
        create_tables(boto3.client("dynamodb"), DynamoDBTables("tenants", "keys"))
        store = dynamodb_stores(boto3.client("dynamodb"), DynamoDBTables("tenants", "keys"))
        plan = deploy.Deployment("default", "dg", "us-east-1", Path(MODEL), key_file=tmp_path / "first.key")
        outputs = {"TenantsTableName": "tenants", "KeysTableName": "keys"}
        out = io.StringIO()
        # when deploy issues the first key, it is in the file, mode 0600, and nowhere in what it printed;
        key = deploy.first_key(plan, outputs, deploy.Shell(out, dry_run=False), out, interactive=False)
        written = plan.key_file.read_text().strip()
        assert written == key and key.startswith("dgk_")
        assert plan.key_file.stat().st_mode & 0o777 == 0o600
        assert key not in out.getvalue() and "(mode 0600)" in out.getvalue()
        assert store.tenants.get_tenant("first") is not None
        assert [k.name for k in store.tenants.list_api_keys("first")] == ["make deploy"]
        # and a second deploy issues none (the first key still stands).
        assert deploy.first_key(plan, outputs, deploy.Shell(out, dry_run=False), out, interactive=False) is None
        assert len(store.tenants.list_api_keys("first")) == 1


def test_without_credentials_a_real_run_stops_at_its_first_call_with_botocores_reason():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "DG_", "GATEWAY_"))}
    env.update(AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull, AWS_EC2_METADATA_DISABLED="true")
    done = subprocess.run([sys.executable, "-m", "devkit.deploy", "teardown", "--region", "eu-west-1",
                           "--config-env", "no-such-env"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 1
    assert "teardown: AWS: Unable to locate credentials" in done.stderr and "Traceback" not in done.stderr


def test_without_a_region_and_a_terminal_a_real_run_asks_for_one_rather_than_guess():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "DG_", "GATEWAY_"))}
    env.update(AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull)
    done = subprocess.run([sys.executable, "-m", "devkit.deploy", "deploy", "--config-env", "no-such-env"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 1
    assert "no region: set AWS_REGION" in done.stderr and "aws " not in done.stdout


@pytest.mark.parametrize("answer", ["two", "0", "-1", "101", "1.5", ""])
def test_an_instance_count_that_is_not_one_to_a_hundred_is_refused_with_the_answer(answer):
    with pytest.raises(deploy.DeployError, match="not a whole number"):
        deploy.count("Instances at least", answer)
    assert deploy.count("Instances at most", " 4 ") == 4
