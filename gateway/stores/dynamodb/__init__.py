"""The DynamoDB stores (AWS; moto in tests): one class per store interface, each on the
client the composition root built. The tables are the template's; `create_tables` makes
the same ones for tests and local tools.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.stores import Stores
from gateway.stores.dynamodb.batches import DynamoDBBatches, create_batches_table
from gateway.stores.dynamodb.catalogs import DynamoDBCatalogs
from gateway.stores.dynamodb.counters import DynamoDBCounters
from gateway.stores.dynamodb.idempotency import DynamoDBIdempotency
from gateway.stores.dynamodb.items import index
from gateway.stores.dynamodb.records import DynamoDBRecords
from gateway.stores.dynamodb.tenants import DynamoDBTenants

_PK_SK = {"KeySchema": [{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
          "AttributeDefinitions": [{"AttributeName": "pk", "AttributeType": "S"}, {"AttributeName": "sk", "AttributeType": "S"}]}


@dataclass(frozen=True, slots=True)
class DynamoDBTables:
    """The tables of one deployment: catalogs, records and batches only where they are
    configured (batches with the S3 bucket that holds their files' bytes)."""

    tenants: str
    keys: str
    catalogs: str | None = None
    records: str | None = None
    batches: str | None = None
    batch_bucket: str | None = None


def dynamodb_stores(client: Any, tables: DynamoDBTables, batches_client: Any = None, s3: Any = None) -> Stores:
    """`batches_client` and `s3`: the batch store's DynamoDB client (else `client`) and the
    client for its bucket (needed where `tables.batches` is set)."""
    return Stores(tenants=DynamoDBTenants(client, tables.tenants, tables.keys), counters=DynamoDBCounters(client, tables.keys),
                  idempotency=DynamoDBIdempotency(client, tables.keys),
                  catalogs=DynamoDBCatalogs(client, tables.catalogs) if tables.catalogs else None,
                  records=DynamoDBRecords(client, tables.records) if tables.records else None,
                  batches=DynamoDBBatches(batches_client or client, s3, tables.batches, tables.batch_bucket)
                  if tables.batches and tables.batch_bucket else None)


def create_tables(client: Any, tables: DynamoDBTables) -> None:
    """For tests and local tools; in AWS the template creates the tables."""
    client.create_table(TableName=tables.tenants, BillingMode="PAY_PER_REQUEST", **_PK_SK)
    client.create_table(
        TableName=tables.keys, BillingMode="PAY_PER_REQUEST", KeySchema=_PK_SK["KeySchema"],
        AttributeDefinitions=[*_PK_SK["AttributeDefinitions"], {"AttributeName": "tenant_id", "AttributeType": "S"},
                              {"AttributeName": "created_at", "AttributeType": "N"}],
        GlobalSecondaryIndexes=[_index("tenant_id", "created_at")],
    )
    if tables.batches:
        create_batches_table(client, tables.batches)
    if tables.catalogs:
        client.create_table(
            TableName=tables.catalogs, BillingMode="PAY_PER_REQUEST",
            KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "version", "KeyType": "RANGE"}],
            AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"},
                                  {"AttributeName": "version", "AttributeType": "N"},
                                  {"AttributeName": "tenant_id", "AttributeType": "S"},
                                  {"AttributeName": "name_version", "AttributeType": "S"}],
            GlobalSecondaryIndexes=[_index("tenant_id", "name_version")],
        )
        client.update_time_to_live(TableName=tables.catalogs,
                                   TimeToLiveSpecification={"Enabled": True, "AttributeName": "ttl"})
    if tables.records:
        client.create_table(
            TableName=tables.records, BillingMode="PAY_PER_REQUEST",
            KeySchema=[{"AttributeName": "tenant_id", "KeyType": "HASH"}, {"AttributeName": "record_id", "KeyType": "RANGE"}],
            AttributeDefinitions=[{"AttributeName": "tenant_id", "AttributeType": "S"},
                                  {"AttributeName": "record_id", "AttributeType": "S"}],
        )


def _index(partition: str, sort: str) -> dict[str, Any]:
    return index("by_tenant", partition, sort)
