"""Build the store and the authenticator from settings (the adapters chosen once, here)."""

from __future__ import annotations

from gateway.auth.authenticate import Authenticator
from gateway.auth.revocation import RevocationCheck
from gateway.auth.store import TenantStore
from gateway.auth.tokens import KeyRing, file_key_ring, secrets_manager_key_ring
from gateway.settings import AuthSettings


def build_store(settings: AuthSettings) -> TenantStore | None:
    if settings.sqlite_path:
        from gateway.stores.sqlite import SQLiteStore

        return SQLiteStore(settings.sqlite_path)
    if settings.tenants_table and settings.keys_table:
        from gateway.stores.dynamodb import DynamoDBStore

        return DynamoDBStore(settings.tenants_table, settings.keys_table, catalogs_table=settings.catalogs_table,
                             records_table=settings.records_table)
    return None


def build_authenticator(settings: AuthSettings, store: TenantStore | None = None) -> Authenticator | None:
    store = store or build_store(settings)
    if store is None:
        return None
    keys = None
    if settings.signing_secret_id:
        keys = secrets_manager_key_ring(settings.signing_secret_id)
    elif settings.signing_keys_file:
        keys = file_key_ring(settings.signing_keys_file)
    return Authenticator(store, keys, revocations=RevocationCheck(store, check_s=settings.revocation_check_s))


def build_record_keys(settings: AuthSettings) -> KeyRing | None:
    """The records' state-hash keys (never the signing keys: those rotate out in a day)."""
    if settings.record_key_secret_id:
        return secrets_manager_key_ring(settings.record_key_secret_id)
    if settings.record_keys_file:
        return file_key_ring(settings.record_keys_file)
    return None
