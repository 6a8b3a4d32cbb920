"""The clients for the AWS services the gateway itself reads and writes (DynamoDB,
Secrets Manager, SSM, API Gateway), made in one place.

`GATEWAY_AWS_ENDPOINT_URL` points all of them at one endpoint instead of AWS's: under
`sam local` the function reaches a local stand-in for those services (moto's server) that
way, since the SAM CLI passes a function only the variables its template declares. Empty
in AWS. SageMaker endpoints are not among them: the gateway calls them with its own client
(`gateway.backends.sagemaker_runtime`), each with its own `endpoint_url` in the model
settings.
"""

from __future__ import annotations

import os
import threading
from typing import Any

ENDPOINT_URL_VARIABLE = "GATEWAY_AWS_ENDPOINT_URL"


def hot_path_config() -> Any:
    """Short timeouts and one retry: the authorizer has 10 s and callers are waiting, so a
    slow store is a quick refusal (503, or the authorizer's `unverified`), never a hang
    that API Gateway turns into its own 500."""
    from botocore.config import Config

    # `total_max_attempts` counts the first call; botocore reads `max_attempts` as retries only.
    return Config(connect_timeout=1, read_timeout=2, retries={"total_max_attempts": 2, "mode": "standard"})


def client(service: str, *, hot_path: bool = False, **options: Any) -> Any:
    """A botocore client of the shared session (boto3 is never imported: its resources,
    and the S3 transfer manager it loads, cost every cold start tens of milliseconds)."""
    if endpoint_url := os.environ.get(ENDPOINT_URL_VARIABLE, "").strip():
        options.setdefault("endpoint_url", endpoint_url)
    if hot_path:
        options["config"] = hot_path_config()
    return session().create_client(service, **options)


_SESSION: Any = None
_SESSION_LOCK = threading.Lock()


def session() -> Any:
    """One botocore session for every client: its loader reads each service model, the
    endpoint rules and the partitions once, not once a client (most of what building a
    client costs). Credentials are resolved per client, by botocore's provider chain."""
    global _SESSION
    with _SESSION_LOCK:
        if _SESSION is None:
            import botocore.session

            _SESSION = botocore.session.get_session()
            _SESSION.register_component("data_loader", _known_services_loader(_SESSION.get_config_variable("data_path")))
        return _SESSION


# Every service a client is made for, in the gateway, its functions and its tools. Checked
# by tests/unit/gateway/test_aws_clients.py against every client the code makes.
SERVICES = frozenset({"dynamodb", "secretsmanager", "ssm", "apigateway"})


def _known_services_loader(data_path: str | None) -> Any:
    """botocore's loader, less its census. To check a service's name before loading its
    model, botocore lists every service folder it ships (about 450, and the API versions in
    each): about 1,000 directory reads for each kind of file a client loads, on a cold
    start's cold file cache. This one answers that check from SERVICES, each name confirmed
    by its own folder; a name outside it is botocore's UnknownServiceError."""
    from botocore.exceptions import DataNotFoundError
    from botocore.loaders import Loader

    class KnownServicesLoader(Loader):
        def list_available_services(self, type_name: str) -> list[str]:
            found = []
            for name in sorted(SERVICES):
                try:
                    self.list_api_versions(name, type_name)
                except DataNotFoundError:
                    continue
                found.append(name)
            return found

    # As botocore's create_loader: AWS_DATA_PATH's folders are searched before its own.
    extra = [os.path.expanduser(os.path.expandvars(p)) for p in data_path.split(os.pathsep)] if data_path else []
    return KnownServicesLoader(extra_search_paths=extra)


def reset_session() -> None:
    """Forget the shared session, so the next client reads the environment again (tests that
    change it, as moto resets boto3's default session; a function's environment never changes)."""
    global _SESSION
    with _SESSION_LOCK:
        _SESSION = None
