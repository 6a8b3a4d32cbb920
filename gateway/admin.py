"""Operate tenants and credentials: `python -m gateway.admin <command> ...`.

Works against the store the environment configures (GATEWAY_SQLITE_PATH, or
GATEWAY_TENANTS_TABLE + GATEWAY_KEYS_TABLE for DynamoDB) or the one given with
`--sqlite PATH` / `--dynamodb TENANTS_TABLE KEYS_TABLE`. Secrets (API keys, tokens)
are printed once, to stdout, and never logged.

    create-tenant ID [--name NAME] [--catalog-only yes|no]
    map-principal ARN --tenant ID --scopes decide,chat [--models m1,m2]
    unmap-principal ARN
    issue-key --tenant ID --scopes decide,chat [--models m1] [--ttl-days N] [--name NAME]
    list-keys --tenant ID
    revoke-key KEY_ID
    mint-token --principal ARN [--scopes ...] [--models ...] [--ttl-s N]   (needs the signing keys)
    revoke-token TOKEN
    new-signing-key --file PATH        (creates or rotates a local signing key document)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from gateway.auth.store import PrincipalRule


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gateway.admin", description="Tenants and credentials.")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--sqlite", metavar="PATH", help="the embedded store file")
    where.add_argument("--dynamodb", nargs=2, metavar=("TENANTS_TABLE", "KEYS_TABLE"))
    parser.add_argument("--signing-keys-file", help="local signing key document (else GATEWAY_SIGNING_* settings)")
    commands = parser.add_subparsers(dest="command", required=True)

    c = commands.add_parser("create-tenant")
    c.add_argument("tenant_id")
    c.add_argument("--name", default="")
    c.add_argument("--catalog-only", choices=["yes", "no"], help="refuse inline questions (catalog entries only)")
    c = commands.add_parser("map-principal")
    c.add_argument("arn")
    c.add_argument("--tenant", required=True)
    c.add_argument("--scopes", required=True)
    c.add_argument("--models")
    c = commands.add_parser("unmap-principal")
    c.add_argument("arn")
    c = commands.add_parser("issue-key")
    c.add_argument("--tenant", required=True)
    c.add_argument("--scopes", required=True)
    c.add_argument("--models")
    c.add_argument("--ttl-days", type=float)
    c.add_argument("--name", default="")
    c = commands.add_parser("list-keys")
    c.add_argument("--tenant", required=True)
    c = commands.add_parser("revoke-key")
    c.add_argument("key_id")
    c = commands.add_parser("mint-token")
    c.add_argument("--principal", required=True, help="the IAM principal ARN the token is minted for")
    c.add_argument("--scopes")
    c.add_argument("--models")
    c.add_argument("--ttl-s", type=int)
    c = commands.add_parser("revoke-token")
    c.add_argument("token", help="the token itself (its signature proves which one it is); '-' reads it from stdin")
    c = commands.add_parser("new-signing-key")
    c.add_argument("--file", required=True)
    args = parser.parse_args(argv)

    from gateway.auth.tenants import ProvisioningError
    from gateway.errors import GatewayError
    from gateway.settings import SettingsError

    try:
        return _run(args)
    except (ProvisioningError, SettingsError, ValueError) as exc:
        print(f"admin: {exc}", file=sys.stderr)
        return 2
    except GatewayError as exc:
        print(f"admin: {exc.message}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    from gateway.auth import tenants
    from gateway.auth.authenticate import normalise_principal

    if args.command == "new-signing-key":
        from gateway.auth.tokens import new_key_document

        path = Path(args.file)
        previous = path.read_text() if path.exists() else None
        document = new_key_document(previous)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600, exist_ok=True)
        path.write_text(document)
        parsed = json.loads(document)
        _out({"file": str(path), "current": parsed["current"], "keys": sum(1 for k in parsed if k.startswith("key:"))})
        return 0

    authenticator = _authenticator(args)
    store = authenticator.store
    if args.command == "create-tenant":
        catalog_only = None if args.catalog_only is None else args.catalog_only == "yes"
        tenant = tenants.create_tenant(store, args.tenant_id, args.name, catalog_only=catalog_only)
        _out({"tenant_id": tenant.tenant_id, "name": tenant.name, "catalog_only": tenant.catalog_only})
    elif args.command == "map-principal":
        arn = normalise_principal(args.arn)
        if arn is None:
            raise ValueError("not an IAM user, role or root ARN (or an STS assumed-role ARN)")
        if store.get_tenant(args.tenant) is None:
            raise ValueError(f"no tenant {args.tenant!r}")
        scopes = tenants.checked_scopes(_list(args.scopes) or [])
        store.put_principal_rule(PrincipalRule(arn, args.tenant, scopes, _tuple(args.models), time.time()))
        _out({"principal_arn": arn, "tenant_id": args.tenant, "scopes": list(scopes), "models": _list(args.models)})
    elif args.command == "unmap-principal":
        arn = normalise_principal(args.arn) or args.arn
        _out({"principal_arn": arn, "removed": store.delete_principal_rule(arn)})
    elif args.command == "issue-key":
        ttl = args.ttl_days * 86400 if args.ttl_days else None
        key = tenants.issue_api_key(store, args.tenant, _list(args.scopes) or [], models=_list(args.models), ttl_s=ttl,
                                    name=args.name)
        _out({"key_id": key.key_id, "api_key": key.secret, "note": "shown once; only its hash is stored"})
    elif args.command == "list-keys":
        for record in store.list_api_keys(args.tenant):
            _out({"key_id": record.key_id, "name": record.name, "scopes": list(record.scopes),
                  "models": None if record.models is None else list(record.models), "created_at": record.created_at,
                  "expires_at": record.expires_at, "revoked_at": record.revoked_at, "last_used_at": record.last_used_at})
    elif args.command == "revoke-key":
        _out({"key_id": args.key_id, "revoked": store.revoke_api_key(args.key_id, time.time())})
    elif args.command == "mint-token":
        caller = authenticator.authenticate_iam(args.principal)
        token, claims = authenticator.mint_token(caller, _list(args.scopes), _list(args.models), args.ttl_s)
        _out({"token": token, "token_id": claims.token_id, "tenant_id": claims.tenant_id, "expires_at": claims.expires_at})
    elif args.command == "revoke-token":
        given = sys.stdin.readline().strip() if args.token == "-" else args.token  # noqa: S105 ("-" means stdin)
        claims = authenticator.verify_token(given)
        store.revoke_token(claims.token_id, claims.tenant_id, float(claims.expires_at))
        _out({"token_id": claims.token_id, "tenant_id": claims.tenant_id, "revoked": True})
    return 0


def _authenticator(args: argparse.Namespace) -> Any:
    from gateway.auth.factory import build_authenticator
    from gateway.settings import AuthSettings

    settings = AuthSettings.from_env()
    overrides: dict[str, Any] = {}
    if args.sqlite:
        overrides = {"sqlite_path": args.sqlite, "tenants_table": None, "keys_table": None}
    elif args.dynamodb:
        overrides = {"sqlite_path": None, "tenants_table": args.dynamodb[0], "keys_table": args.dynamodb[1]}
    if args.signing_keys_file:
        overrides.update(signing_keys_file=args.signing_keys_file, signing_secret_id=None)
    settings = AuthSettings.model_validate({**settings.model_dump(), **overrides})
    authenticator = build_authenticator(settings)
    if authenticator is None:
        raise ValueError("no store: pass --sqlite PATH or --dynamodb TENANTS KEYS, or set GATEWAY_SQLITE_PATH")
    return authenticator


def _list(text: str | None) -> list[str] | None:
    return None if text is None else [part.strip() for part in text.split(",") if part.strip()]


def _tuple(text: str | None) -> tuple[str, ...] | None:
    values = _list(text)
    return None if values is None else tuple(values)


def _out(document: dict[str, Any]) -> None:
    print(json.dumps(document), flush=True)


if __name__ == "__main__":
    os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")
    sys.exit(main())
