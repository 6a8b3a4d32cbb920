"""The suite does not read the developer's environment (the README suggests some of it)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import NO_AWS_FILES, ROOT

# What a developer's shell may well hold: the README's dev key, another region, a profile
# this machine does not have, real-looking keys, and broken settings for both deployables.
HOSTILE = {
    "GATEWAY_DEV_API_KEY": "dgk_0123456789abcdef_" + "A" * 43, "DG_API_KEY": "dgk_0123456789abcdef_" + "B" * 43,
    "DG_URL": "http://127.0.0.1:1", "AWS_PROFILE": "does-not-exist", "AWS_REGION": "eu-west-3",
    "AWS_DEFAULT_REGION": "ap-south-1", "AWS_ACCESS_KEY_ID": "AKIAIOSFODNN7EXAMPLE",
    "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "AWS_SESSION_TOKEN": "expired",
    "GATEWAY_MODELS": "{not json", "GATEWAY_SQLITE_PATH": "/nonexistent/gateway.db", "SCORER_BUDGET_S": "soon",
    "SM_LLAMA_CPP_MODEL": "/nonexistent.gguf", "POWERTOOLS_LOG_LEVEL": "DEBUG",
    "OPENAI_API_KEY": "sk-not-this-one", "OPENAI_BASE_URL": "http://127.0.0.1:9/v1",
    "HTTP_PROXY": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9", "ALL_PROXY": "http://127.0.0.1:9",
    "http_proxy": "http://127.0.0.1:9",
}


def test_boto3_reads_no_profile_or_credentials_file_of_the_developers():
    assert os.environ["AWS_CONFIG_FILE"] == os.environ["AWS_SHARED_CREDENTIALS_FILE"] == NO_AWS_FILES
    assert not os.path.exists(NO_AWS_FILES) and os.environ["AWS_EC2_METADATA_DISABLED"] == "true"


@pytest.mark.slow  # a selection of the suite, run again in a shell of its own
@pytest.mark.timeout(900)
def test_the_suite_passes_with_the_developers_variables_set():
    # Given a shell holding every variable above, when the tests that reach AWS clients,
    # settings and the local stack run, then they pass as they do in a clean shell (before
    # the environment was scrubbed, an AWS_PROFILE alone failed the local stack's tests).
    selection = ["tests/unit/gateway/test_aws.py", "tests/unit/gateway/test_settings.py",
                 "tests/unit/scorer_container/test_settings.py", "tests/unit/gateway/services/test_throttle.py",
                 "tests/e2e/test_sdks.py::test_openai_models_list"]
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *selection],
                         cwd=ROOT, env={**os.environ, **HOSTILE}, capture_output=True, text=True, timeout=880)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
