"""Operate tenants and credentials: `python -m devkit.admin <command> ...`.

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
    revoke-token-id TOKEN_ID --tenant ID
    revoke-tokens --tenant ID | --principal ARN   (every token minted until now)
    set-limits ID [--rate-per-s R] [--burst B] [--max-options N] [--max-text-bytes N]
               [--max-request-tokens N] [--max-chat-tokens N] [--max-in-flight N|none]
               [--monthly-budget-usd USD|none] [--endpoint-seconds-per-minute S|none]
               [--share-weight W] [--usage-plan API_ID:STAGE]
    usage ID [--from YYYY-MM-DD] [--to YYYY-MM-DD]   (spend by day and entry, and the budgets)
    new-signing-key --file PATH        (creates or rotates a local signing key document)
    new-record-key --file PATH [--retention-days N]   (rotates the records' state-hash keys, keeping
                                       every earlier one for the retention, so old records still verify)
    verify-record RECORD_ID --tenant ID --state-file PATH [--record-keys-file PATH]
                                       (was this the state the decision was made on?)
    emergency-rotate --file PATH | --secret-id ID [--drop-key KID ...]
                                       (a fresh key document: every earlier key stops verifying at once)
    adopt-catalog-heads [--retention-days N]   (once after the upgrade that added catalog heads, on
                                       DynamoDB: entries written before get theirs, so the daily refit
                                       sees them and their old versions expire)
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
    args = parser().parse_args(argv)

    from gateway.auth.tenants import ProvisioningError
    from gateway.errors import ServiceError
    from gateway.settings import SettingsError

    try:
        return _run(args)
    except (ProvisioningError, SettingsError, ValueError) as exc:
        print(f"admin: {exc}", file=sys.stderr)
        return 2
    except ServiceError as exc:
        print(f"admin: {exc.message}", file=sys.stderr)
        return 2


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m devkit.admin", description="Tenants and credentials.")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--sqlite", metavar="PATH", help="the embedded store file")
    where.add_argument("--dynamodb", nargs=2, metavar=("TENANTS_TABLE", "KEYS_TABLE"))
    parser.add_argument("--signing-keys-file", help="local signing key document (else GATEWAY_SIGNING_* settings)")
    commands = parser.add_subparsers(dest="command", required=True)
    _tenant_commands(commands)
    _credential_commands(commands)
    _key_commands(commands)
    return parser


def _tenant_commands(commands: Any) -> None:
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
    c = commands.add_parser("set-limits")
    c.add_argument("tenant_id")
    for name, kind in (("rate-per-s", float), ("burst", int), ("max-options", int), ("max-text-bytes", int),
                       ("max-request-tokens", int), ("max-chat-tokens", int), ("share-weight", float)):
        c.add_argument(f"--{name}", type=kind)
    for name in ("monthly-budget-usd", "endpoint-seconds-per-minute"):  # "none" lifts the limit
        c.add_argument(f"--{name}", type=_float_or_none, default=_UNCHANGED)
    # "none": the model's own figure, half of what its scorers run at once
    c.add_argument("--max-in-flight", type=_int_or_none, default=_UNCHANGED)
    c.add_argument("--usage-plan", metavar="API_ID:STAGE",
                   help="give the tenant its own usage plan key with these rate and burst (AWS: API_ID:STAGE;"
                        " 'local' for the local runner); without one a tenant shares the default bucket")
    c = commands.add_parser("usage")
    c.add_argument("tenant_id")
    c.add_argument("--from", dest="first")
    c.add_argument("--to", dest="last")


def _credential_commands(commands: Any) -> None:
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
    c = commands.add_parser("revoke-token-id")
    c.add_argument("token_id")
    c.add_argument("--tenant", required=True)
    c = commands.add_parser("revoke-tokens")
    who = c.add_mutually_exclusive_group(required=True)
    who.add_argument("--tenant")
    who.add_argument("--principal")


def _key_commands(commands: Any) -> None:
    c = commands.add_parser("new-signing-key")
    c.add_argument("--file", required=True)
    c = commands.add_parser("new-record-key")
    c.add_argument("--file", required=True)
    c.add_argument("--retention-days", type=float, default=90)
    c = commands.add_parser("verify-record")
    c.add_argument("record_id")
    c.add_argument("--tenant", required=True)
    c.add_argument("--state-file", required=True, type=Path, help="the state as sent: text, or JSON when it was an object")
    c.add_argument("--record-keys-file", help="else GATEWAY_RECORD_KEY_SECRET_ID / GATEWAY_RECORD_KEYS_FILE")
    c = commands.add_parser("adopt-catalog-heads")
    c.add_argument("--retention-days", type=float, default=90, help="the stack's RecordRetentionDays")
    c = commands.add_parser("emergency-rotate")
    where_keys = c.add_mutually_exclusive_group(required=True)
    where_keys.add_argument("--file")
    where_keys.add_argument("--secret-id")
    c.add_argument("--drop-key", action="append", default=[], metavar="KID",
                   help="a key id to refuse from now on (read from the document when it can be read)")


def _run(args: argparse.Namespace) -> int:
    if args.command in ("new-signing-key", "new-record-key"):
        _out(_new_key(args))
        return 0
    stores, authenticator = _configured(args)
    if args.command == "emergency-rotate":
        _out(_emergency_rotate(args, authenticator))
    elif args.command == "adopt-catalog-heads":
        adopt = getattr(stores.catalogs, "adopt_entries_without_heads", None)
        if adopt is None:  # a SQLite file is brought up to date as it is opened
            raise ValueError("adopt-catalog-heads is for DynamoDB: set GATEWAY_CATALOGS_TABLE")
        _out({"adopted": adopt(args.retention_days * 86400)})
    elif args.command in TENANT_COMMANDS:
        _tenant_command(args, stores, authenticator)
    else:
        _credential_command(args, authenticator)
    return 0


def _new_key(args: argparse.Namespace) -> dict[str, Any]:
    from gateway.auth.tokens import new_key_document

    path = Path(args.file)
    previous = path.read_text() if path.exists() else None
    if args.command == "new-record-key":  # a record's key must outlive the record
        document = new_key_document(previous, keep_s=(args.retention_days + 1) * 86400)
    else:
        document = new_key_document(previous)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600, exist_ok=True)
    path.write_text(document)
    parsed = json.loads(document)
    return {"file": str(path), "current": parsed["current"], "keys": sum(1 for k in parsed if k.startswith("key:"))}


TENANT_COMMANDS = ("create-tenant", "map-principal", "unmap-principal", "issue-key", "set-limits", "usage", "verify-record")
_UNCHANGED = object()  # an optional limit not given on the command line


def _float_or_none(text: str) -> float | None:
    return None if text.lower() == "none" else float(text)


def _int_or_none(text: str) -> int | None:
    return None if text.lower() == "none" else int(text)


def _tenant_command(args: argparse.Namespace, stores: Any, authenticator: Any) -> None:
    from gateway.auth import tenants
    from gateway.auth.authenticate import normalise_principal

    store = stores.tenants
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
        removed = store.delete_principal_rule(arn)
        # Tokens it minted would live on for up to 12 h: refuse every one of them.
        not_before = authenticator.revoke_all_tokens(f"principal:{arn}")
        _out({"principal_arn": arn, "removed": removed, "tokens_not_before": not_before})
    elif args.command == "issue-key":
        ttl = args.ttl_days * 86400 if args.ttl_days else None
        key = tenants.issue_api_key(store, args.tenant, _list(args.scopes) or [], models=_list(args.models), ttl_s=ttl,
                                    name=args.name)
        _out({"key_id": key.key_id, "api_key": key.secret, "note": "shown once; only its hash is stored"})
    elif args.command == "set-limits":
        _out(_set_limits(args, store))
    elif args.command == "usage":
        _out(_usage(args, stores))
    elif args.command == "verify-record":
        _out(_verify_record(args, stores))


def _credential_command(args: argparse.Namespace, authenticator: Any) -> None:
    from gateway.auth.authenticate import normalise_principal

    store = authenticator.tenant_store
    if args.command == "list-keys":
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
        token_id = authenticator.revoke_token(_operator(claims.tenant_id), token=given)
        _out({"token_id": token_id, "tenant_id": claims.tenant_id, "revoked": True})
    elif args.command == "revoke-token-id":
        token_id = authenticator.revoke_token(_operator(args.tenant), token_id=args.token_id)
        _out({"token_id": token_id, "tenant_id": args.tenant, "revoked": True})
    elif args.command == "revoke-tokens":
        subject = f"tenant:{args.tenant}" if args.tenant else f"principal:{normalise_principal(args.principal) or args.principal}"
        _out({"subject": subject, "tokens_not_before": authenticator.revoke_all_tokens(subject)})


def _verify_record(args: argparse.Namespace, stores: Any) -> dict[str, Any]:
    from gateway.auth.tokens import file_key_ring
    from gateway.decisions.records import state_matches
    from gateway.functions.composition import build_record_keys
    from gateway.settings import AuthSettings

    keys = file_key_ring(args.record_keys_file) if args.record_keys_file else build_record_keys(AuthSettings.from_env())
    if keys is None:
        raise ValueError("no record keys: pass --record-keys-file or set GATEWAY_RECORD_KEYS_FILE")
    if stores.records is None:
        raise ValueError("no records table: set GATEWAY_RECORDS_TABLE")
    record = stores.records.get_record(args.tenant, args.record_id)
    if record is None:
        raise ValueError(f"no record {args.record_id!r} for tenant {args.tenant!r}")
    text = args.state_file.read_text()
    try:
        state = json.loads(text)
        state = state if isinstance(state, dict | list) else text
    except ValueError:
        state = text
    return {"record_id": args.record_id, "state_matches": state_matches(keys, record, state)}


def _operator(tenant_id: str) -> Any:
    """The operator acting for a tenant (an admin, as the IAM admin scope would be)."""
    from gateway.auth.credentials import Principal

    return Principal(tenant_id, frozenset({"admin"}), None, "operator", None, iam=True, kind="iam")


def _set_limits(args: argparse.Namespace, store: Any) -> dict[str, Any]:
    from gateway.auth import tenants

    changes = {name: getattr(args, name) for name in ("rate_per_s", "burst", "max_options", "max_text_bytes",
                                                      "max_request_tokens", "max_chat_tokens", "share_weight")
               if getattr(args, name) is not None}
    changes.update({name: getattr(args, name) for name in ("monthly_budget_usd", "endpoint_seconds_per_minute",
                                                           "max_in_flight")
                    if getattr(args, name) is not _UNCHANGED})
    tenant = tenants.set_limits(store, args.tenant_id, **changes)
    if args.usage_plan == "local":
        import secrets

        tenant = tenants.set_limits(store, args.tenant_id, usage_key=f"local-{secrets.token_hex(8)}")
    elif args.usage_plan:
        from gateway import aws
        from gateway.auth.usage_plans import assign_usage_plan

        api_id, _, stage = args.usage_plan.partition(":")
        key = assign_usage_plan(tenant, api_id, stage, aws.client("apigateway"))
        tenant = tenants.set_limits(store, args.tenant_id, usage_key=key)
    elif {"rate_per_s", "burst"} & set(changes):
        print("admin: rate and burst apply once the tenant has a usage plan key of its own (--usage-plan);"
              " until then it shares the default bucket", file=sys.stderr)
    limits = tenant.limits.as_json()
    limits.pop("usage_key", None)  # an identifier, not a secret, but it has no business in terminals
    return {"tenant_id": tenant.tenant_id, "limits": limits, "usage_plan": bool(tenant.limits.usage_key)}


def _usage(args: argparse.Namespace, stores: Any) -> dict[str, Any]:
    """What the tenant spent, as GET /v1/usage answers it (the operator's view of any tenant)."""
    from gateway.services.spending import Spending

    tenant = stores.tenants.get_tenant(args.tenant_id)
    if tenant is None:
        raise ValueError(f"no tenant {args.tenant_id!r}")
    today = time.strftime("%Y-%m-%d", time.gmtime())
    return Spending(stores.counters, lambda _: tenant.limits).usage(args.tenant_id, args.first or today[:8] + "01",
                                                          args.last or today, tenant.limits)


def _emergency_rotate(args: argparse.Namespace, authenticator: Any) -> dict[str, Any]:
    """A document holding only a new key, so every earlier key stops verifying as rings
    reload (5 minutes at most), and each dropped key refused at once where the
    revocation check runs (10 s): even a token forged with a leaked key is refused."""
    from gateway.auth.tokens import KEY_FIELD, new_key_document

    previous = None
    if args.file:
        path = Path(args.file)
        previous = path.read_text() if path.exists() else None
    else:
        from gateway import aws

        client = aws.client("secretsmanager")
        try:
            previous = client.get_secret_value(SecretId=args.secret_id)["SecretString"]
        except client.exceptions.ClientError:
            previous = None  # the secret's policy lets only the functions read it: name the keys with --drop-key
    dropped = set(args.drop_key)
    if previous:
        dropped |= {name[len(KEY_FIELD):] for name in json.loads(previous) if name.startswith(KEY_FIELD)}
    if not dropped:
        raise ValueError("the current document cannot be read: name the keys to drop with --drop-key KID")
    document = new_key_document(None)
    for key_id in sorted(dropped):
        authenticator.tenant_store.set_not_before(f"key:{key_id}", 1e18)  # no token signed by it is good again
    if args.file:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600, exist_ok=True)
        path.write_text(document)
    else:
        client.put_secret_value(SecretId=args.secret_id, SecretString=document, VersionStages=["AWSCURRENT"])
    return {"dropped": sorted(dropped), "current": json.loads(document)["current"]}


def _configured(args: argparse.Namespace) -> tuple[Any, Any]:
    """The stores and the authenticator the arguments and the environment name."""
    from gateway.functions.composition import build_authenticator, build_stores
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
    stores = build_stores(settings)
    if stores is None:
        raise ValueError("no store: pass --sqlite PATH or --dynamodb TENANTS KEYS, or set GATEWAY_SQLITE_PATH")
    return stores, build_authenticator(settings, stores)


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
